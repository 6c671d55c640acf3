// The two judgements of a replay, apart from the runs that feed them so they can be tested on
// plain inputs: JudgeFidelity (did the trigger fire again, bitwise?) and Diagnose (which of
// TRANSIENT, DATA_OR_MODEL, NUMERICS, NO_DIVERGENCE, and which layer). Both write facts into the
// ReplayReport, never sentences: phrasing them is the renderers' job (report/replay_text.h).
// Internal to capsule::replay.
#ifndef CAPSULE_REPLAY_INTERNAL_DIAGNOSIS_H_
#define CAPSULE_REPLAY_INTERNAL_DIAGNOSIS_H_

#include "capsule/format/capsule_fwd.h"
#include "capsule/instrument/internal/layer_probe.h"

namespace capsule::v1 {
class ReplayReport;
}  // namespace capsule::v1

namespace capsule::internal {

// From the capsule's trigger and the replayed run of the trainer's path: trigger, captured and
// replayed values, fidelity and fidelity_detail. (replayer.cc)
void JudgeFidelity(const v1::Capsule& c, const ProbeResult& run, v1::ReplayReport& report);

// From fidelity, reference_anomalous, layers and bisect: diagnosis, and when a layer diverges
// first_divergent_layer, first_divergent_phase and first_divergent_source. The first divergent
// layer is the first DIVERGED forward entry; failing that the lowest-index DIVERGED backward
// entry; failing that the bisect's first bad layer. (diagnosis.cc)
void Diagnose(v1::ReplayReport& report);

}  // namespace capsule::internal

#endif  // CAPSULE_REPLAY_INTERNAL_DIAGNOSIS_H_
