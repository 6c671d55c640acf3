#include "capsule/instrument/health_stats.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace capsule {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// Relative tolerance of mean and rms against a float64 ATen reference.
constexpr double kRtol = 1e-12;

const std::vector<at::ScalarType> kFloatTypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

// Sizes around the vector width (8 float lanes, 16 per unrolled iteration), the scalar cutoff (32)
// and the chunk size (32768 elements).
const std::vector<int64_t> kSizes = {1,   7,    8,     9,     15,    16,         17,
                                     31,  32,   33,    47,    63,    64,         65,
                                     100, 1000, 32767, 32768, 32769, 65536 + 17, 3 * 32768 + 5};

// A denormal (subnormal) value of each dtype: finite and nonzero.
double Denormal(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return 1e-310;
    case at::kHalf:
      return 1e-6;
    default:  // float32 and bfloat16 share the exponent range
      return 1e-39;
  }
}

struct Reference {
  HealthStats stats;
  double abs_mean = 0;  // mean |x| over finite elements: the scale for the mean's tolerance
};

// The same statistics from plain ATen ops in float64, over the logical (row-major) order.
Reference ComputeReference(const at::Tensor& t) {
  Reference ref;
  if (!t.defined() || t.numel() == 0) return ref;
  const at::Tensor d = t.to(at::kDouble).contiguous().reshape({-1});
  HealthStats& s = ref.stats;
  s.numel = d.numel();
  s.nan_count = d.isnan().sum().item<int64_t>();
  s.pos_inf_count = d.isposinf().sum().item<int64_t>();
  s.neg_inf_count = d.isneginf().sum().item<int64_t>();
  s.zero_count = d.eq(0).sum().item<int64_t>();
  const at::Tensor finite = d.isfinite();
  const at::Tensor nonfinite = finite.logical_not().nonzero();
  s.first_nonfinite_index = nonfinite.numel() > 0 ? nonfinite[0][0].item<int64_t>() : -1;
  const at::Tensor f = d.masked_select(finite);
  if (f.numel() > 0) {
    s.min = f.min().item<double>();
    s.max = f.max().item<double>();
    s.absmax = f.abs().max().item<double>();
    s.mean = f.mean().item<double>();
    s.rms = f.pow(2).mean().sqrt().item<double>();
    ref.abs_mean = f.abs().mean().item<double>();
  }
  return ref;
}

HealthStats Stats(const at::Tensor& t, bool vectorize = true) {
  HealthStatsOptions options;
  options.vectorize = vectorize;
  StatusOr<HealthStats> s = ComputeHealthStats(t, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : HealthStats();
}

void ExpectMatchesReference(const at::Tensor& t, bool vectorize = true) {
  SCOPED_TRACE(std::string("dtype=") + c10::toString(t.scalar_type()) +
               " numel=" + std::to_string(t.numel()) + " vectorize=" + std::to_string(vectorize));
  const HealthStats got = Stats(t, vectorize);
  const Reference ref = ComputeReference(t);
  const HealthStats& want = ref.stats;
  EXPECT_EQ(got.numel, want.numel);
  EXPECT_EQ(got.nan_count, want.nan_count);
  EXPECT_EQ(got.pos_inf_count, want.pos_inf_count);
  EXPECT_EQ(got.neg_inf_count, want.neg_inf_count);
  EXPECT_EQ(got.zero_count, want.zero_count);
  EXPECT_EQ(got.first_nonfinite_index, want.first_nonfinite_index);
  EXPECT_EQ(got.min, want.min);
  EXPECT_EQ(got.max, want.max);
  EXPECT_EQ(got.absmax, want.absmax);
  // The mean of values of both signs can be tiny next to the values; bound its error by their
  // magnitude instead.
  EXPECT_NEAR(got.mean, want.mean, kRtol * ref.abs_mean);
  EXPECT_NEAR(got.rms, want.rms, kRtol * want.rms);
  EXPECT_EQ(got.finite(), want.nonfinite_count() == 0);
}

// Float64 values with every kind of special placed at random positions (and at both ends), then
// cast to `dtype`.
at::Tensor MakeTensor(int64_t n, at::ScalarType dtype, bool specials, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.5, 3.0);
  std::uniform_int_distribution<int> kind(0, 99);
  std::vector<double> v(static_cast<size_t>(n));
  const double tiny = Denormal(dtype);
  for (int64_t i = 0; i < n; ++i) {
    double x = normal(rng);
    switch (kind(rng)) {
      case 0:
        x = 0.0;
        break;
      case 1:
        x = -0.0;
        break;
      case 2:
        x = tiny;
        break;
      case 3:
        x = -tiny;
        break;
      case 4:
        if (specials) x = kNaN;
        break;
      case 5:
        if (specials) x = kInf;
        break;
      case 6:
        if (specials) x = -kInf;
        break;
      default:
        break;
    }
    v[static_cast<size_t>(i)] = x;
  }
  if (specials && n > 2) {
    v.back() = -kInf;
  }
  return at::tensor(v, at::kDouble).to(dtype);
}

