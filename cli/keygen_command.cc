#include <iostream>

#include "capsule/cli/cli.h"
#include "capsule/cli/commands.h"
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
  auto pair = GenerateKeyPair();
  if (!pair.ok()) {
    PrintError(pair.status());
    return kExitError;
  }
  const std::string key_path = options.out_prefix + ".key";
  const std::string pub_path = options.out_prefix + ".pub";
  Status s = SavePrivateKeyFile(pair->private_key, key_path);
  if (s.ok()) {
    s = SavePublicKeyFile(pair->public_key, pub_path);
    if (!s.ok()) std::remove(key_path.c_str());  // never leave half a pair
  }
  if (!s.ok()) {
    PrintError(s);
    return kExitError;
  }
  std::cout << "wrote " << key_path << " (private, mode 0600) and " << pub_path << "\n"
            << "key id " << pair->public_key.KeyIdHex() << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
