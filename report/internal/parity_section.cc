#include "capsule/report/internal/parity_section.h"

#include "capsule/proto/parity.pb.h"
#include "capsule/report/internal/text.h"
#include "capsule/report/parity_text.h"

namespace capsule::internal {
namespace {

const v1::ParityReport* ParityOf(const ReportModel& m) {
  return m.replay && m.replay->parity ? m.replay->parity.get() : nullptr;
}

}  // namespace

void ParityHtml(std::ostream& out, const ReportModel& m) {
  const v1::ParityReport* p = ParityOf(m);
  if (p == nullptr) return;
  out << "<h2>Inference parity (whole sequence vs cached decode)</h2>\n<p id=\"parity\">"
      << HtmlEscape(ParitySentence(*p)) << "</p>\n<figure>" << ParityChartSvg(*p)
      << "<figcaption>error of the worst layer at each position, as a multiple of its tolerance "
         "(log scale; the dashed line is the tolerance)</figcaption></figure>\n<pre>"
      << HtmlEscape(ParityTable(*p)) << "</pre>\n";
}

void ParityMarkdown(std::ostream& out, const ReportModel& m) {
  const v1::ParityReport* p = ParityOf(m);
  if (p == nullptr) return;
  out << "### Inference parity (whole sequence vs cached decode)\n\n"
      << MarkdownEscape(ParitySentence(*p)) << "\n\n<pre>" << HtmlEscape(ParityTable(*p))
      << "</pre>\n\n";
}

}  // namespace capsule::internal
