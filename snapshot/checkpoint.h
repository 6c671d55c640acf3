// Checkpoints: the files of named tensors a LibTorch or PyTorch user already has, read and written
// so that a capsule can name one instead of embedding every weight (WeightsReference).
//
// Read as data only (checkpoint/checkpoint_index.h): a state dict saved by Python's torch.save
// (model.state_dict() itself, an OrderedDict, or a plain dict), torch::pickle_save of a
// c10::Dict<std::string, at::Tensor>, and a TorchScript module archive (torch.jit.save,
// torch::serialize::OutputArchive), whose attributes are read from its data.pkl, nested modules
// as dotted names, and whose code never runs. The file is hashed before it is parsed, and refused
// before any parse when it is not the file the caller expects. SaveCheckpoint writes a dict that
// both Python's torch.load and this reader open.
//
//   CAPSULE_ASSIGN_OR_RETURN(LoadedCheckpoint ckpt, LoadCheckpoint("model.pt"));
//   CAPSULE_ASSIGN_OR_RETURN(auto digests, TensorDigests(ckpt.tensors));
//
// Thread safety: reentrant; tensors must not be written while they are hashed or saved.
#ifndef CAPSULE_SNAPSHOT_CHECKPOINT_H_
#define CAPSULE_SNAPSHOT_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/layer_sequence.h"

namespace capsule {

struct LoadedCheckpoint {
  std::vector<NamedTensor> tensors;  // in the file's order; views of one storage share it
  std::string format;                // "torch_pickle" or "torch_archive"
  int64_t size_bytes = 0;
  std::string file_sha256;
};

// The file a caller expects, checked before a byte of it is parsed (a capsule's
// WeightsReference). Unset fields are not checked.
struct CheckpointExpectation {
  int64_t size_bytes = -1;
  std::string file_sha256;  // 64 lowercase hex
};

// Hashes the file (streamed, never held whole), compares it with `expected`, then reads its index
// and each storage straight into its tensor's memory: peak memory is the tensors, not the file.
// kNotFound / kPermissionDenied for the file; kFailedPrecondition when its size or SHA-256 is not
// the expected one (nothing parsed); kResourceExhausted over the size limit (1 TiB) or when the
// tensors cannot be allocated; and the codes of ReadCheckpointIndex (kInvalidArgument for what is
// not a state dict or a module archive, naming the opcode or global, ...), each message naming
// the file.
StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path,
                                          const CheckpointExpectation& expected = {});

// Writes `tensors` as a state-dict pickle archive, atomically (a temporary file renamed).
Status SaveCheckpoint(const std::string& path, const std::vector<NamedTensor>& tensors);

// One tensor as the canonical model hash sees it (snapshot/hashing.h).
struct TensorDigestInfo {
  std::string name;
  std::string dtype;  // as capsule.v1.DType names it: "float32", "bfloat16", ... (format/dtype.h)
  std::vector<int64_t> shape;
  std::string sha256;  // of the contiguous little-endian bytes
};

// Every tensor's digest, sorted by name. kInvalidArgument for a tensor whose dtype capsule.v1.DType
// does not name (a complex tensor).
StatusOr<std::vector<TensorDigestInfo>> TensorDigests(const std::vector<NamedTensor>& tensors);

// Whether a recorded digest list names every tensor (a checkpoint's) or only some (the ones a
// capsule embeds): then tensors it does not name are not differences.
enum class DigestCoverage { kAll, kSome };

// The first difference between two name-sorted digest lists, as a sentence naming the tensor
// ("tensor 'blocks.2.mlp.fc1.weight' differs: sha256 1a2b..., recorded 3c4d..."); empty when they
// agree.
std::string FirstDigestDifference(const std::vector<TensorDigestInfo>& expected,
                                  const std::vector<TensorDigestInfo>& actual,
                                  DigestCoverage coverage = DigestCoverage::kAll);

}  // namespace capsule

#endif  // CAPSULE_SNAPSHOT_CHECKPOINT_H_
