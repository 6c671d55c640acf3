#include "capsule/snapshot/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/checkpoint/checkpoint_index.h"
#include "capsule/format/dtype.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/snapshot/internal/tensor_codec.h"

namespace capsule {
namespace {

constexpr uint64_t kMaxCheckpointBytes = uint64_t{1} << 40;
constexpr size_t kHashChunk = size_t{4} << 20;

at::ScalarType ScalarTypeOf(CheckpointDtype dtype) {
  switch (dtype) {
    case CheckpointDtype::kFloat64:
      return at::kDouble;
    case CheckpointDtype::kFloat32:
      return at::kFloat;
    case CheckpointDtype::kFloat16:
      return at::kHalf;
    case CheckpointDtype::kBFloat16:
      return at::kBFloat16;
    case CheckpointDtype::kInt64:
      return at::kLong;
    case CheckpointDtype::kInt32:
      return at::kInt;
    case CheckpointDtype::kInt16:
      return at::kShort;
    case CheckpointDtype::kInt8:
      return at::kChar;
    case CheckpointDtype::kUInt8:
      return at::kByte;
    case CheckpointDtype::kBool:
      return at::kBool;
    case CheckpointDtype::kComplex64:
      return at::kComplexFloat;
    case CheckpointDtype::kComplex128:
      return at::kComplexDouble;
  }
  return at::kFloat;
}

// The file's SHA-256, read in pieces: hashing a checkpoint never holds it whole.
StatusOr<std::string> HashFile(const RandomAccessFile& file) {
  std::string buffer(static_cast<size_t>(std::min<uint64_t>(file.size(), kHashChunk)), '\0');
  Sha256Hasher hasher;
  for (uint64_t at = 0; at < file.size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(file.size() - at, buffer.size()));
    CAPSULE_RETURN_IF_ERROR(file.ReadAt(at, n, buffer.data()));
    hasher.Update(buffer.data(), n);
    at += n;
  }
  CAPSULE_ASSIGN_OR_RETURN(const std::string digest, hasher.Finish());
  return HexEncode(digest);
}

// Each storage read straight into a tensor of its own, and each named tensor a view of it (sizes,
// strides and offset as saved: ReadCheckpointIndex checked that they fit).
StatusOr<std::vector<NamedTensor>> Materialize(const RandomAccessFile& file,
                                               const CheckpointIndex& index) {
  std::vector<NamedTensor> out;
  try {
    std::vector<at::Tensor> storages;
    storages.reserve(index.storages.size());
    for (const CheckpointStorage& s : index.storages) {
      at::Tensor t = at::empty({static_cast<int64_t>(s.numel)}, at::dtype(ScalarTypeOf(s.dtype)));
      char* data = static_cast<char*>(t.data_ptr());
      CAPSULE_RETURN_IF_ERROR(file.ReadAt(s.offset, static_cast<size_t>(s.bytes), data));
      // A bool that is neither 0 nor 1 is undefined behaviour for every kernel that reads it.
      if (s.dtype == CheckpointDtype::kBool &&
          std::any_of(data, data + s.bytes, [](char c) { return c != 0 && c != 1; })) {
        return InvalidArgumentError("bool storage '" + PrintableShort(s.key) +
                                    "' holds a byte other than 0 or 1");
      }
      storages.push_back(std::move(t));
    }
    out.reserve(index.tensors.size());
    for (const CheckpointTensor& t : index.tensors) {
      const at::Tensor& storage = storages[t.storage];
      at::Tensor view = at::empty({0}, storage.options());
      view.set_(storage.storage(), static_cast<int64_t>(t.storage_offset), t.sizes, t.strides);
      out.emplace_back(t.name, std::move(view));
    }
  } catch (const c10::Error& e) {
    return ResourceExhaustedError(std::string("cannot hold its tensors: ") +
                                  e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("cannot hold its tensors: out of memory");
  }
  return out;
}

StatusOr<LoadedCheckpoint> Load(const RandomAccessFile& file,
                                const CheckpointExpectation& expected) {
  if (file.size() > kMaxCheckpointBytes) {
    return ResourceExhaustedError(std::to_string(file.size()) + " bytes, over the limit of " +
                                  std::to_string(kMaxCheckpointBytes));
  }
  LoadedCheckpoint ckpt;
  ckpt.size_bytes = static_cast<int64_t>(file.size());
  if (expected.size_bytes >= 0 && ckpt.size_bytes != expected.size_bytes) {
    return FailedPreconditionError("is " + std::to_string(ckpt.size_bytes) + " bytes, expected " +
                                   std::to_string(expected.size_bytes) +
                                   "; refused before parsing");
  }
  CAPSULE_ASSIGN_OR_RETURN(ckpt.file_sha256, HashFile(file));
  if (!expected.file_sha256.empty() && ckpt.file_sha256 != expected.file_sha256) {
    return FailedPreconditionError("has sha256 " + ckpt.file_sha256.substr(0, 16) + "…, expected " +
                                   expected.file_sha256.substr(0, 16) +
                                   "…; refused before parsing");
  }
  CheckpointSource source;
  source.size = file.size();
  source.read = [&file](uint64_t offset, size_t n, char* out) {
    return file.ReadAt(offset, n, out);
  };
  CheckpointLimits limits;
  limits.max_file_bytes = kMaxCheckpointBytes;
  CAPSULE_ASSIGN_OR_RETURN(CheckpointIndex index, ReadCheckpointIndex(source, limits));
  CAPSULE_ASSIGN_OR_RETURN(ckpt.tensors, Materialize(file, index));
  ckpt.format = std::move(index.format);
  return ckpt;
}

}  // namespace

StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path,
                                          const CheckpointExpectation& expected) {
  CAPSULE_ASSIGN_OR_RETURN(RandomAccessFile file, RandomAccessFile::Open(path));
  StatusOr<LoadedCheckpoint> ckpt = Load(file, expected);
  if (ckpt.ok()) return ckpt;
  if (ckpt.status().code() == StatusCode::kFailedPrecondition) {  // "checkpoint P has sha256 ..."
    return FailedPreconditionError("checkpoint " + path + " " + ckpt.status().message());
  }
  return ckpt.status().WithContext("checkpoint " + path);
}

