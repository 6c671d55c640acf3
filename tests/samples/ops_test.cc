// The fused kernels of samples/tiny_gpt/ops.h against their plain ATen formulas: forward and
// backward, at widths with and without a tail, in FP32 (against FP64) and in FP64 (against finite
// differences), plus each KernelDefects switch.
#include "samples/tiny_gpt/ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace capsule::tiny_gpt {
namespace {

using UnaryOp = std::function<at::Tensor(const at::Tensor&)>;

constexpr int64_t kWidths[] = {1, 15, 16, 17, 33};

// max |a - b| / max |b|: the error relative to the tensor's scale, so that elements near zero do
// not dominate.
double ScaledError(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ad = a.detach().to(at::kDouble);
  const at::Tensor bd = b.detach().to(at::kDouble);
  const double scale = bd.abs().max().item<double>();
  return (ad - bd).abs().max().item<double>() / std::max(scale, 1e-300);
}

at::Tensor Leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

at::Generator Gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor Randn(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kDouble) {
  return at::empty(shape, at::kDouble).normal_(0.0, 1.0, Gen(seed)).to(dtype);
}

// Gradients of sum(f(inputs) * upstream) with respect to inputs.
std::vector<at::Tensor> Grads(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                              const std::vector<at::Tensor>& inputs, const at::Tensor& upstream) {
  const at::Tensor out = f(inputs);
  const at::Tensor loss = (out * upstream.to(out.scalar_type())).sum();
  return torch::autograd::grad({loss}, inputs);
}

// The fused op in FP32 and the reference formula in FP64 on the same data: forward and every input
// gradient within `tol` (scaled error).
void ExpectFp32MatchesReference(
    const std::string& what, const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fused,
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& ref,
    const std::vector<at::Tensor>& inputs64, double tol) {
  std::vector<at::Tensor> in32, in64;
  for (const at::Tensor& t : inputs64) {
    in32.push_back(Leaf(t.to(at::kFloat)));
    in64.push_back(Leaf(t.to(at::kFloat).to(at::kDouble)));  // same values as in32
  }
  const at::Tensor out32 = fused(in32);
  const at::Tensor out64 = ref(in64);
  ASSERT_EQ(out32.scalar_type(), at::kFloat) << what;
  ASSERT_EQ(out32.sizes(), out64.sizes()) << what;
  const double fwd = ScaledError(out32, out64);
  const at::Tensor upstream = Randn(out64.sizes(), 99);
  const std::vector<at::Tensor> g32 = Grads(fused, in32, upstream);
  const std::vector<at::Tensor> g64 = Grads(ref, in64, upstream);
  double bwd = 0;
  for (size_t i = 0; i < g32.size(); ++i) bwd = std::max(bwd, ScaledError(g32[i], g64[i]));
  std::printf("  %-28s fp32 vs fp64: forward %.2e  backward %.2e\n", what.c_str(), fwd, bwd);
  EXPECT_LT(fwd, tol) << what;
  EXPECT_LT(bwd, tol) << what;
}

// Central finite differences of sum(f(x) * upstream) in FP64 against the hand-written backward.
void ExpectGradcheck(const std::string& what,
                     const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                     const std::vector<at::Tensor>& inputs64) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : inputs64) leaves.push_back(Leaf(t));
  const at::Tensor upstream = Randn(f(leaves).sizes(), 7);
  const std::vector<at::Tensor> analytic = Grads(f, leaves, upstream);
  const double h = 1e-6;
  double worst = 0;
  for (size_t k = 0; k < leaves.size(); ++k) {
    at::Tensor numeric = at::zeros_like(inputs64[k]);
    for (int64_t e = 0; e < inputs64[k].numel(); ++e) {
      std::vector<at::Tensor> plus(inputs64), minus(inputs64);
      plus[k] = inputs64[k].clone();
      minus[k] = inputs64[k].clone();
      plus[k].view(-1)[e] += h;
      minus[k].view(-1)[e] -= h;
      const double fp = (f(plus) * upstream).sum().item<double>();
      const double fm = (f(minus) * upstream).sum().item<double>();
      numeric.view(-1)[e] = (fp - fm) / (2 * h);
    }
    worst = std::max(worst, ScaledError(analytic[k], numeric));
  }
  std::printf("  %-28s fp64 gradcheck: %.2e\n", what.c_str(), worst);
  EXPECT_LT(worst, 1e-6) << what;
}

// ---------------------------------------------------------------------------------------------

