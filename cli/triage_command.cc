#include "capsule/cli/triage_command.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/triage.pb.h"
#include "capsule/ranks/run_analysis.h"

namespace capsule::cli {

void SetupTriageCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<TriageCliOptions>();
  CLI::App* cmd = app.add_subcommand("triage", kTriageDescription);
  cmd->add_option("dir", options->dir, "Folder of one run's capsules (*.capsule, not recursive)")
      ->required();
  cmd->add_option("--run", options->run_id, "The run to triage when DIR holds several");
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->add_flag("--json", options->json, "Print a capsule.v1.RunTriage as JSON");
  cmd->callback([options, run] { *run = [options] { return RunTriageCommand(*options); }; });
}

int RunTriageCommand(const TriageCliOptions& o) {
  auto read_options = MakeLoadOptions(o.trust);
  if (!read_options.ok()) {
    PrintError(read_options.status());
    return kExitError;
  }
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o.dir, ec)) {
    std::error_code entry_ec;
    if (e.is_regular_file(entry_ec) && e.path().extension() == ".capsule") {
      files.push_back(e.path());
    }
  }
  if (ec) {
    PrintError(InvalidArgumentError("cannot read the folder " + o.dir + ": " + ec.message()));
    return kExitError;
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    PrintError(NotFoundError("no *.capsule file in " + o.dir),
               "triage reads the capsules every rank of one run wrote");
    return kExitError;
  }
  // Each capsule goes through the verifying reader alone: one it refuses (unreadable, or not
  // trusted) is listed with the reason and never used, and the others are still read. Each whose
  // signature could be judged gets its trust line. Only what the analysis reads of each is kept,
  // so the folder costs about one capsule of memory, not all of them.
  RunAnalysisInput input;
  std::vector<v1::InputTrust> trust;
  bool refused = false;
  for (const auto& path : files) {
    v1::InputTrust judged;
    auto c = ReadLoadedCapsule(path.string(), o.trust, *read_options, &judged);
    if (!judged.file().empty()) {
      PrintTrustLine(judged);
      trust.push_back(judged);
    }
    if (!c.ok()) {
      refused |= c.status().code() == StatusCode::kUnauthenticated;
      input.AddUnreadable(path.string(), std::string(c.status().message()));
      continue;
    }
    input.Add(path.string(), *c->decoded.capsule);
  }
  RunAnalysisOptions options;
  options.run_id = o.run_id;
  options.dir = o.dir;
  const std::unique_ptr<v1::RunTriage> triage = AnalyseRun(input, options);
  for (v1::InputTrust& t : trust) *triage->add_trust() = std::move(t);
  std::cout << (o.json ? RenderRunAnalysisJson(*triage) : RenderRunAnalysisText(*triage));
  // What was found rests on the capsules used; one the keys do not vouch for was left out, and
  // the user must know before acting on the rest (a rank's capsule forged, say).
  if (refused) {
    PrintError(UnauthenticatedError("a capsule in " + o.dir + " is not trusted and was not used"),
               "--pubkey its signer's key, or --allow-untrusted to use it anyway");
    return kExitUntrusted;
  }
  switch (triage->outcome()) {
    case v1::TRIAGE_NO_FINDING:
      return kExitOk;
    case v1::TRIAGE_FINDING:
      return kExitFinding;
    case v1::TRIAGE_SEVERAL_RUNS:
      PrintError(InvalidArgumentError("capsules of several runs in " + o.dir),
                 "--run ID picks one");
      return kExitError;
    case v1::TRIAGE_NO_RUN:
      PrintError(NotFoundError(o.run_id.empty()
                                   ? "no readable capsule of a distributed run in " + o.dir
                                   : "no readable capsule of run " + o.run_id + " in " + o.dir));
      return kExitError;
    default:
      return kExitError;  // undecided: a check needs a capsule the folder lacks
  }
}

}  // namespace capsule::cli
