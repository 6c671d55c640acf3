#include "capsule/cli/common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/command.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/derivation.h"
#include "capsule/format/envelope.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/report/replay_tool.h"

namespace capsule::cli {

void PrintError(const Status& status, std::string_view remedy) {
  // One line, whatever the message quotes (file names, capsule strings).
  std::cerr << "capsule: " << Printable(status.message());
  if (!remedy.empty()) std::cerr << "; " << Printable(remedy);
  std::cerr << "\n";
}

namespace {
Invocation& InvocationStorage() {
  static auto* invocation = new Invocation();  // never destroyed: read until exit
  return *invocation;
}
}  // namespace

void SetInvocation(const Invocation& invocation) { InvocationStorage() = invocation; }

const Invocation& CurrentInvocation() { return InvocationStorage(); }

std::string ModelArgs(const std::vector<std::string>& plugins) {
  std::string out;
  const Invocation& inv = CurrentInvocation();
  if (!inv.model_args.empty()) {
    for (const std::string& a : inv.model_args) out += " " + a;
    return out;
  }
  for (const std::string& p : plugins) out += " --plugin " + p;
  return out;
}

std::string RerunRemedy(const Status& status, const RerunFacts& f) {
  switch (status.code()) {
    case StatusCode::kNotFound:
      if (f.model_registered) return "";
      if (!f.python_capsule) return "load the model's plugin with --plugin SO";
      // Python stages cannot be loaded from a plugin: the factory that rebuilds them can.
      if (!CurrentInvocation().model_args.empty() || CurrentInvocation().program != "capsule") {
        return "name the function that rebuilds it with --model pkg.module:factory";
      }
      return "it was written from Python: replay it with python3 -P -m capsule and --model "
             "pkg.module:factory";
    case StatusCode::kFailedPrecondition:
      // In the order replay checks them: environment, weights, then the batch.
      if (f.torch_version_differs && !f.force) return f.has_force ? "--force to go on anyway" : "";
      if (f.checkpoint_named && !f.weights && !f.tokens_redacted) {
        // The checkpoint it names is not the recorded file, its tensors differ, or its path is
        // unknown here.
        if (!f.has_force || f.force) return "";
        return f.checkpoint ? "--force to replay with this checkpoint anyway"
                            : "--checkpoint PT for the file it names, or --force to replay with "
                              "this one anyway";
      }
      if (!f.weights_embedded && !f.weights) {
        // A model over max_weight_bytes (256 MiB) is captured without its weights: say both
        // ways to replay it whole.
        return f.has_weights
                   ? "pass them with --weights FILE (a capsule written with weight policy ALL); "
                     "for later capsules, have the trainer name its checkpoint "
                     "(MonitorOptions::weights_checkpoint, or monitor.set_weights_checkpoint(path) "
                     "in Python) and they replay from it"
                   : "";
      }
      if (f.tokens_redacted) return "";
      // What is left is a model hash mismatch with the weights given.
      if (f.weights && !f.force && f.has_force) return "--force to replay anyway";
      return "";
    default:
      return "";
  }
}

int ExitCodeForReadError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kUnauthenticated:
      return kExitUntrusted;
    case StatusCode::kDataLoss:
    case StatusCode::kOutOfRange:
    case StatusCode::kInvalidArgument:
      return kExitInvalid;
    default:
      return kExitError;
  }
}

StatusOr<ReadOptions> MakeReadOptions(const std::vector<std::string>& pubkeys,
                                      bool allow_unsigned) {
  ReadOptions options;
  options.allow_unsigned = allow_unsigned;
  for (const std::string& path : pubkeys) {
    CAPSULE_ASSIGN_OR_RETURN(PublicKey key, LoadPublicKeyFile(path));
    options.trusted_keys.push_back(std::move(key));
  }
  return options;
}

void AddTrustOptions(CLI::App* cmd, TrustOptions* trust, CapsuleUse use) {
  trust->command = cmd->get_name();
  trust->use = use;
  cmd->add_option(flags::kPubkey, trust->pubkeys,
                  "Trusted public key (PEM); repeatable. A capsule is trusted when one of these "
                  "signed it (and the capsules it was made from were trusted by its maker)")
      ->check(CLI::ExistingFile);
  cmd->add_flag(flags::kAllowUntrusted, trust->allow_untrusted,
                use == CapsuleUse::kAct
                    ? "Use a capsule no --pubkey key vouches for (signed by another key, or made "
                      "from an untrusted capsule); its trust is stated"
                    : "With --pubkey, also read a capsule no --pubkey key vouches for; its trust "
                      "is stated (without --pubkey every signed capsule is read)");
  cmd->add_flag(flags::kAllowUnsigned, trust->allow_unsigned,
                "Also accept an unsigned capsule, or one made from an unsigned capsule (implies "
                "--allow-untrusted); its trust is stated");
}

CLI::Validator NonNegativeNumber() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0) {
          return text + " is not a number >= 0";
        }
        return "";
      },
      "NUMBER>=0");
}

