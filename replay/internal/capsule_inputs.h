// What the replayer and the extractor both read out of a capsule and both do to LibTorch's global
// state before running a layer. Internal to capsule::replay.
#ifndef CAPSULE_REPLAY_INTERNAL_CAPSULE_INPUTS_H_
#define CAPSULE_REPLAY_INTERNAL_CAPSULE_INPUTS_H_

#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/model/layer_sequence.h"
#include "capsule/model/model.h"

namespace capsule::v1 {
class TensorBlob;
class LayerComparison;
}  // namespace capsule::v1

namespace capsule {
struct TensorComparison;
}  // namespace capsule

namespace capsule::internal {

// kInternal with what LibTorch said, prefixed by `what`.
Status FromTorch(const c10::Error& e, const std::string& what);

const v1::TensorBlob* FindTensor(const v1::Capsule& c, const std::string& name);

// The batch tensors the capsule embeds (input_ids, labels, attention_mask, loss_mask); absent ones
// stay undefined.
StatusOr<LayerBatch> LoadBatchTensors(const v1::Capsule& c);

// Whether a batch loaded from `c` can be run: kFailedPrecondition when the capsule's token ids
// were redacted (only their SHA-256 is kept), kInvalidArgument when it never held input_ids.
Status RequireInputIds(const v1::Capsule& c, const LayerBatch& batch);

// The PARAMETER tensors the capsule embeds, by name, in capsule order.
StatusOr<std::vector<NamedTensor>> ParameterTensors(const v1::Capsule& c);

// The embedded model buffers (role BUFFER: BatchNorm's running statistics), loaded into `model`
// (Model::LoadBuffers); OK when there are none.
Status LoadCapsuleBuffers(const v1::Capsule& c, Model& model);

// How `params`, a model's whole state read from `source` ("the capsule", a file), differ from the
// weights the capsule recorded, by canonical model hash: "weights from SOURCE have model sha256
// 1a2b…, the capsule was recorded with 3c4d…"; empty when they agree or the capsule records no
// hash. One hash pass over the tensors and no model: replay and extract ask it before they build
// a model from the capsule's config.
StatusOr<std::string> ModelHashMismatch(const v1::Capsule& c,
                                        const std::vector<NamedTensor>& params,
                                        const std::string& source);

// The CPUs this process may run on (its affinity mask), at least 1.
int UsableCpus();

// Refuses (kFailedPrecondition) a capsule recorded with another torch version unless `force`, in
// which case the mismatch is appended to `warnings`; then sets the captured intra-op thread count
// (reductions depend on it), at most UsableCpus() (a warning says when it is fewer), and the
// deterministic-algorithms flag.
Status PinEnvironment(const v1::Capsule& c, bool force, std::vector<std::string>* warnings);

// A layer's tensors cast to a path's compute dtype: floating tensors change dtype, index tensors
// (token ids) stay. Detached copies: each layerwise run starts from fixed inputs.
TensorList CastTo(const TensorList& xs, at::ScalarType dtype, bool requires_grad = false);

// Copies a comparison's metrics and verdict into the replay result.
void FillComparison(const TensorComparison& t, v1::LayerComparison* out);

}  // namespace capsule::internal

#endif  // CAPSULE_REPLAY_INTERNAL_CAPSULE_INPUTS_H_
