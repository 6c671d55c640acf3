// TinyGpt: a small decoder-only transformer with a reference and an optimized execution path.
//
// It is capsule's sample model: byte-level tokens, learned positional embeddings, pre-LN blocks
// (causal multi-head attention, GELU MLP), a final layer norm, an untied LM head and a mean
// cross-entropy loss, exposed as the layers "embed", "blocks.0".."blocks.{L-1}", "ln_f", "lm_head",
// "loss". The FP32 master parameters are shared by two LayerSequences:
//   REFERENCE  FP64, plain ATen ops; parameters are cast inside Forward, so gradients reach the
//              FP32 masters;
//   OPTIMIZED  FP32 with the hand-written fused kernels of ops.h (layer norm, causal softmax,
//   GELU),
//              and the place where injected faults (faults.h) live.
// On a clean model the two agree to FP32 rounding, layer by layer, forward and backward. With
// TinyGptConfig::lora_rank each block's attention output projection has a low-rank adapter, not
// a parameter, that both paths apply at run time and the decoder can merge (MergeAdapters).
//
//   CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<TinyGpt> model, TinyGpt::Create(TinyGptConfig{}));
//   torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
//   model->SetStep(step);
//   at::Tensor loss = RunSequence(model->Path(PathKind::kOptimized), batch);
//   loss.backward();
//   opt.step();
//
// Thread safety: a TinyGpt and its paths are used from one thread at a time.
#ifndef CAPSULE_SAMPLES_TINY_GPT_TINY_GPT_H_
#define CAPSULE_SAMPLES_TINY_GPT_TINY_GPT_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/decoder.h"
#include "capsule/model/layer_sequence.h"
#include "capsule/model/model.h"
#include "samples/tiny_gpt/faults.h"
#include "samples/tiny_gpt/tiny_gpt_config.h"

namespace capsule::tiny_gpt {

// The name tiny_gpt is registered under in the model registry (ModelSpecInfo::registry_name).
inline constexpr char kRegistryName[] = "tiny_gpt";

class TinyGpt : public Model, public Decodable {
 public:
  // Builds a model with deterministic initial weights drawn from config.seed. kInvalidArgument when
  // the config does not validate.
  static StatusOr<std::unique_ptr<TinyGpt>> Create(const TinyGptConfig& config);

  // Rebuilds the model a Spec() describes, including the runtime fault state it records (current
  // step, whether a transient fault is still armed). Weights are the initial ones: load the
  // captured weights afterwards (LoadParameters).
  static StatusOr<std::unique_ptr<TinyGpt>> FromSpec(const ModelSpecInfo& spec);

  ~TinyGpt() override;
  TinyGpt(const TinyGpt&) = delete;
  TinyGpt& operator=(const TinyGpt&) = delete;

  LayerSequence& Path(PathKind kind) override;
  // The incremental decoder (model/decoder.h): the OPTIMIZED path's FP32 kernels run over a
  // key/value cache, in eval mode. The decode faults (faults.h) live here alone.
  IncrementalDecoder& Decoder() override;
  // In module order: embed.tok, embed.pos (not with rope), blocks.0.ln1.weight, ..., ln_f.bias,
  // lm_head.weight.
  std::vector<NamedTensor> NamedParameters() const override;
  // {"tiny_gpt", config JSON plus "step" and "fault_armed"}.
  ModelSpecInfo Spec() const override;

  // "fused_layer_norm", "fused_softmax", "fused_gelu": the hand-written kernels of ops.h. Off, a
  // switch runs the plain ATen composition (ops.h Reference*) in FP32 instead, and the faults tied
  // to it (faults.h) are gone. All on by default; Spec() records the ones off.
  std::vector<std::string> FeatureSwitches() const override;
  std::vector<std::string> EnabledFeatures() const override;
  Status SetEnabledFeatures(const std::vector<std::string>& enabled) override;
  // Blocks: [batch, T, d_model] with any batch and T in 1..seq_len, the fused softmax's tile
  // along T, magnitudes up to 1e4 (a residual stream far larger than a trained model's).
  // Other layers keep their captured shape.
  std::optional<LayerInputSpec> LayerInputs(size_t i) const override;

  // The FP32 masters in NamedParameters() order, ready for a torch::optim optimizer.
  std::vector<at::Tensor> parameters() const;

  const TinyGptConfig& config() const { return config_; }

  // Injects a fault (validated like TinyGptConfig::fault; kInvalidArgument otherwise). Arms a
  // transient fault.
  Status SetFault(const FaultSpec& fault);
  const FaultSpec& fault() const { return config_.fault; }

  // The trainer's global step; faults switch on by it. Call once per step before running a path.
  void SetStep(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

  // A transient fault fires once, on the first OPTIMIZED execution of its layer at its step, and
  // disarms itself: re-running the step (as capture and replay do) is clean. Tests re-arm it here.
  void RearmTransient() { transient_armed_ = true; }
  bool transient_armed() const { return transient_armed_; }

 private:
  class ReferencePath;
  class OptimizedPath;
  class DecodePath;
  struct Block;

  explicit TinyGpt(const TinyGptConfig& config);

  // Whether the configured fault is on for layer `layer` now. A transient fault is consumed by the
  // call that reports it.
  bool FaultActive(FaultKind kind, int64_t layer);
  bool FaultFires(FaultKind kind, int64_t layer);
  // A fault of the objective (loss-sum), which has no layer: active from its step on.
  bool ObjectiveFaultActive(FaultKind kind) const;
  // The REFERENCE path's cache and attention weights for layer i (IncrementalDecoder).
  std::vector<NamedTensor> ReferenceTrace(size_t i, const TensorList& inputs,
                                          const LayerBatch& batch);
  std::unique_ptr<IncrementalDecoder> MakeDecodePath();
  // Draws every block's adapter from lora_seed (none when lora_rank is 0).
  void InitAdapters();

  TinyGptConfig config_;
  int64_t step_ = 0;
  bool transient_armed_ = true;
  bool fused_layer_norm_ = true;
  bool fused_softmax_ = true;
  bool fused_gelu_ = true;

  at::Tensor tok_embedding_;  // [vocab, d]
  at::Tensor pos_embedding_;  // [seq_len, d]; undefined with rope
  std::vector<Block> blocks_;
  at::Tensor ln_f_weight_, ln_f_bias_;
  at::Tensor lm_head_weight_;  // [vocab, d]

  std::vector<NamedTensor> named_;                      // module order
  std::vector<std::vector<NamedTensor>> layer_params_;  // per LayerSequence index
  std::unique_ptr<ReferencePath> reference_;
  std::unique_ptr<OptimizedPath> optimized_;
  std::unique_ptr<IncrementalDecoder> decoder_;
};

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_TINY_GPT_H_
