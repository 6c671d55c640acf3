// Comparator: metrics against hand-computed values, the tolerance rule at its boundary, tolerance
// precedence, non-finite handling, and the default FP32 tolerance on tiny_gpt (clean layers pass
// with a margin, injected finite faults fail with a margin).
#include "capsule/replay/comparator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capsule/model/layer_sequence.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/faults.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

at::Tensor Doubles(std::vector<double> values) {
  return at::tensor(values, at::TensorOptions().dtype(at::kDouble));
}

TensorComparison Compare(const at::Tensor& c, const at::Tensor& r,
                         const CompareOptions& options = {}, bool logits = false,
                         const std::string& layer = "layer") {
  StatusOr<TensorComparison> result = CompareTensors(c, r, layer, options, logits);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : TensorComparison{};
}

CompareOptions WithTolerance(double atol, double rtol) {
  CompareOptions options;
  options.tolerance = Tolerance{atol, rtol};
  return options;
}

TEST(Comparator, IdenticalTensorsDoNotDiverge) {
  const at::Tensor r = at::randn({4, 5, 6}, at::kDouble);
  const TensorComparison c =
      Compare(r.to(at::kFloat).to(at::kDouble), r.to(at::kFloat).to(at::kDouble));
  EXPECT_EQ(c.numel, 120);
  EXPECT_EQ(c.max_abs_err, 0.0);
  EXPECT_EQ(c.max_rel_err, 0.0);
  EXPECT_EQ(c.rms_err_rel, 0.0);
  EXPECT_DOUBLE_EQ(c.cosine, 1.0);
  EXPECT_EQ(c.nonfinite_mismatch, 0);
  EXPECT_EQ(c.failed, 0);
  EXPECT_EQ(c.fail_fraction, 0.0);
  EXPECT_FALSE(c.top1_agreement.has_value());
  EXPECT_FALSE(c.diverged);
  EXPECT_EQ(c.reason, "");
}

TEST(Comparator, FloatCandidateOfAnFp64ReferenceIsWithinTheDefault) {
  const at::Tensor r = at::randn({1000}, at::kDouble);
  const TensorComparison c = Compare(r.to(at::kFloat), r);
  EXPECT_EQ(c.tolerance_used, DefaultTolerance(at::kFloat));
  EXPECT_GT(c.max_abs_err, 0.0);
  EXPECT_LE(c.max_rel_err, 0.6e-7);  // float rounding: half an ulp
  EXPECT_FALSE(c.diverged);
}

TEST(Comparator, SingleNanIsANonFiniteMismatchAndAlwaysDiverges) {
  const at::Tensor r = Doubles({1, 2, 3, 4, 5, 6, 7, 8});
  at::Tensor cand = r.clone();
  cand[5] = kNan;
  CompareOptions lenient = WithTolerance(kInf, kInf);
  lenient.max_fail_fraction = 1.0;
  for (const CompareOptions& options : {CompareOptions{}, lenient}) {
    const TensorComparison c = Compare(cand, r, options);
    EXPECT_EQ(c.nonfinite_mismatch, 1);
    EXPECT_EQ(c.failed, 1);
    EXPECT_DOUBLE_EQ(c.fail_fraction, 1.0 / 8);
    EXPECT_TRUE(c.diverged);
    EXPECT_NE(
        c.reason.find("non-finite mismatch at 1 of 8 elements; first at index 5: nan vs ref 6"),
        std::string::npos)
        << c.reason;
    // The metrics cover the positions where both are finite.
    EXPECT_EQ(c.max_abs_err, 0.0);
    EXPECT_DOUBLE_EQ(c.cosine, 1.0);
  }
}

TEST(Comparator, EqualNonFinitePositionsAreNotFailures) {
  const TensorComparison same =
      Compare(Doubles({kNan, kInf, -kInf, 1}), Doubles({kNan, kInf, -kInf, 1}));
  EXPECT_EQ(same.nonfinite_mismatch, 0);
  EXPECT_EQ(same.failed, 0);
  EXPECT_FALSE(same.diverged);

  struct Case {
    double c, r;
  };
  for (const Case& k :
       {Case{kInf, -kInf}, Case{kNan, kInf}, Case{kInf, 1.0}, Case{1.0, kNan}, Case{-kInf, kNan}}) {
    const TensorComparison c = Compare(Doubles({0, k.c}), Doubles({0, k.r}));
    EXPECT_EQ(c.nonfinite_mismatch, 1) << k.c << " vs " << k.r;
    EXPECT_TRUE(c.diverged) << k.c << " vs " << k.r;
  }
}

