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

std::string SelfPath() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n <= 0 || static_cast<size_t>(n) >= path.size()) return "";
  path.resize(static_cast<size_t>(n));
  return path;
}

}  // namespace

bool NeedsTorch(std::string_view command) {
  return command == "replay" || command == "extract" || command == "gate" ||
         command == "minimize" || command == "stress";
}

std::string FindTorchCli(const std::string& self) {
  const size_t slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  for (const std::string& candidate :
       {dir + "/capsule-torch", dir + "/" CAPSULE_LIBEXEC_RELATIVE "/capsule-torch"}) {
    if (IsExecutable(candidate)) return candidate;
  }
  return "";
}

int ForwardToTorchCli(int argc, char** argv) {
  (void)argc;
  const std::string self = SelfPath();
  const std::string torch_cli = FindTorchCli(self);
  if (torch_cli.empty()) {
    PrintError(NotFoundError(std::string("capsule ") + argv[1] +
                             " runs models and needs capsule-torch (the command line linked "
                             "with LibTorch), which is not beside " +
                             (self.empty() ? std::string("this executable") : self) +
                             " nor in its " CAPSULE_LIBEXEC_RELATIVE),
               "build or install capsule with LibTorch (CAPSULE_WITH_TORCH=ON)");
    return kExitError;
  }
  ::execv(torch_cli.c_str(), argv);
  const int err = errno;
  PrintError(InternalError("cannot run " + torch_cli + ": " + std::strerror(err)));
  return kExitError;
}

}  // namespace capsule::cli
