// capsule redact: writes a copy of a capsule with private items dropped, signed anew.
// Internal to the CLI.
#ifndef CAPSULE_CLI_REDACT_COMMAND_H_
#define CAPSULE_CLI_REDACT_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule::cli {

struct RedactCliOptions {
  std::string file;
  std::string drop;  // a comma-separated subset of kRedactItemNames (format/redact.h)
  std::string key;   // private key signing the output
  std::string out;
  bool force = false;  // replace an existing OUT
  TrustOptions trust;
};
void SetupRedactCommand(CLI::App& app, RunFn* run);
int RunRedactCommand(const RedactCliOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_REDACT_COMMAND_H_