TEST(HealthStatsTest, UndefinedAndEmptyTensorsHaveNoElements) {
  for (const at::Tensor& t : {at::Tensor(), at::empty({0}), at::empty({3, 0, 2}, at::kHalf)}) {
    const HealthStats s = Stats(t);
    EXPECT_EQ(s.numel, 0);
    EXPECT_EQ(s.nonfinite_count(), 0);
    EXPECT_EQ(s.zero_count, 0);
    EXPECT_EQ(s.first_nonfinite_index, -1);
    EXPECT_EQ(s.min, 0);
    EXPECT_EQ(s.rms, 0);
    EXPECT_TRUE(s.finite());
  }
}

TEST(HealthStatsTest, MatchesReferenceForAllFloatTypesAndSizes) {
  uint32_t seed = 1;
  for (at::ScalarType dtype : kFloatTypes) {
    for (int64_t n : kSizes) {
      for (bool specials : {false, true}) {
        const at::Tensor t = MakeTensor(n, dtype, specials, seed++);
        ExpectMatchesReference(t, /*vectorize=*/true);
        ExpectMatchesReference(t, /*vectorize=*/false);
      }
    }
  }
}

TEST(HealthStatsTest, FirstNonfiniteIndexNearVectorAndChunkBoundaries) {
  for (at::ScalarType dtype : kFloatTypes) {
    for (int64_t n : {int64_t{40}, int64_t{3 * 32768 + 5}}) {
      for (int64_t pos :
           {int64_t{0}, int64_t{7}, int64_t{8}, int64_t{15}, int64_t{16}, int64_t{31}, int64_t{32},
            int64_t{39}, int64_t{32767}, int64_t{32768}, int64_t{65536 + 3}, n - 1}) {
        if (pos >= n) continue;
        for (double special : {kNaN, kInf, -kInf}) {
          at::Tensor t = at::randn({n}, at::kDouble).to(dtype);
          t[pos] = special;
          if (pos + 5 < n) t[pos + 5] = kNaN;  // a later one must not win
          const HealthStats s = Stats(t);
          EXPECT_EQ(s.first_nonfinite_index, pos) << c10::toString(dtype) << " n=" << n;
          EXPECT_EQ(s.nonfinite_count(), pos + 5 < n ? 2 : 1);
          ExpectMatchesReference(t);
        }
      }
    }
  }
}

