#include "capsule/replay/internal/diagnosis.h"

#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/findings.h"

namespace capsule::internal {

void Diagnose(v1::ReplayReport& report) {
  const v1::LayerComparison* first = nullptr;
  for (const auto& l : report.layers()) {
    if (l.verdict() == v1::DIVERGED && l.phase() == v1::FORWARD) {
      first = &l;
      break;
    }
  }
  if (first == nullptr) {
    // Backward entries run from the last layer down; the first divergent gradient in execution
    // order is the lowest index.
    for (const auto& l : report.layers()) {
      if (l.verdict() == v1::DIVERGED && (first == nullptr || l.index() < first->index())) {
        first = &l;
      }
    }
  }
  if (first != nullptr) {
    report.set_first_divergent_layer(first->name());
    report.set_first_divergent_phase(first->phase());
    report.set_first_divergent_source(v1::LAYERWISE);
  }
  // The numerics stage, beside data and objective: it explains when the optimized path diverges.
  v1::StageReport* numerics = nullptr;
  for (auto& s : *report.mutable_stages()) {
    if (s.stage() == v1::STAGE_NUMERICS) numerics = &s;
  }
  if (numerics == nullptr) {
    numerics = report.add_stages();
    numerics->set_stage(v1::STAGE_NUMERICS);
  }
  numerics->set_ran(report.layers_size() > 0 || report.has_bisect() ||
                    report.has_backward_bisect());
  // The composite runs' verdict: the forward bisect's, else the backward bisect's (a block that
  // only the optimized path's backward gets wrong, such as a detach(), leaves the forward exact).
  const v1::BisectReport* bisect =
      report.has_bisect() && !report.bisect().first_bad_layer().empty() ? &report.bisect()
      : report.has_backward_bisect() && !report.backward_bisect().first_bad_layer().empty()
          ? &report.backward_bisect()
          : nullptr;
  const bool bisect_bad = bisect != nullptr;
  numerics->set_explains(first != nullptr || bisect_bad);
  numerics->clear_findings();
  v1::Finding& f =
      AddFinding(*numerics, "numerics.first_divergent_layer", numerics->explains(), 0, 0);
  if (first != nullptr) {
    AddFact(f, "source", "layerwise");
    AddFact(f, "layer", first->name());
    AddFact(f, "phase", v1::Phase_Name(first->phase()));
  } else if (bisect_bad) {
    AddFact(f, "source", bisect == &report.bisect() ? "bisect" : "backward_bisect");
    AddFact(f, "layer", bisect->first_bad_layer());
  }
  RenderDetails(numerics);
  // The first earlier stage with a failed finding explains the trigger, unless the failure did
  // not reproduce at all (then nothing in this batch explains it).
  const v1::StageReport* earlier = nullptr;
  for (const auto& s : report.stages()) {
    if (earlier == nullptr && s.explains() &&
        (s.stage() == v1::STAGE_DATA || s.stage() == v1::STAGE_OBJECTIVE ||
         s.stage() == v1::STAGE_GRADIENTS || s.stage() == v1::STAGE_OPTIMIZER)) {
      earlier = &s;
    }
  }
  // NOT_CHECKED (a manual capture with nothing to compare) is not evidence of a transient: the
  // layerwise comparison decides.
  if (report.fidelity() == v1::NOT_REPRODUCED) {
    report.set_diagnosis(v1::TRANSIENT);
  } else if (earlier != nullptr) {
    report.set_diagnosis(earlier->stage() == v1::STAGE_DATA        ? v1::DATA
                         : earlier->stage() == v1::STAGE_OBJECTIVE ? v1::OBJECTIVE
                         : earlier->stage() == v1::STAGE_GRADIENTS ? v1::GRADIENTS
                                                                   : v1::OPTIMIZER);
  } else if (report.reference_anomalous()) {
    report.set_diagnosis(v1::DATA_OR_MODEL);
  } else if (first != nullptr) {
    report.set_diagnosis(v1::NUMERICS);
  } else if (bisect_bad) {
    // Layerwise comparison was off or passed, but composite runs still diverge.
    report.set_diagnosis(v1::NUMERICS);
    report.set_first_divergent_layer(bisect->first_bad_layer());
    report.set_first_divergent_phase(bisect == &report.bisect() ? v1::FORWARD : v1::BACKWARD);
    report.set_first_divergent_source(v1::BISECT);
  } else {
    report.set_diagnosis(v1::NO_DIVERGENCE);
  }
}

}  // namespace capsule::internal
