#include "capsule/cli/verify_command.h"

#include <iostream>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/derivation.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::cli {

void SetupVerifyCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<VerifyOptions>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Check a capsule's integrity and its signature, and that a trusted key signed it (exit 0 "
      "trusted, 3 untrusted, 4 invalid)");
  cmd->add_option("file", options->file, "Capsule file")->required();
  cmd->add_option("--pubkey", options->pubkeys,
                  "Trusted public key (PEM); repeatable. Without one, the signature is still "
                  "checked but no signer is trusted")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--deep", options->deep,
                "Also parse and validate the content and re-hash every embedded tensor");
  cmd->add_option("--save-signer", options->save_signer,
                  "Write the signer's public key, which the capsule carries, to this PEM file "
                  "(never replaced); check its key id with its owner before trusting it");
  cmd->callback([options, run] { *run = [options] { return RunVerifyCommand(*options); }; });
}

int RunVerifyCommand(const VerifyOptions& options) {
  auto read_options = MakeReadOptions(options.pubkeys, /*allow_unsigned=*/false);
  if (!read_options.ok()) {
    PrintError(read_options.status());
    return kExitError;
  }
  read_options->verify_tensor_digests = options.deep;
  // Every signature is checked; trust is judged below, so the line can say what is known.
  read_options->allow_untrusted = true;
  const std::string file = Printable(options.file);
  // A file that cannot be read (missing, a directory, a FIFO, too large) was never judged: exit 2,
  // as every other command. Only what the bytes say makes a capsule untrusted (3) or invalid (4).
  auto failed = [&file](const Status& why, int exit_code) {
    PrintError(why);
    std::cout << file << ": FAILED (" << StatusCodeName(why.code()) << ")\n";
    return exit_code;
  };
  auto bytes = ReadFileBytes(options.file, read_options->max_file_bytes);
  if (!bytes.ok()) return failed(bytes.status(), kExitError);
  auto decoded = DecodeCapsule(*bytes, *read_options);
  if (!decoded.ok()) {
    return failed(decoded.status().WithContext(options.file),
                  ExitCodeForReadError(decoded.status()));
  }
  const EnvelopeInfo& e = decoded->envelope;
  const std::string key_id = HexEncode(e.key_id);
  if (!options.save_signer.empty()) {
    if (e.signer_key.empty()) {
      PrintError(FailedPreconditionError(
          "the capsule does not carry its signer's public key (format 1.0); nothing saved"));
      return kExitError;
    }
    auto pub = PublicKey::FromRaw(e.signer_key);
    Status s = pub.ok() ? SavePublicKeyFile(*pub, options.save_signer) : pub.status();
    if (!s.ok()) {
      PrintError(s);
      return kExitError;
    }
    std::cerr << "capsule: saved the public key of signer " << key_id << " to "
              << options.save_signer << "; check this key id with its owner, then trust it with "
              << "--pubkey " << options.save_signer << "\n";
    if (e.signature != SignatureState::kVerified) return kExitUntrusted;
  }
  const char* deep = options.deep ? ", content valid" : "";
  // What the capsule was made from (format/derivation.h), oldest first: the signer vouches for
  // the capsule no further than its maker trusted those.
  const v1::Capsule& c = *decoded->capsule;
  for (const v1::Derivation& d : c.derivations()) {
    std::cerr << "capsule: " << file << ": " << DescribeDerivation(d) << "\n";
  }
  const v1::Derivation* source = UntrustedSource(c);
  switch (e.signature) {
    case SignatureState::kVerified:
      if (source == nullptr) {
        std::cout << file << ": OK, signed by key " << key_id << deep << "\n";
        return kExitOk;
      }
      std::cout << file << ": UNTRUSTED, signed by key " << key_id << deep << "; "
                << DescribeDerivation(*source) << "\n";
      std::cerr << "capsule: " << file
                << " is signed by a trusted key, but was made from a capsule "
                << "its maker did not trust: verify that one instead\n";
      return kExitUntrusted;
    case SignatureState::kValidUnknownSigner:
      std::cout << file << ": UNTRUSTED, valid signature by unknown key " << key_id << deep << "\n";
      break;
    case SignatureState::kNotChecked:
    case SignatureState::kUnsigned:  // refused by the read options; kept for the switch
      std::cout << file << ": UNTRUSTED, signed by key " << key_id
                << " (format 1.0 carries no signer key; the signature needs --pubkey)" << deep
                << "\n";
      break;
  }
  std::cerr << "capsule: " << file << " is not signed by "
            << (options.pubkeys.empty() ? "a trusted key (no --pubkey given)"
                                        : "any of the --pubkey keys given")
            << "; to trust key " << key_id.substr(0, 16)
            << ", check its id with the signer, then pass their public key with --pubkey"
            << (e.signer_key.empty() ? "" : " (--save-signer PUB writes it from the capsule)")
            << "\n";
  return kExitUntrusted;
}

}  // namespace capsule::cli
