// capsule verify: checks a capsule's integrity and signature, and with --deep its content.
// Internal to the CLI.
#ifndef CAPSULE_CLI_VERIFY_COMMAND_H_
#define CAPSULE_CLI_VERIFY_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule::cli {

struct VerifyOptions {
  std::string file;
  std::vector<std::string> pubkeys;
  bool deep = false;        // also re-hash every embedded tensor and validate the content
  std::string save_signer;  // write the public key a 1.1 capsule carries to this PEM file
};
void SetupVerifyCommand(CLI::App& app, RunFn* run);
int RunVerifyCommand(const VerifyOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_VERIFY_COMMAND_H_
