// The regression gate: after a fix, replay each capsule of a folder against the current build of
// the model and judge whether its failure is gone. JudgeGate is the rule, over a capsule and its
// replay report, so a CI script and `capsule gate DIR` decide alike:
// - still failing: a layer diverges, a triage stage has a failed finding, or the trigger fires
//   again (for a trigger other than MANUAL: a NaN the fixed build still produces);
// - passing: none of those (a manual capture, made for a finite fault, passes when its layers
//   agree and every stage passes).
//
//   capsule::GateVerdict v = capsule::JudgeGate(capsule, report);
//   if (!v.passed) std::cerr << v.old_verdict << " -> " << v.new_verdict << "\n";
//
// Thread safety: pure functions.
#ifndef CAPSULE_REPLAY_GATE_H_
#define CAPSULE_REPLAY_GATE_H_

#include <string>

#include "capsule/format/capsule_fwd.h"

namespace capsule {
namespace v1 {
class ReplayReport;
}  // namespace v1

struct GateVerdict {
  bool passed = false;
  std::string old_verdict;  // what the capsule recorded: "NON_FINITE_LOSS at blocks.2"
  std::string new_verdict;  // what the replay found now: "NUMERICS at blocks.2", "fixed"
  std::string reason;       // why it still fails; empty when it passed
};

GateVerdict JudgeGate(const v1::Capsule& capsule, const v1::ReplayReport& report);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_GATE_H_
