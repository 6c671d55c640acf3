#include "capsule/replay/internal/diagnosis.h"

#include "capsule/proto/replay_report.pb.h"

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
  // NOT_CHECKED (a manual capture with nothing to compare) is not evidence of a transient: the
  // layerwise comparison decides.
  if (report.fidelity() == v1::NOT_REPRODUCED) {
    report.set_diagnosis(v1::TRANSIENT);
  } else if (report.reference_anomalous()) {
    report.set_diagnosis(v1::DATA_OR_MODEL);
  } else if (first != nullptr) {
    report.set_diagnosis(v1::NUMERICS);
  } else if (report.has_bisect() && !report.bisect().first_bad_layer().empty()) {
    // Layerwise comparison was off or passed, but composite runs still diverge.
    report.set_diagnosis(v1::NUMERICS);
    report.set_first_divergent_layer(report.bisect().first_bad_layer());
    report.set_first_divergent_phase(v1::FORWARD);
    report.set_first_divergent_source(v1::BISECT);
  } else {
    report.set_diagnosis(v1::NO_DIVERGENCE);
  }
}

}  // namespace capsule::internal
