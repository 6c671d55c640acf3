// Trigger rule: the kinds of trigger that make a capsule, and whether a re-run of the step fires
// the captured trigger again.
//
// Both sides that re-run a captured step ask the same question with this one function: the
// Monitor after its capture re-run (capsule.v1.Trigger.capture_rerun) and the replayer in its
// fidelity run (NOT_REPRODUCED versus REPRODUCED_*). The rule per kind:
//
//   NON_FINITE_LOSS   the re-run's loss is not finite
//   NON_FINITE_GRAD   the re-run's backward ran and its gradient norm is not finite
//   LOSS_SPIKE        the re-run's loss is above the captured threshold
//   GRAD_NORM_SPIKE   the re-run's backward ran and its gradient norm is above the threshold
//   EXCEPTION         the re-run threw
//   MANUAL (and NONE or a kind this build does not know): nothing crossed a line, so the step
//                     itself is what must come back: the re-run's loss is within
//                     kReproducedRelativeTolerance of the captured one (|r - c| <= 1e-6 *
//                     max(1, |c|)); a non-finite captured loss needs a non-finite re-run loss.
//
// "Fires again" is deliberately not "bitwise": a re-run on the same RNG, batch and thread count is
// usually bit-identical, and the replayer grades that on top (REPRODUCED_EXACT when the watched
// value and every layer's forward statistics have the same bits, REPRODUCED_APPROX otherwise).
//
//   CAPSULE_ASSIGN_OR_RETURN(capsule::ProbeResult r, capsule::ProbeStep(seq, batch, {}));
//   const capsule::RerunOutcome rerun = capsule::RerunOutcomeOf(r);   //
//   instrument/internal/layer_probe.h const bool again = capsule::TriggerFiresAgain(kind, observed,
//   threshold, rerun);
//
// Thread safety: pure functions.
#ifndef CAPSULE_INSTRUMENT_TRIGGER_RULE_H_
#define CAPSULE_INSTRUMENT_TRIGGER_RULE_H_

namespace capsule {

// capsule.v1.TriggerKind values.
enum class TriggerKind {
  kNone = 0,
  kNonFiniteLoss = 1,
  kLossSpike = 2,
  kGradNormSpike = 3,
  kNonFiniteGrad = 4,
  kManual = 5,
  kException = 6,
  // Distributed (capture/distributed.h): captured from the snapshot, without a re-run.
  kHang = 7,
  kCollectiveError = 8,
  kPeerTrigger = 9,
  kReplicaDesync = 10,
  kGradReduction = 11,
};

// What a re-run of the step produced, as far as the rule looks at it.
struct RerunOutcome {
  double loss = 0;
  double grad_norm = 0;        // meaningful only when backward_done
  bool backward_done = false;  // the backward pass ran to the end
  bool threw = false;          // a layer (or the backward pass) threw
};

// How close a re-run's loss must come to a MANUAL capture's loss, relative to max(1, |loss|).
inline constexpr double kReproducedRelativeTolerance = 1e-6;

// Whether `kind` watches the gradient norm (NON_FINITE_GRAD, GRAD_NORM_SPIKE) or the loss.
bool WatchesGradNorm(TriggerKind kind);

// The value of the quantity `kind` watches in `rerun`: its gradient norm or its loss.
double WatchedValue(TriggerKind kind, const RerunOutcome& rerun);

// Whether `rerun` fires the trigger that was captured with `observed` and `threshold` (the rule
// above).
bool TriggerFiresAgain(TriggerKind kind, double observed, double threshold,
                       const RerunOutcome& rerun);

}  // namespace capsule

#endif  // CAPSULE_INSTRUMENT_TRIGGER_RULE_H_
