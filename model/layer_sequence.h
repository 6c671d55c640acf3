// LayerSequence: how a model is described to capsule.
//
// LibTorch's C++ nn::Module has no forward hooks, so a model that wants per-layer capture,
// layerwise replay and bisection describes one execution path as an explicit sequence of layers.
// The contract replay relies on:
// - Layer i consumes the outputs of layer i-1; layer 0 consumes {batch.ModelInput()} (the
//   model's `inputs`, or its `input_ids`). Side inputs every layer may need (labels, masks) come
//   in the LayerBatch.
// - The last layer returns {loss}, a scalar. The layer before it, when its first output is not a
//   scalar, is treated as the logits (top-1 agreement), and these two are what the bisect oracle
//   compares between composite runs.
// - Both paths of a Model have the same layer names, in the same order, over the same parameters;
//   anything else that changes what a path computes is part of Model::Spec().
// Names are module paths: "embed", "blocks.3", "ln_f", "lm_head", "loss".
//
//   capsule::LayerBatch batch{input_ids, {}, labels};
//   capsule::TensorList x = {batch.ModelInput()};
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

// The batch-level inputs of one step, shared by every layer. Layer 0 receives {ModelInput()}:
// `inputs` when the model takes something other than token ids (float features, images), else
// `input_ids`. Every layer may read the rest (labels, masks) from the batch; the last layer
// returns the scalar loss.
struct LayerBatch {
  at::Tensor input_ids;        // int64 [batch, seq]: a language model's tokens
  at::Tensor inputs;           // any dtype and shape: the input of a model without tokens
  at::Tensor labels;           // targets: int64 [batch, seq] per position for a language model
                               // (see labels_shifted), any dtype and shape otherwise
  at::Tensor attention_mask;   // optional: [batch, seq] 0/1
  at::Tensor loss_mask;        // optional: [batch, seq] 0/1
  at::Tensor response_mask;    // optional: [batch, seq] 0/1, aligned like loss_mask: 1 on a
                               // response token, 0 on a prompt token the loss should leave out
  bool labels_shifted = true;  // labels[i] is the target of position i
  bool training = true;        // dropout and friends on

  // What layer 0 receives: `inputs` if set, else `input_ids`.
  const at::Tensor& ModelInput() const { return inputs.defined() ? inputs : input_ids; }
};

// A tensor a sequence saw inside one of its layers (a Python model's module hooks), named by the
// module path that produced it: a forward output, or the gradient of one (`backward`).
struct ObservedTensor {
  std::string name;
  bool backward = false;
  at::Tensor value;
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

  // What the sequence saw inside its layers since the last call, in the order it appeared (a
  // model observed through hooks rather than described stage by stage). Capture records their
  // statistics beside the layers'. Default: nothing.
  virtual std::vector<ObservedTensor> TakeObserved() { return {}; }
};

// What layer 0 of `seq` receives: {batch.ModelInput()}, as a float64 copy when the path computes
// in float64 and the input is floating (images, features): the reference path computes from the
// trainer's own values in FP64, while an optimized path gets exactly what the trainer fed it.
TensorList FirstLayerInput(const LayerSequence& seq, const LayerBatch& batch);

// Copies of the floating tensors of `xs`, to hand a layer that may change its input in place (a
// Python stage's nn.ReLU(inplace=True)): the caller's tensors (a recorded output, a leaf it takes
// gradients against, the batch) keep their values, and gradients flow through the copies.
TensorList PrivateCopy(const TensorList& xs);

// Runs every layer of `seq` on `batch` (from FirstLayerInput) and returns the loss.
at::Tensor RunSequence(LayerSequence& seq, const LayerBatch& batch);

}  // namespace capsule

#endif  // CAPSULE_MODEL_LAYER_SEQUENCE_H_
