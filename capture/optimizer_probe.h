// OptimizerProbe: records the trainer's optimizer step in the capsule of a step that triggered,
// so that replay's optimizer stage can redo it with a hand-written FP64 AdamW and compare: the
// hyper-parameters of every parameter group (the lr actually used), which parameters are frozen or
// outside the optimizer, which the configuration exempts from weight decay, each parameter's
// gradient as the optimizer got it (after unscaling and clipping), its moments and step count
// before, and the parameter and moments after the trainer's own step().
//
// The trainer calls it around its step. On a step without a capture it costs one branch: nothing
// is copied unless the Monitor has a capsule waiting (EndStep or CaptureNow fired this step).
//
//   capsule::OptimizerProbe probe(monitor, optimizer, model.NamedParameters(), probe_options);
//   ...
//   monitor.EndStep(scalars);              // a trigger builds the capsule, which now waits
//   ... unscale, finite check, clip ...
//   probe.BeforeStep({.clip_max_norm = 1.0, .found_inf = !finite});
//   if (finite) optimizer.step();
//   capsule::StepReport written = probe.AfterStep();   // the capsule, with the step in it
//
// torch::optim::AdamW and torch::optim::Adam are recorded in full; any other optimizer is recorded
// as OTHER_OPTIMIZER (groups' learning rates and the parameters after the step), which replay
// does not redo. An optimizer the probe cannot see as a torch::optim::Optimizer (Python's
// torch.optim, through the Python package's Monitor.attach_optimizer) is read through an
// OptimizerReader that gives the same facts. State tensors are recorded while parameters, gradients
// and moments before and after fit in `max_state_bytes` (about 7 times the model's parameter
// bytes); above it only the scalars and norms are.
//
// Thread safety: used from the training thread only, like the Monitor it is attached to. The
// probe must not outlive the Monitor; it detaches itself when destroyed.
#ifndef CAPSULE_CAPTURE_OPTIMIZER_PROBE_H_
#define CAPSULE_CAPTURE_OPTIMIZER_PROBE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capsule/capture/monitor.h"
#include "capsule/model/layer_sequence.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace capsule {

struct OptimizerProbeOptions {
  // The trainer's weight-decay exclusion rule, as its configuration states it (for example "no
  // decay on biases and norm weights": parameters with fewer than two dimensions). Replay checks
  // that exempt parameters sit in groups without weight decay. Unset: nothing is declared exempt
  // and that check is skipped.
  std::function<bool(const std::string& name, const at::Tensor& param)> decay_exempt;
  // Tensors (gradients, moments, parameters after the step) are recorded while their bytes stay
  // within this; models under ~9 M FP32 parameters by default.
  uint64_t max_state_bytes = uint64_t{256} << 20;
};

// One parameter group's hyper-parameters at the step (capsule.v1.ParamGroup).
struct OptimizerGroupState {
  double lr = 0;
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;  // Adam and AdamW only
  bool amsgrad = false;
  bool maximize = false;
};

// One parameter's place in the optimizer and its Adam state.
struct OptimizerParamState {
  int group = -1;                  // index in OptimizerState::groups; -1: not in the optimizer
  int64_t step = 0;                // the optimizer's step count for it (0: no state yet)
  at::Tensor exp_avg, exp_avg_sq;  // the optimizer's own tensors; undefined: no state yet
};

// The optimizer as the probe reads it, before and after the step.
struct OptimizerState {
  enum class Kind { kOther, kAdamW, kAdam };
  Kind kind = Kind::kOther;     // kOther: groups' learning rates only, not redone by replay
  std::string optimizer_class;  // as the trainer's language names it: "torch.optim.AdamW"
  // Why the optimizer is not recorded in full ("" when it is); a capture note of the capsule.
  std::string not_captured;
  std::vector<OptimizerGroupState> groups;
  std::map<std::string, OptimizerParamState> params;  // by the parameter's name in `named`
};

// Reads the optimizer's state for the named parameters. May throw: the probe then records that
// the step was not recorded, and the trainer goes on.
using OptimizerReader = std::function<OptimizerState(const std::vector<NamedTensor>& named)>;

// What the trainer did between EndStep and step(), as it declares it.
struct OptimizerStepInfo {
  double clip_max_norm = 0;                     // 0: no clipping
  std::optional<double> grad_norm_before_clip;  // the norm the clip saw
  double loss_scale = 0;                        // gradient scaler's scale; 0 or 1: none
  bool found_inf = false;                       // the trainer's own finite check fired
  // The order of its steps, e.g. {"unscale", "finite_check", "clip", "step"}.
  std::vector<std::string> order;
  // Per parameter group: the lr the schedule gives for this step, when the trainer has one.
  std::vector<std::optional<double>> scheduled_lr;
};

class OptimizerProbe {
 public:
  // `named`: the model's parameters with their module-path names (Model::NamedParameters()); the
  // optimizer's tensors are matched to them by identity. Neither reference is owned; both must
  // outlive the probe. Attaches the probe to `monitor` (one probe per Monitor).
  OptimizerProbe(Monitor& monitor, torch::optim::Optimizer& optimizer,
                 std::vector<NamedTensor> named, OptimizerProbeOptions options = {});
  // Any optimizer, read through `reader` (called in BeforeStep and AfterStep on the training
  // thread).
  OptimizerProbe(Monitor& monitor, OptimizerReader reader, std::vector<NamedTensor> named,
                 OptimizerProbeOptions options = {});
  ~OptimizerProbe();
  OptimizerProbe(const OptimizerProbe&) = delete;
  OptimizerProbe& operator=(const OptimizerProbe&) = delete;

  // Call after unscaling and clipping, right before optimizer.step() (or where it would be,
  // when the trainer skips it). Records the state before the step when a capsule is waiting.
  void BeforeStep(const OptimizerStepInfo& info = {});

  // Call right after optimizer.step() (or where it would be). Records the state after it, writes
  // the waiting capsule and returns its report; an empty report when none was waiting. Never
  // throws; a failure is in the report.
  StepReport AfterStep();

 private:
  struct Before;  // the state recorded by BeforeStep
  // Writes the step recorded by BeforeStep, and the parameters as they are now, into `c`.
  void RecordStep(v1::Capsule* c);
  Monitor& monitor_;
  OptimizerReader reader_;
  std::vector<NamedTensor> named_;
  OptimizerProbeOptions options_;
  std::unique_ptr<Before> before_;
};

}  // namespace capsule

#endif  // CAPSULE_CAPTURE_OPTIMIZER_PROBE_H_
