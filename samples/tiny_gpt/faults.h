// Injectable faults: the bug classes capsule is meant to diagnose, reproduced in tiny_gpt.
//
// A FaultSpec names a fault kind, the layer it hits (a LayerSequence name such as "blocks.2") and
// the first training step at which it is active. Apart from bad-data, every fault lives in the
// OPTIMIZED path, so the REFERENCE path shows what the layer should have computed. A kernel fault
// lives in one of the optimized path's switches (TinyGpt::FeatureSwitches, named in brackets) and
// is gone with that switch off:
//   nan               the layer's kernel writes NaN into its output, from the step on (in a block:
//                     [fused_gelu])
//   softmax-overflow  the block's attention logits are large (both paths) and the fused softmax
//                     skips the max subtraction, so exp() overflows in FP32 (the reference is
//                     stable) [fused_softmax]
//   tail-block        the block's fused softmax skips the n % 16 tail of rows of n > 16 visible
//                     keys, so the failure needs T >= 17 [fused_softmax]
//   eps               the fused layer norms of the layer use kFaultyLayerNormEps instead of the
//                     config's [fused_layer_norm]
//   gelu-grad         the block's fused GELU backward drops a term of the derivative: the forward
//                     is right, the gradients are not [fused_gelu]
//   bad-data          not a layer fault: one sample of that one step's batch is corrupted
//                     (CorruptBatch)
//   bad-batch         as bad-data, but every sample of the batch is corrupted: no sample stands
//                     out, so replay can only say that the reference path fails too
//   loss-sum          an objective fault, in both paths: the loss is the token sum, not the mean
//   disconnected      a gradient fault, in both paths: the block's MLP branch is detach()ed, so
//                     its parameters get no gradient (the forward is unchanged)
//   labels-unshifted  an objective fault in the data pipeline: from the step on, the labels are
//                     the input ids themselves, not shifted by one (UnshiftLabels)
//   transient         a NaN like `nan`, but only on the first execution of that one step (a
//                     simulated hardware fault: re-running the step does not reproduce it)
// The decode faults live in the incremental decoder (TinyGpt::Decoder) alone, so the training paths
// are clean and only a parity replay (replay/parity.h) sees them; each needs the config option
// whose code it breaks:
//   mask-offset       the block's causal mask ignores the cache: query i of a step sees keys
//                     j <= i instead of j <= past + i, whenever a step has fewer queries than keys
//   rope-decode-position  [rope] in a step after the first, the block rotates q and k by the
//                     position within the step instead of the absolute one
//   rerotated-key     [rope] the cache stores rotated keys, and the block rotates the whole cache
//                     again each time it appends to it
//   gqa-decode-map    [n_kv_heads < n_heads] in steps after the first, query head h reads kv
//                     head h % n_kv_heads instead of h / (n_heads / n_kv_heads)
//   left-pad-positions  [pad_mask] no layer: steps after the first number their tokens from the
//                     cache length, counting the left padding the prompt's position ids skipped
//   dropout-in-eval   [dropout > 0] the block applies its residual dropout in every step after the
//                     first although the decoder runs in eval mode
//   bf16-merge        [lora_rank > 0] the block's adapter is merged into its weight in bfloat16
//                     and stored so (the merged weight rounded) whatever dtype the merge targets
//   merge-twice       [lora_rank > 0] the block's adapter delta is added to its weight twice
//                     when merged
// The trainer's own faults (train_main.cc), from the step on; the model is unchanged by them:
//   pad-in-loss       padded positions keep a label (the pad id) and loss mask 1, so padding is
//                     counted in the loss (the trainer pads its batches with this fault)
//   accum-scale       gradient accumulation divides each micro-batch's token mean by the number
//                     of micro-batches instead of weighing it by its share of the step's tokens
//   frozen-updated    the layer's parameters are frozen (requires_grad false) but left in the
//                     optimizer, whose momentum and weight decay still move them
//   decay-on-norm     AdamW's decay group also holds the layer norms' weights, which the
//                     configuration exempts from weight decay
//   step-on-overflow  the layer's kernel writes NaN at that one step (like `nan`), and the
//                     trainer runs the optimizer step anyway instead of skipping it
//   clip-before-unscale  with a loss scale and clipping, the trainer clips the scaled gradients
//                     (whose norm is the scale times too large) and unscales after, so the step
//                     gets gradients far smaller than the clip threshold allows
//
//   CAPSULE_ASSIGN_OR_RETURN(FaultSpec fault, ParseFaultSpec("tail-block:blocks.2@10"));
//   CAPSULE_RETURN_IF_ERROR(model->SetFault(fault));
//   if (FaultCorruptsBatch(fault, step)) CorruptBatch(batch);
//
// Thread safety: values and pure functions; CorruptBatch mutates only its argument.
#ifndef CAPSULE_SAMPLES_TINY_GPT_FAULTS_H_
#define CAPSULE_SAMPLES_TINY_GPT_FAULTS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "capsule/base/status.h"
#include "capsule/model/layer_sequence.h"

