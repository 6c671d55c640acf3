// capsule keygen: writes a new Ed25519 key pair: OUT.key (mode 0600) and OUT.pub.
// Internal to the CLI.
#ifndef CAPSULE_CLI_KEYGEN_COMMAND_H_
#define CAPSULE_CLI_KEYGEN_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule::cli {

struct KeygenOptions {
  std::string out_prefix;
};
void SetupKeygenCommand(CLI::App& app, RunFn* run);
int RunKeygenCommand(const KeygenOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_KEYGEN_COMMAND_H_