TEST(Comparator, ToleranceBoundaryIsExact) {
  // Binary-exact numbers: the bound atol + rtol*|r| = 0.25 + 0.5*2 = 1.25 and every difference
  // below are computed without rounding.
  const CompareOptions options = WithTolerance(0.25, 0.5);
  const double just_over = std::nextafter(1.25, kInf);
  const at::Tensor r = Doubles({2.0});
  for (const double on_bound : {2.0 + 1.25, 2.0 - 1.25}) {
    const TensorComparison on = Compare(Doubles({on_bound}), r, options);
    EXPECT_EQ(on.max_abs_err, 1.25);
    EXPECT_EQ(on.failed, 0) << on_bound;
    EXPECT_FALSE(on.diverged) << on_bound;
  }
  for (const double past : {std::nextafter(3.25, kInf), 2.0 - just_over}) {
    const TensorComparison over = Compare(Doubles({past}), r, options);
    EXPECT_GT(over.max_abs_err, 1.25);
    EXPECT_EQ(over.failed, 1) << past;
    EXPECT_TRUE(over.diverged) << past;
  }
  // rtol scales with |r|, not with |c|: r = -2 gives the same bound.
  EXPECT_FALSE(Compare(Doubles({-3.25}), Doubles({-2.0}), options).diverged);
  EXPECT_TRUE(Compare(Doubles({-2.0 + just_over}), Doubles({-2.0}), options).diverged);
}

TEST(Comparator, ReferenceMaxScalesAtolByTheLargestReferenceMagnitude) {
  CompareOptions options = WithTolerance(0.25, 0);
  options.atol_scale = AtolScale::kReferenceMax;
  // max|r| = 4 (the Inf is ignored): the bound is 0.25 * 4 = 1 for every element, exactly.
  const at::Tensor r = Doubles({4, 0, kInf});
  const TensorComparison on = Compare(Doubles({4, 1, kInf}), r, options);
  EXPECT_EQ(on.reference_absmax, 4.0);
  EXPECT_EQ(on.atol_scale, AtolScale::kReferenceMax);
  EXPECT_FALSE(on.diverged);
  const TensorComparison over = Compare(Doubles({4, std::nextafter(1.0, kInf), kInf}), r, options);
  EXPECT_TRUE(over.diverged);
  EXPECT_NE(over.reason.find("1 of 3 elements (33.3333%) exceed atol*max|ref|+rtol*|ref| "
                             "(atol 0.25, max|ref| 4, rtol 0)"),
            std::string::npos)
      << over.reason;
  // The same error is absolute-mode failure.
  options.atol_scale = AtolScale::kAbsolute;
  EXPECT_TRUE(Compare(Doubles({4, 1, kInf}), r, options).diverged);
}

TEST(Comparator, ReferenceMaxVerdictDoesNotDependOnTheTensorsScale) {
  CompareOptions options = WithTolerance(1e-3, 1e-3);
  options.atol_scale = AtolScale::kReferenceMax;
  const at::Tensor r = at::randn({64}, at::kDouble);
  at::Tensor c = r.clone();
  // Over the bound atol*max|r| + rtol*|r[i]| wherever |r[i]| < max|r|: at the smallest element, so
  // that no draw of r puts the maximum there (the bound would then be met exactly).
  const int64_t i = r.abs().argmin().item<int64_t>();
  c[i] += 2e-3 * r.abs().max();
  for (const double scale : {1.0, 1e-7, 1e6}) {
    EXPECT_FALSE(Compare(r * scale, r * scale, options).diverged) << scale;
    const TensorComparison cmp = Compare(c * scale, r * scale, options);
    EXPECT_TRUE(cmp.diverged) << scale;
    EXPECT_EQ(cmp.failed, 1) << scale;
  }
}