namespace capsule::tiny_gpt {

enum class FaultKind {
  kNone,
  kNan,
  kSoftmaxOverflow,
  kTailBlock,
  kEps,
  kBadData,
  kTransient,
  kLossSum,
  kLabelsUnshifted,
  kBadBatch,
  kDisconnected,
  kPadInLoss,
  kAccumScale,
  kFrozenUpdated,
  kDecayOnNorm,
  kStepOnOverflow,
  kClipBeforeUnscale,
  kGeluGrad,
  kMaskOffset,
  kRopeDecode,
  kRerotatedKey,
  kGqaDecodeMap,
  kLeftPadPositions,
  kDropoutInEval,
  kBf16Merge,
  kMergeTwice
};

// "none", "nan", "softmax-overflow", "tail-block", "eps", "bad-data", "transient", "loss-sum",
// "labels-unshifted", "bad-batch", "disconnected", "pad-in-loss", "accum-scale",
// "frozen-updated", "decay-on-norm", "step-on-overflow", "clip-before-unscale", "gelu-grad",
// "mask-offset", "rope-decode-position", "rerotated-key", "gqa-decode-map", "left-pad-positions",
// "dropout-in-eval", "bf16-merge", "merge-twice".
const char* FaultKindName(FaultKind kind);
StatusOr<FaultKind> ParseFaultKind(std::string_view name);

struct FaultSpec {
  FaultKind kind = FaultKind::kNone;
  std::string layer;      // LayerSequence name; ignored by none and bad-data
  int64_t from_step = 0;  // first active step (transient and bad-data: the only one)

  // "none", "bad-data@7", "tail-block:blocks.2@10": the form ParseFaultSpec reads.
  std::string ToString() const;

  friend bool operator==(const FaultSpec& a, const FaultSpec& b) {
    return a.kind == b.kind && a.layer == b.layer && a.from_step == b.from_step;
  }
};

// Reads "KIND[:LAYER][@STEP]" (STEP defaults to 0). Checks the syntax and that the kind needs a
// layer; whether the layer exists is the model's business (TinyGpt::SetFault).
StatusOr<FaultSpec> ParseFaultSpec(std::string_view text);

// The epsilon an eps fault substitutes: a plausible constant mix-up (1e-1 for 1e-5) whose effect is
// finite but far above FP32 rounding at the layer that has it.
inline constexpr double kFaultyLayerNormEps = 1e-1;

// The factor by which a softmax-overflow fault grows the block's attention logits. It emulates
// attention-logit growth strongly enough that exp() of the raw logits overflows FP32 on any
// ordinary batch, while a max-subtracting softmax handles the same logits without trouble.
inline constexpr double kOverflowLogitGain = 1e4;

// True when `fault` is a bad-data or bad-batch fault for this step.
bool FaultCorruptsBatch(const FaultSpec& fault, int64_t step);

// The sample CorruptBatch corrupts: the first of the batch.
inline constexpr int64_t kCorruptSample = 0;

// Corrupts the labels of sample kCorruptSample the way a tokenizer mismatch does: every label byte
// gets its high bit flipped, producing non-ASCII targets an English byte corpus never contains, so
// a model that has learned the corpus assigns them tiny probability and the loss spikes on both
// paths. Ignored labels (-100) stay ignored. Deterministic given the batch.
// With `every_sample` (bad-batch), all samples are corrupted alike.
void CorruptBatch(LayerBatch& batch, bool every_sample = false);

// True when `fault` is of `kind` and active at `step` (from its step on; step-on-overflow: at
// that step only).
bool TrainerFaultActive(const FaultSpec& fault, FaultKind kind, int64_t step);

// True when `fault` is a labels-unshifted fault active at this step.
bool FaultUnshiftsLabels(const FaultSpec& fault, int64_t step);
// Replaces the labels by the input ids (the shift by one forgotten); -100 stays -100.
void UnshiftLabels(LayerBatch& batch);

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_FAULTS_H_
