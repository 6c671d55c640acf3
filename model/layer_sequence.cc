#include "capsule/model/layer_sequence.h"

namespace capsule {

const char* PathKindName(PathKind kind) {
  return kind == PathKind::kReference ? "reference" : "optimized";
}

at::Tensor RunSequence(LayerSequence& seq, const LayerBatch& batch) {
  TensorList x = {batch.ModelInput()};
  for (size_t i = 0; i < seq.size(); ++i) x = seq.Forward(i, x, batch);
  return x.at(0);
}

}  // namespace capsule