Status SaveCheckpoint(const std::string& path, const std::vector<NamedTensor>& tensors) {
  std::vector<char> bytes;
  try {
    c10::Dict<std::string, at::Tensor> dict;
    for (const NamedTensor& t : tensors) dict.insert(t.first, t.second.detach().to(at::kCPU));
    bytes = torch::pickle_save(dict);
  } catch (const c10::Error& e) {
    return InternalError(std::string("cannot serialize the checkpoint: ") +
                         e.what_without_backtrace());
  }
  AtomicWriteOptions options;
  options.overwrite = true;
  return WriteFileAtomic(path, std::string_view(bytes.data(), bytes.size()), options);
}

StatusOr<std::vector<TensorDigestInfo>> TensorDigests(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorDigestInfo> out;
  out.reserve(tensors.size());
  try {
    for (const NamedTensor& t : tensors) {
      const at::Tensor c = t.second.detach().to(at::kCPU).contiguous();
      TensorDigestInfo d;
      d.name = t.first;
      d.dtype = DTypeName(DTypeFromScalarType(c.scalar_type()));
      if (DTypeFromScalarType(c.scalar_type()) == v1::DTYPE_UNSPECIFIED) {
        return InvalidArgumentError("tensor '" + t.first + "' has dtype " +
                                    c10::toString(c.scalar_type()) +
                                    ", which a capsule cannot name");
      }
      d.shape.assign(c.sizes().begin(), c.sizes().end());
      CAPSULE_ASSIGN_OR_RETURN(
          d.sha256, Sha256Hex(std::string_view(static_cast<const char*>(c.data_ptr()),
                                               static_cast<size_t>(c.numel()) * c.element_size())));
      out.push_back(std::move(d));
    }
  } catch (const c10::Error& e) {
    return InternalError(std::string("cannot hash a tensor: ") + e.what_without_backtrace());
  }
  std::sort(out.begin(), out.end(),
            [](const TensorDigestInfo& a, const TensorDigestInfo& b) { return a.name < b.name; });
  return out;
}

std::string FirstDigestDifference(const std::vector<TensorDigestInfo>& expected,
                                  const std::vector<TensorDigestInfo>& actual,
                                  DigestCoverage coverage) {
  auto shape = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
    return out + "]";
  };
  size_t i = 0, j = 0;
  while (i < expected.size() || j < actual.size()) {
    if (j == actual.size() || (i < expected.size() && expected[i].name < actual[j].name)) {
      return "tensor '" + expected[i].name + "' is missing";
    }
    if (i == expected.size() || actual[j].name < expected[i].name) {
      if (coverage == DigestCoverage::kSome) {
        ++j;
        continue;
      }
      return "tensor '" + actual[j].name + "' is not in the recorded checkpoint";
    }
    const TensorDigestInfo& e = expected[i];
    const TensorDigestInfo& a = actual[j];
    if (e.dtype != a.dtype || e.shape != a.shape) {
      return "tensor '" + e.name + "' is " + a.dtype + shape(a.shape) + ", recorded " + e.dtype +
             shape(e.shape);
    }
    if (e.sha256 != a.sha256) {
      return "tensor '" + e.name + "' differs: sha256 " + a.sha256.substr(0, 16) + "…, recorded " +
             e.sha256.substr(0, 16) + "…";
    }
    ++i;
    ++j;
  }
  return "";
}

}  // namespace capsule
