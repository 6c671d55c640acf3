#include "samples/tiny_gpt/ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace capsule::tiny_gpt {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kTile = kKernelTile;

// Rows handed to one parallel_for task: enough elements that a task is worth a thread hop.
int64_t GrainRows(int64_t width) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width));
}

template <typename T>
T TileSum(const T (&lanes)[kTile]) {
  T sum = 0;
  for (int64_t l = 0; l < kTile; ++l) sum += lanes[l];
  return sum;
}

void PoisonFirst(at::Tensor& out) {
  if (out.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "capsule_poison_first", [&] {
    out.data_ptr<scalar_t>()[0] = std::numeric_limits<scalar_t>::quiet_NaN();
  });
}

// ---------------------------------------------------------------------------------------------
// Causal softmax. A row of key width tk belongs to query i; its first n = i + 1 + (tk - tq) keys
// are visible. The three passes (max, exp+sum, normalise) are each tiled by kTile with per-lane
// partial results so the full tiles vectorise; the tail runs scalar.

template <typename T>
void SoftmaxRowForward(const T* x, T* y, int64_t n, int64_t width, T scale,
                       const KernelDefects& defects) {
  const int64_t full = n - n % kTile;
  T row_max = 0;
  if (!defects.skip_max) {
    T lanes[kTile];
    std::fill(lanes, lanes + kTile, -std::numeric_limits<T>::infinity());
    for (int64_t j = 0; j < full; j += kTile) {
      for (int64_t l = 0; l < kTile; ++l) lanes[l] = std::max(lanes[l], x[j + l]);
    }
    row_max = -std::numeric_limits<T>::infinity();
    for (int64_t l = 0; l < kTile; ++l) row_max = std::max(row_max, lanes[l]);
    for (int64_t j = full; j < n; ++j) row_max = std::max(row_max, x[j]);
  }
  T lanes[kTile] = {};
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) {
      const T e = std::exp(scale * (x[j + l] - row_max));
      y[j + l] = e;
      lanes[l] += e;
    }
  }
  T sum = TileSum(lanes);
  for (int64_t j = full; j < n; ++j) {
    y[j] = std::exp(scale * (x[j] - row_max));
    sum += y[j];
  }
  const T inv = T(1) / sum;
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) y[j + l] *= inv;
  }
  if (!(defects.drop_tail && full > 0)) {
    for (int64_t j = full; j < n; ++j) y[j] *= inv;
  }
  std::fill(y + n, y + width, T(0));
}

template <typename T>
void SoftmaxRowBackward(const T* g, const T* y, T* dx, int64_t n, int64_t width, T scale) {
  const int64_t full = n - n % kTile;
  T lanes[kTile] = {};
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) lanes[l] += g[j + l] * y[j + l];
  }
  T dot = TileSum(lanes);
  for (int64_t j = full; j < n; ++j) dot += g[j] * y[j];
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) dx[j + l] = scale * y[j + l] * (g[j + l] - dot);
  }
  for (int64_t j = full; j < n; ++j) dx[j] = scale * y[j] * (g[j] - dot);
  std::fill(dx + n, dx + width, T(0));
}

int64_t VisibleKeys(int64_t row, int64_t tq, int64_t tk) {
  return std::min(tk, row % tq + 1 + (tk - tq));
}

at::Tensor SoftmaxForward(const at::Tensor& x, double scale, const KernelDefects& defects) {
  const int64_t tq = x.size(-2);
  const int64_t tk = x.size(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(1, tk);
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "capsule_fused_softmax_fwd", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, GrainRows(tk), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        SoftmaxRowForward<scalar_t>(xp + r * tk, yp + r * tk, VisibleKeys(r, tq, tk), tk,
                                    static_cast<scalar_t>(scale), defects);
      }
    });
  });
  if (defects.write_nan) PoisonFirst(y);
  return y;
}

at::Tensor SoftmaxBackward(const at::Tensor& g, const at::Tensor& y, double scale) {
  const int64_t tq = y.size(-2);
  const int64_t tk = y.size(-1);
  const int64_t rows = y.numel() / std::max<int64_t>(1, tk);
  at::Tensor dx = at::empty_like(y);
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "capsule_fused_softmax_bwd", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    at::parallel_for(0, rows, GrainRows(tk), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        SoftmaxRowBackward<scalar_t>(gp + r * tk, yp + r * tk, dp + r * tk, VisibleKeys(r, tq, tk),
                                     tk, static_cast<scalar_t>(scale));
      }
    });
  });
  return dx;
}

