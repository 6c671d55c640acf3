// The data and objective stages on a classifier's batch: one integer class per sample (labels
// [batch]), logits [batch, classes], inputs of any kind (images, features, token ids). triage.cc
// runs them in place of the language-model checks when IsClassificationBatch says so.
// - data: non-finite inputs (by sample), targets outside [0, classes) that are not the ignore
//   index, a batch with no target; targets that are all one class, a note.
// - objective: a hand-written FP64 cross-entropy (the declared label smoothing and ignore index,
//   a mean over the samples with a target, or their sum when the trainer declares TOKEN_SUM)
//   against the model's loss and against the loss the trainer reported for the step. When one
//   differs, the variant that does match is named: a sum, the other label smoothing, ignored
//   samples counted in the mean.
//
// Thread safety: pure functions.
#ifndef CAPSULE_REPLAY_INTERNAL_CLASSIFICATION_STAGE_H_
#define CAPSULE_REPLAY_INTERNAL_CLASSIFICATION_STAGE_H_

#include "capsule/replay/internal/triage.h"

namespace capsule::internal {

// Declared (Objective.kind CLASSIFICATION), or undeclared with integer labels [batch] and logits
// [batch, classes].
bool IsClassificationBatch(const TriageInput& in);

v1::StageReport RunClassificationDataStage(const TriageInput& in);
v1::StageReport RunClassificationObjectiveStage(const TriageInput& in);

// The trainer's own loss (computed in its precision, on the step in its own mode) against the
// FP64 cross-entropy of the reference path's logits: clean FP32 resnet18 steps stay within 1.4e-6,
// ViT steps within 5.4e-8 (README, "Triage").
inline constexpr double kClassificationTrainerLossRelTol = 1e-4;

// At most this many per-sample findings of one check; the last says how many there are in all.
inline constexpr int kMaxSampleFindings = 8;

}  // namespace capsule::internal

#endif  // CAPSULE_REPLAY_INTERNAL_CLASSIFICATION_STAGE_H_