TEST(HealthStatsTest, NonFiniteOnlyTensorsHaveZeroMoments) {
  for (at::ScalarType dtype : kFloatTypes) {
    for (int64_t n : {int64_t{1}, int64_t{9}, int64_t{100}, int64_t{70000}}) {
      const HealthStats nan = Stats(at::full({n}, kNaN, at::kDouble).to(dtype));
      EXPECT_EQ(nan.nan_count, n);
      EXPECT_EQ(nan.first_nonfinite_index, 0);
      EXPECT_EQ(nan.min, 0);
      EXPECT_EQ(nan.max, 0);
      EXPECT_EQ(nan.absmax, 0);
      EXPECT_EQ(nan.mean, 0);
      EXPECT_EQ(nan.rms, 0);
      EXPECT_FALSE(nan.finite());

      at::Tensor mixed = at::full({n}, kInf, at::kDouble);
      mixed.slice(0, 0, n, 2).fill_(-kInf);
      const HealthStats inf = Stats(mixed.to(dtype));
      EXPECT_EQ(inf.neg_inf_count, (n + 1) / 2);
      EXPECT_EQ(inf.pos_inf_count, n / 2);
      EXPECT_EQ(inf.nonfinite_count(), n);
      EXPECT_EQ(inf.rms, 0);
    }
  }
}

TEST(HealthStatsTest, CountsSignedZerosAndKeepsDenormalsFinite) {
  for (at::ScalarType dtype : kFloatTypes) {
    const double tiny = Denormal(dtype);
    std::vector<double> v(50, 0.0);
    for (size_t i = 0; i < v.size(); i += 2) v[i] = -0.0;
    v[17] = tiny;
    v[40] = -tiny;
    const at::Tensor t = at::tensor(v, at::kDouble).to(dtype);
    const HealthStats s = Stats(t);
    EXPECT_EQ(s.zero_count, 48) << c10::toString(dtype);
    EXPECT_TRUE(s.finite());
    EXPECT_GT(s.max, 0);
    EXPECT_LT(s.min, 0);
    EXPECT_EQ(s.absmax, t[17].item<double>());
    // A float64 denormal's square underflows to 0 in double, so only the narrower types keep rms >
    // 0.
    if (dtype != at::kDouble) {
      EXPECT_GT(s.rms, 0);
    }
    ExpectMatchesReference(t);
    ExpectMatchesReference(t, /*vectorize=*/false);
  }
}

TEST(HealthStatsTest, ZeroDimTensors) {
  for (at::ScalarType dtype : kFloatTypes) {
    const HealthStats s = Stats(at::scalar_tensor(-2.5, at::TensorOptions().dtype(dtype)));
    EXPECT_EQ(s.numel, 1);
    EXPECT_EQ(s.min, -2.5);
    EXPECT_EQ(s.max, -2.5);
    EXPECT_EQ(s.absmax, 2.5);
    EXPECT_EQ(s.mean, -2.5);
    EXPECT_EQ(s.rms, 2.5);

    const HealthStats n = Stats(at::scalar_tensor(kNaN, at::TensorOptions().dtype(dtype)));
    EXPECT_EQ(n.nan_count, 1);
    EXPECT_EQ(n.first_nonfinite_index, 0);
    EXPECT_EQ(n.mean, 0);

    const HealthStats z = Stats(at::scalar_tensor(-0.0, at::TensorOptions().dtype(dtype)));
    EXPECT_EQ(z.zero_count, 1);
  }
}

// Non-contiguous views, each with specials: results follow the logical row-major order.
std::vector<std::pair<std::string, at::Tensor>> Views(at::ScalarType dtype, uint32_t seed) {
  const at::Tensor base = MakeTensor(60 * 70, dtype, /*specials=*/true, seed).reshape({60, 70});
  const at::Tensor cube = MakeTensor(6 * 50 * 40, dtype, true, seed + 1).reshape({6, 50, 40});
  const at::Tensor row = MakeTensor(100, dtype, true, seed + 2);
  return {
      {"transpose", base.t()},
      {"row_step", base.slice(0, 1, 60, 3)},
      {"col_step", base.slice(1, 0, 70, 3)},
      {"both_steps", base.slice(0, 2, 60, 2).slice(1, 1, 70, 5)},
      {"narrow_cols", base.narrow(1, 3, 50)},  // rows stay contiguous: vector runs of 50
      {"expand_rows", row.expand({40, 100})},  // stride 0 outer, contiguous inner
      {"expand_cols", row.slice(0, 0, 50).unsqueeze(1).expand({50, 9})},  // stride 0 inner
      {"expand_middle", base.slice(0, 0, 8).unsqueeze(1).expand({8, 3, 70})},
      {"expand_transposed", base.t().unsqueeze(0).expand({2, 70, 60})},
      {"permute", cube.permute({2, 0, 1})},
      {"permute_inner_contiguous", cube.permute({1, 0, 2})},
      {"diagonal", base.diagonal()},
      {"select", cube.select(2, 7)},
  };
}

