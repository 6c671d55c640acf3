// capsule inspect: shows what a capsule holds: a summary, or with --json the capsule as JSON.
// Internal to the CLI.
#ifndef CAPSULE_CLI_INSPECT_COMMAND_H_
#define CAPSULE_CLI_INSPECT_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule::cli {

struct InspectOptions {
  std::string file;
  TrustOptions trust;
  bool json = false;
  bool full = false;  // include tensor bytes (base64) in --json
};
void SetupInspectCommand(CLI::App& app, RunFn* run);
int RunInspectCommand(const InspectOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_INSPECT_COMMAND_H_
