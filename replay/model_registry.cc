#include "capsule/replay/model_registry.h"

#include <c10/util/Exception.h>

#include <exception>
#include <utility>

namespace capsule {

Status ModelRegistry::Register(std::string name, ModelFactory factory) {
  if (name.empty()) return InvalidArgumentError("model registry: empty model name");
  if (!factory) {
    return InvalidArgumentError("model registry: model '" + name + "' has no factory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!factories_.emplace(name, std::move(factory)).second) {
    return Status(StatusCode::kAlreadyExists,
                  "model registry: model '" + name + "' is already registered");
  }
  return Status::Ok();
}

Status ModelRegistry::SetFallback(ModelFactory factory) {
  if (!factory) return InvalidArgumentError("model registry: the fallback has no factory");
  std::lock_guard<std::mutex> lock(mu_);
  if (fallback_) {
    return Status(StatusCode::kAlreadyExists, "model registry: a fallback factory is already set");
  }
  fallback_ = std::move(factory);
  return Status::Ok();
}

StatusOr<std::unique_ptr<Model>> ModelRegistry::Create(const ModelSpecInfo& spec) const {
  ModelFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = factories_.find(spec.registry_name);
    factory = it != factories_.end() ? it->second : fallback_;
  }
  if (!factory) {
    std::string registered;
    for (const std::string& name : names()) {
      registered += (registered.empty() ? "" : ", ") + name;
    }
    if (registered.empty()) registered = "none";
    return NotFoundError("model '" + spec.registry_name +
                         "' is not registered; registered: " + registered);
  }
  // Factories may come from a plugin: nothing they throw may escape into the caller.
  const std::string where = "model '" + spec.registry_name + "': ";
  try {
    StatusOr<std::unique_ptr<Model>> model = factory(spec);
    if (!model.ok()) return model.status();
    if (*model == nullptr) return InternalError(where + "factory returned no model");
    return model;
  } catch (const c10::Error& e) {
    return InternalError(where + "factory failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InternalError(where + "factory failed: " + e.what());
  } catch (...) {
    return InternalError(where + "factory failed with an unknown exception");
  }
}

std::vector<std::string> ModelRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(factories_.size());
  for (const auto& [name, factory] : factories_) out.push_back(name);
  return out;
}

bool ModelRegistry::Has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return factories_.count(name) != 0 || static_cast<bool>(fallback_);
}

}  // namespace capsule