class FusedSoftmaxFunction : public torch::autograd::Function<FusedSoftmaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores, double scale,
                            const KernelDefects& defects) {
    at::Tensor y = SoftmaxForward(scores.contiguous(), scale, defects);
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const double scale = ctx->saved_data["scale"].toDouble();
    return {SoftmaxBackward(grads[0].contiguous(), y, scale), at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// Layer norm. Row statistics use the two-pass formula (mean, then mean of squared deviations):
// the one-pass E[x^2] - E[x]^2 loses most of its digits in FP32 once |mean| >> std.

template <typename T>
void LayerNormRowForward(const T* x, const T* w, const T* b, T* y, int64_t d, T eps,
                         const KernelDefects& defects, T* mean_out, T* rstd_out) {
  const int64_t full = d - d % kTile;
  T lanes[kTile] = {};
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) lanes[l] += x[j + l];
  }
  T sum = TileSum(lanes);
  for (int64_t j = full; j < d; ++j) sum += x[j];
  const T mean = sum / static_cast<T>(d);

  std::fill(lanes, lanes + kTile, T(0));
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) {
      const T c = x[j + l] - mean;
      lanes[l] += c * c;
    }
  }
  T sq = TileSum(lanes);
  for (int64_t j = full; j < d; ++j) sq += (x[j] - mean) * (x[j] - mean);
  const T rstd = T(1) / std::sqrt(sq / static_cast<T>(d) + eps);

  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) {
      y[j + l] = (x[j + l] - mean) * rstd * w[j + l] + b[j + l];
    }
  }
  for (int64_t j = full; j < d; ++j) {
    y[j] = defects.drop_tail && full > 0 ? x[j] : (x[j] - mean) * rstd * w[j] + b[j];
  }
  *mean_out = mean;
  *rstd_out = rstd;
}

template <typename T>
void LayerNormRowBackward(const T* g, const T* x, const T* w, T mean, T rstd, T* dx, int64_t d) {
  const int64_t full = d - d % kTile;
  T lanes_gw[kTile] = {};
  T lanes_gwx[kTile] = {};
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) {
      const T gw = g[j + l] * w[j + l];
      lanes_gw[l] += gw;
      lanes_gwx[l] += gw * (x[j + l] - mean) * rstd;
    }
  }
  T sum_gw = TileSum(lanes_gw);
  T sum_gwx = TileSum(lanes_gwx);
  for (int64_t j = full; j < d; ++j) {
    const T gw = g[j] * w[j];
    sum_gw += gw;
    sum_gwx += gw * (x[j] - mean) * rstd;
  }
  const T a = sum_gw / static_cast<T>(d);
  const T c = sum_gwx / static_cast<T>(d);
  for (int64_t j = 0; j < full; j += kTile) {
    for (int64_t l = 0; l < kTile; ++l) {
      const T xhat = (x[j + l] - mean) * rstd;
      dx[j + l] = rstd * (g[j + l] * w[j + l] - a - xhat * c);
    }
  }
  for (int64_t j = full; j < d; ++j) {
    const T xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * (g[j] * w[j] - a - xhat * c);
  }
}

struct LayerNormOutputs {
  at::Tensor y, mean, rstd;
};

LayerNormOutputs LayerNormForward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                  double eps, const KernelDefects& defects) {
  const int64_t d = x.size(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(1, d);
  LayerNormOutputs out{at::empty_like(x), at::empty({rows}, x.options()),
                       at::empty({rows}, x.options())};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "capsule_fused_layer_norm_fwd", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    scalar_t* yp = out.y.data_ptr<scalar_t>();
    scalar_t* mp = out.mean.data_ptr<scalar_t>();
    scalar_t* rp = out.rstd.data_ptr<scalar_t>();
    at::parallel_for(0, rows, GrainRows(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        LayerNormRowForward<scalar_t>(xp + r * d, wp, bp, yp + r * d, d, static_cast<scalar_t>(eps),
                                      defects, mp + r, rp + r);
      }
    });
  });
  if (defects.write_nan) PoisonFirst(out.y);
  return out;
}