TEST(FusedLayerNorm, MatchesReferenceAtEveryWidth) {
  for (const int64_t w : kWidths) {
    const std::string what = "layer_norm width " + std::to_string(w);
    const std::vector<at::Tensor> in = {Randn({6, 5, w}, 1) * 3 + 2, Randn({w}, 2) + 1,
                                        Randn({w}, 3)};
    auto fused = [](const std::vector<at::Tensor>& t) {
      return FusedLayerNorm(t[0], t[1], t[2], 1e-5);
    };
    auto ref = [](const std::vector<at::Tensor>& t) {
      return ReferenceLayerNorm(t[0], t[1], t[2], 1e-5);
    };
    ExpectFp32MatchesReference(what, fused, ref, in, 1e-5);
    // Double runs the same kernel code: it must equal the formula to double rounding.
    EXPECT_LT(ScaledError(fused(in), ref(in)), 1e-12) << what;
    ExpectGradcheck(what, fused, {Randn({3, w}, 4), Randn({w}, 5) + 1, Randn({w}, 6)});
  }
}

TEST(FusedLayerNorm, AgreesWithAtenLayerNorm) {
  const at::Tensor x = Randn({4, 64}, 11, at::kFloat);
  const at::Tensor w = Randn({64}, 12, at::kFloat);
  const at::Tensor b = Randn({64}, 13, at::kFloat);
  EXPECT_LT(ScaledError(FusedLayerNorm(x, w, b, 1e-5), at::layer_norm(x, {64}, w, b, 1e-5)), 1e-6);
}

TEST(FusedGelu, MatchesReferenceAtEveryWidth) {
  for (const int64_t w : kWidths) {
    const std::string what = "gelu width " + std::to_string(w);
    const std::vector<at::Tensor> in = {Randn({7, 3, w}, 21) * 2};
    auto fused = [](const std::vector<at::Tensor>& t) { return FusedGelu(t[0]); };
    auto ref = [](const std::vector<at::Tensor>& t) { return ReferenceGelu(t[0]); };
    ExpectFp32MatchesReference(what, fused, ref, in, 1e-6);
    EXPECT_LT(ScaledError(fused(in), ref(in)), 1e-13) << what;
    ExpectGradcheck(what, fused, {Randn({2, w}, 22) * 2});
  }
}

TEST(FusedGelu, IsTheTanhApproximation) {
  const at::Tensor x = at::linspace(-6, 6, 97, at::kFloat);
  EXPECT_LT(ScaledError(FusedGelu(x), at::gelu(x, "tanh")), 1e-6);
  // Far from the erf form, so a silent switch of formula would show.
  EXPECT_GT((FusedGelu(x) - at::gelu(x, "none")).abs().max().item<double>(), 1e-4);
}

TEST(FusedCausalSoftmax, MatchesReferenceAtEveryWidth) {
  for (const int64_t w : kWidths) {
    for (const int64_t tq : std::set<int64_t>{w, (w + 1) / 2}) {
      const std::string what = "softmax " + std::to_string(tq) + "x" + std::to_string(w);
      const std::vector<at::Tensor> in = {Randn({2, 3, tq, w}, 31) * 4};
      auto fused = [](const std::vector<at::Tensor>& t) { return FusedCausalSoftmax(t[0], 0.7); };
      auto ref = [](const std::vector<at::Tensor>& t) { return ReferenceCausalSoftmax(t[0], 0.7); };
      ExpectFp32MatchesReference(what, fused, ref, in, 1e-6);
      EXPECT_LT(ScaledError(fused(in), ref(in)), 1e-13) << what;
      ExpectGradcheck(what, fused, {Randn({tq, w}, 32) * 2});
    }
  }
}

TEST(FusedCausalSoftmax, MasksTheFutureAndNormalisesRows) {
  const at::Tensor p = FusedCausalSoftmax(Randn({3, 33, 33}, 41, at::kFloat), 1.0);
  EXPECT_EQ(p.triu(1).abs().max().item<float>(), 0.0f);
  EXPECT_LT((p.sum(-1) - 1).abs().max().item<float>(), 1e-6);
}

TEST(FusedCausalSoftmax, RejectsBadShapes) {
  EXPECT_THROW(FusedCausalSoftmax(at::zeros({4, 3}), 1.0), c10::Error);  // fewer keys than queries
  EXPECT_THROW(FusedCausalSoftmax(at::zeros({3}), 1.0), c10::Error);
  EXPECT_THROW(FusedCausalSoftmax(at::zeros({3, 3}, at::kLong), 1.0), c10::Error);
  EXPECT_THROW(FusedLayerNorm(at::zeros({2, 8}), at::ones({7}), at::zeros({8}), 1e-5), c10::Error);
}

