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

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalid = 1;
inline constexpr int kExitError = 2;

// The CLI with no models registered (replay then needs --plugin).
int Main(int argc, char** argv);
// The CLI with `registry`'s models available to replay (a trainer binary registers its own).
// Ignored by a build without LibTorch, which has no replay subcommand.
int Main(int argc, char** argv, ModelRegistry& registry);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_CLI_H_
