// The checkpoint reader's fuzz target (ReadCheckpointIndex, checkpoint/checkpoint_index.h), shared
// by the libFuzzer binary (capsule_checkpoint_fuzzer) and its ctest regression driver, which holds
// the seeds in tests/fuzz/corpus/checkpoint to their names: "ok-*" must be read, "bad-*" refused.
//
// An input that starts like a zip file ("PK"), or like a legacy torch.save file, is read as a
// whole checkpoint. Any other input is
// taken as data.pkl and put into an archive here, beside storage records data/0 .. data/7 of 128
// bytes each, so that mutations of a pickle reach the opcodes and the tensor checks instead of
// stopping at the zip directory.
//
// Thread safety: thread-safe.
#ifndef CAPSULE_TESTS_FUZZ_CHECKPOINT_FUZZER_H_
#define CAPSULE_TESTS_FUZZ_CHECKPOINT_FUZZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "capsule/base/status.h"

namespace capsule::fuzz {

// A zip archive of stored records, as torch.save lays them out (no zip64 records).
std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& records);

// What the target reads `bytes` as: the file itself, or an archive around it (see above).
std::string CheckpointFuzzFile(std::string_view bytes);

// ReadCheckpointIndex of CheckpointFuzzFile(bytes), with the target's limits.
Status CheckpointForRegression(std::string_view bytes);

}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // CAPSULE_TESTS_FUZZ_CHECKPOINT_FUZZER_H_