void AddPluginOption(CLI::App* cmd, std::vector<std::string>* plugins) {
  cmd->add_option("--plugin", *plugins,
                  "Shared library registering the capsules' models; repeatable")
      ->check(CLI::ExistingFile);
}

void AddForceOption(CLI::App* cmd, bool* force) {
  cmd->add_flag("--force", *force,
                "Replace OUT when it exists (a regular file only; never the input itself)");
}

namespace {

// Why writing OUT failed, with the --force remedy when OUT already exists.
void PrintWriteError(const Status& status, const std::string& out) {
  PrintError(status.WithContext(out),
             status.code() == StatusCode::kAlreadyExists ? "--force to replace it" : "");
}

}  // namespace

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

bool WriteOutputFile(const std::string& in, const std::string& out, std::string_view bytes,
                     bool force) {
  if (SameFile(in, out)) {
    PrintError(InvalidArgumentError(out + " is the input file; not replacing it"));
    return false;
  }
  AtomicWriteOptions options;
  options.overwrite = force;
  const Status s = WriteFileAtomic(out, bytes, options);
  if (!s.ok()) {
    PrintWriteError(s, out);
    return false;
  }
  return true;
}

StatusOr<ReadOptions> MakeLoadOptions(const TrustOptions& trust) {
  CAPSULE_ASSIGN_OR_RETURN(ReadOptions options,
                           MakeReadOptions(trust.pubkeys, /*allow_unsigned=*/true));
  // ReadLoadedCapsule judges trust itself; the reader only checks every signature.
  options.allow_untrusted = true;
  return options;
}

namespace {

// How far `trust` trusts a capsule whose envelope reads as `e` and whose content (once decoded) is
// `c`: the one place the words of a `trust:` line are chosen.
v1::InputTrust Judge(const std::string& file, const EnvelopeInfo& e, const v1::Capsule* c,
                     const TrustOptions& trust) {
  v1::InputTrust t;
  t.set_file(Printable(file));
  t.set_signature(TrustOf(e.signature));
  const std::string key = HexEncode(e.key_id);
  if (e.signature != SignatureState::kUnsigned) t.set_signer_key_id(key);
  std::string text;
  switch (e.signature) {
    case SignatureState::kVerified:
      text = "signed by trusted key " + key;
      break;
    case SignatureState::kValidUnknownSigner:
      text = "valid signature, unknown signer " + key +
             (trust.pubkeys.empty() ? " (no --pubkey given)" : " (not among --pubkey)");
      break;
    case SignatureState::kNotChecked:
      text = "signed by key " + key +
             ", signature not checked (format 1.0 carries no signer key; --pubkey checks it)";
      break;
    case SignatureState::kUnsigned:
      text = "unsigned";
      break;
  }
  const v1::Derivation* source = c != nullptr ? UntrustedSource(*c) : nullptr;
  if (source != nullptr) {
    *t.mutable_untrusted_source() = *source;
    text += "; " + DescribeDerivation(*source);
  } else if (c != nullptr && c->derivations_size() > 0) {
    text += "; " + DescribeDerivation(c->derivations(c->derivations_size() - 1));
  }
  t.set_trusted(e.signature == SignatureState::kVerified && source == nullptr);
  t.set_text(text);
  return t;
}

// Whether `trust` lets its command go on with a capsule in state `s` (its own signature, or the
// least trusted source it records).
bool Allowed(const TrustOptions& trust, SignatureState s) {
  const bool any_signer = trust.allow_untrusted || trust.allow_unsigned ||
                          (trust.use == CapsuleUse::kShow && trust.pubkeys.empty());
  switch (s) {
    case SignatureState::kVerified:
      return true;
    case SignatureState::kValidUnknownSigner:
    case SignatureState::kNotChecked:
      return any_signer;
    case SignatureState::kUnsigned:
      return trust.allow_unsigned;
  }
  return false;
}

// kUnauthenticated "FILE: refused: <trust>; <what would get round it>", or OK when `trust` lets
// the command use the capsule. `c` is null before the payload is decoded (the signature alone).
Status Refusal(const std::string& file, const v1::InputTrust& judged, const EnvelopeInfo& e,
               const v1::Capsule* c, const TrustOptions& trust) {
  const v1::Derivation* source = c != nullptr ? UntrustedSource(*c) : nullptr;
  const SignatureState from_source =
      source != nullptr ? SourceState(*source) : SignatureState::kVerified;
  const bool signature_ok = Allowed(trust, e.signature);
  if (signature_ok && Allowed(trust, from_source)) return Status::Ok();
  const std::string verb = trust.use == CapsuleUse::kShow ? "read" : "use";
  const bool unsigned_refused = !signature_ok ? e.signature == SignatureState::kUnsigned
                                              : from_source == SignatureState::kUnsigned;
  std::string why =
      trust.use == CapsuleUse::kShow
          ? "with --pubkey, " + trust.command + " reads only capsules those keys vouch for"
          : trust.command + " uses only capsules a --pubkey key vouches for";
  const std::string anyway = "--allow-untrusted to " + verb + " it anyway";
  if (unsigned_refused) {
    why = trust.use == CapsuleUse::kShow && trust.pubkeys.empty()
              ? "--allow-unsigned to read it anyway"
              : why + "; --allow-unsigned to " + verb + " it anyway";
  } else if (!signature_ok && e.signature == SignatureState::kValidUnknownSigner) {
    why += ": check that key id with its owner and pass their key with --pubkey (capsule verify " +
           file + " --save-signer PUB writes it), or " + anyway;
  } else if (!signature_ok) {
    why += ": pass the signer's key with --pubkey to check the signature, or " + anyway;
  } else {
    why += ", and its maker did not trust what it was made from; " + anyway;
  }
  return UnauthenticatedError(file + ": refused: " + judged.text() + "; " + why);
}

// ReadLoadedCapsule once the bytes are read.
StatusOr<LoadedCapsule> JudgeAndDecode(const std::string& file, std::string bytes,
                                       const TrustOptions& trust, const ReadOptions& options,
                                       v1::InputTrust* judged) {
  // The signature first, judged before anything is decompressed; then the content, and the trust
  // of what it was made from.
  OpenOptions open;
  open.trusted_keys = options.trusted_keys;
  open.allow_unsigned = open.allow_untrusted = true;
  auto env = OpenEnvelope(bytes, open);
  if (!env.ok()) return env.status().WithContext(file);
  v1::InputTrust t = Judge(file, env->info, nullptr, trust);
  if (judged != nullptr) *judged = t;
  CAPSULE_RETURN_IF_ERROR(Refusal(file, t, env->info, nullptr, trust));
  auto decoded = DecodeOpenedEnvelope(*env, options);
  if (!decoded.ok()) return decoded.status().WithContext(file);
  t = Judge(file, env->info, decoded->capsule.get(), trust);
  if (judged != nullptr) *judged = t;
  CAPSULE_RETURN_IF_ERROR(Refusal(file, t, env->info, decoded->capsule.get(), trust));
  auto sha256 = Sha256Hex(bytes);
  if (!sha256.ok()) return sha256.status().WithContext(file);
  return LoadedCapsule{std::move(bytes), std::move(*sha256), std::move(*decoded), std::move(t)};
}

}  // namespace

