#include <iostream>

#include "capsule/base/sha256.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/commands.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"

namespace capsule::cli {

void SetupVerifyCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<VerifyOptions>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check a capsule's integrity and that a trusted key signed it (exit 0 ok, 1 not)");
  cmd->add_option("file", options->file, "Capsule file")->required();
  cmd->add_option("--pubkey", options->pubkeys, "Trusted public key (PEM); repeatable")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_flag("--deep", options->deep,
                "Also parse and validate the content and re-hash every embedded tensor");
  cmd->callback([options, run] { *run = [options] { return RunVerifyCommand(*options); }; });
}

int RunVerifyCommand(const VerifyOptions& options) {
  auto read_options = MakeReadOptions(options.pubkeys, /*allow_unsigned=*/false);
  if (!read_options.ok()) {
    PrintError(read_options.status());
    return kExitError;
  }
  read_options->verify_tensor_digests = options.deep;
  read_options->validate = options.deep;
  auto decoded = ReadCapsuleFile(options.file, *read_options);
  if (!decoded.ok()) {
    std::cerr << "capsule: " << decoded.status().message() << "\n";
    std::cout << options.file << ": FAILED (" << StatusCodeName(decoded.status().code()) << ")\n";
    return ExitCodeForReadError(decoded.status());
  }
  std::cout << options.file << ": OK, signed by key " << HexEncode(decoded->envelope.key_id)
            << (options.deep ? ", content valid" : "") << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
