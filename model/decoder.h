// IncrementalDecoder: how a model that generates token by token is described to capsule.
//
// Training runs a whole sequence at once; inference runs a prefill (the prompt, whole or in
// chunks) and then one token per step, each layer reading and extending a cache of the keys,
// values and position ids it has seen. Both must compute the same thing, and the places where
// they do not (a causal mask that ignores the cache's offset, rotary positions counted from the
// chunk instead of the sequence, a cache whose keys are rotated twice, a grouped-query head map
// that only the decode loop gets wrong, position ids that forget left padding, dropout left on)
// are what replay's parity mode (replay/parity.h) names. A model offers an IncrementalDecoder
// beside its two LayerSequences by also deriving from Decodable; its layers are the paths' layers
// without the loss.
// The contract parity relies on:
// - ForwardStep(i, ...) runs layer i on the new tokens of `step` (positions [past, past + T) of
//   the sequence) and appends what layer i caches for them; layer 0 receives {step.input_ids}.
// - Cache(i) is what layer i holds after the steps so far: {"pos", "k", "v"} with the position
//   dimension last but one for k and v ([B, H_kv, past, d_head]) and last for pos ([B, past]);
//   empty for a layer without a cache. Probe(i) is what the last step's attention weighed:
//   {"attn", [B, H, T, past + T]}, or empty.
// - ReferenceTrace(i, inputs, batch) is the same for the whole sequence on the REFERENCE path
//   (FP64, eval mode), from layer i's full-sequence input: cache tensors over every position and
//   "attn" [B, H, T, T].
// - Adapters(i) / MergeAdapters(dtype), for a model with low-rank adapters: the REFERENCE path
//   applies them at run time; merged, the decoder runs with the merged weights Adapters(i) shows.
//
//   capsule::IncrementalDecoder& dec = dynamic_cast<capsule::Decodable&>(model).Decoder();
//   dec.ResetCache();
//   capsule::DecodeStep step{prompt_ids, mask, /*past=*/0};
//   capsule::TensorList x = {step.input_ids};
//   for (size_t i = 0; i < dec.size(); ++i) x = dec.ForwardStep(i, x, step);
//
// Thread safety: an IncrementalDecoder is used from one thread at a time.
#ifndef CAPSULE_MODEL_DECODER_H_
#define CAPSULE_MODEL_DECODER_H_

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "capsule/model/layer_sequence.h"

namespace capsule {

// The new tokens of one prefill chunk or decode step.
struct DecodeStep {
  at::Tensor input_ids;       // int64 [batch, T]: the new tokens
  at::Tensor attention_mask;  // optional [batch, past + T] 0/1 over every position so far
  int64_t past = 0;           // positions already in the cache
};

// A low-rank (LoRA-style) adapter on one weight of a layer: the layer computes with
// base + scale * b @ a, the adapter applied at run time or merged into the weight.
struct LowRankAdapter {
  std::string weight;  // the adapted parameter, as NamedParameters() names it
  at::Tensor base;     // [out, in]
  at::Tensor a;        // [rank, in]
  at::Tensor b;        // [out, rank]
  double scale = 1;    // alpha / rank
  at::Tensor merged;   // the weight the decoder runs with; undefined while applied at run time
};

class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;

  // The layers, named as the model's paths name them (without the loss).
  virtual size_t size() const = 0;
  virtual std::string name(size_t i) const = 0;
  // The floating dtype the decoder computes in.
  virtual at::ScalarType compute_dtype() const = 0;

  // Empties every layer's cache.
  virtual void ResetCache() = 0;
  // Runs layer i on the new tokens of `step`. May throw c10::Error.
  virtual TensorList ForwardStep(size_t i, const TensorList& inputs, const DecodeStep& step) = 0;
  virtual std::vector<NamedTensor> Cache(size_t i) const = 0;
  virtual std::vector<NamedTensor> Probe(size_t i) const = 0;
  // Layer i's cache and attention over the whole sequence, from the REFERENCE path in FP64 and
  // eval mode, given layer i's full-sequence input. May throw c10::Error.
  virtual std::vector<NamedTensor> ReferenceTrace(size_t i, const TensorList& inputs,
                                                  const LayerBatch& batch) = 0;

  // Layer i's adapters; none by default.
  virtual std::vector<LowRankAdapter> Adapters(size_t /*i*/) const { return {}; }
  // Merges every adapter into its weight, the merged weight stored in `dtype` (inference's
  // target dtype: at::kFloat, at::kBFloat16); std::nullopt applies them at run time again (the
  // default state). Adapters() then carries the merged weights. May throw c10::Error.
  virtual void MergeAdapters(std::optional<at::ScalarType> /*dtype*/) {}
};

// A model that can decode incrementally (a Model that also derives from this).
class Decodable {
 public:
  virtual ~Decodable() = default;
  virtual IncrementalDecoder& Decoder() = 0;
};

}  // namespace capsule

#endif  // CAPSULE_MODEL_DECODER_H_
