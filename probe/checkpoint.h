// Checkpoints: the files of named tensors a LibTorch or PyTorch user already has, read and written
// so that a capsule can name one instead of embedding every weight (WeightsReference).
//
// Two formats are read: the pickle archive Python's torch.save writes for a state dict saved as a
// plain dict (torch.save(dict(model.state_dict()), path); LibTorch's unpickler reads the
// OrderedDict that model.state_dict() returns as None, and the error says so), and
// torch::pickle_save of a c10::Dict<std::string, at::Tensor>, read through LibTorch's unpickler;
// and the archive torch::serialize::OutputArchive (torch::save of a module or of named tensors)
// writes, whose nested modules become dotted names. SaveCheckpoint writes the first, which both
// Python's torch.load and this reader open.
//
//   CAPSULE_ASSIGN_OR_RETURN(LoadedCheckpoint ckpt, LoadCheckpoint("model.pt"));
//   CAPSULE_ASSIGN_OR_RETURN(auto digests, TensorDigests(ckpt.tensors));
//
// Thread safety: reentrant; tensors must not be written while they are hashed or saved.
#ifndef CAPSULE_PROBE_CHECKPOINT_H_
#define CAPSULE_PROBE_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/layer_sequence.h"

namespace capsule {

struct LoadedCheckpoint {
  std::vector<NamedTensor> tensors;  // in the file's order
  std::string format;                // "torch_pickle" or "torch_archive"
  int64_t size_bytes = 0;
  std::string file_sha256;
};

// kNotFound / kPermissionDenied for the file; kInvalidArgument naming the file when it is neither
// format or holds something other than named tensors.
StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path);

// Writes `tensors` as a state-dict pickle archive, atomically (a temporary file renamed).
Status SaveCheckpoint(const std::string& path, const std::vector<NamedTensor>& tensors);

// One tensor as the canonical model hash sees it (probe/hashing.h).
struct TensorDigestInfo {
  std::string name;
  std::string dtype;  // as capsule.v1.DType names it: "float32", "bfloat16", ... (format/dtype.h)
  std::vector<int64_t> shape;
  std::string sha256;  // of the contiguous little-endian bytes
};

// Every tensor's digest, sorted by name. kInvalidArgument for a tensor whose dtype capsule.v1.DType
// does not name (a complex tensor).
StatusOr<std::vector<TensorDigestInfo>> TensorDigests(const std::vector<NamedTensor>& tensors);

// The first difference between two name-sorted digest lists, as a sentence naming the tensor
// ("tensor 'blocks.2.mlp.fc1.weight' differs: sha256 1a2b... expected 3c4d..."); empty when they
// are equal.
std::string FirstDigestDifference(const std::vector<TensorDigestInfo>& expected,
                                  const std::vector<TensorDigestInfo>& actual);

}  // namespace capsule

#endif  // CAPSULE_PROBE_CHECKPOINT_H_
