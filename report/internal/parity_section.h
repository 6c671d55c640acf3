// The parity section of the Markdown and HTML reports: the verdict, the per-position table and,
// in HTML, the chart (report/parity_text.h draws them). Writes nothing without a parity result.
//
// Thread safety: pure functions.
#ifndef CAPSULE_REPORT_INTERNAL_PARITY_SECTION_H_
#define CAPSULE_REPORT_INTERNAL_PARITY_SECTION_H_

#include <ostream>

#include "capsule/report/report.h"

namespace capsule::internal {

void ParityHtml(std::ostream& out, const ReportModel& m);
void ParityMarkdown(std::ostream& out, const ReportModel& m);

}  // namespace capsule::internal

#endif  // CAPSULE_REPORT_INTERNAL_PARITY_SECTION_H_
