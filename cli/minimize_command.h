// capsule minimize: shrinks a capsule's batch to the smallest input that still fails alike.
// Needs LibTorch: defined in capsule-torch; the LibTorch-free `capsule` lists the command by its
// description and hands it on (torch_forward.h).
// Internal to the CLI.
#ifndef CAPSULE_CLI_MINIMIZE_COMMAND_H_
#define CAPSULE_CLI_MINIMIZE_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

inline constexpr const char kMinimizeDescription[] =
    "Shrink a capsule's batch to the smallest input that still fails the same way, and say what "
    "the failure needs";

struct MinimizeCliOptions {
  std::string file;
  std::string key;  // private key signing the minimized capsule
  std::string out;
  bool force = false;
  std::vector<std::string> plugins;
  TrustOptions trust;
  int max_replays = 64;
};
void SetupMinimizeCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunMinimizeCommand(const MinimizeCliOptions& options, ModelRegistry& registry);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_MINIMIZE_COMMAND_H_
