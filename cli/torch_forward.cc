#include "capsule/cli/torch_forward.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "capsule/base/status.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"

namespace capsule::cli {
namespace {

bool IsExecutable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

// This executable's absolute path, from /proc/self/exe, however long; empty, with *err set,
// when it cannot be read (no /proc).
std::string SelfPath(int* err) {
  // PATH_MAX is no bound on a path: grow the buffer until the link fits (a path is at most a
  // few pages in practice; 1 MiB is far beyond any).
  for (size_t size = 4096; size <= (size_t{1} << 20); size *= 4) {
    std::string path(size, '\0');
    const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
    if (n < 0) {
      *err = errno;
      return "";
    }
    if (static_cast<size_t>(n) < path.size()) {
      path.resize(static_cast<size_t>(n));
      return path;
    }
  }
  *err = ENAMETOOLONG;
  return "";
}

}  // namespace

bool NeedsTorch(std::string_view command) {
  return command == "replay" || command == "extract" || command == "gate" ||
         command == "minimize" || command == "stress";
}

std::string FindTorchCli(const std::string& self) {
  // Only beside an executable whose absolute path is known: a relative or empty one would make
  // the search start in the current directory, which anyone may have filled.
  if (self.empty() || self[0] != '/') return "";
  const std::string dir = self.substr(0, self.rfind('/'));
  for (const std::string& candidate :
       {dir + "/capsule-torch", dir + "/" CAPSULE_LIBEXEC_RELATIVE "/capsule-torch"}) {
    if (IsExecutable(candidate)) return candidate;
  }
  return "";
}

int ForwardToTorchCli(int argc, char** argv) {
  (void)argc;
  int self_err = 0;
  const std::string self = SelfPath(&self_err);
  if (self.empty()) {
    PrintError(FailedPreconditionError(std::string("capsule ") + argv[1] +
                                       " runs models in capsule-torch, which is looked for beside "
                                       "this executable, whose path cannot be read from "
                                       "/proc/self/exe (" +
                                       std::strerror(self_err) + ")"),
               "mount /proc, or run capsule-torch itself by its path");
    return kExitError;
  }
  const std::string torch_cli = FindTorchCli(self);
  if (torch_cli.empty()) {
    PrintError(NotFoundError(std::string("capsule ") + argv[1] +
                             " runs models and needs capsule-torch (the command line linked "
                             "with LibTorch), which is not beside " +
                             self + " nor in its " CAPSULE_LIBEXEC_RELATIVE),
               "build or install capsule with LibTorch (CAPSULE_WITH_TORCH=ON)");
    return kExitError;
  }
  ::execv(torch_cli.c_str(), argv);
  const int err = errno;
  PrintError(InternalError("cannot run " + torch_cli + ": " + std::strerror(err)));
  return kExitError;
}

}  // namespace capsule::cli
