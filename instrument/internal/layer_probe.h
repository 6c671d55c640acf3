// The instrumented re-run of one step: runs a LayerSequence layer by layer and records each
// layer's inputs and output, forward health statistics at every layer boundary, the gradient of
// the loss with respect to every layer output (backward statistics), parameter-gradient norms, and
// the first anomalous layer.
//
// Gradients are computed with torch::autograd::grad, so no parameter's .grad is touched: probing a
// step does not disturb the trainer. The caller restores RNG state around it when it must (the
// Monitor does).
//
//   CAPSULE_ASSIGN_OR_RETURN(capsule::ProbeResult r, capsule::ProbeStep(seq, batch, {}));
//   if (r.first_anomalous >= 0) std::cout << r.layers[r.first_anomalous].name << "\n";
//
// Thread safety: one probe per LayerSequence at a time.
#ifndef CAPSULE_INSTRUMENT_INTERNAL_LAYER_PROBE_H_
#define CAPSULE_INSTRUMENT_INTERNAL_LAYER_PROBE_H_

#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/instrument/health_stats.h"
#include "capsule/instrument/trigger_rule.h"
#include "capsule/model/layer_sequence.h"

namespace capsule {

struct LayerRecord {
  int index = 0;
  std::string name;
  TensorList inputs;    // as fed to the layer (the previous layer's outputs)
  at::Tensor output;    // the layer's first output
  HealthStats forward;  // of `output`
  bool has_backward = false;
  at::Tensor grad;  // d loss / d output (undefined when output does not require grad)
  HealthStats backward;
};

enum class AnomalyPhase { kNone, kForward, kBackward };

// The gradient of one parameter that requires grad, from the probe's backward.
struct ParameterGrad {
  std::string name;   // "blocks.3.mlp.fc1.weight"
  std::string layer;  // the layer that owns it
  at::Tensor grad;    // undefined when the loss does not depend on the parameter
};

// A tensor seen inside a layer (LayerSequence::TakeObserved), with its statistics.
struct ObservedRecord {
  std::string name;
  bool backward = false;
  at::Tensor value;
  HealthStats stats;
};

struct ProbeResult {
  std::vector<LayerRecord> layers;  // in execution order; fewer than seq.size() if a layer threw
  std::vector<ParameterGrad>
      parameter_grads;  // after a backward: every parameter that requires grad
  at::Tensor loss;
  double loss_value = 0;
  double grad_norm = 0;  // L2 norm over all parameter gradients (NaN if any is non-finite)
  bool backward_done = false;
  // The first layer whose forward output is non-finite; failing that, the layer whose backward
  // produced the first non-finite gradient (gradients arrive from the last layer down).
  int first_anomalous = -1;
  AnomalyPhase anomaly_phase = AnomalyPhase::kNone;
  std::string anomaly_reason;
  std::string error;  // what a throwing layer said; layers stops there
  // What the sequence saw inside its layers, in order (empty for sequences that do not observe).
  std::vector<ObservedRecord> observed;
};

struct ProbeOptions {
  bool backward = true;
};

// kInternal only for failures outside the model (statistics); an exception thrown by a layer is
// reported in ProbeResult::error with the layers that ran before it.
StatusOr<ProbeResult> ProbeStep(LayerSequence& seq, const LayerBatch& batch,
                                const ProbeOptions& options);

// What the trigger rule (instrument/trigger_rule.h) looks at in a probed step.
RerunOutcome RerunOutcomeOf(const ProbeResult& r);

}  // namespace capsule

#endif  // CAPSULE_INSTRUMENT_INTERNAL_LAYER_PROBE_H_
