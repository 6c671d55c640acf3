// capsule gate: replays every capsule of a regression folder against this build.
// Needs LibTorch: defined in capsule-torch; the LibTorch-free `capsule` lists the command by its
// description and hands it on (torch_forward.h).
// Internal to the CLI.
#ifndef CAPSULE_CLI_GATE_COMMAND_H_
#define CAPSULE_CLI_GATE_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

inline constexpr const char kGateDescription[] =
    "Replay every capsule of a folder against the current build: exit 1 if any still fails";

struct GateCliOptions {
  std::string dir;
  std::vector<std::string> plugins;
  TrustOptions trust;
  bool json = false;
};
void SetupGateCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunGateCommand(const GateCliOptions& options, ModelRegistry& registry);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_GATE_COMMAND_H_
