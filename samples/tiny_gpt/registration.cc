#include "samples/tiny_gpt/registration.h"

#include <memory>
#include <utility>

#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule::tiny_gpt {

void RegisterTinyGpt(ModelRegistry& registry) {
  // The only possible error is kAlreadyExists; the first registration of the name then stays, as
  // documented, so there is nothing to report.
  (void)registry.Register(
      kRegistryName, [](const ModelSpecInfo& spec) -> StatusOr<std::unique_ptr<Model>> {
        CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<TinyGpt> model, TinyGpt::FromSpec(spec));
        return std::unique_ptr<Model>(std::move(model));
      });
}

}  // namespace capsule::tiny_gpt
