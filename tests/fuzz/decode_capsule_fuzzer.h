// The DecodeCapsule fuzz target (README, "Building by hand"; the other targets are in
// envelope_fuzzer.cc, read_fuzzer.cc and redact_fuzzer.cc), shared by the libFuzzer binary
// (capsule_decode_fuzzer), the ctest regression driver (capsule_fuzz_regression) and the seed
// corpus generator (capsule_fuzz_make_corpus).
//
// Each input is decoded as a capsule file with the fuzz options and with the default options.
// Because mutations almost never keep the SHA-256 digest valid, the target also re-seals the
// input's header and payload under a fresh digest (so payload mutations reach zstd), and treats an
// input that does not start with the capsule magic as a serialized capsule.v1.Capsule, compressed
// and sealed here (so mutations reach protobuf parsing and ValidateCapsule). Invariants that must
// hold are checked and abort() when broken: a crash is a finding.
//
// Thread safety: thread-safe.
#ifndef CAPSULE_TESTS_FUZZ_DECODE_CAPSULE_FUZZER_H_
#define CAPSULE_TESTS_FUZZ_DECODE_CAPSULE_FUZZER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "capsule/base/status.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {

// What the regression driver holds corpus files to: DecodeCapsule with FuzzReadOptions() for a
// capsule file; for anything else, the input as a serialized message, compressed, sealed unsigned
// and decoded.
Status DecodeForRegression(std::string_view bytes);

}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // CAPSULE_TESTS_FUZZ_DECODE_CAPSULE_FUZZER_H_
