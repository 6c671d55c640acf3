// Plugins: shared libraries that add models to a ModelRegistry at run time.
//
// `capsule replay --plugin ./libmy_models.so` loads the library the user names and calls its entry
// point, capsule_register_models(registry), which registers the library's model factories. Nothing
// is loaded that the user did not name: there is no search path, and a bare file name means the
// file of that name in the current directory, never a library found through LD_LIBRARY_PATH.
// A plugin stays loaded for the life of the process, since the models and factories it registered
// run its code. A plugin defines the entry point declared below, with default visibility:
//
//   extern "C" CAPSULE_PLUGIN_EXPORT void capsule_register_models(capsule::ModelRegistry& r) {
//     capsule::tiny_gpt::RegisterTinyGpt(r);
//   }
//   // and the host:  CAPSULE_RETURN_IF_ERROR(capsule::LoadPlugin(path, registry));
//
// Building a plugin: it shares the host's LibTorch (link the shared torch libraries) and carries
// its own static copy of the capsule libraries it uses, with their symbols kept local
// (-fvisibility=hidden, -Wl,--exclude-libs,ALL), so that it can neither clash with the host's copy
// nor bind to it. It must not contain the capsule format library's generated protobuf code
// (proto/capsule.pb.cc), which would register capsule.proto in protobuf's global pool a second
// time; a model plugin has no reason to reference it. The registry itself crosses the boundary only
// as a reference to an object whose layout both sides compile from the same headers.
//
// Thread safety: LoadPlugin may be called from any thread; the plugin's entry point runs on the
// calling thread, and registration is as thread-safe as ModelRegistry.
#ifndef CAPSULE_REPLAY_PLUGIN_LOADER_H_
#define CAPSULE_REPLAY_PLUGIN_LOADER_H_

#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/replay/model_registry.h"

// Marks the entry point as exported from a plugin built with -fvisibility=hidden.
#define CAPSULE_PLUGIN_EXPORT __attribute__((visibility("default")))

// The entry point every plugin defines (declared here so its definition is type-checked).
extern "C" CAPSULE_PLUGIN_EXPORT void capsule_register_models(capsule::ModelRegistry& registry);

namespace capsule {

// The symbol LoadPlugin looks up.
inline constexpr char kPluginEntryPoint[] = "capsule_register_models";

// Loads the shared library at `path` (relative paths from the current directory) with
// dlopen(RTLD_NOW | RTLD_LOCAL) and calls its capsule_register_models(registry). Errors:
// kInvalidArgument for an empty path; kNotFound "plugin X does not exist"; kFailedPrecondition
// when the file is not a loadable shared library (with the loader's message); kNotFound "plugin X
// does not export capsule_register_models"; kInternal when the entry point throws. Loading the same
// plugin again is harmless: its models are already registered.
Status LoadPlugin(const std::string& path, ModelRegistry& registry);

// LoadPlugin for each path in order; stops at the first failure.
Status LoadPlugins(const std::vector<std::string>& paths, ModelRegistry& registry);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_PLUGIN_LOADER_H_
