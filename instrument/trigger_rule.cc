#include "capsule/instrument/trigger_rule.h"

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
    case TriggerKind::kHang:
    case TriggerKind::kCollectiveError:
    case TriggerKind::kPeerTrigger:
    case TriggerKind::kReplicaDesync:
    case TriggerKind::kGradReduction:
      // Distributed: a local re-run cannot bring the peers back, only this rank's own step. With
      // the step's loss recorded (observed) it must come back as MANUAL's does; without it (the
      // rank stopped before its loss) the step must run through.
      if (!std::isfinite(observed)) return !rerun.threw;
      break;
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
