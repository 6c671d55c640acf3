#include <iostream>

#include "capsule/cli/cli.h"
#include "capsule/cli/commands.h"
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
  AddTrustOptions(cmd, &options->trust);
  cmd->add_flag("--json", options->json, "Print the differences as JSON");
  cmd->callback([options, run] { *run = [options] { return RunDiffCommand(*options); }; });
}

int RunDiffCommand(const DiffCliOptions& o) {
  // 1 means "they differ", so any read failure is an error (exit 2) here.
  int rc = kExitError;
  auto a = LoadCapsule(o.a, o.trust.pubkeys, o.trust.allow_unsigned, &rc);
  if (!a) return rc;
  auto b = LoadCapsule(o.b, o.trust.pubkeys, o.trust.allow_unsigned, &rc);
  if (!b) return rc;
  const std::vector<CapsuleDifference> diff =
      DiffCapsules(*a->decoded.capsule, *b->decoded.capsule);
  std::cout << (o.json ? RenderDiffJson(diff) : RenderDiffTable(diff));
  return diff.empty() ? kExitOk : kExitFinding;
}

}  // namespace capsule::cli
