// The `capsule` executable does not link LibTorch, so the format commands (keygen, inspect, verify,
// report, diff, redact) start in milliseconds: loading LibTorch's shared libraries alone takes
// 0.4 s on an idle machine and several seconds on a busy one. The commands that run a model
// (replay, extract) are handed to capsule-torch, the same command line linked with LibTorch,
// installed beside it (the build directory) or in <prefix>/libexec/capsule. Internal to the CLI.
#ifndef CAPSULE_CLI_TORCH_FORWARD_H_
#define CAPSULE_CLI_TORCH_FORWARD_H_

#include <string>
#include <string_view>

namespace capsule::cli {

// Whether `command` (argv[1]) needs LibTorch.
bool NeedsTorch(std::string_view command);

// Where capsule-torch is for the executable at `self` (an absolute path): beside it, or at the
// installed libexec path relative to it. Empty when neither exists, and for a `self` that is empty
// or relative: the current directory is never searched.
std::string FindTorchCli(const std::string& self);

// Replaces this process with capsule-torch and the same arguments. Returns only on failure, with
// exit status 2 and the reason printed (no /proc/self/exe to find this executable by, no
// capsule-torch beside it).
int ForwardToTorchCli(int argc, char** argv);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_TORCH_FORWARD_H_