TEST(Comparator, ReferenceMaxOnAnAllZeroReferenceRequiresZeros) {
  CompareOptions options = WithTolerance(1e-3, 1e-3);
  options.atol_scale = AtolScale::kReferenceMax;
  const at::Tensor zeros = at::zeros({8}, at::kDouble);
  EXPECT_FALSE(Compare(zeros.clone(), zeros, options).diverged);
  at::Tensor c = zeros.clone();
  c[0] = 1e-30;
  EXPECT_TRUE(Compare(c, zeros, options).diverged);
}

TEST(Comparator, DefaultToleranceTable) {
  EXPECT_EQ(DefaultTolerance(at::kDouble), (Tolerance{1e-10, 1e-8}));
  EXPECT_EQ(DefaultTolerance(at::kFloat), (Tolerance{2e-5, 1e-5}));
  EXPECT_EQ(DefaultTolerance(at::kBFloat16), (Tolerance{1e-1, 5e-2}));
  EXPECT_EQ(DefaultTolerance(at::kHalf), (Tolerance{3e-2, 3e-2}));
  EXPECT_EQ(DefaultTolerance(at::kLong), (Tolerance{0, 0}));
  EXPECT_EQ(DefaultTolerance(at::kBool), (Tolerance{0, 0}));
  // The looser the dtype, the looser its default.
  EXPECT_LT(DefaultTolerance(at::kDouble).atol, DefaultTolerance(at::kFloat).atol);
  EXPECT_LT(DefaultTolerance(at::kFloat).atol, DefaultTolerance(at::kHalf).atol);
  EXPECT_LE(DefaultTolerance(at::kHalf).atol, DefaultTolerance(at::kBFloat16).atol);
}

TEST(Comparator, IntegerCandidatesMustMatchExactly) {
  const at::Tensor r = at::arange(10, at::kLong);
  EXPECT_FALSE(Compare(r.clone(), r).diverged);
  at::Tensor c = r.clone();
  c[3] = 4;
  const TensorComparison off = Compare(c, r);
  EXPECT_EQ(off.failed, 1);
  EXPECT_TRUE(off.diverged);
}

TEST(Comparator, PerLayerOverrideWinsOverGlobalWhichWinsOverDtypeDefault) {
  CompareOptions options;
  EXPECT_EQ(ResolveTolerance(options, "blocks.1", at::kFloat), DefaultTolerance(at::kFloat));
  options.tolerance = Tolerance{0.5, 0};
  EXPECT_EQ(ResolveTolerance(options, "blocks.1", at::kFloat), (Tolerance{0.5, 0}));
  options.layer_tolerance["blocks.1"] = Tolerance{2.0, 0};
  EXPECT_EQ(ResolveTolerance(options, "blocks.1", at::kFloat), (Tolerance{2.0, 0}));
  EXPECT_EQ(ResolveTolerance(options, "blocks.2", at::kFloat), (Tolerance{0.5, 0}));

  // The same error of 1 is judged by whichever tolerance applies.
  const at::Tensor r = Doubles({0, 0});
  const at::Tensor c = Doubles({0, 1});
  const TensorComparison by_layer = Compare(c, r, options, false, "blocks.1");
  EXPECT_EQ(by_layer.tolerance_used, (Tolerance{2.0, 0}));
  EXPECT_FALSE(by_layer.diverged);
  const TensorComparison by_global = Compare(c, r, options, false, "blocks.2");
  EXPECT_EQ(by_global.tolerance_used, (Tolerance{0.5, 0}));
  EXPECT_TRUE(by_global.diverged);
  const TensorComparison by_default = Compare(c, r, CompareOptions{}, false, "blocks.1");
  EXPECT_EQ(by_default.tolerance_used, DefaultTolerance(at::kDouble));
  EXPECT_TRUE(by_default.diverged);
}