TEST(HealthStatsTest, NonContiguousViewsMatchReference) {
  uint32_t seed = 100;
  for (at::ScalarType dtype : kFloatTypes) {
    for (const auto& [name, view] : Views(dtype, seed)) {
      SCOPED_TRACE(name);
      ExpectMatchesReference(view, true);
      ExpectMatchesReference(view, false);
    }
    seed += 10;
  }
}

TEST(HealthStatsTest, FirstNonfiniteIndexIsLogicalInTransposedView) {
  for (at::ScalarType dtype : kFloatTypes) {
    at::Tensor m = at::zeros({5, 7}, at::TensorOptions().dtype(dtype));
    m[3][2] = kNaN;               // storage offset 3*7+2 = 23
    m[0][6] = kInf;               // storage offset 6, but logically later in the transpose
    const at::Tensor mt = m.t();  // 7x5; (2, 3) is logical index 2*5+3 = 13, (6, 0) is 30
    EXPECT_EQ(Stats(m).first_nonfinite_index, 6);
    EXPECT_EQ(Stats(mt).first_nonfinite_index, 13) << c10::toString(dtype);
    EXPECT_EQ(Stats(mt, false).first_nonfinite_index, 13);
  }
}

TEST(HealthStatsTest, LargeStridedViewsAcrossChunks) {
  at::Tensor a = at::randn({400, 300});
  a[399][0] = kNaN;  // logical index 0*400+399 in the transpose
  a[5][250] = -kInf;
  ExpectMatchesReference(a.t());
  EXPECT_EQ(Stats(a.t()).first_nonfinite_index, 399);
  ExpectMatchesReference(a.slice(1, 0, 300, 2));
  ExpectMatchesReference(at::randn({3000}).expand({40, 3000}));
}

TEST(HealthStatsTest, ResultDoesNotDependOnThreadCount) {
  const int saved = at::get_num_threads();
  for (at::ScalarType dtype : kFloatTypes) {
    at::Tensor t = at::randn({2 * 1000 * 1000 + 3}, at::kDouble).mul_(1e3).to(dtype);
    t[123457] = kNaN;
    t[1900001] = -kInf;
    for (const at::Tensor& view : {t, t.slice(0, 0, t.numel(), 3)}) {
      std::vector<HealthStats> runs;
      for (int threads : {1, 2, 3, 4}) {
        at::set_num_threads(threads);
        runs.push_back(Stats(view));
      }
      for (size_t i = 1; i < runs.size(); ++i) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " run " + std::to_string(i));
        EXPECT_EQ(runs[i].nan_count, runs[0].nan_count);
        EXPECT_EQ(runs[i].neg_inf_count, runs[0].neg_inf_count);
        EXPECT_EQ(runs[i].zero_count, runs[0].zero_count);
        EXPECT_EQ(runs[i].first_nonfinite_index, runs[0].first_nonfinite_index);
        for (auto field : {&HealthStats::min, &HealthStats::max, &HealthStats::absmax,
                           &HealthStats::mean, &HealthStats::rms}) {
          // Bit-identical, not just close.
          EXPECT_EQ(std::memcmp(&(runs[i].*field), &(runs[0].*field), sizeof(double)), 0)
              << runs[i].*field << " vs " << runs[0].*field;
        }
      }
      ExpectMatchesReference(view);
    }
  }
  at::set_num_threads(saved);
}

