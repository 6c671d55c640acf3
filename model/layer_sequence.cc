#include "capsule/model/layer_sequence.h"

namespace capsule {

const char* PathKindName(PathKind kind) {
  return kind == PathKind::kReference ? "reference" : "optimized";
}

TensorList FirstLayerInput(const LayerSequence& seq, const LayerBatch& batch) {
  const at::Tensor& x = batch.ModelInput();
  if (x.defined() && x.is_floating_point() && seq.compute_dtype() == at::kDouble &&
      x.scalar_type() != at::kDouble) {
    return {x.detach().to(at::kDouble)};
  }
  return {x};
}

TensorList PrivateCopy(const TensorList& xs) {
  TensorList out;
  out.reserve(xs.size());
  for (const at::Tensor& x : xs) {
    out.push_back(x.defined() && x.is_floating_point() ? x.clone() : x);
  }
  return out;
}

at::Tensor RunSequence(LayerSequence& seq, const LayerBatch& batch) {
  TensorList x = FirstLayerInput(seq, batch);
  for (size_t i = 0; i < seq.size(); ++i) x = seq.Forward(i, PrivateCopy(x), batch);
  return x.at(0);
}

}  // namespace capsule