TEST(Comparator, FailFractionThreshold) {
  const at::Tensor r = at::zeros({10}, at::kDouble);
  at::Tensor c = r.clone();
  c[2] = 1;
  c[7] = -1;
  CompareOptions options = WithTolerance(0.5, 0);
  const TensorComparison strict = Compare(c, r, options);
  EXPECT_EQ(strict.failed, 2);
  EXPECT_DOUBLE_EQ(strict.fail_fraction, 0.2);
  EXPECT_TRUE(strict.diverged);
  EXPECT_NE(strict.reason.find("2 of 10 elements (20%) exceed atol+rtol*|ref| (atol 0.5, rtol 0)"),
            std::string::npos)
      << strict.reason;
  options.max_fail_fraction = 0.2;  // "more than" the fraction diverges
  EXPECT_FALSE(Compare(c, r, options).diverged);
  options.max_fail_fraction = 0.19;
  EXPECT_TRUE(Compare(c, r, options).diverged);
}

TEST(Comparator, MetricsMatchHandComputedValues) {
  // c - r = [0, 0, -1]: rms(c-r)/rms(r) = 1/sqrt(14); cosine = 11 / (3 sqrt(14)).
  const TensorComparison a = Compare(Doubles({1, 2, 2}), Doubles({1, 2, 3}), WithTolerance(2, 0));
  EXPECT_DOUBLE_EQ(a.max_abs_err, 1.0);
  EXPECT_DOUBLE_EQ(a.max_rel_err, 1.0 / 3);
  EXPECT_DOUBLE_EQ(a.rms_err_rel, 1.0 / std::sqrt(14.0));
  EXPECT_DOUBLE_EQ(a.cosine, 11.0 / (3.0 * std::sqrt(14.0)));
  EXPECT_FALSE(a.diverged);

  const TensorComparison b = Compare(Doubles({4, 3}), Doubles({3, 4}), WithTolerance(1, 0));
  EXPECT_DOUBLE_EQ(b.cosine, 24.0 / 25.0);
  EXPECT_DOUBLE_EQ(b.rms_err_rel, std::sqrt(2.0) / 5.0);
  EXPECT_DOUBLE_EQ(b.max_rel_err, 1.0 / 3);

  // Opposite vectors; a reference of zeros (relative error undefined there: excluded).
  EXPECT_DOUBLE_EQ(Compare(Doubles({-1, -2}), Doubles({1, 2})).cosine, -1.0);
  const TensorComparison zero_ref = Compare(Doubles({0, 1e-3}), Doubles({0, 0}));
  EXPECT_EQ(zero_ref.max_rel_err, 0.0);
  EXPECT_DOUBLE_EQ(zero_ref.max_abs_err, 1e-3);
  EXPECT_EQ(zero_ref.rms_err_rel, kInf);
  EXPECT_EQ(zero_ref.cosine, 0.0);
  EXPECT_EQ(Compare(Doubles({0, 0}), Doubles({0, 0})).cosine, 1.0);
}

TEST(Comparator, WorstRatioIsTheErrorAsAMultipleOfItsBound) {
  // Bounds atol + rtol*|r| = 1 + 0.5*|r|: 1.5 for r = 1 (error 0.75: half), 6 for r = 10 (error
  // 3: half), 1 for r = 0 (error 2: twice, so it fails).
  const TensorComparison t =
      Compare(Doubles({1.75, 13, 2}), Doubles({1, 10, 0}), WithTolerance(1, 0.5));
  EXPECT_DOUBLE_EQ(t.worst_ratio, 2.0);
  EXPECT_DOUBLE_EQ(t.atol_applied, 1.0);
  EXPECT_TRUE(t.diverged);
  const TensorComparison ok = Compare(Doubles({1.75, 13}), Doubles({1, 10}), WithTolerance(1, 0.5));
  EXPECT_DOUBLE_EQ(ok.worst_ratio, 0.5);
  EXPECT_FALSE(ok.diverged);
  // Nothing allowed, something differs: infinitely far.
  EXPECT_EQ(Compare(Doubles({1e-9}), Doubles({0}), WithTolerance(0, 0)).worst_ratio, kInf);
  EXPECT_EQ(Compare(Doubles({0}), Doubles({0}), WithTolerance(0, 0)).worst_ratio, 0.0);
  // With atol relative to the reference's scale, the bound shows the scaled atol.
  CompareOptions scaled = WithTolerance(0.1, 0);
  scaled.atol_scale = AtolScale::kReferenceMax;
  const TensorComparison g = Compare(Doubles({0.5, 50}), Doubles({0, 40}), scaled);
  EXPECT_DOUBLE_EQ(g.atol_applied, 4.0);
  EXPECT_DOUBLE_EQ(g.worst_ratio, 2.5);
}

