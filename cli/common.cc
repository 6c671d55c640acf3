#include "capsule/cli/common.h"

#include <cstdio>
#include <iostream>

#include "capsule/base/file_util.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/commands.h"
#include "capsule/format/signing.h"

namespace capsule::cli {

void PrintError(const Status& status) { std::cerr << "capsule: " << status.message() << "\n"; }

int ExitCodeForReadError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kDataLoss:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnauthenticated:
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
                "Accept an unsigned capsule, or one whose signer is not given with --pubkey "
                "(reported as such)")
      ->excludes(pub);
}

std::optional<LoadedCapsule> LoadCapsule(const std::string& file,
                                         const std::vector<std::string>& pubkeys,
                                         bool allow_unsigned, int* exit_code) {
  *exit_code = kExitError;
  auto options = MakeReadOptions(pubkeys, allow_unsigned);
  if (!options.ok()) {
    PrintError(options.status());
    return std::nullopt;
  }
  options->allow_untrusted = allow_unsigned;
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

std::string HumanBytes(uint64_t bytes) {
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  } else if (bytes < 1024ull * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  }
  return buf;
}

}  // namespace capsule::cli