// Replay compares a capsule's statistics with a re-run's bit for bit, and the two may run on
// different CPUs. So every vector kernel (AVX2; AVX-512 where the CPU has it, one chunk at a time
// or two interleaved) must compute what the AVX2 kernel computes, down to the last bit and to the
// sign of a zero minimum or maximum. The model below is that computation, element by element, for
// a contiguous 1-D float32/bf16/fp16 tensor: chunks of 32768 elements, each one run. A run of 32
// or more finite elements goes through 16 double lanes (element j of every 16 into lane j,
// combined pairwise, then the tail of fewer than 16 added in order) and 8 float min/max lanes
// (elements j and j + 8 of every 16 into lane j, in vminps/vmaxps order); other runs go through
// the scalar loop. Chunks are combined in order.
bool CpuRunsVectorKernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

struct ModelSums {
  double min = kInf;
  double max = -kInf;
  double sum = 0;
  double sumsq = 0;
  int64_t finite = 0;
};

// vminps / vmaxps: the first operand only if it is strictly smaller / larger.
float VMin(float a, float b) { return a < b ? a : b; }
float VMax(float a, float b) { return a > b ? a : b; }

double LaneTree(const double (&x)[16]) {
  double lane[4];
  for (int k = 0; k < 4; ++k) lane[k] = (x[k] + x[4 + k]) + (x[8 + k] + x[12 + k]);
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

ModelSums ModelRun(const float* v, int64_t n) {
  ModelSums r;
  const bool finite = std::all_of(v, v + n, [](float x) { return std::isfinite(x); });
  if (n >= 32 && finite) {
    double s[16] = {}, q[16] = {};
    float mn[8], mx[8];
    std::fill(mn, mn + 8, std::numeric_limits<float>::infinity());
    std::fill(mx, mx + 8, -std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      for (int j = 0; j < 16; ++j) {
        const double d = v[i + j];
        s[j] += d;
        q[j] = std::fma(d, d, q[j]);
      }
      for (int l = 0; l < 8; ++l) {
        mn[l] = VMin(mn[l], VMin(v[i + l], v[i + 8 + l]));
        mx[l] = VMax(mx[l], VMax(v[i + l], v[i + 8 + l]));
      }
    }
    double sum = LaneTree(s), sumsq = LaneTree(q);
    float fmn = mn[0], fmx = mx[0];
    for (int l = 0; l < 8; ++l) {
      fmn = std::min(fmn, mn[l]);
      fmx = std::max(fmx, mx[l]);
    }
    double tail_sum = 0, tail_sumsq = 0;
    for (; i < n; ++i) {
      const double d = v[i];
      tail_sum += d;
      tail_sumsq += d * d;
      fmn = std::min(fmn, v[i]);
      fmx = std::max(fmx, v[i]);
    }
    r.min = fmn;
    r.max = fmx;
    r.sum += sum + tail_sum;
    r.sumsq += sumsq + tail_sumsq;
    r.finite = n;
    return r;
  }
  double mn = kInf, mx = -kInf, sum = 0, sumsq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = v[i];
    if (!std::isfinite(d)) continue;
    ++r.finite;
    mn = std::min(mn, d);
    mx = std::max(mx, d);
    sum += d;
    sumsq += d * d;
  }
  r.min = std::min(r.min, mn);
  r.max = std::max(r.max, mx);
  r.sum += sum;
  r.sumsq += sumsq;
  return r;
}

HealthStats ModelVectorKernels(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).contiguous();  // exact for bf16 and fp16
  const float* v = f.data_ptr<float>();
  const int64_t n = f.numel();
  constexpr int64_t kChunk = 32768;
  ModelSums total;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const ModelSums c = ModelRun(v + begin, std::min(kChunk, n - begin));
    total.min = std::min(total.min, c.min);
    total.max = std::max(total.max, c.max);
    total.sum += c.sum;
    total.sumsq += c.sumsq;
    total.finite += c.finite;
  }
  HealthStats s;
  if (total.finite == 0) return s;
  s.min = total.min;
  s.max = total.max;
  s.mean = total.sum / static_cast<double>(total.finite);
  s.rms = std::sqrt(total.sumsq / static_cast<double>(total.finite));
  return s;
}