TEST(Comparator, Top1AgreementOverTheLastDimension) {
  // Rows 0 and 2 agree on their argmax, row 1 does not.
  const at::Tensor r = Doubles({0, 5, 1, 2, /**/ 9, 0, 0, 1, /**/ 0, 0, 0, 3}).view({3, 4});
  const at::Tensor c = Doubles({0, 4, 1, 2, /**/ 1, 0, 8, 1, /**/ 0, 0, 1, 3}).view({3, 4});
  const TensorComparison t = Compare(c, r, WithTolerance(100, 0), /*logits=*/true);
  ASSERT_TRUE(t.top1_agreement.has_value());
  EXPECT_DOUBLE_EQ(*t.top1_agreement, 2.0 / 3);
  EXPECT_FALSE(t.diverged);  // agreement is reported, the verdict is the tolerance rule's
  EXPECT_FALSE(Compare(c, r, WithTolerance(100, 0)).top1_agreement.has_value());

  // Ties go to the first maximum and NaN counts as the largest value, as in at::argmax.
  const at::Tensor tie_r = Doubles({1, 1, 0});
  EXPECT_DOUBLE_EQ(*Compare(Doubles({1, 0.5, 0}), tie_r, {}, true).top1_agreement, 1.0);
  EXPECT_DOUBLE_EQ(*Compare(Doubles({1, kNan, 0}), Doubles({1, kNan, 0}), {}, true).top1_agreement,
                   1.0);
  EXPECT_DOUBLE_EQ(*Compare(Doubles({1, 2, kNan}), Doubles({1, 2, 0}), WithTolerance(kInf, 0), true)
                        .top1_agreement,
                   0.0);
}

