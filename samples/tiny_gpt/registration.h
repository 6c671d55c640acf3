// Registration of tiny_gpt in a ModelRegistry, so that replay can rebuild it from a capsule.
//
// Replay finds a capsule's model by the registry name in its model spec ("tiny_gpt"). A binary that
// links this library registers tiny_gpt directly; the capsule_tiny_gpt_plugin shared library does
// the same from its capsule_register_models entry point, for a `capsule` binary that does not link
// tiny_gpt (`capsule replay --plugin .../libcapsule_tiny_gpt_plugin.so`). It lives apart from the
// capsule_tiny_gpt library so that trainers, which only capture, do not depend on replay.
//
//   capsule::ModelRegistry registry;
//   capsule::tiny_gpt::RegisterTinyGpt(registry);
//   CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<capsule::Model> model, registry.Create(spec));
//
// Thread safety: as ModelRegistry::Register; the factory it registers is safe to call concurrently.
#ifndef CAPSULE_SAMPLES_TINY_GPT_REGISTRATION_H_
#define CAPSULE_SAMPLES_TINY_GPT_REGISTRATION_H_

#include "capsule/replay/model_registry.h"

namespace capsule::tiny_gpt {

// Registers "tiny_gpt" (kRegistryName), built by TinyGpt::FromSpec. When the name is already
// registered (a plugin loaded into a binary that registered tiny_gpt itself), the first
// registration stays.
//
// The build after a fix, simulated: $CAPSULE_TINY_GPT_FIXED, a comma-separated list of fault kinds
// ("nan,eps"), makes the factory build the model without a recorded fault of those kinds, as a
// build with that kernel fixed would (`capsule gate` of a regressions folder, README).
void RegisterTinyGpt(ModelRegistry& registry);

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_REGISTRATION_H_
