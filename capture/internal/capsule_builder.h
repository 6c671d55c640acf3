// Capsule builder: turns what the Monitor knows about a failing step — its snapshot, the capture
// re-run's probe result, what fired, the scalar history, the log ring, the identity and the model
// — into the capsule.v1.Capsule message. It reads the model's parameters and the environment and
// changes nothing: no file, no RNG, no thread count, no Monitor state. Loading the key and writing
// the file are capture_writer.h; re-running the step is the Monitor's, under a RerunGuard.
//
//   internal::CaptureContext context;
//   context.fired = {TriggerKind::kNonFiniteLoss, NAN, 0, "loss is not finite"};
//   context.model = &model;
//   CAPSULE_ASSIGN_OR_RETURN(internal::BuiltCapsule built,
//                            internal::BuildCapsule(snapshot, &probe_result, context, options));
//
// Thread safety: reentrant; the model must not change while it runs.
#ifndef CAPSULE_CAPTURE_INTERNAL_CAPSULE_BUILDER_H_
#define CAPSULE_CAPTURE_INTERNAL_CAPSULE_BUILDER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/capture/internal/step_snapshot.h"
#include "capsule/capture/monitor.h"
#include "capsule/format/validate.h"
#include "capsule/instrument/internal/layer_probe.h"
#include "capsule/instrument/trigger_rule.h"
#include "capsule/model/model.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::internal {

// What fired: capsule.v1.Trigger's kind, observed, threshold and rule.
struct FiredTrigger {
  TriggerKind kind = TriggerKind::kNone;
  double observed = 0;
  double threshold = 0;
  std::string rule;
};

// Everything a capsule records besides the step snapshot and the re-run.
struct CaptureContext {
  FiredTrigger fired;
  std::string message;          // the exception's text or the manual reason
  int64_t now_unix_micros = 0;  // the capsule's creation and the trigger's wall time
  std::vector<std::pair<int64_t, StepScalars>> history;  // (step, scalars), oldest first
  std::vector<std::string> log_lines;                    // the log ring, oldest first
  v1::Identity identity;                                 // from SetIdentity
  Model* model = nullptr;                // not owned; null: no model, weights or per-layer sections
  PathKind path = PathKind::kOptimized;  // the path the trainer runs (and the re-run ran)
  std::vector<RunEvent> events;          // Monitor::AddEvent, oldest first
  std::optional<GenerationInfo> generation;  // Monitor::SetGeneration
};

struct BuiltCapsule {
  v1::Capsule capsule;
  // The parameters' bytes, left where they are: tensor_data[i], when set, is capsule.tensors(i)'s
  // data (its field is empty), and `held` keeps those tensors alive. WriteCapsuleFile takes them as
  // WriteOptions::tensor_data, so a capture never holds a second copy of the weights. Valid while
  // the parameters are not updated: OwnTensorBytes before the optimizer step moves them.
  TensorDataViews tensor_data;
  std::vector<at::Tensor> held;
  // Lines the builder appended to capsule.log (the weight cap's fallback to the anomalous layer),
  // for the Monitor's own log ring.
  std::vector<std::string> notes;
};

// Fills every section of the capsule. `rerun` is the capture re-run of the step on
// `context.model`'s `context.path` (null: no re-run, so no per-layer statistics, no first
// anomalous layer and no Trigger.capture_rerun); whether it fired the trigger again is decided by
// TriggerFiresAgain (instrument/trigger_rule.h). Weights follow options.weight_policy, kAll falling
// back to kAnomalousLayer above options.max_weight_bytes. The codes of TensorToBlob and
// CanonicalModelHash (kInvalidArgument for a tensor the format cannot hold).
// Copies the held tensor bytes into the message and lets the tensors go: for a capsule written
// after the trainer moves on (after the optimizer step, or on the background writer).
void OwnTensorBytes(BuiltCapsule* built);

StatusOr<BuiltCapsule> BuildCapsule(const StepSnapshot& snapshot, const ProbeResult* rerun,
                                    const CaptureContext& context, const MonitorOptions& options);

}  // namespace capsule::internal

#endif  // CAPSULE_CAPTURE_INTERNAL_CAPSULE_BUILDER_H_
