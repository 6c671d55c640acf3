// capsule stress: runs one layer's two paths over generated inputs: which diverge.
// Needs LibTorch: defined in capsule-torch; the LibTorch-free `capsule` lists the command by its
// description and hands it on (torch_forward.h).
// Internal to the CLI.
#ifndef CAPSULE_CLI_STRESS_COMMAND_H_
#define CAPSULE_CLI_STRESS_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

inline constexpr const char kStressDescription[] =
    "Run one layer's reference and optimized paths over generated inputs (tile boundaries, "
    "extreme magnitudes, strided layouts), forward and backward: which inputs diverge?";

struct StressCliOptions {
  std::string file;
  std::string layer;
  std::string phase = "both";
  std::vector<std::string> plugins;
  TrustOptions trust;
  bool force = false;
  bool json = false;
};
void SetupStressCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunStressCommand(const StressCliOptions& options, ModelRegistry& registry);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_STRESS_COMMAND_H_
