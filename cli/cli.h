// The `capsule` command line as a library call, so a trainer binary can embed the whole CLI with
// its own models registered statically.
//
//   int main(int argc, char** argv) {
//     capsule::ModelRegistry registry;
//     RegisterMyModels(registry);
//     return capsule::cli::Main(argc, argv, registry);
//   }
//
// Exit status (cli/capsule.md): 0 ok / no divergence; 1 invalid capsule, divergence found or
// failure not reproduced; 2 error (unreadable file, bad usage, missing key, ...).
//
// Thread safety: call from one thread; it writes to stdout/stderr.
#ifndef CAPSULE_CLI_CLI_H_
#define CAPSULE_CLI_CLI_H_

#include <string>
#include <vector>

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

// Exit statuses, the same for every command (capsule.md, EXIT STATUS).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFinding = 1;  // replay: a divergence or not reproduced; diff: they differ
inline constexpr int kExitError = 2;    // could not judge: usage, files, limits, newer format
inline constexpr int kExitUntrusted =
    3;                                  // intact or not, the signer is not trusted / bad signature
inline constexpr int kExitInvalid = 4;  // not a capsule, truncated, corrupt

// The CLI with no models registered (replay then needs --plugin).
int Main(int argc, char** argv);
// The CLI with `registry`'s models available to replay (a trainer binary registers its own).
// Ignored by a build without LibTorch, which has no replay subcommand.
int Main(int argc, char** argv, ModelRegistry& registry);

// How the user started the command line, for the commands it prints ("replay: ...", "next:
// ...") to be ones that work as typed: `capsule` by default; the Python package's `python3 -m
// capsule`, with the `--model pkg.module:factory` that loads the model in place of plugins.
struct Invocation {
  std::string program = "capsule";
  std::vector<std::string> model_args;  // repeated in printed commands; empty: --plugin flags
};
int Main(int argc, char** argv, ModelRegistry& registry, const Invocation& invocation);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_CLI_H_