StatusOr<LoadedCapsule> ReadLoadedCapsule(const std::string& file, const TrustOptions& trust,
                                          const ReadOptions& options, v1::InputTrust* judged) {
  CAPSULE_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(file, options.max_file_bytes));
  return JudgeAndDecode(file, std::move(bytes), trust, options, judged);
}

void PrintTrustLine(const v1::InputTrust& trust) {
  std::cerr << "trust: " << trust.file() << ": " << trust.text() << "\n";
}

std::optional<LoadedCapsule> LoadCapsule(const std::string& file, const TrustOptions& trust,
                                         int* exit_code) {
  *exit_code = kExitError;
  auto options = MakeLoadOptions(trust);
  if (!options.ok()) {
    PrintError(options.status());
    return std::nullopt;
  }
  // A file that cannot be read was not judged (exit 2), whatever the code of the reason; a
  // decoding failure or a refusal is a verdict on the capsule.
  auto bytes = ReadFileBytes(file, options->max_file_bytes);
  if (!bytes.ok()) {
    PrintError(bytes.status());
    return std::nullopt;
  }
  auto loaded = JudgeAndDecode(file, std::move(*bytes), trust, *options, nullptr);
  if (!loaded.ok()) {
    PrintError(loaded.status());
    *exit_code = ExitCodeForReadError(loaded.status());
    return std::nullopt;
  }
  PrintTrustLine(loaded->trust);
  return std::move(*loaded);
}

std::optional<CommandInput> OpenCommandInput(const InputRequest& request, int* exit_code) {
  *exit_code = kExitError;
  CommandInput input;
  if (!request.key.empty()) {
    auto key = LoadPrivateKeyFile(request.key);
    if (!key.ok()) {
      PrintError(key.status().WithContext("--key"));
      return std::nullopt;
    }
    input.key = std::move(*key);
  }
  if (request.load_models) {
    if (Status s = request.load_models(); !s.ok()) {
      PrintError(s);
      return std::nullopt;
    }
  }
  std::optional<LoadedCapsule> loaded = LoadCapsule(request.file, request.trust, exit_code);
  if (!loaded) return std::nullopt;
  input.capsule = std::move(*loaded);
  return input;
}

StatusOr<std::string> EncodeDerived(const LoadedCapsule& source, std::string_view tool,
                                    const PrivateKey& key, uint32_t optional_flags,
                                    v1::Capsule* out) {
  CAPSULE_RETURN_IF_ERROR(RecordDerivation(*source.decoded.capsule, source.decoded.envelope,
                                           source.sha256, tool, /*now_unix_micros=*/0, out));
  WriteOptions write;
  write.signing_key = &key;
  write.optional_flags = optional_flags;
  return EncodeCapsule(*out, write);
}

}  // namespace capsule::cli
