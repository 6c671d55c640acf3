// The attention pieces tiny_gpt's three ways of running a block share: position ids, rotary
// embeddings, grouped-query heads and padding. The training paths run them over a whole
// sequence; the incremental decoder over the new tokens of one step against its cache. With every
// inference option off (TinyGptConfig) they reduce to the operations the paths ran before the
// options existed, so earlier capsules replay to the same bits.
//
//   at::Tensor pos = PositionIds(mask, batch, /*past=*/0, t);
//   Qkv parts = SplitQkv(at::linear(h, w, b), config);
//   at::Tensor q = Rope(parts.q, pos, config);
//
// Thread safety: pure functions.
#ifndef CAPSULE_SAMPLES_TINY_GPT_INTERNAL_ATTENTION_H_
#define CAPSULE_SAMPLES_TINY_GPT_INTERNAL_ATTENTION_H_

#include <ATen/Tensor.h>

#include <cstdint>

#include "samples/tiny_gpt/tiny_gpt_config.h"

namespace capsule::tiny_gpt::internal {

// What a padded key's score is set to before the softmax: finite, so that a row whose every key
// is padding (a left-pad query) stays a uniform distribution instead of NaN.
inline constexpr double kPaddedScore = -1e30;

// int64 [B, T]: the positions of the new tokens [past, past + T) of a step. With a mask
// ([B, past + T], 0 on padding) the number of real tokens before each one, so left padding does
// not shift the prompt; without one, past + j.
at::Tensor PositionIds(const at::Tensor& mask, int64_t batch, int64_t past, int64_t t);

// q [B, H, T, dh], k and v [B, H_kv, T, dh] of a block's qkv projection [B, T, (H + 2 H_kv) dh].
struct Qkv {
  at::Tensor q, k, v;
};
Qkv SplitQkv(const at::Tensor& projected, const TinyGptConfig& config);

// x [B, heads, T, dh] rotated by `positions` [B, T] (rotary embeddings, the half-split form):
// pairs (x_i, x_{i + dh/2}) turn by position / rope_scale * rope_base^(-2i/dh).
at::Tensor Rope(const at::Tensor& x, const at::Tensor& positions, const TinyGptConfig& config);

// kv [B, H_kv, Tk, dh] widened to the query heads [B, H, Tk, dh]: query head h reads kv head
// h / (H / H_kv), or h % H_kv with `modulo` (the decode fault gqa-decode-map).
at::Tensor ExpandKv(const at::Tensor& kv, int64_t heads, bool modulo = false);

// scores [B, H, Tq, Tk] with the keys whose mask entry ([B, Tk]) is 0 set to kPaddedScore.
at::Tensor HidePaddedKeys(const at::Tensor& scores, const at::Tensor& key_mask);

// softmax_j(scale * scores[..., i, j]) over keys j <= i + offset (the causal mask of a step whose
// queries start `offset` keys in), 0 elsewhere; any floating dtype.
at::Tensor OffsetCausalSoftmax(const at::Tensor& scores, double scale, int64_t offset);

// [B, H, T, dh] -> [B, T, H dh].
at::Tensor MergeHeads(const at::Tensor& x);

// x @ w^T + bias, plus scale * (x @ a^T) @ b^T when a [rank, in] is defined: a low-rank adapter
// (b [out, rank]) applied at run time. Computes in x's dtype.
at::Tensor AdaptedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                         const at::Tensor& a, const at::Tensor& b, double scale);

}  // namespace capsule::tiny_gpt::internal

#endif  // CAPSULE_SAMPLES_TINY_GPT_INTERNAL_ATTENTION_H_
