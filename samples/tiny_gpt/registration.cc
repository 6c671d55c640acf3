#include "samples/tiny_gpt/registration.h"

#include <cstdlib>
#include <memory>
#include <string_view>
#include <utility>

#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule::tiny_gpt {

namespace {

// Whether $CAPSULE_TINY_GPT_FIXED lists `kind` (registration.h).
bool FixedInThisBuild(FaultKind kind) {
  const char* env = std::getenv("CAPSULE_TINY_GPT_FIXED");
  if (env == nullptr || kind == FaultKind::kNone) return false;
  std::string_view list(env);
  while (!list.empty()) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == FaultKindName(kind)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

void RegisterTinyGpt(ModelRegistry& registry) {
  // The only possible error is kAlreadyExists; the first registration of the name then stays, as
  // documented, so there is nothing to report.
  (void)registry.Register(
      kRegistryName, [](const ModelSpecInfo& spec) -> StatusOr<std::unique_ptr<Model>> {
        CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<TinyGpt> model, TinyGpt::FromSpec(spec));
        if (FixedInThisBuild(model->fault().kind)) {
          CAPSULE_RETURN_IF_ERROR(model->SetFault(FaultSpec{}));
        }
        return std::unique_ptr<Model>(std::move(model));
      });
}

}  // namespace capsule::tiny_gpt
