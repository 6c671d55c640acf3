// Helpers shared by the subcommands: trusted-key loading, status-to-exit mapping, error printing.
// Internal to the CLI.
#ifndef CAPSULE_CLI_COMMON_H_
#define CAPSULE_CLI_COMMON_H_

#include <optional>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_reader.h"

namespace capsule::cli {

// Prints "capsule: <message>" to stderr.
void PrintError(const Status& status);

// 1 for a capsule judged invalid (corrupt, truncated, unsigned, untrusted, not a capsule),
// 2 for anything that stopped us from judging (missing file, permissions, limits, newer format).
int ExitCodeForReadError(const Status& status);

// ReadOptions trusting the given public key files.
StatusOr<ReadOptions> MakeReadOptions(const std::vector<std::string>& pubkeys, bool allow_unsigned);

// A capsule read for a subcommand: the file's bytes (a capsule's SHA-256 is of exactly these) and
// what they decode to.
struct LoadedCapsule {
  std::string bytes;
  DecodedCapsule decoded;
};

// Reads and decodes `file` trusting `pubkeys`; `allow_unsigned` also accepts unsigned capsules and
// signers not given (reported as "not checked"), as --allow-unsigned promises. On failure prints
// why and returns nullopt with *exit_code set: ExitCodeForReadError for a capsule judged invalid,
// kExitError for anything that stopped the judging.
std::optional<LoadedCapsule> LoadCapsule(const std::string& file,
                                         const std::vector<std::string>& pubkeys,
                                         bool allow_unsigned, int* exit_code);

// "1.2 MiB", "512 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_COMMON_H_