TEST(Comparator, ShapeMismatchIsAnError) {
  const StatusOr<TensorComparison> r =
      CompareTensors(at::zeros({2, 3}), at::zeros({3, 2}), "lm_head", {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "compare 'lm_head': shape [2, 3] differs from the reference's [3, 2]");
  // Same numel, different rank: still a mismatch.
  EXPECT_FALSE(CompareTensors(at::zeros({6}), at::zeros({2, 3}), "x", {}).ok());
}

TEST(Comparator, RefusesBadInputsAndOptions) {
  const at::Tensor t = at::zeros({2});
  EXPECT_EQ(CompareTensors(at::Tensor(), t, "x", {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CompareTensors(at::zeros({2}, at::kComplexFloat), at::zeros({2}, at::kComplexFloat), "x", {})
          .status()
          .code(),
      StatusCode::kInvalidArgument);
  CompareOptions negative = WithTolerance(-1, 0);
  EXPECT_EQ(CompareTensors(t, t, "x", negative).status().code(), StatusCode::kInvalidArgument);
  CompareOptions nan_layer;
  nan_layer.layer_tolerance["x"] = Tolerance{0, kNan};
  const Status s = CompareTensors(t, t, "x", nan_layer).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 'x' tolerance must be >= 0"), std::string::npos) << s;
  CompareOptions fraction;
  fraction.max_fail_fraction = 1.5;
  EXPECT_EQ(CompareTensors(t, t, "x", fraction).status().code(), StatusCode::kInvalidArgument);
}

TEST(Comparator, EmptyTensorsCompareFine) {
  const TensorComparison c = Compare(at::zeros({0, 4}), at::zeros({0, 4}, at::kDouble), {}, true);
  EXPECT_EQ(c.numel, 0);
  EXPECT_FALSE(c.diverged);
  EXPECT_EQ(c.fail_fraction, 0.0);
  EXPECT_EQ(*c.top1_agreement, 1.0);
}

TEST(Comparator, StridedTensorsAreReadInLogicalOrder) {
  const at::Tensor r = at::arange(12, at::kDouble).view({3, 4}).t();  // non-contiguous [4, 3]
  at::Tensor c = r.contiguous();
  c[1][2] = 100;  // logical flat index 1 * 3 + 2 = 5
  const TensorComparison cmp = Compare(c, r);
  EXPECT_EQ(cmp.failed, 1);
  EXPECT_NE(cmp.reason.find("worst at index 5: 100 vs ref 9"), std::string::npos) << cmp.reason;
}

TEST(Comparator, LargeTensorsSpanManyChunks) {
  // 200 rows of 1000 logits: more elements than one FP64 chunk holds, rows kept whole.
  at::Tensor r = at::randn({200, 1000}, at::kDouble);
  r[199][999] = -100;  // not the argmax of its row, so the NaN below changes it
  at::Tensor c = r.to(at::kFloat);
  c[199][999] = kNan;                // NaN is the largest value for argmax
  c[3] = r[3].neg().to(at::kFloat);  // argmax becomes row 3's argmin
  const TensorComparison cmp = Compare(c, r, {}, /*logits=*/true);
  EXPECT_EQ(cmp.numel, 200000);
  EXPECT_EQ(cmp.nonfinite_mismatch, 1);
  EXPECT_NE(cmp.reason.find("first at index 199999"), std::string::npos) << cmp.reason;
  EXPECT_DOUBLE_EQ(*cmp.top1_agreement, 198.0 / 200);
  const Tolerance tol = DefaultTolerance(at::kFloat);
  const at::Tensor row3 = r[3].abs();
  EXPECT_EQ(cmp.failed, 1 + (2 * row3 > tol.atol + tol.rtol * row3).sum().item<int64_t>());
}

// ---------------------------------------------------------------------------------------------
// The FP32 default on the sample model: the measurements behind the table, repeated on one model
// so that a change to the model or to the table that breaks the margins is caught.

using tiny_gpt::FaultKind;
using tiny_gpt::FaultSpec;
using tiny_gpt::TinyGpt;
using tiny_gpt::TinyGptConfig;

// Layerwise comparison, forward and backward, as replay does it: every layer gets the REFERENCE
// input of that layer and, backward, the REFERENCE upstream gradient, cast to each path's dtype.
// Returns, per layer, the comparisons of its output, then of its input and parameter gradients.
std::vector<std::vector<TensorComparison>> LayerwiseComparisons(TinyGpt& model,
                                                                const LayerBatch& batch,
                                                                const CompareOptions& options) {
  LayerSequence& ref = model.Path(PathKind::kReference);
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  std::vector<at::Tensor> inputs, outputs;
  TensorList x = {batch.input_ids};
  for (size_t i = 0; i < ref.size(); ++i) {
    inputs.push_back(x[0].detach());
    x = ref.Forward(i, x, batch);
    outputs.push_back(x[0]);
  }
  std::vector<at::Tensor> upstream = torch::autograd::grad(
      {outputs.back()}, std::vector<at::Tensor>(outputs.begin(), outputs.end() - 1));
  upstream.push_back(at::ones({}, at::kDouble));

  std::vector<std::vector<TensorComparison>> out(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    std::vector<at::Tensor> results[2];
    for (LayerSequence* path : {&ref, &opt}) {
      at::Tensor in = inputs[i];
      if (i > 0) in = in.to(path->compute_dtype()).requires_grad_(true);
      const at::Tensor y = path->Forward(i, {in}, batch).at(0);
      std::vector<at::Tensor> wrt;
      if (i > 0) wrt.push_back(in);
      for (const NamedTensor& p : path->LayerParameters(i)) wrt.push_back(p.second);
      std::vector<at::Tensor> grads =
          torch::autograd::grad({y}, wrt, {upstream[i].to(y.scalar_type())});
      std::vector<at::Tensor>& r = results[path == &ref ? 0 : 1];
      r.push_back(y.detach());
      r.insert(r.end(), grads.begin(), grads.end());
    }
    const std::string name = ref.name(i);
    for (size_t k = 0; k < results[0].size(); ++k) {
      StatusOr<TensorComparison> c = CompareTensors(results[1][k], results[0][k], name, options);
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) out[i].push_back(*c);
    }
  }
  return out;
}

bool AnyDiverged(std::vector<TensorComparison>::const_iterator begin,
                 std::vector<TensorComparison>::const_iterator end) {
  for (auto it = begin; it != end; ++it) {
    if (it->diverged) return true;
  }
  return false;
}

// The FP32 default scaled by `factor`, in the given mode.
CompareOptions ScaledDefault(double factor, AtolScale scale) {
  const Tolerance d = DefaultTolerance(at::kFloat);
  CompareOptions options = WithTolerance(d.atol * factor, d.rtol * factor);
  options.atol_scale = scale;
  return options;
}

std::unique_ptr<TinyGpt> MakeTinyGpt(int64_t n_layers) {
  TinyGptConfig config;
  config.n_layers = n_layers;
  config.seed = 5;  // not one of the seeds the table was calibrated on
  StatusOr<std::unique_ptr<TinyGpt>> model = TinyGpt::Create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

LayerBatch MakeBatch() {
  tiny_gpt::CorpusLoaderOptions options;
  options.seed = 7;
  StatusOr<tiny_gpt::CorpusLoader> loader =
      tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return loader->Next().batch;
}

// Clean layers pass a tenth of the default: forward in absolute mode, forward and backward in
// kReferenceMax mode (absolute atol is meaningless for gradients of size ~1e-5).
TEST(ComparatorOnTinyGpt, CleanLayersPassATenthOfTheFp32Default) {
  std::unique_ptr<TinyGpt> model = MakeTinyGpt(4);
  const LayerBatch batch = MakeBatch();
  for (const AtolScale scale : {AtolScale::kAbsolute, AtolScale::kReferenceMax}) {
    const auto layers = LayerwiseComparisons(*model, batch, ScaledDefault(0.1, scale));
    for (size_t i = 0; i < layers.size(); ++i) {
      const size_t checked = scale == AtolScale::kAbsolute ? 1 : layers[i].size();
      for (size_t k = 0; k < checked; ++k) {
        EXPECT_FALSE(layers[i][k].diverged)
            << model->config().layer_name(i) << " tensor " << k << ": " << layers[i][k].reason;
      }
    }
  }
}

// Injected finite faults fail at the named layer, and only there, with the default made
// kFaultMargin times looser: forward in both modes, backward in kReferenceMax mode.
TEST(ComparatorOnTinyGpt, FiniteFaultsFailAMultipleOfTheFp32Default) {
  constexpr double kFaultMargin = 5;
  std::unique_ptr<TinyGpt> model = MakeTinyGpt(4);
  const LayerBatch batch = MakeBatch();
  for (const FaultSpec& fault :
       {FaultSpec{FaultKind::kEps, "blocks.1", 0}, FaultSpec{FaultKind::kEps, "ln_f", 0},
        FaultSpec{FaultKind::kTailBlock, "blocks.2", 0}}) {
    ASSERT_TRUE(model->SetFault(fault).ok());
    for (const AtolScale scale : {AtolScale::kAbsolute, AtolScale::kReferenceMax}) {
      const auto layers = LayerwiseComparisons(*model, batch, ScaledDefault(kFaultMargin, scale));
      const int64_t at = model->config().layer_index(fault.layer);
      const std::string what =
          fault.ToString() + (scale == AtolScale::kAbsolute ? " abs " : " max ");
      for (size_t i = 0; i < layers.size(); ++i) {
        const std::string name = model->config().layer_name(i);
        if (static_cast<int64_t>(i) != at) {
          EXPECT_FALSE(AnyDiverged(layers[i].begin(), layers[i].end())) << what << name;
          continue;
        }
        EXPECT_TRUE(layers[i][0].diverged) << what << "forward";
        if (scale == AtolScale::kReferenceMax) {
          EXPECT_TRUE(AnyDiverged(layers[i].begin() + 1, layers[i].end())) << what << "backward";
        }
      }
    }
  }
}

}  // namespace
}  // namespace capsule
