#include "capsule/cli/report_command.h"

#include <iostream>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/redact.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/report/replay_tool.h"
#include "capsule/report/report.h"

namespace capsule::cli {

void SetupReportCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<ReportCliOptions>();
  CLI::App* cmd =
      app.add_subcommand("report", "Write an issue-ready report (Markdown, HTML or JSON)");
  cmd->add_option("file", options->file, "Capsule file")->required();
  cmd->add_option("--format", options->format, "md (default), html or json")
      ->check(CLI::IsMember({"md", "html", "json"}));
  cmd->add_option("--replay-json", options->replay_json,
                  "Include a replay result (`capsule replay --json` output)")
      ->check(CLI::ExistingFile);
  cmd->add_option(flags::kRedact, options->redact,
                  "Leave out of the report: comma-separated " + JoinRedactItemNames(", "));
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kShow);
  cmd->add_option("-o,--out", options->out, "Output file (written atomically); default stdout");
  AddForceOption(cmd, &options->force);
  cmd->callback([options, run] { *run = [options] { return RunReportCommand(*options); }; });
}

int RunReportCommand(const ReportCliOptions& o) {
  ReportOptions report_options;
  auto redact = ParseRedactItemList(o.redact);
  if (!redact.ok()) {
    PrintError(redact.status().WithContext(flags::kRedact));
    return kExitError;
  }
  report_options.redact = *redact;
  int rc = kExitError;
  std::optional<CommandInput> input = OpenCommandInput({o.file, o.trust, "", nullptr}, &rc);
  if (!input) return rc;
  const LoadedCapsule* loaded = &input->capsule;
  std::unique_ptr<v1::ReplayReport> replay;
  if (!o.replay_json.empty()) {
    auto text = ReadFileBytes(o.replay_json, uint64_t{64} << 20);
    if (!text.ok()) {
      PrintError(text.status());
      return kExitError;
    }
    auto parsed = ParseReplayReportJson(*text);
    if (!parsed.ok()) {
      PrintError(parsed.status().WithContext(o.replay_json));
      return kExitError;
    }
    replay = std::move(*parsed);
  }
  report_options.file_name = o.file;
  report_options.file_sha256 = loaded->sha256;
  report_options.trust = &loaded->trust;
  const ReportModel model = BuildReportModel(*loaded->decoded.capsule, loaded->decoded.envelope,
                                             replay.get(), report_options);
  const std::string text = o.format == "html"   ? RenderHtml(model)
                           : o.format == "json" ? RenderJson(model)
                                                : RenderMarkdown(model);
  if (o.out.empty()) {
    std::cout << text;
    return kExitOk;
  }
  return WriteOutputFile(o.file, o.out, text, o.force) ? kExitOk : kExitError;
}

}  // namespace capsule::cli
