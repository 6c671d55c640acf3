#include "capsule/cli/stress_command.h"

// capsule stress FILE --layer NAME: the layer's two paths over generated inputs (replay/stress.h).
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "capsule/base/internal/printable_line.h"
#include "capsule/base/internal/strings.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/cli/printable_stream.h"
#include "capsule/format/json.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/stress.h"

namespace capsule::cli {

void SetupStressCommand(CLI::App& app, RunFn* run, ModelRegistry* registry) {
  auto options = std::make_shared<StressCliOptions>();
  CLI::App* cmd = app.add_subcommand("stress", kStressDescription);
  cmd->add_option("file", options->file, "Capsule file (with all weights embedded)")->required();
  cmd->add_option("--layer", options->layer, "The layer to stress, e.g. blocks.2")->required();
  cmd->add_option("--phase", options->phase, "Phases to compare")
      ->check(CLI::IsMember({"forward", "backward", "both"}));
  AddPluginOption(cmd, &options->plugins);
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->add_flag("--force", options->force, "Run despite a torch version mismatch");
  cmd->add_flag("--json", options->json, "Print the result as JSON");
  cmd->callback([options, run, registry] {
    *run = [options, registry] { return RunStressCommand(*options, *registry); };
  });
}

int RunStressCommand(const StressCliOptions& o, ModelRegistry& registry) {
  int rc = kExitError;
  std::optional<CommandInput> input =
      OpenCommandInput({o.file, o.trust, "", PluginModels(o.plugins, registry)}, &rc);
  if (!input) return rc;
  const LoadedCapsule* loaded = &input->capsule;
  StressOptions options;
  options.layer = o.layer;
  options.force = o.force;
  options.forward = o.phase != "backward";
  options.backward = o.phase != "forward";
  options.progress = ProgressLine("stress");  // null unless standard error is a terminal
  auto report = StressLayer(*loaded->decoded.capsule, registry, options);
  if (options.progress) ClearProgressLine();
  if (!report.ok()) {
    PrintError(report.status(),
               RerunRemedy(report.status(), RerunFactsOf(*loaded->decoded.capsule, registry)));
    return kExitError;
  }
  report->set_capsule(o.file);
  *report->mutable_trust() = loaded->trust;
  if (o.json) {
    std::cout << MessageToJson(*report) << "\n";
  } else {
    // Layer and case names, notes and errors quote the capsule or the model: one PrintableLine
    // per line.
    using Line = PrintableLine;
    const v1::StressReport& r = *report;
    Line(std::cout) << "stress " << r.layer() << ": " << r.cases() << " inputs"
                    << (r.tile() > 0 ? ", kernel tile " + std::to_string(r.tile()) : std::string())
                    << (r.declared() ? "" : " (the model declares nothing about them)");
    for (const std::string& n : r.notes()) Line(std::cout) << "note: " << n;
    Line{std::cout};
    Line(std::cout) << Pad("case", 28) << Pad("family", 11) << Pad("shape", 14) << Pad("phase", 9)
                    << Pad("tensor", 26) << Pad("max abs err", 13) << Pad("max rel err", 13)
                    << Pad("bad elems", 11) << "verdict";
    for (const v1::StressCase& c : r.results()) {
      std::string shape = "[";
      for (int i = 0; i < c.shape_size(); ++i) {
        shape += (i == 0 ? "" : ",") + std::to_string(c.shape(i));
      }
      shape += "]";
      Line(std::cout) << Pad(c.name(), 28) << Pad(c.family(), 11) << Pad(shape, 14)
                      << Pad(c.phase() == v1::BACKWARD ? "backward" : "forward", 9)
                      << Pad(c.tensor(), 26) << Pad(FormatSignificant(c.max_abs_err(), 3), 13)
                      << Pad(FormatSignificant(c.max_rel_err(), 3), 13)
                      << Pad(std::to_string(c.mismatched()), 11)
                      << (c.diverged() ? "DIVERGED" : "ok")
                      << (c.error().empty() ? "" : " (" + c.error() + ")");
    }
    // Per family, which inputs diverge and which agree: the pattern is the finding ("T=17, T=31
    // diverge; T=16 agrees": a tail past the tile).
    std::vector<std::string> families;
    for (const v1::StressCase& c : r.results()) {
      if (std::find(families.begin(), families.end(), c.family()) == families.end()) {
        families.push_back(c.family());
      }
    }
    Line{std::cout};
    for (const std::string& family : families) {
      std::vector<std::string> bad, good;
      for (const v1::StressCase& c : r.results()) {
        if (c.family() != family) continue;
        std::vector<std::string>& list = c.diverged() ? bad : good;
        if (std::find(bad.begin(), bad.end(), c.name()) != bad.end()) continue;
        if (std::find(list.begin(), list.end(), c.name()) == list.end()) list.push_back(c.name());
        if (c.diverged()) good.erase(std::remove(good.begin(), good.end(), c.name()), good.end());
      }
      auto join = [](const std::vector<std::string>& v) {
        std::string out;
        for (const std::string& n : v) out += (out.empty() ? "" : ", ") + n;
        return out.empty() ? std::string("none") : out;
      };
      Line(std::cout) << Pad(family + ":", 11) << "diverge: " << join(bad)
                      << "; agree: " << join(good);
    }
    Line{std::cout};
    Line(std::cout) << "stress: " << r.diverged() << " of " << r.cases() << " inputs diverge in "
                    << r.layer();
  }
  return report->diverged() > 0 ? kExitFinding : kExitOk;
}

}  // namespace capsule::cli
