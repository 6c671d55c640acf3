// capsule diff: compares two capsules: identity, environment, step, data and numerics.
// Internal to the CLI.
#ifndef CAPSULE_CLI_DIFF_COMMAND_H_
#define CAPSULE_CLI_DIFF_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule::cli {

struct DiffCliOptions {
  std::string a;
  std::string b;
  TrustOptions trust;
  bool json = false;
};
void SetupDiffCommand(CLI::App& app, RunFn* run);
int RunDiffCommand(const DiffCliOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_DIFF_COMMAND_H_
