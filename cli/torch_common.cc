// The parts of cli/common.h that need LibTorch (a model registry, plugins): compiled into the
// command line linked with LibTorch only, so that the rest of common.cc is compiled once for both
// command lines.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/replay/model_registry.h"
#include "capsule/replay/plugin_loader.h"
#include "capsule/report/replay_tool.h"
#include "capsule/snapshot/internal/environment.h"

namespace capsule::cli {

std::function<Status()> PluginModels(const std::vector<std::string>& plugins,
                                     ModelRegistry& registry) {
  return [&plugins, &registry] { return LoadPlugins(plugins, registry); };
}

RerunFacts RerunFactsOf(const v1::Capsule& c, const ModelRegistry& registry) {
  RerunFacts f;
  f.model_registered = registry.Has(c.model().registry_name());
  f.torch_version_differs =
      !c.environment().torch_version().empty() && c.environment().torch_version() != TorchVersion();
  f.python_capsule = WrittenFromPython(c);
  f.weights_embedded = c.model().weight_policy() == v1::WEIGHTS_ALL;
  f.checkpoint_named = !f.weights_embedded && c.model().has_weights_reference();
  for (const auto& s : c.data().sequences()) f.tokens_redacted |= !s.token_ids_sha256().empty();
  return f;
}

}  // namespace capsule::cli
