// Helpers shared by the subcommands: trusted-key loading, status-to-exit mapping, error printing.
// Internal to the CLI.
#ifndef CAPSULE_CLI_COMMON_H_
#define CAPSULE_CLI_COMMON_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/command.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/signing.h"
#include "capsule/proto/report.pb.h"

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

// Prints "capsule: <message>" to stderr, and "; <remedy>" after it when a remedy is given.
void PrintError(const Status& status, std::string_view remedy = {});

// What is known about a replay or extract the library refused, from which the remedy is chosen.
// The libraries say what is wrong; which flag gets round it is the command line's to say.
struct RerunFacts {
  bool model_registered = true;        // the capsule's model is in the registry
  bool python_capsule = false;         // written from Python (report/replay_tool.h)
  bool torch_version_differs = false;  // the capsule was recorded with another torch
  bool weights_embedded = true;        // the capsule holds all weights (weight policy ALL)
  bool tokens_redacted = false;        // only the token ids' SHA-256 is kept
  bool has_force = false;              // the subcommand has --force (replay)
  bool force = false;                  // ... and it was given
  bool has_weights = false;            // the subcommand has --weights (replay)
  bool weights = false;                // ... and it was given
  bool checkpoint_named = false;       // the capsule names a weights checkpoint
  bool checkpoint = false;             // --checkpoint was given
};

// How this process's command line was started (cli.h): set by Main, read by the commands that
// print a command to run next. ModelArgs gives the flags that load the model: the invocation's
// own (`--model ...`), or `--plugin P` for each plugin given.
void SetInvocation(const Invocation& invocation);
const Invocation& CurrentInvocation();
std::string ModelArgs(const std::vector<std::string>& plugins);

// The flag that gets round `status`, a refusal of ReplayCapsule or ExtractLayer, in words for
// PrintError; empty when no flag can.
std::string RerunRemedy(const Status& status, const RerunFacts& facts);

#ifdef CAPSULE_WITH_TORCH
// The facts the capsule and the registry give (the subcommand adds its flags).
RerunFacts RerunFactsOf(const v1::Capsule& capsule, const ModelRegistry& registry);
#endif

// 3 for a capsule whose signer is not trusted (unsigned, a key not given, a bad signature), 4 for
// one judged invalid (corrupt, truncated, not a capsule), 2 for anything that stopped us from
// judging (missing file, permissions, limits, newer format).
int ExitCodeForReadError(const Status& status);

// ReadOptions trusting the given public key files.
StatusOr<ReadOptions> MakeReadOptions(const std::vector<std::string>& pubkeys, bool allow_unsigned);

// A capsule read for a subcommand: the file's bytes, their SHA-256 (lowercase hex: how reports,
// extracts and redactions name the file), what they decode to, and how far the command trusts
// it (what its `trust:` line says, and its JSON).
struct LoadedCapsule {
  std::string bytes;
  std::string sha256;
  DecodedCapsule decoded;
  v1::InputTrust trust;
};

// The ReadOptions a command reads with under `trust` (its keys, flags and use): every signature
// is checked, and the trust the command asks for is judged by ReadLoadedCapsule, so that a
// refusal can say what would get round it.
StatusOr<ReadOptions> MakeLoadOptions(const TrustOptions& trust);

// Reads `file`, judges its trust as `trust` asks and decodes it, the signature before anything is
// decompressed and the sources its derivations record after; prints nothing. A capsule the
// command may not use is kUnauthenticated "FILE: refused: <its trust>; <what to do>" (exit 3); a
// file that cannot be read keeps its code. For a command that lists a capsule it cannot use
// instead of stopping (triage, gate): *judged, when not null, receives the trust of a refused
// capsule too.
StatusOr<LoadedCapsule> ReadLoadedCapsule(const std::string& file, const TrustOptions& trust,
                                          const ReadOptions& options,
                                          v1::InputTrust* judged = nullptr);

// The line a command prints to stderr for each capsule it uses: "trust: FILE: <text>".
void PrintTrustLine(const v1::InputTrust& trust);

// Reads `file` as ReadLoadedCapsule does and prints its trust line. On failure prints why and
// returns nullopt with *exit_code set: ExitCodeForReadError for a capsule judged invalid or not
// trusted, kExitError for anything that stopped the judging.
std::optional<LoadedCapsule> LoadCapsule(const std::string& file, const TrustOptions& trust,
                                         int* exit_code);

// What a command that reads one capsule asks for before it works on it.
struct InputRequest {
  std::string file;
  TrustOptions trust;
  std::string key;  // --key: the private key the command signs its output with; empty: none
  // Registers the models the command re-runs (capsule-torch: its --plugin libraries); null: none.
  std::function<Status()> load_models;
};

// What the shared preamble hands a command: the capsule, read and judged, and the signing key
// when the request named one.
struct CommandInput {
  LoadedCapsule capsule;
  std::optional<PrivateKey> key;
};

// The preamble every command that reads one capsule starts with, in this order, so that a bad key
// or plugin is refused before any capsule is read: loads the key, registers the models, then
// reads `file` as LoadCapsule does (its trust line printed). On failure prints why and returns
// nullopt with *exit_code set.
std::optional<CommandInput> OpenCommandInput(const InputRequest& request, int* exit_code);

#ifdef CAPSULE_WITH_TORCH
// InputRequest::load_models for the plugins a command was given.
std::function<Status()> PluginModels(const std::vector<std::string>& plugins,
                                     ModelRegistry& registry);
#endif

// Encodes `out`, made by `tool` ("redact", "extract", "minimize") from `source`, signed with
// `key`: first records the derivation (format/derivation.h) — the source's SHA-256, its signer
// and how far this command trusted it — so the new signature never vouches for more than the
// source had. Errors are those of RecordDerivation and EncodeCapsule.
StatusOr<std::string> EncodeDerived(const LoadedCapsule& source, std::string_view tool,
                                    const PrivateKey& key, uint32_t optional_flags,
                                    v1::Capsule* out);

// Writes `bytes` to `out` for a command that read `in`: refuses `out` when it is `in` (with or
// without --force), replaces an existing regular file only with `force`, and prints why it did
// not write (with "--force to replace it" where that would help). False when nothing was written.
bool WriteOutputFile(const std::string& in, const std::string& out, std::string_view bytes,
                     bool force);

// `s` followed by spaces up to `width` characters (one space at least): a column of a table.
std::string Pad(const std::string& s, size_t width);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_COMMON_H_
