#include "capsule/cli/diff_command.h"

#include <iostream>

#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/report/diff.h"

namespace capsule::cli {

void SetupDiffCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<DiffCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "diff", "Compare two capsules: identity, environment, config, trigger, layer stats");
  cmd->add_option("a", options->a, "First capsule file")->required();
  cmd->add_option("b", options->b, "Second capsule file")->required();
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->add_flag("--json", options->json, "Print the differences as JSON");
  cmd->callback([options, run] { *run = [options] { return RunDiffCommand(*options); }; });
}

int RunDiffCommand(const DiffCliOptions& o) {
  // A capsule that cannot be read, or is not trusted, is its exit status (2, 3, 4), never 1.
  // "Equivalent" is said of two capsules the user trusts, or chose to use anyway.
  int rc = kExitError;
  std::optional<CommandInput> a = OpenCommandInput({o.a, o.trust, "", nullptr}, &rc);
  if (!a) return rc;
  std::optional<CommandInput> b = OpenCommandInput({o.b, o.trust, "", nullptr}, &rc);
  if (!b) return rc;
  const std::vector<CapsuleDifference> diff =
      DiffCapsules(*a->capsule.decoded.capsule, *b->capsule.decoded.capsule);
  std::cout << (o.json ? RenderDiffJson(diff, &a->capsule.trust, &b->capsule.trust)
                       : RenderDiffTable(diff));
  return diff.empty() ? kExitOk : kExitFinding;
}

}  // namespace capsule::cli
