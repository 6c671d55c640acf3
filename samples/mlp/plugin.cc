// `capsule replay --plugin ./libmlp_plugin.so run.capsule`: registers the MLP.
#include "capsule/replay/plugin_loader.h"
#include "mlp.h"

extern "C" CAPSULE_PLUGIN_EXPORT void capsule_register_models(capsule::ModelRegistry& registry) {
  (void)registry.Register("mlp", mlp::MlpFromSpec);
}
