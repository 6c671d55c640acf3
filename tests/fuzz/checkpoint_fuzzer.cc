// The checkpoint reader fuzz target (tests/fuzz/checkpoint_fuzzer.h). Invariants, each abort()ing
// when broken:
// - a rejection has a proper code (never kInternal) and a message;
// - an accepted index holds at least one tensor, every name once, and storages that lie inside the
//   file without overlapping, each exactly numel * element size bytes;
// - every tensor addresses only elements of its storage, and no more of them than it holds
//   (checked here with wide arithmetic, independently of the reader);
// - reading the same bytes again gives the same index.
#include "tests/fuzz/checkpoint_fuzzer.h"

#include <algorithm>
#include <set>

#include "capsule/base/internal/little_endian.h"
#include "capsule/checkpoint/checkpoint_index.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {
namespace {

using internal::StoreLe16;
using internal::StoreLe32;

void Append16(std::string& s, uint16_t v) {
  char b[2];
  StoreLe16(b, v);
  s.append(b, 2);
}
void Append32(std::string& s, uint32_t v) {
  char b[4];
  StoreLe32(b, v);
  s.append(b, 4);
}

bool IsReaderCode(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:    // not a checkpoint, outside the subset
    case StatusCode::kDataLoss:           // a directory that contradicts the file
    case StatusCode::kUnimplemented:      // newer version, compressed, big-endian
    case StatusCode::kResourceExhausted:  // over a limit
    case StatusCode::kOutOfRange:         // a read past the end
      return true;
    default:
      return false;
  }
}

bool Equal(const CheckpointIndex& a, const CheckpointIndex& b) {
  if (a.format != b.format || a.storages.size() != b.storages.size() ||
      a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.storages.size(); ++i) {
    const CheckpointStorage &x = a.storages[i], &y = b.storages[i];
    if (x.key != y.key || x.dtype != y.dtype || x.numel != y.numel || x.offset != y.offset ||
        x.bytes != y.bytes) {
      return false;
    }
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const CheckpointTensor &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.storage != y.storage || x.storage_offset != y.storage_offset ||
        x.sizes != y.sizes || x.strides != y.strides || x.requires_grad != y.requires_grad) {
      return false;
    }
  }
  return true;
}

void CheckIndex(const CheckpointIndex& index, uint64_t file_size) {
  if (index.tensors.empty()) Fail("accepted a checkpoint without tensors", Status());
  if (index.format != "torch_pickle" && index.format != "torch_archive") {
    Fail("accepted an unknown format", Status());
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const CheckpointStorage& s : index.storages) {
    const unsigned __int128 bytes =
        static_cast<unsigned __int128>(s.numel) * CheckpointDtypeSize(s.dtype);
    if (bytes != s.bytes) Fail("a storage whose bytes are not numel * element size", Status());
    if (s.offset > file_size || s.bytes > file_size - s.offset) {
      Fail("a storage outside the file", Status());
    }
    ranges.emplace_back(s.offset, s.offset + s.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) Fail("storages that overlap", Status());
  }
  std::set<std::string> names;
  for (const CheckpointTensor& t : index.tensors) {
    if (!names.insert(t.name).second) Fail("a name given twice", Status());
    if (t.storage >= index.storages.size()) Fail("a tensor without its storage", Status());
    const CheckpointStorage& s = index.storages[t.storage];
    if (t.sizes.size() != t.strides.size()) Fail("sizes and strides disagree", Status());
    bool empty = false;
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      if (t.sizes[d] < 0 || t.strides[d] < 0) Fail("a negative size or stride", Status());
      empty = empty || t.sizes[d] == 0;
    }
    if (empty) {
      if (t.storage_offset > s.numel) Fail("an empty tensor past its storage", Status());
      continue;
    }
    // Saturating at 2^64 + 1: past every storage there can be.
    const unsigned __int128 kHuge = (static_cast<unsigned __int128>(1) << 64) + 1;
    unsigned __int128 numel = 1, last = t.storage_offset;
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      const uint64_t size = static_cast<uint64_t>(t.sizes[d]);
      numel = std::min(kHuge, numel * size);
      last = std::min(kHuge, last + static_cast<unsigned __int128>(size - 1) *
                                        static_cast<uint64_t>(t.strides[d]));
    }
    if (last >= s.numel) Fail("a tensor that reaches past its storage", Status());
    if (numel > s.numel) Fail("a tensor with more elements than its storage", Status());
  }
}

}  // namespace

std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out, central;
  for (const auto& [name, data] : records) {
    const uint32_t offset = static_cast<uint32_t>(out.size());
    // Local header: signature, version, flags, method 0 (stored), time, date, crc, sizes, name.
    Append32(out, 0x04034b50);
    Append16(out, 20);
    for (int i = 0; i < 4; ++i) Append16(out, 0);
    Append32(out, 0);
    Append32(out, static_cast<uint32_t>(data.size()));
    Append32(out, static_cast<uint32_t>(data.size()));
    Append16(out, static_cast<uint16_t>(name.size()));
    Append16(out, 0);
    out += name + data;
    Append32(central, 0x02014b50);
    Append16(central, 20);
    Append16(central, 20);
    for (int i = 0; i < 4; ++i) Append16(central, 0);
    Append32(central, 0);
    Append32(central, static_cast<uint32_t>(data.size()));
    Append32(central, static_cast<uint32_t>(data.size()));
    Append16(central, static_cast<uint16_t>(name.size()));
    for (int i = 0; i < 4; ++i) Append16(central, 0);
    Append32(central, 0);
    Append32(central, offset);
    central += name;
  }
  const uint32_t cd_offset = static_cast<uint32_t>(out.size());
  out += central;
  Append32(out, 0x06054b50);
  Append16(out, 0);
  Append16(out, 0);
  Append16(out, static_cast<uint16_t>(records.size()));
  Append16(out, static_cast<uint16_t>(records.size()));
  Append32(out, static_cast<uint32_t>(central.size()));
  Append32(out, cd_offset);
  Append16(out, 0);
  return out;
}

std::string CheckpointFuzzFile(std::string_view bytes) {
  // A zip file, or the head of a legacy (pre-zip) torch.save file: read as it is.
  if (bytes.substr(0, 2) == "PK" || bytes.substr(0, 4) == std::string_view("\x80\x02\x8a\x0a", 4)) {
    return std::string(bytes);
  }
  std::vector<std::pair<std::string, std::string>> records = {
      {"archive/data.pkl", std::string(bytes)}};
  for (int i = 0; i < 8; ++i) {
    records.emplace_back("archive/data/" + std::to_string(i), std::string(128, char('a' + i)));
  }
  records.emplace_back("archive/version", "3\n");
  return StoredZip(records);
}

Status CheckpointForRegression(std::string_view bytes) {
  const std::string file = CheckpointFuzzFile(bytes);
  return ReadCheckpointIndex(MemorySource(file)).status();
}

}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace capsule;
  const std::string file =
      fuzz::CheckpointFuzzFile(std::string_view(reinterpret_cast<const char*>(data), size));
  StatusOr<CheckpointIndex> index = ReadCheckpointIndex(MemorySource(file));
  if (!index.ok()) {
    if (!fuzz::IsReaderCode(index.status().code()) || index.status().message().empty()) {
      fuzz::Fail("rejection without a reader's code and a message", index.status());
    }
    return 0;
  }
  fuzz::CheckIndex(*index, file.size());
  StatusOr<CheckpointIndex> again = ReadCheckpointIndex(MemorySource(file));
  if (!again.ok() || !fuzz::Equal(*index, *again)) fuzz::Fail("a second read differs", Status());
  return 0;
}
