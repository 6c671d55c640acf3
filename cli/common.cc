#include "capsule/cli/common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "capsule/base/file_util.h"
#include "capsule/base/printable.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/commands.h"
#include "capsule/format/signing.h"

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

void AddTrustOptions(CLI::App* cmd, TrustOptions* trust) {
  CLI::Option* pub =
      cmd->add_option("--pubkey", trust->pubkeys, "Trusted public key (PEM); repeatable")
          ->check(CLI::ExistingFile);
  cmd->add_flag("--allow-unsigned", trust->allow_unsigned,
                "Also accept an unsigned capsule (reported as such). A signed capsule is read "
                "without this; its signature is checked only against keys given with --pubkey")
      ->excludes(pub);
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

StatusOr<ReadOptions> MakeLoadOptions(const std::vector<std::string>& pubkeys,
                                      bool allow_unsigned) {
  CAPSULE_ASSIGN_OR_RETURN(ReadOptions options, MakeReadOptions(pubkeys, allow_unsigned));
  // Reading is not trusting: without --pubkey a signed capsule is read whoever signed it, and
  // shown as "not checked" with the signer's key id (a capsule attached to an issue usually
  // arrives without its .pub). --pubkey asks for trust: then the signer must be one of them.
  options.allow_untrusted = allow_unsigned || pubkeys.empty();
  return options;
}

StatusOr<LoadedCapsule> ReadLoadedCapsule(const std::string& file, const ReadOptions& options) {
  CAPSULE_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(file, options.max_file_bytes));
  auto decoded = DecodeCapsule(bytes, options);
  if (!decoded.ok()) return decoded.status().WithContext(file);
  return LoadedCapsule{std::move(bytes), std::move(*decoded)};
}

std::optional<LoadedCapsule> LoadCapsule(const std::string& file,
                                         const std::vector<std::string>& pubkeys,
                                         bool allow_unsigned, int* exit_code) {
  *exit_code = kExitError;
  auto options = MakeLoadOptions(pubkeys, allow_unsigned);
  if (!options.ok()) {
    PrintError(options.status());
    return std::nullopt;
  }
  // Not through ReadLoadedCapsule: a file that cannot be read was not judged (exit 2), whatever
  // the code of the reason, while a decoding failure is a verdict on the capsule.
  auto bytes = ReadFileBytes(file, options->max_file_bytes);
  if (!bytes.ok()) {
    PrintError(bytes.status());
    return std::nullopt;
  }
  auto decoded = DecodeCapsule(*bytes, *options);
  if (!decoded.ok()) {
    PrintError(decoded.status().WithContext(file));
    *exit_code = ExitCodeForReadError(decoded.status());
    return std::nullopt;
  }
  return LoadedCapsule{std::move(*bytes), std::move(*decoded)};
}

}  // namespace capsule::cli
