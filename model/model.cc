#include "capsule/model/model.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace capsule {

Status Model::LoadParameters(const std::vector<NamedTensor>& params) {
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, tensor] : params) {
    if (!given.emplace(name, &tensor).second) {
      return InvalidArgumentError("parameter '" + name + "' given twice");
    }
  }
  const std::vector<NamedTensor> own = NamedParameters();
  std::map<std::string, const at::Tensor*> expected;
  for (const auto& [name, tensor] : own) expected.emplace(name, &tensor);
  for (const auto& [name, tensor] : given) {
    if (expected.count(name) == 0) return InvalidArgumentError("unknown parameter '" + name + "'");
  }
  // Every check before the first copy: a refused load changes nothing.
  for (const auto& [name, master] : own) {
    const auto it = given.find(name);
    if (it == given.end()) return InvalidArgumentError("parameter '" + name + "' is missing");
    const at::Tensor& value = *it->second;
    if (!value.defined() || value.sizes() != master.sizes()) {
      std::ostringstream message;
      message << "parameter '" << name << "' has shape "
              << (value.defined() ? value.sizes() : at::IntArrayRef{}) << ", expected "
              << master.sizes();
      return InvalidArgumentError(message.str());
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, master] : own) {
    at::Tensor target = master;  // shares the parameter's storage
    target.copy_(*given.at(name));
  }
  return Status::Ok();
}

Status Model::LoadBuffers(const std::vector<NamedTensor>& buffers) {
  const std::vector<NamedTensor> own = NamedBuffers();
  std::map<std::string, const at::Tensor*> expected;
  for (const auto& [name, tensor] : own) expected.emplace(name, &tensor);
  for (const auto& [name, value] : buffers) {
    const auto it = expected.find(name);
    if (it == expected.end()) return InvalidArgumentError("unknown buffer '" + name + "'");
    if (!value.defined() || value.sizes() != it->second->sizes()) {
      std::ostringstream message;
      message << "buffer '" << name << "' has shape "
              << (value.defined() ? value.sizes() : at::IntArrayRef{}) << ", expected "
              << it->second->sizes();
      return InvalidArgumentError(message.str());
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, value] : buffers) {
    at::Tensor target = *expected.at(name);  // shares the buffer's storage
    target.copy_(value);
  }
  return Status::Ok();
}

Status Model::SetEnabledFeatures(const std::vector<std::string>& enabled) {
  const std::vector<std::string> known = FeatureSwitches();
  for (const std::string& name : enabled) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return InvalidArgumentError("the model has no optimization switch '" + name + "'");
    }
  }
  const std::vector<std::string> on = EnabledFeatures();
  if (std::set<std::string>(enabled.begin(), enabled.end()) !=
      std::set<std::string>(on.begin(), on.end())) {
    return UnimplementedError("the model lists optimization switches but cannot turn them");
  }
  return Status::Ok();
}

std::optional<LayerInputSpec> Model::LayerInputs(size_t /*i*/) const { return std::nullopt; }

}  // namespace capsule
