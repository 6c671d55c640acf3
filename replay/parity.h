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
// eval mode the runs must agree bit for bit.
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

#include <cstdint>

#include "capsule/base/status.h"
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
};

// Named checks, in the order they are tried at the first divergence (cli/capsule.md).
inline constexpr char kCheckEvalDropout[] = "eval.dropout";
inline constexpr char kCheckPositionIds[] = "position_ids.padding";
inline constexpr char kCheckRerotatedKey[] = "cache.rerotated_key";
inline constexpr char kCheckRopePosition[] = "rope.absolute_position";
inline constexpr char kCheckCachedValue[] = "cache.value";
inline constexpr char kCheckMaskOffset[] = "attention.causal_mask_offset";
inline constexpr char kCheckKvHeadMap[] = "attention.kv_head_map";
inline constexpr char kCheckAttentionScores[] = "attention.scores";
inline constexpr char kCheckLayerOutput[] = "layer.output";

// kInvalidArgument: the model has no incremental decoder (capsule::Decodable), the batch has no
// input_ids [B, T], or prefill / chunk are out of range; kInternal when LibTorch fails.
StatusOr<v1::ParityReport> RunParity(Model& model, const LayerBatch& batch,
                                     const ParityOptions& options);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_PARITY_H_
