// Model: one set of weights with two execution paths over them.
//
// A Model offers a REFERENCE path (FP64, plain ATen ops) and an OPTIMIZED path (the fused /
// low-precision code production runs) as LayerSequences with the same layer names, over the same
// parameters. Replay rebuilds a Model from the ModelSpec stored in the capsule through the model
// registry (replay/model_registry.h), loads the weights, and compares the two paths layer by layer.
//
//   std::unique_ptr<capsule::Model> model = MakeTinyGpt(config);
//   at::Tensor loss = capsule::RunSequence(model->Path(capsule::PathKind::kOptimized), batch);
//   auto params = model->NamedParameters();   // canonical weights, name order stable
//
// Thread safety: a Model is used from one thread at a time.
#ifndef CAPSULE_MODEL_MODEL_H_
#define CAPSULE_MODEL_MODEL_H_

#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/layer_sequence.h"

namespace capsule {

// What replay needs to rebuild a model: its registry name and its construction config (a JSON
// object as text). Mirrors capsule.v1.ModelSpec.
struct ModelSpecInfo {
  std::string registry_name;
  std::string config_json;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual LayerSequence& Path(PathKind kind) = 0;

  // All trainable parameters (the master copies both paths read), with module-path names. Order
  // need not be sorted; hashing sorts by name.
  virtual std::vector<NamedTensor> NamedParameters() const = 0;

  // What replay rebuilds the model from, alone: the registry name and every setting that changes
  // what either path computes, runtime state included (a step-dependent schedule, a one-shot
  // fault flag). Write config_json with SpecConfig (model/spec_config.h).
  virtual ModelSpecInfo Spec() const = 0;

  // Copies values into the parameters by name (replay loads captured weights this way). Every
  // parameter must be present once, with its shape, and no other name may be given; dtype and
  // device are converted. kInvalidArgument naming the first problem otherwise, and nothing is
  // copied then. The default does exactly this over NamedParameters() (whose tensors must be the
  // model's own, not copies), under at::NoGradGuard: override it only to load differently.
  virtual Status LoadParameters(const std::vector<NamedTensor>& params);
};

}  // namespace capsule

#endif  // CAPSULE_MODEL_MODEL_H_
