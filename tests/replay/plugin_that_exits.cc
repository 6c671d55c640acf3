// A plugin whose model ends the process when it is built, as a library that calls exit(1) does
// (OpenMP, when it cannot start the threads it was asked for): the command must say that it
// judged nothing (exit status 2), never leave exit status 1, which says "a finding".
#include <cstdlib>
#include <memory>

#include "capsule/replay/plugin_loader.h"

extern "C" CAPSULE_PLUGIN_EXPORT void capsule_register_models(capsule::ModelRegistry& registry) {
  (void)registry.Register(
      "exits_on_build",
      [](const capsule::ModelSpecInfo&) -> capsule::StatusOr<std::unique_ptr<capsule::Model>> {
        std::exit(1);
      });
}
