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

#include <cstddef>
#include <cstdint>
#include <optional>
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

// What the inputs of one layer may legally be, so that `capsule stress` (replay/stress.h) can
// generate inputs beside the captured one without feeding the layer something it never gets.
// Dimensions are those of the layer's input 0; the batch tensors' dims 0 and 1 (tokens, labels,
// masks) follow batch_dim and length_dim.
struct LayerInputSpec {
  int64_t batch_dim = -1;   // a dimension of any size >= 1; -1: none may vary
  int64_t length_dim = -1;  // a sequence dimension of size 1..max_length; -1: none
  int64_t max_length = 0;
  // The optimized kernels' tile along length_dim, when they have one: stress probes 1, tile - 1,
  // tile, tile + 1 and the other boundaries up to max_length. 0: only odd and extreme lengths.
  int64_t tile = 0;
  // The largest legal magnitude of an input element; 0: the square root of the compute dtype's
  // largest finite value (products of two legal values stay finite).
  double max_abs = 0;
  bool nonfinite_legal = false;       // whether +-Inf may come in (then it is generated too)
  bool reads_attention_mask = false;  // all-masked and single-token rows are generated then
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

  // State that is not trained but changes what the model computes (BatchNorm running statistics
  // and its batch count), with module-path names; the model's own tensors, not copies. Capture
  // embeds it and puts it back after its re-run (which would move running statistics), and replay
  // loads it before running either path. Not part of the canonical model hash. Default: none.
  virtual std::vector<NamedTensor> NamedBuffers() const { return {}; }

  // Copies values into NamedBuffers() by name, under at::NoGradGuard. A subset may be given (a
  // layer extract carries its layer's buffers only); kInvalidArgument for a name the model lacks
  // or a shape that differs, and nothing is copied then.
  virtual Status LoadBuffers(const std::vector<NamedTensor>& buffers);

  // Named optimization switches of the OPTIMIZED path ("fused_softmax", "bf16_matmul"): each
  // swaps a plain implementation of the same math for an optimized one. Replay's features bisect
  // (`capsule replay --bisect=features`) turns them on and off to name the switch that makes a
  // layer diverge. The order is the model's own (bisect searches prefixes of it). Default: none.
  virtual std::vector<std::string> FeatureSwitches() const { return {}; }
  // The switches on now (all of them unless the trainer or Spec() said otherwise).
  virtual std::vector<std::string> EnabledFeatures() const { return FeatureSwitches(); }
  // Turns on exactly `enabled` and the other switches off; the change is part of Spec().
  // kInvalidArgument naming an unknown switch, and nothing changes then. The default accepts only
  // the set already on (kUnimplemented otherwise): a model with switches overrides it.
  virtual Status SetEnabledFeatures(const std::vector<std::string>& enabled);

  // What layer i's inputs may be (LayerInputSpec); nullopt when the model does not say, and stress
  // then keeps the captured shape.
  virtual std::optional<LayerInputSpec> LayerInputs(size_t i) const;
};

}  // namespace capsule

#endif  // CAPSULE_MODEL_MODEL_H_
