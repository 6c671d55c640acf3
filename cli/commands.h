// The subcommands of `capsule`: one file each (keygen_command.cc, ...), each with an options
// struct, a Setup function that declares its flags on a CLI11 app, and a Run function that does
// the work through the libraries and returns the exit status. Internal to the CLI.
#ifndef CAPSULE_CLI_COMMANDS_H_
#define CAPSULE_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace capsule::cli {

// Setup functions register the subcommand and set `*run` to the action to take when it is chosen.
using RunFn = std::function<int()>;

struct KeygenOptions {
  std::string out_prefix;
};
void SetupKeygenCommand(CLI::App& app, RunFn* run);
int RunKeygenCommand(const KeygenOptions& options);

struct TrustOptions {
  std::vector<std::string> pubkeys;
  bool allow_unsigned = false;
};

struct InspectOptions {
  std::string file;
  TrustOptions trust;
  bool json = false;
  bool full = false;  // include tensor bytes (base64) in --json
};
void SetupInspectCommand(CLI::App& app, RunFn* run);
int RunInspectCommand(const InspectOptions& options);

struct VerifyOptions {
  std::string file;
  std::vector<std::string> pubkeys;
  bool deep = false;  // also re-hash every embedded tensor and validate the content
};
void SetupVerifyCommand(CLI::App& app, RunFn* run);
int RunVerifyCommand(const VerifyOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_COMMANDS_H_
