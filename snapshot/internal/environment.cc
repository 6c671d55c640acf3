#include "capsule/snapshot/internal/environment.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <sys/utsname.h>
#include <torch/version.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "capsule/format/version.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

// CPU flags that decide which kernels run (and so the last bits of a result).
const std::set<std::string>& KernelFlags() {
  static const std::set<std::string> flags = {"sse4_2",      "avx",         "avx2",     "fma",
                                              "f16c",        "avx512f",     "avx512bw", "avx512vl",
                                              "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile",
                                              "sha_ni",      "asimd",       "sve"};
  return flags;
}

void ReadCpuInfo(v1::Environment* env) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (!have_model && (key == "model name" || key == "Model")) {
      env->set_cpu_model(value);
      have_model = true;
    } else if (!have_flags && (key == "flags" || key == "Features")) {
      std::istringstream words(value);
      std::string w;
      while (words >> w) {
        if (KernelFlags().count(w)) env->add_cpu_flags(w);
      }
      have_flags = true;
    }
  }
}

std::string BlasName() {
  // Debian's LibTorch calls the system libblas.so.3, whichever implementation the alternatives
  // system selected: the reference BLAS and OpenBLAS give different last bits (and speeds).
  char target[PATH_MAX];
  const ssize_t n =
      ::readlink("/etc/alternatives/libblas.so.3-x86_64-linux-gnu", target, sizeof(target) - 1);
  if (n > 0) {
    target[n] = '\0';
    return target;
  }
  return "unknown";
}

}  // namespace

std::string TorchVersion() { return TORCH_VERSION; }

namespace {
std::mutex extra_libraries_mu;
std::map<std::string, std::string>& ExtraLibraries() {
  static auto* libraries = new std::map<std::string, std::string>();  // never destroyed
  return *libraries;
}
}  // namespace

void AddEnvironmentLibrary(const std::string& name, const std::string& version) {
  std::lock_guard<std::mutex> lock(extra_libraries_mu);
  ExtraLibraries()[name] = version;
}

void CollectEnvironment(v1::Environment* env) {
  env->set_capsule_version(CapsuleVersion());
  env->set_torch_version(TorchVersion());
#if defined(__clang__)
  env->set_compiler("Clang " __clang_version__);
#elif defined(__GNUC__)
  env->set_compiler("GCC " __VERSION__);
#endif
  struct utsname u;
  if (::uname(&u) == 0) {
    env->set_os(std::string(u.sysname) + " " + u.release + " " + u.machine);
    env->set_kernel(u.version);
  }
  ReadCpuInfo(env);
  env->set_blas(BlasName());
  env->set_intra_op_threads(at::get_num_threads());
  env->set_inter_op_threads(at::get_num_interop_threads());
  env->set_deterministic_algorithms(at::globalContext().deterministicAlgorithms());
  for (const auto& [name, version] : FormatLibraryVersions()) {
    (*env->mutable_libraries())[name] = version;
  }
  (*env->mutable_libraries())["torch"] = TORCH_VERSION;
  {
    std::lock_guard<std::mutex> lock(extra_libraries_mu);
    for (const auto& [name, version] : ExtraLibraries())
      (*env->mutable_libraries())[name] = version;
  }
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) env->set_hostname(host);
  if (at::hasCUDA()) {
    const int n = at::detail::getCUDAHooks().getNumGPUs();
    for (int i = 0; i < n; ++i) env->add_cuda_devices("cuda:" + std::to_string(i));
    env->set_cuda_version(std::to_string(at::detail::getCUDAHooks().versionCUDART()));
  }
  env->set_torch_config(at::show_config());
}

}  // namespace capsule
