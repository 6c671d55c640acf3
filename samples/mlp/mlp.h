// A two-layer MLP on float features, written against the installed capsule package the way a
// user's own model would be: the math, plus what capsule needs to record and replay it.
#ifndef CAPSULE_SAMPLES_MLP_MLP_H_
#define CAPSULE_SAMPLES_MLP_MLP_H_

#include <memory>

#include "capsule/model/model.h"

namespace mlp {

struct Config {
  int64_t in = 8, hidden = 32, out = 1, seed = 1;
  double fault_scale = 1.0;  // != 1 scales fc2's output on the optimized path: a planted bug
};

std::unique_ptr<capsule::Model> MakeMlp(const Config& config);

// For a ModelRegistry (the plugin) and for the trainer.
capsule::StatusOr<std::unique_ptr<capsule::Model>> MlpFromSpec(const capsule::ModelSpecInfo& spec);

}  // namespace mlp

#endif  // CAPSULE_SAMPLES_MLP_MLP_H_