void ExpectSameBitsAsModel(const at::Tensor& t, const std::string& what) {
  const HealthStats want = ModelVectorKernels(t);
  const Reference ref = ComputeReference(t);
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    const HealthStats got = Stats(t);
    SCOPED_TRACE(what + " dtype=" + c10::toString(t.scalar_type()) +
                 " numel=" + std::to_string(t.numel()) + " threads=" + std::to_string(threads));
    EXPECT_EQ(got.nan_count, ref.stats.nan_count);
    EXPECT_EQ(got.zero_count, ref.stats.zero_count);
    EXPECT_EQ(got.first_nonfinite_index, ref.stats.first_nonfinite_index);
    for (auto field :
         {&HealthStats::min, &HealthStats::max, &HealthStats::mean, &HealthStats::rms}) {
      EXPECT_EQ(std::memcmp(&(got.*field), &(want.*field), sizeof(double)), 0)
          << got.*field << " vs " << want.*field << " (signbit " << std::signbit(got.*field)
          << " vs " << std::signbit(want.*field) << ")";
    }
  }
  at::set_num_threads(saved);
}

// Sizes: one short run, a tail of 1-15 elements, a partial chunk, whole chunks, and odd and even
// numbers of whole chunks plus a remainder, so that with 1 and 2 threads a chunk is reduced alone
// in one run and interleaved with a neighbour in the other.
const std::vector<int64_t> kChunkedSizes = {
    40, 1000, 32767, 32768, 2 * 32768, 3 * 32768 + 5, 5 * 32768 + 17, 8 * 32768 + 31};

TEST(HealthStatsTest, VectorKernelsAddInTheAvx2KernelsOrder) {
  if (!CpuRunsVectorKernel()) GTEST_SKIP() << "no AVX2: the scalar kernel runs";
  uint32_t seed = 500;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t n : kChunkedSizes) {
      ExpectSameBitsAsModel(MakeTensor(n, dtype, /*specials=*/false, seed++), "finite");
      // One NaN sends only its chunk to the scalar rescan; its neighbours stay vectorized.
      at::Tensor one_nan = MakeTensor(n, dtype, /*specials=*/false, seed++);
      one_nan[n > 2 * 32768 ? 32768 + 100 : n / 2] = kNaN;
      ExpectSameBitsAsModel(one_nan, "one NaN");
      // Magnitudes far apart: float partial sums would drop the small ones.
      at::Tensor wide = MakeTensor(n, at::kDouble, /*specials=*/false, seed++);
      wide.slice(0, 0, n, 7).mul_(dtype == at::kHalf ? 1e3 : 1e7);
      wide.slice(0, 3, n, 11).mul_(dtype == at::kHalf ? 1e-3 : 1e-7);
      ExpectSameBitsAsModel(wide.to(dtype), "wide range");
      ExpectMatchesReference(wide.to(dtype));
    }
  }
}

// Elements of both signs of zero as the minimum (or maximum): which one is reported depends on the
// order elements are compared in, and must not depend on the CPU.
TEST(HealthStatsTest, ZeroMinimumAndMaximumHaveOneSignOnEveryCpu) {
  if (!CpuRunsVectorKernel()) GTEST_SKIP() << "no AVX2: the scalar kernel runs";
  std::mt19937 rng(77);
  std::uniform_int_distribution<int> kind(0, 9);
  std::exponential_distribution<float> magnitude(1.0f);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t n : {int64_t{33}, int64_t{48}, int64_t{100}, int64_t{1000}, int64_t{32768 + 40},
                      int64_t{3 * 32768}}) {
      for (int zero_share : {3, 9, 10}) {  // in tenths; 10: nothing but zeros
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) {
          const int k = kind(rng);
          x = k < zero_share ? (k % 2 == 0 ? 0.0f : -0.0f) : magnitude(rng) + 0.5f;
        }
        const at::Tensor nonneg = at::tensor(v).to(dtype);
        ExpectSameBitsAsModel(nonneg, "zero minimum, share " + std::to_string(zero_share));
        ExpectSameBitsAsModel(-nonneg, "zero maximum, share " + std::to_string(zero_share));
      }
    }
  }
}

