// Operators of tiny_gpt's layers, in the two flavours its execution paths use.
//
// The REFERENCE flavour is a composition of plain ATen ops, meant to run in FP64 and to be
// obviously correct. The FUSED flavour is what the OPTIMIZED path runs: hand-written CPU kernels
// (one pass per stage over contiguous memory, tiled by kKernelTile with a scalar tail, parallel
// over rows) wrapped as autograd functions with hand-written backward passes. The fused kernels
// accept KernelDefects, the switches through which the fault injector (faults.h) reproduces real
// kernel bug classes; a default KernelDefects is a healthy kernel.
//
//   at::Tensor p = FusedCausalSoftmax(scores, 0.25);            // scores: [..., T, T] float
//   at::Tensor h = FusedLayerNorm(x, weight, bias, 1e-5);
//   at::Tensor g = FusedGelu(h);
//   at::Tensor r = ReferenceGelu(h.to(at::kDouble));            // what g should be
//
// Thread safety: every function is pure and may be called concurrently; the fused kernels use
// at::parallel_for internally.
#ifndef CAPSULE_SAMPLES_TINY_GPT_OPS_H_
#define CAPSULE_SAMPLES_TINY_GPT_OPS_H_

#include <ATen/Tensor.h>

#include <cstdint>

namespace capsule::tiny_gpt {

// Width of the fused kernels' tiles along a row. A row of width n is processed as n / 16 full tiles
// followed by a tail of n % 16 elements.
inline constexpr int64_t kKernelTile = 16;

// Deliberate defects a fused kernel can be switched into. Each reproduces a bug class seen in real
// kernels; all are off by default.
struct KernelDefects {
  // The kernel stores NaN into flat element 0 of its output (an uninitialised or poisoned write).
  bool write_nan = false;
  // Softmax only: exponentiates without subtracting the row maximum, so large logits overflow.
  bool skip_max = false;
  // The last pass skips the n % 16 tail of each row that has at least one full tile, which keeps
  // whatever earlier passes left there: unnormalised exponentials for softmax, the input itself
  // for layer norm and GELU (as in an in-place kernel). Rows whose width is a multiple of 16 are
  // unaffected, and so are rows shorter than one tile (all tail: the scalar loop alone, which is
  // right). A causal softmax row i has i + 1 visible keys, so T >= 17 is needed.
  bool drop_tail = false;
  // GELU only: the hand-written backward drops the 1/2 of the product rule's second term
  // (x sech^2(u) u' for x/2 sech^2(u) u'). The forward is right; only gradients are wrong.
  bool wrong_grad = false;
};

// Causal scaled softmax over the last dimension: out[..., i, j] = softmax_j(scale * scores[..., i,
// j]) over keys j <= i + (Tk - Tq), and 0 for masked keys. scores: float or double, [..., Tq, Tk]
// with Tk >= Tq. Differentiable in scores.
at::Tensor FusedCausalSoftmax(const at::Tensor& scores, double scale,
                              const KernelDefects& defects = {});

// Layer norm over the last dimension with an affine transform; weight and bias have the size of the
// last dimension. Differentiable in x, weight and bias.
at::Tensor FusedLayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          double eps, const KernelDefects& defects = {});

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Differentiable.
at::Tensor FusedGelu(const at::Tensor& x, const KernelDefects& defects = {});

// A copy of x with flat element 0 set to NaN; gradients pass through unchanged. Used for layers
// that have no fused kernel of their own to carry a write_nan defect.
at::Tensor WriteNanAtFirst(const at::Tensor& x);

// The same operators as plain ATen compositions, in whatever dtype they are given.
at::Tensor ReferenceCausalSoftmax(const at::Tensor& scores, double scale);
at::Tensor ReferenceLayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              double eps);
at::Tensor ReferenceGelu(const at::Tensor& x);

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_OPS_H_
