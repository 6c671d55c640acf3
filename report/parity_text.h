// Sentences, a table and a chart about a parity replay, for people: replay/parity.h returns facts
// (capsule.v1.ParityReport) and `capsule replay --parity` and the reports phrase them here.
//
//   std::cout << capsule::ParitySentence(report) << "\n" << capsule::ParityTable(report);
//   // "decode departs from the whole-sequence forward at position 8, layer blocks.1 (error 412x
//   //  its tolerance: 0.0113 vs 0.0071); attention.causal_mask_offset: ..."
//   html += capsule::ParityChartSvg(report);
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_REPORT_PARITY_TEXT_H_
#define CAPSULE_REPORT_PARITY_TEXT_H_

#include <string>

namespace capsule::v1 {
class ParityFinding;
class ParityReport;
}  // namespace capsule::v1

namespace capsule {

// The verdict with the first divergent position and layer, the tolerance it was held to and the
// named check that failed.
std::string ParitySentence(const v1::ParityReport& report);

// What a failed check means, with its numbers.
std::string ParityCheckSentence(const v1::ParityFinding& finding);

// One line per position: prefill or decode, the worst layer and its error as a multiple of the
// tolerance, "DIVERGED" where it fails; then the cached tensors that differ.
std::string ParityTable(const v1::ParityReport& report);

// An inline SVG bar chart of the error per position (log scale, relative to the tolerance), the
// tolerance drawn as a line and the first decoded position marked.
std::string ParityChartSvg(const v1::ParityReport& report);

}  // namespace capsule

#endif  // CAPSULE_REPORT_PARITY_TEXT_H_
