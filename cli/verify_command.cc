#include <iostream>

#include "capsule/base/file_util.h"
#include "capsule/base/printable.h"
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
  // A file that cannot be read (missing, a directory, a FIFO, too large) was never judged: exit 2,
  // as every other command. Only what the bytes say makes a capsule invalid (exit 1).
  auto failed = [&options](const Status& why, int exit_code) {
    PrintError(why);
    std::cout << Printable(options.file) << ": FAILED (" << StatusCodeName(why.code()) << ")\n";
    return exit_code;
  };
  auto bytes = ReadFileBytes(options.file, read_options->max_file_bytes);
  if (!bytes.ok()) return failed(bytes.status(), kExitError);
  auto decoded = DecodeCapsule(*bytes, *read_options);
  if (!decoded.ok()) {
    return failed(decoded.status().WithContext(options.file),
                  ExitCodeForReadError(decoded.status()));
  }
  std::cout << Printable(options.file) << ": OK, signed by key "
            << HexEncode(decoded->envelope.key_id) << (options.deep ? ", content valid" : "")
            << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
