#include "capsule/cli/keygen_command.h"

#include <iostream>

#include "capsule/base/internal/printable.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/signing.h"

namespace capsule::cli {

void SetupKeygenCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<KeygenOptions>();
  CLI::App* cmd = app.add_subcommand("keygen", "Create an Ed25519 key pair for signing capsules");
  cmd->add_option("--out", options->out_prefix,
                  "Writes PREFIX.key (private, mode 0600) and PREFIX.pub")
      ->required();
  cmd->callback([options, run] { *run = [options] { return RunKeygenCommand(*options); }; });
}

int RunKeygenCommand(const KeygenOptions& options) {
  // The prefix is checked before a key is generated: "" and "dir/" would write hidden files.
  if (auto paths = KeyFilePathsFor(options.out_prefix); !paths.ok()) {
    PrintError(paths.status().WithContext("--out"));
    return kExitError;
  }
  auto pair = GenerateKeyPair();
  if (!pair.ok()) {
    PrintError(pair.status());
    return kExitError;
  }
  // Exclusive: an existing key is never replaced, and the pair is written whole or not at all.
  auto written = SaveKeyPairFiles(*pair, options.out_prefix);
  if (!written.ok()) {
    PrintError(written.status());
    return kExitError;
  }
  std::cout << "wrote " << Printable(written->private_key) << " (private, mode 0600) and "
            << Printable(written->public_key) << "\n"
            << "key id " << pair->public_key.KeyIdHex() << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
