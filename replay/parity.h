// Parity: does a model's incremental decoder compute what its whole-sequence forward computes?
//
// The REFERENCE path (FP64, eval mode) runs the batch's whole sequence once; that is what every
// position of every layer should be. The model's IncrementalDecoder (model/decoder.h) then runs
// each layer on that layer's reference input, as inference would: positions [0, prefill) in
// chunks, then one token per step over the layer's cache. Each layer gets the reference input, so
// an error does not propagate from one layer to the next, and each position is compared on its
// own with the comparator's rule and the decoder's dtype tolerance (replay/comparator.h). The
// first divergent position, and at it the first divergent layer, name where inference departs
// from training; the layer's cached tensors (position ids, keys, values) and attention weights,
// compared the same way, say which of them departs first, and a named check reads the cause from
// them (cli/capsule.md, PARITY CHECKS). The decoder runs twice from different random states: in
// eval mode the runs must agree bit for bit. In adapter mode the decoder runs with its low-rank
// adapters merged into the weights (in FP32 or the target dtype) against the reference applying
// them at run time, and each merged weight is measured against base + scale * B @ A.
// The result is data (capsule.v1.ParityReport), facts and no sentences; report/parity_text.h
// renders it.
//
//   capsule::ParityOptions options;
//   options.prefill = 8;   // then one token per step
//   CAPSULE_ASSIGN_OR_RETURN(capsule::v1::ParityReport r, capsule::RunParity(model, batch,
//   options)); if (r.diverged()) std::cout << r.first_divergent_position() << " " <<
//   r.first_divergent_layer();
//
// Thread safety: one parity run at a time per process (it draws from and restores LibTorch's
// default generator).
#ifndef CAPSULE_REPLAY_PARITY_H_
#define CAPSULE_REPLAY_PARITY_H_

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>

#include "capsule/base/status.h"
#include "capsule/model/decoder.h"
#include "capsule/model/layer_sequence.h"
#include "capsule/model/model.h"
#include "capsule/replay/comparator.h"

namespace capsule::v1 {
class ParityReport;
}  // namespace capsule::v1

namespace capsule {

struct ParityOptions {
  // Positions run before token-by-token decoding, in 1..T (T: the batch's sequence length); T
  // compares a chunked prefill with the whole sequence. 0 (default): T / 2, at least 1.
  int64_t prefill = 0;
  // Prefill chunk size; 0 (default): the whole prefill in one step.
  int64_t chunk = 0;
  // Tolerances (dtype default of the decoder, global and per-layer overrides). max_fail_fraction
  // and atol_scale apply as in the layerwise replay.
  CompareOptions compare;
  // Adapter mode: the decoder merges its low-rank adapters into their weights, stored in this
  // dtype (inference's target dtype: at::kFloat, at::kBFloat16), and is judged with that dtype's
  // default tolerance unless `compare` sets one; the REFERENCE path applies them at run time in
  // FP64. std::nullopt (default): the decoder applies them at run time too.
  std::optional<at::ScalarType> adapter_merge;
};

// Named checks, in the order they are tried at the first divergence (cli/capsule.md). The
// adapter checks read the merged weights, not activations: in adapter mode they also run without
// a divergence, and then report only what fails.
inline constexpr char kCheckAdapterMergedTwice[] = "adapter.merged_twice";
inline constexpr char kCheckAdapterRounding[] = "adapter.merge_rounding";
inline constexpr char kCheckEvalDropout[] = "eval.dropout";
inline constexpr char kCheckPositionIds[] = "position_ids.padding";
inline constexpr char kCheckRerotatedKey[] = "cache.rerotated_key";
inline constexpr char kCheckRopePosition[] = "rope.absolute_position";
inline constexpr char kCheckCachedValue[] = "cache.value";
inline constexpr char kCheckMaskOffset[] = "attention.causal_mask_offset";
inline constexpr char kCheckKvHeadMap[] = "attention.kv_head_map";
inline constexpr char kCheckAttentionScores[] = "attention.scores";
inline constexpr char kCheckLayerOutput[] = "layer.output";

// How a merged weight departs from base + scale * b @ a, all in FP64 (delta: scale * b @ a).
struct AdapterMergeError {
  // <merged - base, delta> / <delta, delta>: 1 for a merge, 2 for a delta added twice, 0 for none.
  double delta_ratio = 0;
  double max_abs_err = 0;  // max |merged - (base + delta)|
  // max |merged - (base + delta)| / (eps * (|base| + scale * |b| @ |a|)), eps of the dtype the
  // merge is judged in: a merge that rounds each of its operations once in that dtype stays
  // within `bound`; one rounded in a coarser dtype does not.
  double rounding_eps = 0;
  double eps = 0;
  double bound = 0;  // rank + 2
};

// kInvalidArgument when adapter.merged is undefined or the shapes do not fit base [out, in],
// a [rank, in], b [out, rank]. May throw c10::Error.
StatusOr<AdapterMergeError> MeasureAdapterMerge(const LowRankAdapter& adapter,
                                                at::ScalarType dtype);

// kInvalidArgument: the model has no incremental decoder (capsule::Decodable), the batch has no
// input_ids [B, T], prefill / chunk are out of range, or adapter_merge is set for a decoder
// without adapters or is not a floating dtype; kInternal when LibTorch fails.
StatusOr<v1::ParityReport> RunParity(Model& model, const LayerBatch& batch,
                                     const ParityOptions& options);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_PARITY_H_
