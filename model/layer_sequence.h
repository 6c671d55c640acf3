// LayerSequence: how a model is described to capsule.
//
// LibTorch's C++ nn::Module has no forward hooks, so a model that wants per-layer capture,
// layerwise replay and bisection describes one execution path as an explicit sequence of layers.
// Layer i consumes the outputs of layer i-1 (layer 0 consumes {batch.input_ids}); the last layer
// returns {loss} (a scalar). Side inputs every layer may need (labels, masks) come in the
// LayerBatch. Names are module paths: "embed", "blocks.3", "ln_f", "lm_head", "loss".
//
//   capsule::LayerBatch batch{input_ids, labels};
//   capsule::TensorList x = {batch.input_ids};
//   for (size_t i = 0; i < seq.size(); ++i) x = seq.Forward(i, x, batch);
//   at::Tensor loss = x[0];
//
// Thread safety: a LayerSequence is used from one thread at a time.
#ifndef CAPSULE_MODEL_LAYER_SEQUENCE_H_
#define CAPSULE_MODEL_LAYER_SEQUENCE_H_

#include <ATen/Tensor.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace capsule {

using TensorList = std::vector<at::Tensor>;
using NamedTensor = std::pair<std::string, at::Tensor>;

// Which of a model's execution paths: REFERENCE is FP64 with plain ATen ops, OPTIMIZED is what the
// trainer runs in production (fused kernels, FP32/BF16, custom loops). Values match
// capsule.v1.ExecutionPath.
enum class PathKind { kReference = 1, kOptimized = 2 };

const char* PathKindName(PathKind kind);  // "reference" / "optimized"

// The batch-level inputs of one step, shared by every layer.
struct LayerBatch {
  at::Tensor input_ids;        // int64 [batch, seq]
  at::Tensor labels;           // int64 [batch, seq]; targets per position (see labels_shifted)
  at::Tensor attention_mask;   // optional: [batch, seq] 0/1
  at::Tensor loss_mask;        // optional: [batch, seq] 0/1
  bool labels_shifted = true;  // labels[i] is the target of position i
  bool training = true;        // dropout and friends on
};

class LayerSequence {
 public:
  virtual ~LayerSequence() = default;

  virtual size_t size() const = 0;
  virtual std::string name(size_t i) const = 0;

  // Runs layer i. May throw c10::Error (callers at a library boundary catch and convert).
  virtual TensorList Forward(size_t i, const TensorList& inputs, const LayerBatch& batch) = 0;

  // The parameters layer i owns, with full module-path names ("blocks.3.attn.qkv.weight").
  // These are the trainer's tensors (not copies).
  virtual std::vector<NamedTensor> LayerParameters(size_t i) const = 0;

  // The floating dtype this path computes in (kDouble for REFERENCE, kFloat for most OPTIMIZED).
  virtual at::ScalarType compute_dtype() const = 0;
};

// Runs every layer of `seq` on `batch` and returns the loss.
at::Tensor RunSequence(LayerSequence& seq, const LayerBatch& batch);

}  // namespace capsule

#endif  // CAPSULE_MODEL_LAYER_SEQUENCE_H_
