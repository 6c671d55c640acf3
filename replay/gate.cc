#include "capsule/replay/gate.h"

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"

namespace capsule {

GateVerdict JudgeGate(const v1::Capsule& c, const v1::ReplayReport& r) {
  GateVerdict v;
  v.old_verdict = v1::TriggerKind_Name(c.trigger().kind());
  if (!c.numerics().first_anomalous_layer().empty()) {
    v.old_verdict += " at " + c.numerics().first_anomalous_layer();
  }
  std::string finding;
  for (const auto& s : r.stages()) {
    if (s.stage() == v1::STAGE_NUMERICS) continue;  // judged by the layers below
    for (const auto& f : s.findings()) {
      if (f.failed() && finding.empty()) finding = f.check();
    }
  }
  std::string layer;
  for (const auto& l : r.layers()) {
    if (l.verdict() == v1::DIVERGED && layer.empty()) {
      layer = l.name() + " (" + v1::Phase_Name(l.phase()) + ")";
    }
  }
  const bool reproduced =
      r.fidelity() == v1::REPRODUCED_EXACT || r.fidelity() == v1::REPRODUCED_APPROX;
  const bool manual = c.trigger().kind() == v1::MANUAL;
  if (!finding.empty()) {
    v.reason = "a triage finding still fails: " + finding;
  } else if (!layer.empty()) {
    v.reason = "the optimized path still diverges at " + layer;
  } else if (reproduced && !manual) {
    v.reason = "the trigger fires again (" + v1::Fidelity_Name(r.fidelity()) + ")";
  }
  v.passed = v.reason.empty();
  v.new_verdict = v1::Diagnosis_Name(r.diagnosis());
  if (r.has_first_divergent_layer()) v.new_verdict += " at " + r.first_divergent_layer();
  if (v.passed) v.new_verdict = "fixed (" + v1::Fidelity_Name(r.fidelity()) + ", no divergence)";
  return v;
}

}  // namespace capsule
