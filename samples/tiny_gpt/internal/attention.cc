#include "samples/tiny_gpt/internal/attention.h"

#include <ATen/ATen.h>

#include <limits>

namespace capsule::tiny_gpt::internal {

at::Tensor PositionIds(const at::Tensor& mask, int64_t batch, int64_t past, int64_t t) {
  if (!mask.defined()) {
    return at::arange(past, past + t, at::kLong).unsqueeze(0).expand({batch, t});
  }
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == batch && mask.size(1) == past + t,
              "tiny_gpt: attention_mask must be [batch, past + T] = [", batch, ", ", past + t,
              "], got ", mask.sizes());
  const at::Tensor real = mask.ne(0).to(at::kLong).cumsum(1) - 1;
  return real.slice(1, past, past + t).clamp_min(0);
}

Qkv SplitQkv(const at::Tensor& projected, const TinyGptConfig& c) {
  const int64_t b = projected.size(0);
  const int64_t t = projected.size(1);
  const int64_t dh = c.d_model / c.n_heads;
  const int64_t kv = c.kv_heads();
  if (kv == c.n_heads) {
    const at::Tensor parts = projected.view({b, t, 3, c.n_heads, dh}).permute({2, 0, 3, 1, 4});
    return {parts[0], parts[1], parts[2]};
  }
  const std::vector<at::Tensor> parts =
      projected.split_with_sizes({c.n_heads * dh, kv * dh, kv * dh}, -1);
  auto heads = [&](const at::Tensor& x, int64_t h) {
    return x.reshape({b, t, h, dh}).transpose(1, 2);
  };
  return {heads(parts[0], c.n_heads), heads(parts[1], kv), heads(parts[2], kv)};
}

at::Tensor Rope(const at::Tensor& x, const at::Tensor& positions, const TinyGptConfig& c) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor inv_freq =
      at::pow(c.rope_base, at::arange(0, half, at::kDouble) * (-2.0 / x.size(-1)));
  const at::Tensor angles =
      (positions.to(at::kDouble) / c.rope_scale).unsqueeze(-1) * inv_freq;  // [B, T, half]
  const at::Tensor cos = angles.cos().unsqueeze(1).to(x.scalar_type());
  const at::Tensor sin = angles.sin().unsqueeze(1).to(x.scalar_type());
  const at::Tensor x1 = x.slice(-1, 0, half);
  const at::Tensor x2 = x.slice(-1, half, 2 * half);
  return at::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

at::Tensor ExpandKv(const at::Tensor& kv, int64_t heads, bool modulo) {
  const int64_t kv_heads = kv.size(1);
  if (kv_heads == heads) return kv;
  const int64_t group = heads / kv_heads;
  at::Tensor map = at::arange(heads, at::kLong);
  map = modulo ? map.remainder(kv_heads) : map.div(group, "floor");
  return kv.index_select(1, map);
}

at::Tensor HidePaddedKeys(const at::Tensor& scores, const at::Tensor& key_mask) {
  const at::Tensor padded = key_mask.eq(0).unsqueeze(1).unsqueeze(1);  // [B, 1, 1, Tk]
  return scores.masked_fill(padded, kPaddedScore);
}

at::Tensor OffsetCausalSoftmax(const at::Tensor& scores, double scale, int64_t offset) {
  const int64_t tq = scores.size(-2);
  const int64_t tk = scores.size(-1);
  const at::Tensor hidden = at::ones({tq, tk}, scores.options().dtype(at::kBool)).triu(offset + 1);
  return at::softmax((scores * scale).masked_fill(hidden, -std::numeric_limits<double>::infinity()),
                     -1);
}

at::Tensor MergeHeads(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

at::Tensor AdaptedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                         const at::Tensor& a, const at::Tensor& b, double scale) {
  const at::Tensor y = at::linear(x, w.to(x.scalar_type()), bias.to(x.scalar_type()));
  if (!a.defined()) return y;
  const at::Tensor low = at::linear(x, a.to(x.scalar_type()));
  return y + scale * at::linear(low, b.to(x.scalar_type()));
}

}  // namespace capsule::tiny_gpt::internal
