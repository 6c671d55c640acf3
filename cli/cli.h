// The `capsule` command line as a library call, so a trainer binary can embed the whole CLI with
// its own models registered statically.
//
//   int main(int argc, char** argv) { return capsule::cli::Main(argc, argv); }
//
// Exit status (cli/capsule.md): 0 ok / no divergence; 1 invalid capsule, divergence found or
// failure not reproduced; 2 error (unreadable file, bad usage, missing key, ...).
//
// Thread safety: call from one thread; it writes to stdout/stderr.
#ifndef CAPSULE_CLI_CLI_H_
#define CAPSULE_CLI_CLI_H_

namespace capsule::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalid = 1;
inline constexpr int kExitError = 2;

int Main(int argc, char** argv);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_CLI_H_
