// Findings as data, and the one place their sentences are written.
//
// A triage stage judges: it adds a finding with its check name, whether it failed, the measured
// value and the bound, the sample or parameter it names, and the other numbers and names its
// sentence needs as facts (capsule.v1.Finding.facts). It never writes English. RenderDetails then
// fills every finding's `detail` from its check and facts with the sentence of that check, from
// one catalogue (findings.cc), for the terminal, the JSON and the reports alike.
//
//   v1::Finding& f = AddFinding(r, "data.label_out_of_vocab", true, count, 0);
//   NameSample(in, b, f);
//   AddFact(f, "vocab", vocab);
//   ...
//   RenderDetails(&r);  // once, when the stage is done
//
// Thread safety: pure functions.
#ifndef CAPSULE_REPLAY_INTERNAL_FINDINGS_H_
#define CAPSULE_REPLAY_INTERNAL_FINDINGS_H_

#include <string>
#include <vector>

#include "capsule/proto/replay_report.pb.h"

namespace capsule::internal {

// Adds a finding to `r` (a failed one makes the stage explain the step) and returns it.
v1::Finding& AddFinding(v1::StageReport& r, const std::string& check, bool failed, double value,
                        double threshold);

void AddFact(v1::Finding& f, const std::string& name, double number);
void AddFact(v1::Finding& f, const std::string& name, const std::string& text);
// A list of names (at most kFactItems kept; `number` counts them all), with a number each when
// `numbers` is not empty (then as long as `items`).
void AddFact(v1::Finding& f, const std::string& name, const std::vector<std::string>& items,
             const std::vector<double>& numbers = {});

// The names a list fact keeps.
inline constexpr int kFactItems = 4;

// The sentence of `f`, from its check and facts. A check the catalogue does not know gets its
// check name and value (never an empty sentence).
std::string RenderFinding(const v1::Finding& f);

// Fills the detail of every finding of `r`.
void RenderDetails(v1::StageReport* r);

// The checks the catalogue has a sentence for, sorted.
std::vector<std::string> RenderedChecks();

}  // namespace capsule::internal

#endif  // CAPSULE_REPLAY_INTERNAL_FINDINGS_H_
