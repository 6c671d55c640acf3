// The tiny_gpt replay plugin: `capsule replay --plugin libcapsule_tiny_gpt_plugin.so` registers
// tiny_gpt in the CLI's model registry. Built with hidden visibility; only this entry point is
// exported (see replay/plugin_loader.h for how a plugin is linked).
#include "capsule/replay/plugin_loader.h"
#include "samples/tiny_gpt/registration.h"

extern "C" CAPSULE_PLUGIN_EXPORT void capsule_register_models(capsule::ModelRegistry& registry) {
  capsule::tiny_gpt::RegisterTinyGpt(registry);
}
