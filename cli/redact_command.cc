#include "capsule/cli/redact_command.h"

#include <iostream>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/redact.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::cli {

void SetupRedactCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<RedactCliOptions>();
  CLI::App* cmd =
      app.add_subcommand("redact", "Write a re-signed copy of a capsule without private data");
  cmd->add_option("file", options->file, "Capsule file")->required();
  cmd->add_option("--drop", options->drop,
                  "Comma-separated items to remove: " + JoinRedactItemNames(", "))
      ->required();
  cmd->add_option("--key", options->key, "Private key (PEM, mode 0600) to sign the output with")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--out", options->out, "Output capsule file")->required();
  AddForceOption(cmd, &options->force);
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->callback([options, run] { *run = [options] { return RunRedactCommand(*options); }; });
}

int RunRedactCommand(const RedactCliOptions& o) {
  RedactOptions redact;
  Status s = ParseRedactItems(o.drop, &redact);
  if (!s.ok()) {
    PrintError(s.WithContext("--drop"));
    return kExitError;
  }
  // The key is loaded before the input is read: a key with loose permissions is refused before
  // any work is done.
  int rc = kExitError;
  std::optional<CommandInput> input = OpenCommandInput({o.file, o.trust, o.key, nullptr}, &rc);
  if (!input) return rc;
  LoadedCapsule* loaded = &input->capsule;
  const PrivateKey* key = &*input->key;
  redact.source_sha256 = loaded->sha256;
  s = RedactCapsule(loaded->decoded.capsule.get(), redact);
  if (!s.ok()) {
    PrintError(s);
    return kExitError;
  }
  // The source's optional flags still describe the content (weights, extract); redaction adds one.
  auto bytes = EncodeDerived(*loaded, "redact", *key,
                             loaded->decoded.envelope.header.optional_flags | kOptionalFlagRedacted,
                             loaded->decoded.capsule.get());
  if (!bytes.ok()) {
    PrintError(bytes.status());
    return kExitError;
  }
  // Never onto its own input: redacting in place would lose the original if anything went wrong.
  if (!WriteOutputFile(o.file, o.out, *bytes, o.force)) return kExitError;
  auto pub = key->GetPublicKey();
  std::cout << "wrote " << Printable(o.out) << " (dropped";
  for (const auto& item : loaded->decoded.capsule->redaction().dropped()) std::cout << " " << item;
  std::cout << ")";
  if (pub.ok()) std::cout << ", signed by key " << pub->KeyIdHex();
  std::cout << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
