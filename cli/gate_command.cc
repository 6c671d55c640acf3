#include "capsule/cli/gate_command.h"

// capsule gate DIR: the regression gate (replay/gate.h) over a folder of capsules.

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>

#include "capsule/base/internal/printable_line.h"
#include "capsule/base/internal/strings.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/json.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/gate.h"
#include "capsule/replay/plugin_loader.h"
#include "capsule/replay/replayer.h"

namespace capsule::cli {
void SetupGateCommand(CLI::App& app, RunFn* run, ModelRegistry* registry) {
  auto options = std::make_shared<GateCliOptions>();
  CLI::App* cmd = app.add_subcommand("gate", kGateDescription);
  cmd->add_option("dir", options->dir, "Folder of capsules (*.capsule, not recursive)")
      ->required()
      ->check(CLI::ExistingDirectory);
  AddPluginOption(cmd, &options->plugins);
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->add_flag("--json", options->json, "Print the result as JSON");
  cmd->callback([options, run, registry] {
    *run = [options, registry] { return RunGateCommand(*options, *registry); };
  });
}

int RunGateCommand(const GateCliOptions& o, ModelRegistry& registry) {
  if (Status s = LoadPlugins(o.plugins, registry); !s.ok()) {
    PrintError(s);
    return kExitError;
  }
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o.dir, ec)) {
    if (e.is_regular_file(ec) && e.path().extension() == ".capsule") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    PrintError(NotFoundError("no *.capsule file in " + o.dir),
               "a regression folder holds the capsules of fixed failures");
    return kExitError;
  }
  v1::GateReport gate;
  for (const auto& path : files) {
    v1::GateEntry& e = *gate.add_entries();
    e.set_capsule(path.filename().string());
    int rc = 0;
    // Each capsule is judged alone: one that cannot be read, or is not trusted, is an error in its
    // row, not the end of the gate; its trust line (or the refusal) goes to stderr.
    std::optional<LoadedCapsule> loaded = LoadCapsule(path.string(), o.trust, &rc);
    if (!loaded) {
      e.set_error(rc == kExitUntrusted ? "not trusted (exit status 3)"
                                       : "cannot read it (exit status " + std::to_string(rc) + ")");
      gate.set_errors(gate.errors() + 1);
      if (rc == kExitUntrusted) gate.set_untrusted(gate.untrusted() + 1);
      continue;
    }
    *e.mutable_trust() = loaded->trust;
    const v1::Capsule& c = *loaded->decoded.capsule;
    ReplayOptions replay;
    replay.capsule_path = path.string();  // a checkpoint it names relative to itself
    auto report = ReplayCapsule(c, registry, replay);
    if (!report.ok()) {
      e.set_error(std::string(report.status().message()));
      gate.set_errors(gate.errors() + 1);
      continue;
    }
    const GateVerdict v = JudgeGate(c, *report);
    e.set_passed(v.passed);
    e.set_old_verdict(v.old_verdict);
    e.set_new_verdict(v.new_verdict);
    e.set_reason(v.reason);
    if (v.passed) {
      gate.set_passed(gate.passed() + 1);
    } else {
      gate.set_failed(gate.failed() + 1);
    }
  }
  if (o.json) {
    std::cout << MessageToJson(gate) << "\n";
  } else {
    // File names, verdicts and errors quote the capsules: each row is one PrintableLine.
    PrintableLine(std::cout) << Pad("capsule", 44) << Pad("result", 8) << Pad("recorded", 30)
                             << "now";
    for (const v1::GateEntry& e : gate.entries()) {
      const std::string result = !e.error().empty() ? "ERROR" : e.passed() ? "pass" : "FAIL";
      PrintableLine(std::cout) << Pad(e.capsule(), 44) << Pad(result, 8) << Pad(e.old_verdict(), 30)
                               << (!e.error().empty() ? e.error() : e.new_verdict())
                               << (e.reason().empty() ? "" : ": " + e.reason());
    }
    PrintableLine line(std::cout);
    line << "gate: " << gate.passed() << " of " << gate.entries_size()
         << " capsules no longer fail; " << gate.failed() << " still fail, " << gate.errors()
         << " could not be judged";
    if (gate.untrusted() > 0) line << " (" << gate.untrusted() << " not trusted)";
  }
  // A capsule refused as untrusted is the gate's answer as it is every command's (3): the folder
  // holds something its keys do not vouch for.
  if (gate.untrusted() > 0) return kExitUntrusted;
  if (gate.errors() > 0) return kExitError;
  return gate.failed() > 0 ? kExitFinding : kExitOk;
}

}  // namespace capsule::cli