// Returns {dx, dweight, dbias}. The parameter gradients reduce over all rows; each column is summed
// by one task in row order, in double, so the result does not depend on the thread count.
variable_list LayerNormBackward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w,
                                const at::Tensor& mean, const at::Tensor& rstd) {
  const int64_t d = x.size(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(1, d);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dw = at::empty_like(w);
  at::Tensor db = at::empty_like(w);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "capsule_fused_layer_norm_bwd", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    const scalar_t* mp = mean.data_ptr<scalar_t>();
    const scalar_t* rp = rstd.data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    scalar_t* dwp = dw.data_ptr<scalar_t>();
    scalar_t* dbp = db.data_ptr<scalar_t>();
    at::parallel_for(0, rows, GrainRows(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        LayerNormRowBackward<scalar_t>(gp + r * d, xp + r * d, wp, mp[r], rp[r], dxp + r * d, d);
      }
    });
    const int64_t column_tiles = (d + kTile - 1) / kTile;
    const int64_t tile_grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, rows * kTile));
    at::parallel_for(0, column_tiles, tile_grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t c0 = t * kTile;
        const int64_t c1 = std::min(d, c0 + kTile);
        double acc_w[kTile] = {};
        double acc_b[kTile] = {};
        for (int64_t r = 0; r < rows; ++r) {
          const scalar_t* gr = gp + r * d;
          const scalar_t* xr = xp + r * d;
          for (int64_t c = c0; c < c1; ++c) {
            acc_w[c - c0] += static_cast<double>(gr[c] * (xr[c] - mp[r]) * rp[r]);
            acc_b[c - c0] += static_cast<double>(gr[c]);
          }
        }
        for (int64_t c = c0; c < c1; ++c) {
          dwp[c] = static_cast<scalar_t>(acc_w[c - c0]);
          dbp[c] = static_cast<scalar_t>(acc_b[c - c0]);
        }
      }
    });
  });
  return {dx, dw, db};
}

class FusedLayerNormFunction : public torch::autograd::Function<FusedLayerNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps, const KernelDefects& defects) {
    const at::Tensor xc = x.contiguous();
    const at::Tensor wc = weight.contiguous();
    LayerNormOutputs out = LayerNormForward(xc, wc, bias.contiguous(), eps, defects);
    ctx->save_for_backward({xc, wc, out.mean, out.rstd});
    return out.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    variable_list g =
        LayerNormBackward(grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3]);
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation), tiled along the last dimension.

constexpr double kGeluK0 = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluK1 = 0.044715;

template <typename T>
T GeluValue(T x) {
  const T u = static_cast<T>(kGeluK0) * (x + static_cast<T>(kGeluK1) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

// With `wrong` (KernelDefects::wrong_grad) the product rule's second term loses its 1/2:
// x sech^2(u) u' instead of x/2 sech^2(u) u'.
template <typename T>
T GeluDerivative(T x, bool wrong = false) {
  const T u = static_cast<T>(kGeluK0) * (x + static_cast<T>(kGeluK1) * x * x * x);
  const T t = std::tanh(u);
  const T du = static_cast<T>(kGeluK0) * (T(1) + T(3) * static_cast<T>(kGeluK1) * x * x);
  return T(0.5) * (T(1) + t) + (wrong ? T(1) : T(0.5)) * x * (T(1) - t * t) * du;
}

at::Tensor GeluForward(const at::Tensor& x, const KernelDefects& defects) {
  const int64_t d = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(1, d);
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "capsule_fused_gelu_fwd", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const int64_t full = d - d % kTile;
    at::parallel_for(0, rows, GrainRows(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* xr = xp + r * d;
        scalar_t* yr = yp + r * d;
        for (int64_t j = 0; j < full; j += kTile) {
          for (int64_t l = 0; l < kTile; ++l) yr[j + l] = GeluValue(xr[j + l]);
        }
        for (int64_t j = full; j < d; ++j) {
          yr[j] = defects.drop_tail && full > 0 ? xr[j] : GeluValue(xr[j]);
        }
      }
    });
  });
  if (defects.write_nan) PoisonFirst(y);
  return y;
}

