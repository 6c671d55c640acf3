// capsule report: renders a capsule as a Markdown, HTML or JSON bug report.
// Internal to the CLI.
#ifndef CAPSULE_CLI_REPORT_COMMAND_H_
#define CAPSULE_CLI_REPORT_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule::cli {

struct ReportCliOptions {
  std::string file;
  TrustOptions trust;
  std::string format = "md";  // md | html | json
  std::string replay_json;    // `capsule replay --json` output to include; empty: none
  std::string redact;         // a subset of kRedactItemNames, left out of the report
  std::string out;            // empty: stdout
  bool force = false;         // replace an existing OUT
};
void SetupReportCommand(CLI::App& app, RunFn* run);
int RunReportCommand(const ReportCliOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_REPORT_COMMAND_H_
