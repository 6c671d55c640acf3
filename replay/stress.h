// Stress: one layer's reference and optimized paths over a generated matrix of inputs beside the
// captured one, forward and backward.
//
// Replay names the first bad layer for the captured input; stress asks which inputs the layer's
// optimized kernels get wrong. From the layer's captured input (the REFERENCE path's, as replay's
// layerwise stage feeds it) it generates, within what the model declares legal
// (Model::LayerInputs):
//   shape      lengths 1, 2, tile - 1, tile, tile + 1, ... up to the declared maximum, and a batch
//              of one (the captured rows repeated or cut; the batch tensors follow);
//   magnitude  the input scaled to the largest legal magnitude, to subnormals and to zeros; one
//              element at the largest magnitude; +-Inf when declared legal;
//   layout     the same values in transposed, sliced (every other element of a larger buffer)
//              and expanded (stride 0 over the batch) memory;
//   mask       an all-masked row and a single-token row, when the layer reads the attention mask.
// Both paths get the same values (rounded to the optimized dtype first). Forward compares the
// first output with replay's layerwise tolerances; backward compares the gradients of the input
// and of the layer's parameters for one fixed upstream gradient (atol a fraction of each reference
// gradient's largest magnitude). A case on which a path throws counts as diverged.
//
//   StressOptions options;
//   options.layer = "blocks.2";
//   CAPSULE_ASSIGN_OR_RETURN(v1::StressReport r, StressLayer(capsule, registry, options));
//   for (const auto& c : r.results()) if (c.diverged()) std::cout << c.name() << "\n";
//
// Thread safety: as ReplayCapsule.
#ifndef CAPSULE_REPLAY_STRESS_H_
#define CAPSULE_REPLAY_STRESS_H_

#include <functional>
#include <string>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/replay/comparator.h"
#include "capsule/replay/model_registry.h"

namespace capsule::v1 {
class StressReport;
}  // namespace capsule::v1

namespace capsule {

struct StressOptions {
  std::string layer;                                 // a layer name of the model ("blocks.2")
  bool forward = true;                               // compare outputs
  bool backward = true;                              // compare input and parameter gradients
  CompareOptions compare;                            // as replay's layerwise comparison
  bool force = false;                                // go on despite a torch version mismatch
  std::function<void(const std::string&)> progress;  // one line per case
};

// kNotFound: no such layer (the message lists them) or model not registered; kFailedPrecondition:
// weights not embedded, tokens redacted, another torch version without force.
StatusOr<v1::StressReport> StressLayer(const v1::Capsule& capsule, const ModelRegistry& registry,
                                       const StressOptions& options);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_STRESS_H_
