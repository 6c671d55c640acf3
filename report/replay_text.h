// Sentences about a replay result, for people: the replayer returns facts (capsule.v1.ReplayReport)
// and the renderers (`capsule replay`'s output, the Markdown and HTML reports) phrase them here, so
// every one says the same thing in the same words.
//
//   report.set_diagnosis_text(capsule::DiagnosisSentence(report));
//   // "numerics in the optimized path: first divergent layer blocks.2 (forward, 64 non-finite
//   //  mismatches); bisect confirms it in 4 runs"
//
// Thread safety: pure function; thread-safe.
#ifndef CAPSULE_REPORT_REPLAY_TEXT_H_
#define CAPSULE_REPORT_REPLAY_TEXT_H_

#include <string>

namespace capsule::v1 {
class ReplayReport;
class StageReport;
}  // namespace capsule::v1

namespace capsule {

// The diagnosis with its evidence and what to do next, from diagnosis, fidelity_detail,
// reference_loss, the first divergent layer's entry in layers, bisect and extract_layer. Empty for
// an unspecified diagnosis.
std::string DiagnosisSentence(const v1::ReplayReport& report);

// "data", "objective", "numerics" for a capsule.v1.Stage value.
std::string StageName(int stage);

// A stage's verdict as every output spells it: "skipped" (it did not run), "FAILED" (a finding
// explains the step) or "passed".
std::string StageVerdict(const v1::StageReport& stage);

}  // namespace capsule

#endif  // CAPSULE_REPORT_REPLAY_TEXT_H_
