#include "capsule/probe/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>

#include <algorithm>
#include <utility>

#include "capsule/base/file_util.h"
#include "capsule/base/sha256.h"
#include "capsule/format/dtype.h"
#include "capsule/probe/tensor_codec.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

constexpr uint64_t kMaxCheckpointBytes = uint64_t{1} << 40;

Status NotTensors(const std::string& path, const std::string& why) {
  return InvalidArgumentError("checkpoint " + path +
                              " is neither a state dict saved by torch.save nor a torch::save "
                              "archive of named tensors (" +
                              why + ")");
}

// A state dict: a dict of str -> Tensor (Python's OrderedDict unpickles as one).
StatusOr<std::vector<NamedTensor>> FromPickle(const std::string& path, const std::string& bytes) {
  c10::IValue value;
  try {
    value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    // LibTorch's unpickler reads collections.OrderedDict, what model.state_dict() returns, as
    // None, and then cannot fill it.
    if (what.find("Expected GenericDict but got None") != std::string::npos) {
      return NotTensors(path,
                        "a Python OrderedDict, which LibTorch's unpickler cannot read: save the "
                        "state dict as a plain dict, torch.save(dict(model.state_dict()), path)");
    }
    return NotTensors(path, what);
  }
  if (!value.isGenericDict()) return NotTensors(path, "the pickle holds no dict");
  std::vector<NamedTensor> out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return NotTensors(path, "an entry is not a string key with a tensor");
    }
    out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  return out;
}

void ReadArchive(torch::serialize::InputArchive& archive, const std::string& prefix,
                 std::vector<NamedTensor>& out) {
  for (const std::string& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t)) {
      out.emplace_back(prefix + key, t);
      continue;
    }
    torch::serialize::InputArchive sub;
    if (archive.try_read(key, sub)) ReadArchive(sub, prefix + key + ".", out);
  }
}

}  // namespace

StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path) {
  CAPSULE_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path, kMaxCheckpointBytes));
  LoadedCheckpoint ckpt;
  ckpt.size_bytes = static_cast<int64_t>(bytes.size());
  ckpt.file_sha256 = Sha256Hex(bytes);
  StatusOr<std::vector<NamedTensor>> pickled = FromPickle(path, bytes);
  if (pickled.ok()) {
    ckpt.tensors = std::move(*pickled);
    ckpt.format = "torch_pickle";
  } else {
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      ReadArchive(archive, "", ckpt.tensors);
    } catch (const c10::Error& e) {
      return pickled.status();  // the pickle's reason: the common format
    }
    ckpt.format = "torch_archive";
  }
  if (ckpt.tensors.empty()) return NotTensors(path, "it holds no tensor");
  return ckpt;
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
      d.sha256 = Sha256Hex(std::string_view(static_cast<const char*>(c.data_ptr()),
                                            static_cast<size_t>(c.numel()) * c.element_size()));
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
                                  const std::vector<TensorDigestInfo>& actual) {
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
