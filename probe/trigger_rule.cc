#include "capsule/probe/trigger_rule.h"

#include <algorithm>
#include <cmath>

namespace capsule {

bool WatchesGradNorm(TriggerKind kind) {
  return kind == TriggerKind::kNonFiniteGrad || kind == TriggerKind::kGradNormSpike;
}

double WatchedValue(TriggerKind kind, const RerunOutcome& rerun) {
  return WatchesGradNorm(kind) ? rerun.grad_norm : rerun.loss;
}

bool TriggerFiresAgain(TriggerKind kind, double observed, double threshold,
                       const RerunOutcome& rerun) {
  switch (kind) {
    case TriggerKind::kNonFiniteLoss:
      return !std::isfinite(rerun.loss);
    case TriggerKind::kNonFiniteGrad:
      return rerun.backward_done && !std::isfinite(rerun.grad_norm);
    case TriggerKind::kLossSpike:
      return rerun.loss > threshold;
    case TriggerKind::kGradNormSpike:
      return rerun.backward_done && rerun.grad_norm > threshold;
    case TriggerKind::kException:
      return rerun.threw;
    case TriggerKind::kManual:
    case TriggerKind::kNone:
      break;
  }
  // MANUAL, and any kind this build does not know: the step itself must come back.
  if (!std::isfinite(observed)) return !std::isfinite(rerun.loss);
  return std::fabs(rerun.loss - observed) <=
         kReproducedRelativeTolerance * std::max(1.0, std::fabs(observed));
}

}  // namespace capsule
