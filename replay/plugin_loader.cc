#include "capsule/replay/plugin_loader.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <exception>
#include <mutex>
#include <string>

namespace capsule {

namespace {

using RegisterModelsFn = void (*)(ModelRegistry&);

// dlerror() reports through a per-thread buffer, but dlopen/dlsym from another thread between a
// call and its dlerror() can still mix messages on some libcs: read them under one lock.
std::mutex& DlMutex() {
  static std::mutex mu;
  return mu;
}

std::string DlError() {
  const char* message = dlerror();
  return message != nullptr ? message : "unknown dynamic loader error";
}

}  // namespace

Status LoadPlugin(const std::string& path, ModelRegistry& registry) {
  if (path.empty()) return InvalidArgumentError("plugin path is empty");
  // dlopen searches the library path for a name without '/'; "./" pins it to the current
  // directory, so only the file the user named can be loaded.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return NotFoundError("plugin " + path + " does not exist");
    }
    return ErrnoError(err, "cannot read plugin", path);
  }
  if (!S_ISREG(st.st_mode)) {
    return FailedPreconditionError("plugin " + path + " is not a regular file");
  }

  RegisterModelsFn entry = nullptr;
  {
    std::lock_guard<std::mutex> lock(DlMutex());
    dlerror();  // clear any stale message
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return FailedPreconditionError("plugin " + path + " cannot be loaded: " + DlError());
    }
    void* symbol = dlsym(handle, kPluginEntryPoint);
    if (symbol == nullptr) {
      dlclose(handle);
      return NotFoundError("plugin " + path + " does not export " + kPluginEntryPoint +
                           "; define it as extern \"C\" with default visibility");
    }
    // The handle is never closed: registered factories and the models they build run its code.
    entry = reinterpret_cast<RegisterModelsFn>(symbol);
  }

  try {
    entry(registry);
  } catch (const c10::Error& e) {
    return InternalError("plugin " + path + ": " + kPluginEntryPoint +
                         " failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InternalError("plugin " + path + ": " + kPluginEntryPoint + " failed: " + e.what());
  } catch (...) {
    return InternalError("plugin " + path + ": " + kPluginEntryPoint +
                         " failed with an unknown exception");
  }
  return Status::Ok();
}

Status LoadPlugins(const std::vector<std::string>& paths, ModelRegistry& registry) {
  for (const std::string& path : paths) CAPSULE_RETURN_IF_ERROR(LoadPlugin(path, registry));
  return Status::Ok();
}

}  // namespace capsule