at::Tensor GeluBackward(const at::Tensor& g, const at::Tensor& x, bool wrong_grad) {
  const int64_t d = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(1, d);
  at::Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "capsule_fused_gelu_bwd", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    const int64_t full = d - d % kTile;
    at::parallel_for(0, rows, GrainRows(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t o = r * d;
        for (int64_t j = 0; j < full; j += kTile) {
          for (int64_t l = 0; l < kTile; ++l) {
            dp[o + j + l] = gp[o + j + l] * GeluDerivative(xp[o + j + l], wrong_grad);
          }
        }
        for (int64_t j = full; j < d; ++j) {
          dp[o + j] = gp[o + j] * GeluDerivative(xp[o + j], wrong_grad);
        }
      }
    });
  });
  return dx;
}

class FusedGeluFunction : public torch::autograd::Function<FusedGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const KernelDefects& defects) {
    const at::Tensor xc = x.contiguous();
    ctx->save_for_backward({xc});
    ctx->saved_data["wrong_grad"] = defects.wrong_grad;
    return GeluForward(xc, defects);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const bool wrong_grad = ctx->saved_data["wrong_grad"].toBool();
    return {GeluBackward(grads[0].contiguous(), x, wrong_grad), at::Tensor()};
  }
};

class WriteNanFunction : public torch::autograd::Function<WriteNanFunction> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& x) {
    at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
    PoisonFirst(y);
    return y;
  }

  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    return {grads[0]};
  }
};

void CheckFloating(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op,
              ": expects float or double, got ", t.scalar_type());
}

}  // namespace

at::Tensor FusedCausalSoftmax(const at::Tensor& scores, double scale,
                              const KernelDefects& defects) {
  CheckFloating(scores, "fused causal softmax");
  TORCH_CHECK(scores.dim() >= 2, "fused causal softmax: expects [..., Tq, Tk], got ",
              scores.sizes());
  TORCH_CHECK(scores.size(-1) >= scores.size(-2),
              "fused causal softmax: needs at least as many keys as queries, got ", scores.sizes());
  TORCH_CHECK(scale > 0, "fused causal softmax: scale must be positive, got ", scale);
  return FusedSoftmaxFunction::apply(scores, scale, defects);
}

at::Tensor FusedLayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          double eps, const KernelDefects& defects) {
  CheckFloating(x, "fused layer norm");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && bias.dim() == 1 &&
                  weight.size(0) == x.size(-1) && bias.size(0) == x.size(-1),
              "fused layer norm: weight and bias must match the last dimension of x ", x.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && bias.scalar_type() == x.scalar_type(),
              "fused layer norm: x, weight and bias must share a dtype");
  return FusedLayerNormFunction::apply(x, weight, bias, eps, defects);
}

at::Tensor FusedGelu(const at::Tensor& x, const KernelDefects& defects) {
  CheckFloating(x, "fused gelu");
  return FusedGeluFunction::apply(x, defects);
}

at::Tensor WriteNanAtFirst(const at::Tensor& x) {
  CheckFloating(x, "write nan");
  return WriteNanFunction::apply(x);
}

at::Tensor ReferenceCausalSoftmax(const at::Tensor& scores, double scale) {
  const int64_t tq = scores.size(-2);
  const int64_t tk = scores.size(-1);
  const at::Tensor hidden = at::ones({tq, tk}, scores.options().dtype(at::kBool)).triu(tk - tq + 1);
  return at::softmax((scores * scale).masked_fill(hidden, -std::numeric_limits<double>::infinity()),
                     -1);
}

at::Tensor ReferenceLayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              double eps) {
  const at::Tensor centered = x - x.mean({-1}, /*keepdim=*/true);
  const at::Tensor var = (centered * centered).mean({-1}, /*keepdim=*/true);
  return centered * at::rsqrt(var + eps) * weight + bias;
}

at::Tensor ReferenceGelu(const at::Tensor& x) {
  return 0.5 * x * (1.0 + at::tanh(kGeluK0 * (x + kGeluK1 * x * x * x)));
}

}  // namespace capsule::tiny_gpt