TEST(FusedKernels, ResultsDoNotDependOnThreadCount) {
  const int saved = at::get_num_threads();
  const at::Tensor x = Randn({64, 48, 40}, 51, at::kFloat);
  const at::Tensor w = Randn({40}, 52, at::kFloat);
  const at::Tensor b = Randn({40}, 53, at::kFloat);
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    std::vector<at::Tensor> leaves = {Leaf(x), Leaf(w), Leaf(b)};
    const at::Tensor y = FusedGelu(FusedLayerNorm(leaves[0], leaves[1], leaves[2], 1e-5));
    const at::Tensor p = FusedCausalSoftmax(y.narrow(-1, 0, 40).narrow(-2, 0, 40), 0.5);
    std::vector<at::Tensor> out = torch::autograd::grad({(p * p).sum() + y.sum()}, leaves);
    out.push_back(p.detach());
    return out;
  };
  const std::vector<at::Tensor> one = run(1);
  const std::vector<at::Tensor> two = run(2);
  at::set_num_threads(saved);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(at::equal(one[i], two[i])) << i;
}

// ---------------------------------------------------------------------------------------------
// KernelDefects: each switch changes exactly what it claims to.

TEST(KernelDefects, WriteNanPoisonsOnlyElementZero) {
  const at::Tensor x = Randn({4, 17}, 61, at::kFloat);
  KernelDefects nan;
  nan.write_nan = true;
  const std::vector<std::pair<UnaryOp, UnaryOp>> ops = {
      {[](const at::Tensor& t) { return FusedGelu(t); },
       [&](const at::Tensor& t) { return FusedGelu(t, nan); }},
      {[](const at::Tensor& t) { return FusedCausalSoftmax(t, 1.0); },
       [&](const at::Tensor& t) { return FusedCausalSoftmax(t, 1.0, nan); }},
      {[](const at::Tensor& t) { return FusedLayerNorm(t, at::ones({17}), at::zeros({17}), 1e-5); },
       [&](const at::Tensor& t) {
         return FusedLayerNorm(t, at::ones({17}), at::zeros({17}), 1e-5, nan);
       }},
      {[](const at::Tensor& t) { return t.clone(); },
       [](const at::Tensor& t) { return WriteNanAtFirst(t); }},
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const at::Tensor good = ops[i].first(x).reshape(-1);
    const at::Tensor bad = ops[i].second(x).reshape(-1);
    EXPECT_TRUE(std::isnan(bad[0].item<float>())) << i;
    EXPECT_EQ(at::isnan(bad).sum().item<int64_t>(), 1) << i;
    EXPECT_TRUE(at::equal(good.slice(0, 1), bad.slice(0, 1))) << i;
  }
}

TEST(KernelDefects, WriteNanAtFirstPassesGradientsThrough) {
  const at::Tensor x = Leaf(Randn({3, 5}, 62, at::kFloat));
  const at::Tensor g = torch::autograd::grad({(WriteNanAtFirst(x) * 0).nansum()}, {x})[0];
  const at::Tensor upstream = Randn({3, 5}, 63, at::kFloat);
  const at::Tensor g2 = torch::autograd::grad({WriteNanAtFirst(x)}, {x}, {upstream})[0];
  EXPECT_TRUE(at::equal(g2, upstream));
  EXPECT_EQ(g.abs().sum().item<float>(), 0.0f);
}

TEST(KernelDefects, DropTailLeavesMultiplesOf16Alone) {
  KernelDefects tail;
  tail.drop_tail = true;
  for (const int64_t w : {16, 32, 48}) {
    const at::Tensor x = Randn({5, w}, 71, at::kFloat);
    const at::Tensor ones = at::ones({w});
    const at::Tensor zeros = at::zeros({w});
    EXPECT_TRUE(at::equal(FusedGelu(x, tail), FusedGelu(x))) << w;
    EXPECT_TRUE(
        at::equal(FusedLayerNorm(x, ones, zeros, 1e-5, tail), FusedLayerNorm(x, ones, zeros, 1e-5)))
        << w;
  }
}