TEST(HealthStatsTest, IntegerAndBoolTensors) {
  for (at::ScalarType dtype : {at::kByte, at::kChar, at::kShort, at::kInt, at::kLong}) {
    const at::Tensor t = at::randint(-100, 100, {5000}, at::kLong)
                             .clamp_min(dtype == at::kByte ? 0 : -100)
                             .to(dtype);
    ExpectMatchesReference(t);
    ExpectMatchesReference(t.slice(0, 0, 5000, 7));
  }
  const at::Tensor b = at::rand({1000}).gt(0.3);
  const HealthStats s = Stats(b);
  EXPECT_EQ(s.zero_count, b.logical_not().sum().item<int64_t>());
  EXPECT_TRUE(s.finite());
  ExpectMatchesReference(b);
}

TEST(HealthStatsTest, HugeFloat64ValuesDoNotOverflowMeanOrRms) {
  const HealthStats big = Stats(at::full({1000}, 1e300, at::kDouble));
  EXPECT_TRUE(big.finite());
  EXPECT_NEAR(big.mean, 1e300, 1e300 * kRtol);
  EXPECT_NEAR(big.rms, 1e300, 1e300 * kRtol);

  at::Tensor alternating = at::full({1001}, 1.5e308, at::kDouble);
  alternating.slice(0, 1, 1001, 2).neg_();
  alternating[500] = kNaN;
  const HealthStats s = Stats(alternating);
  EXPECT_EQ(s.nan_count, 1);
  EXPECT_EQ(s.first_nonfinite_index, 500);
  EXPECT_EQ(s.absmax, 1.5e308);
  EXPECT_NEAR(s.mean, 0, 1.5e308 * 1e-12);
  EXPECT_NEAR(s.rms, 1.5e308, 1.5e308 * kRtol);
}

TEST(HealthStatsTest, SpecialTensorKinds) {
  // Requires grad: read without recording anything.
  at::Tensor w = at::randn({64}).requires_grad_(true);
  ExpectMatchesReference(w.detach());
  EXPECT_EQ(Stats(w).numel, 64);

  // A negative view reads as the negated values.
  const at::Tensor x = at::randn({100});
  const HealthStats neg = Stats(at::_neg_view(x));
  EXPECT_EQ(neg.max, -x.min().item<double>());

  // Autograd's zero tensors have no storage.
  const HealthStats z = Stats(at::_efficientzerotensor({3, 4}));
  EXPECT_EQ(z.numel, 12);
  EXPECT_EQ(z.zero_count, 12);
  EXPECT_EQ(z.rms, 0);
}

TEST(HealthStatsTest, RefusesUnsupportedInputs) {
  StatusOr<HealthStats> c = ComputeHealthStats(at::randn({4}, at::kComplexFloat));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("unsupported dtype"), std::string::npos) << c.status();

  StatusOr<HealthStats> sp = ComputeHealthStats(at::eye(3).to_sparse());
  ASSERT_FALSE(sp.ok());
  EXPECT_EQ(sp.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sp.status().message().find("to_dense"), std::string::npos) << sp.status();

  StatusOr<HealthStats> meta =
      ComputeHealthStats(at::empty({3}, at::TensorOptions().device(at::kMeta)));
  ASSERT_FALSE(meta.ok());
  EXPECT_EQ(meta.status().code(), StatusCode::kInvalidArgument);
}

TEST(HealthStatsTest, CudaTensorsAreCopiedToCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::Tensor t = at::randn({1000});
  t[10] = kNaN;
  const HealthStats cpu = Stats(t);
  const HealthStats gpu = Stats(t.to(at::kCUDA));
  EXPECT_EQ(gpu.first_nonfinite_index, cpu.first_nonfinite_index);
  EXPECT_EQ(std::memcmp(&gpu.mean, &cpu.mean, sizeof(double)), 0);
}

}  // namespace
}  // namespace capsule
