// capsule extract: writes a capsule holding one layer, its weights and its recorded inputs.
// Needs LibTorch: defined in capsule-torch; the LibTorch-free `capsule` lists the command by its
// description and hands it on (torch_forward.h).
// Internal to the CLI.
#ifndef CAPSULE_CLI_EXTRACT_COMMAND_H_
#define CAPSULE_CLI_EXTRACT_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

inline constexpr const char kExtractDescription[] =
    "Write a minimal capsule holding one layer, its weights and its recorded inputs; "
    "`capsule replay` of it runs only that layer (the model's plugin still builds it)";

struct ExtractCliOptions {
  std::string file;
  std::string layer;
  std::string key;  // private key signing the extract
  std::string out;
  bool force = false;  // replace an existing OUT
  std::vector<std::string> plugins;
  TrustOptions trust;
};
void SetupExtractCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunExtractCommand(const ExtractCliOptions& options, ModelRegistry& registry);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_EXTRACT_COMMAND_H_
