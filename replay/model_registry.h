// ModelRegistry: how replay turns the model spec stored in a capsule back into a Model.
//
// A capsule names its model by a registry name ("tiny_gpt") and a construction config (JSON text);
// the registry maps the name to a factory that builds the Model from that spec. Models get into a
// registry statically (a trainer binary calls its own registration function, e.g.
// capsule::tiny_gpt::RegisterTinyGpt) or from a plugin the user names (replay/plugin_loader.h).
// Factories return initial weights; replay loads the captured weights afterwards.
//
//   capsule::ModelRegistry registry;
//   CAPSULE_RETURN_IF_ERROR(registry.Register("my_model", [](const capsule::ModelSpecInfo& spec) {
//     return MyModel::FromSpec(spec);     // StatusOr<std::unique_ptr<capsule::Model>>
//   }));
//   CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<capsule::Model> model, registry.Create(spec));
//
// Thread safety: all methods may be called concurrently. Create runs the factory outside the
// registry's lock, so a factory may itself use the registry; factories must be safe to call from
// any thread if the caller creates models concurrently.
#ifndef CAPSULE_REPLAY_MODEL_REGISTRY_H_
#define CAPSULE_REPLAY_MODEL_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/model.h"

namespace capsule {

// Builds a model from its spec (ModelSpecInfo::config_json is the model's own business). Errors
// should say what is wrong with the config; kInvalidArgument is the usual code.
using ModelFactory = std::function<StatusOr<std::unique_ptr<Model>>(const ModelSpecInfo&)>;

class ModelRegistry {
 public:
  ModelRegistry() = default;
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // kInvalidArgument for an empty name or an empty factory; kAlreadyExists when the name is taken
  // (the first registration stays).
  Status Register(std::string name, ModelFactory factory);

  // The factory for every name not registered: a user who names one factory for the capsule at
  // hand (`python3 -P -m capsule replay FILE --model pkg.module:factory`) means it for whatever
  // name the capsule recorded. kInvalidArgument for an empty factory; kAlreadyExists when one is
  // set.
  Status SetFallback(ModelFactory factory);

  // Builds the model spec.registry_name names (or, when that name is not registered, with the
  // fallback factory). kNotFound when there is neither (the message lists the registered names);
  // the factory's own error otherwise. A factory that throws or returns no model gives kInternal.
  StatusOr<std::unique_ptr<Model>> Create(const ModelSpecInfo& spec) const;

  // Registered names, sorted.
  std::vector<std::string> names() const;
  bool Has(const std::string& name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, ModelFactory> factories_;  // guarded by mu_
  ModelFactory fallback_;                          // guarded by mu_
};

}  // namespace capsule

#endif  // CAPSULE_REPLAY_MODEL_REGISTRY_H_
