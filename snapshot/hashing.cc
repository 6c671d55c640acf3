#include "capsule/snapshot/hashing.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"

namespace capsule {
namespace {

void AppendU64(Sha256Hasher& h, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  h.Update(b, 8);
}

void AppendString(Sha256Hasher& h, const std::string& s) {
  AppendU64(h, s.size());
  h.Update(s);
}

}  // namespace

StatusOr<std::string> CanonicalModelHash(const std::vector<NamedTensor>& parameters) {
  std::vector<const NamedTensor*> sorted;
  sorted.reserve(parameters.size());
  for (const NamedTensor& p : parameters) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(),
            [](const NamedTensor* a, const NamedTensor* b) { return a->first < b->first; });
  Sha256Hasher h;
  h.Update("capsule/model/v1\n");
  AppendU64(h, sorted.size());
  try {
    for (const NamedTensor* p : sorted) {
      const at::Tensor c = p->second.detach().to(at::kCPU).contiguous();
      AppendString(h, p->first);
      AppendString(h, std::string(c10::toString(c.scalar_type())));
      AppendU64(h, static_cast<uint64_t>(c.dim()));
      for (int64_t d : c.sizes()) AppendU64(h, static_cast<uint64_t>(d));
      const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
      AppendU64(h, bytes);
      h.Update(c.data_ptr(), bytes);
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("cannot hash the model parameters: ") +
                         e.what_without_backtrace());
  }
  CAPSULE_ASSIGN_OR_RETURN(std::string raw, h.Finish());
  return HexEncode(raw);
}

StatusOr<FileHash> HashFile(const std::string& path) {
  CAPSULE_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path, uint64_t{1} << 34));
  FileHash f;
  f.path = path;
  const size_t slash = path.rfind('/');
  f.name = slash == std::string::npos ? path : path.substr(slash + 1);
  f.size_bytes = static_cast<int64_t>(bytes.size());
  CAPSULE_ASSIGN_OR_RETURN(f.sha256, Sha256Hex(bytes));
  return f;
}

}  // namespace capsule
