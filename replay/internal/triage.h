// The triage stages before the numerics: data and objective (replay_report.proto, Stage). Both
// read the batch and the FP64 reference path's logits and loss, so they judge what the model was
// given and what its loss computed, independently of the optimized path:
// - data: each sample's mean token loss in FP64; a sample the model finds no better than random
//   on most of its tokens, while the rest of the batch has been learned, is bad data (named by
//   index, sample id and dataset index); labels outside the vocabulary are bad data too, and so
//   is a sample with no target under a declared per-sequence mean (a token mean gives it no
//   weight: a note). A sample with a high but consistent loss is a hard sample (a note).
// - objective: the labels against the inputs at every small offset (a shift other than the
//   declared one), targets predicted from padding or on prompt tokens, and a hand-written FP64
//   token-mean cross-entropy against the model's loss. When they differ, the variant that does
//   match is named: a token sum, a per-sequence mean, the other label alignment, or a denominator
//   that counts masked positions. An accumulated step's trainer loss must be the declared one.
// - gradients: from the reference path's backward, parameters that require grad and get none;
//   parameters declared frozen that the capsule shows trained.
// Each check is its own function in triage.cc; it states facts, and findings.cc words them.
// Thresholds and the margins clean runs keep from them: README, "Triage".
//
// Thread safety: pure functions.
#ifndef CAPSULE_REPLAY_INTERNAL_TRIAGE_H_
#define CAPSULE_REPLAY_INTERNAL_TRIAGE_H_

#include <ATen/ATen.h>

#include <limits>
#include <vector>

#include "capsule/instrument/internal/layer_probe.h"
#include "capsule/model/layer_sequence.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/findings.h"

namespace capsule::internal {

struct TriageInput {
  const v1::Capsule* capsule = nullptr;  // sample ids and the cursor; may be null
  const LayerBatch* batch = nullptr;
  at::Tensor logits;  // the reference path's logits [B, T, V]; undefined when it has none
  // The same in the step's own mode (training: dropout, BatchNorm's batch statistics), the mode
  // the trainer's loss was computed in; undefined when it has none.
  at::Tensor step_logits;
  double model_loss = 0;  // the reference path's loss on the same batch
  // The trainer's path's loss on the same batch, in its own precision; NaN: not run.
  double optimized_loss = std::numeric_limits<double>::quiet_NaN();
  // The reference path's parameter gradients (its backward in training mode); null: none ran.
  const std::vector<ParameterGrad>* parameter_grads = nullptr;
};

// Starts `r` as a report of `stage`: it runs when `unsupported` (why the batch cannot be judged)
// is empty, and is skipped with that reason otherwise. Returns whether it runs.
bool StartStage(v1::Stage stage, const std::string& unsupported, v1::StageReport* r);

// Names sample `b` in `f`: its index, and the trainer's sample id and dataset index when the
// capsule records them.
void NameSample(const TriageInput& in, int64_t b, v1::Finding& f);

// A bad sample: at least this fraction of its target tokens have a loss of log V or more ...
inline constexpr double kBadSampleUniformFraction = 0.5;
// ... its mean token loss is at least this many nats above the median of the other samples ...
inline constexpr double kBadSampleExcessNats = 1.0;
// ... and those others have learned something: their median is at most this fraction of log V.
inline constexpr double kLearnedFractionOfLogV = 0.75;
// The model's loss and the hand-written cross-entropy agree within this relative error (both are
// FP64 over the same logits: clean runs differ by about 1e-15).
inline constexpr double kLossMatchRelTol = 1e-6;

// The trainer's own loss of an accumulated step (computed in its precision: FP32 here; clean
// tiny_gpt runs stay within 1e-7, README "Triage")
// against the declared reduction over every micro-batch. A mismatch fails the objective stage.
inline constexpr double kTrainerLossRelTol = 1e-5;
// ... or, when larger, this many times the relative distance between the trainer's path's loss
// and the FP64 reference's on the same batch (a model in a lower precision than FP32).
inline constexpr double kTrainerLossPrecisionFactor = 10;

// Labels that equal the inputs at an offset other than the declared one (labels[i] = input[i+1]
// declared shifted, input[i] unshifted) at this fraction of the targets in the loss, and more
// often than at the declared offset, are shifted by that offset (clean text: a few percent at
// any other). Offsets within kMaxLabelShift of the declared one are tried.
inline constexpr double kLabelsEqualInputsFraction = 0.5;
inline constexpr int64_t kMaxLabelShift = 4;

v1::StageReport RunDataStage(const TriageInput& in);
v1::StageReport RunObjectiveStage(const TriageInput& in);
// Parameters that require grad but get none, or an exactly-zero one (the loss does not reach
// them: a stray detach(), a branch left out of the graph), by layer; per-layer norms ranked.
v1::StageReport RunGradientsStage(const TriageInput& in);

// The optimizer step the capsule recorded (capsule.v1.OptimizerStep), redone with a hand-written
// FP64 Adam/AdamW from the recorded state and compared with what the trainer's step did: a step
// on non-finite gradients, frozen parameters that moved, weight decay on parameters the
// configuration exempts, an lr other than the schedule's, gradients above the clip threshold, and
// an update that is not the declared optimizer's (optimizer_stage.cc). `reference_grad_norm`
// is the FP64 reference backward's global gradient norm (NaN when none ran): against it, the norm
// the trainer's clip saw tells whether it clipped before unscaling.
v1::StageReport RunOptimizerStage(const v1::Capsule& c, double reference_grad_norm);

// The clip saw the scaled norm when it is within this relative distance of scale x the reference
// norm (and the unscaled one when within it of the reference norm).
inline constexpr double kClipNormRelTol = 1e-2;

// Element bounds of the optimizer comparison: the trainer's parameter after the step may differ
// from the FP64 one by kOptimizerUlps FP32 units in the last place of the parameter, plus this
// fraction of the update; each moment by this fraction of its terms.
inline constexpr double kOptimizerParamUlps = 4;
inline constexpr double kOptimizerUpdateRelTol = 1e-3;
inline constexpr double kOptimizerMomentRelTol = 1e-5;

}  // namespace capsule::internal

#endif  // CAPSULE_REPLAY_INTERNAL_TRIAGE_H_