TEST(KernelDefects, DropTailBreaksOnlyTheTail) {
  KernelDefects tail;
  tail.drop_tail = true;
  for (const int64_t w : {17, 33, 47}) {
    const int64_t full = w - w % kKernelTile;
    const at::Tensor x = Randn({5, w}, 72, at::kFloat) * 3;
    const at::Tensor ones = at::ones({w});
    const at::Tensor zeros = at::zeros({w});
    const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {
        {FusedGelu(x, tail), FusedGelu(x)},
        {FusedLayerNorm(x, ones, zeros, 1e-5, tail), FusedLayerNorm(x, ones, zeros, 1e-5)},
    };
    for (const auto& [bad, good] : pairs) {
      EXPECT_TRUE(at::equal(bad.slice(-1, 0, full), good.slice(-1, 0, full))) << w;
      EXPECT_GT(ScaledError(bad.slice(-1, full), good.slice(-1, full)), 1e-2) << w;
      EXPECT_TRUE(at::isfinite(bad).all().item<bool>()) << w;
    }
  }
  // Softmax: a causal row of n visible keys has a tail when n % 16 != 0; with the tail
  // unnormalised the row no longer sums to 1, except rows with no tail (n = 16, 32) and rows
  // shorter than one tile (n < 16), which the scalar loop alone handles, rightly.
  const at::Tensor p = FusedCausalSoftmax(Randn({2, 33, 33}, 73, at::kFloat), 1.0, tail);
  EXPECT_TRUE(at::isfinite(p).all().item<bool>());
  const at::Tensor row_sums = p.sum(-1);
  for (int64_t row = 0; row < 33; ++row) {
    const int64_t n = row + 1;
    const double err = (row_sums.select(-1, row) - 1).abs().max().item<double>();
    if (n % kKernelTile == 0 || n < kKernelTile) {
      EXPECT_LT(err, 1e-6) << "row " << row;
    } else {
      EXPECT_GT(err, 1e-2) << "row " << row;
    }
  }
}

TEST(KernelDefects, DropTailLeavesRowsShorterThanATileAlone) {
  KernelDefects tail;
  tail.drop_tail = true;
  for (const int64_t w : {1, 5, 15}) {
    const at::Tensor x = Randn({4, w}, 74, at::kFloat);
    EXPECT_TRUE(at::equal(FusedGelu(x, tail), FusedGelu(x))) << w;
    EXPECT_TRUE(at::equal(FusedLayerNorm(x, at::ones({w}), at::zeros({w}), 1e-5, tail),
                          FusedLayerNorm(x, at::ones({w}), at::zeros({w}), 1e-5)))
        << w;
    const at::Tensor s = Randn({2, w, w}, 75, at::kFloat);
    EXPECT_TRUE(at::equal(FusedCausalSoftmax(s, 1.0, tail), FusedCausalSoftmax(s, 1.0))) << w;
  }
}

TEST(KernelDefects, WrongGradLeavesTheForwardAndBreaksTheBackward) {
  KernelDefects wrong;
  wrong.wrong_grad = true;
  const at::Tensor x = Leaf(Randn({6, 40}, 76, at::kFloat) * 2);
  EXPECT_TRUE(at::equal(FusedGelu(x, wrong), FusedGelu(x)));
  const at::Tensor upstream = Randn({6, 40}, 77, at::kFloat);
  const at::Tensor good = torch::autograd::grad({FusedGelu(x)}, {x}, {upstream})[0];
  const at::Tensor bad = torch::autograd::grad({FusedGelu(x, wrong)}, {x}, {upstream})[0];
  const at::Tensor xd = Leaf(x.to(at::kDouble));
  const at::Tensor ref =
      torch::autograd::grad({ReferenceGelu(xd)}, {xd}, {upstream.to(at::kDouble)})[0];
  EXPECT_LT(ScaledError(good, ref), 1e-5);
  EXPECT_GT(ScaledError(bad, ref), 1e-2);
}

TEST(KernelDefects, SkipMaxOverflowsOnlyOnLargeLogits) {
  KernelDefects skip;
  skip.skip_max = true;
  const at::Tensor small = Randn({4, 20, 20}, 81, at::kFloat);
  EXPECT_LT(ScaledError(FusedCausalSoftmax(small, 1.0, skip), FusedCausalSoftmax(small, 1.0)),
            1e-6);
  const at::Tensor large = small * 100;
  EXPECT_FALSE(at::isfinite(FusedCausalSoftmax(large, 1.0, skip)).all().item<bool>());
  EXPECT_TRUE(at::isfinite(FusedCausalSoftmax(large, 1.0)).all().item<bool>());
  EXPECT_TRUE(at::isfinite(ReferenceCausalSoftmax(large.to(at::kDouble), 1.0)).all().item<bool>());
}

}  // namespace
}  // namespace capsule::tiny_gpt
