#include "capsule/probe/health_stats.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define CAPSULE_HEALTH_STATS_X86 1
// The library is built for baseline x86-64; only these functions use AVX2 and they run only after
// a runtime CPU check, so no separate translation unit or global -mavx2 is needed.
#define CAPSULE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CAPSULE_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#else
#define CAPSULE_HEALTH_STATS_X86 0
#endif

namespace capsule {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Work unit of the parallel loop, in positions of the walk (see Geometry). It must not depend on
// the thread count: every chunk is reduced on its own and the partial results are combined in
// chunk order, which makes the result bit-identical for any number of threads. 32K elements
// (128 KiB of float32) amortise the per-chunk overhead and still give a few chunks per thread at
// 1 MiB.
constexpr int64_t kChunkElements = int64_t{1} << 15;
// Below this length a contiguous run goes straight to the scalar kernel: the vector kernel's
// horizontal reductions would cost more than they save.
constexpr int64_t kMinVectorRun = 32;

// Everything one chunk contributes; sums are over finite elements, in double.
struct Partial {
  int64_t finite = 0;
  int64_t nan = 0;
  int64_t pos_inf = 0;
  int64_t neg_inf = 0;
  int64_t zero = 0;
  double min = kInf;
  double max = -kInf;
  double sum = 0;
  double sumsq = 0;
  int64_t first_nonfinite = -1;
};

// What the vector kernels compute over a contiguous run without classifying elements. The run is
// all finite exactly when sumsq is finite: squares are >= 0 so nothing cancels, an Inf or NaN
// element makes sumsq Inf or NaN, and float32/bf16/fp16 squares summed in double cannot overflow.
// (float64 squares can; that only sends the run to the exact scalar kernel.)
struct RunSums {
  double sum = 0;
  double sumsq = 0;
  double min = kInf;
  double max = -kInf;
  int64_t zero = 0;
};

void AddFiniteRun(const RunSums& r, int64_t n, Partial* acc) {
  acc->finite += n;
  acc->zero += r.zero;
  acc->min = std::min(acc->min, r.min);
  acc->max = std::max(acc->max, r.max);
  acc->sum += r.sum;
  acc->sumsq += r.sumsq;
}

template <typename T>
inline double ToDouble(T x) {
  return static_cast<double>(x);
}
inline double ToDouble(c10::Half x) { return static_cast<double>(static_cast<float>(x)); }
inline double ToDouble(c10::BFloat16 x) { return static_cast<double>(static_cast<float>(x)); }

// Keeps the smaller of two logical indices, -1 meaning none. Runs are visited in memory order, so
// the first non-finite element seen is not necessarily the first in logical order.
inline int64_t MinIndex(int64_t a, int64_t b) {
  if (a < 0) return b;
  if (b < 0) return a;
  return std::min(a, b);
}

// The exact kernel: classifies every element. Used for short runs, runs in which the vector kernel
// saw a non-finite element (the rescan that finds the first index), integer dtypes, and CPUs
// without AVX2. Element i of the run is p[i * stride] and has logical index base + i * lstride.
template <typename T>
void ClassifyRun(const T* p, int64_t stride, int64_t n, int64_t base, int64_t lstride,
                 Partial* acc) {
  int64_t finite = 0, nan = 0, pos_inf = 0, neg_inf = 0, zero = 0;
  double mn = kInf, mx = -kInf, sum = 0, sumsq = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double v = ToDouble(p[i * stride]);
    if (std::isfinite(v)) {
      ++finite;
      zero += v == 0;
      mn = std::min(mn, v);
      mx = std::max(mx, v);
      sum += v;
      sumsq += v * v;
    } else {
      if (first < 0) first = base + i * lstride;
      if (std::isnan(v)) {
        ++nan;
      } else if (v > 0) {
        ++pos_inf;
      } else {
        ++neg_inf;
      }
    }
  }
  acc->finite += finite;
  acc->nan += nan;
  acc->pos_inf += pos_inf;
  acc->neg_inf += neg_inf;
  acc->zero += zero;
  acc->min = std::min(acc->min, mn);
  acc->max = std::max(acc->max, mx);
  acc->sum += sum;
  acc->sumsq += sumsq;
  acc->first_nonfinite = MinIndex(acc->first_nonfinite, first);
}

// Second pass for the rare float64 tensor whose finite values overflow sum or sum of squares
// (|x| > ~1e154): accumulates x / scale instead, so mean = scale * sum / n stays representable.
template <typename T>
void ScaledSumsRun(const T* p, int64_t stride, int64_t n, double scale, Partial* acc) {
  double sum = 0, sumsq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = ToDouble(p[i * stride]);
    if (std::isfinite(v)) {
      const double s = v / scale;
      sum += s;
      sumsq += s * s;
    }
  }
  acc->sum += sum;
  acc->sumsq += sumsq;
}

#if CAPSULE_HEALTH_STATS_X86

// Loaders give eight elements as float32 lanes (for min, max and the zero count) and widen them
// to two vectors of four doubles (for the sums).
struct LoadF32 {
  using T = float;
  static CAPSULE_AVX2_INLINE __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
  // Converting straight from memory saves the lane extract; loads are cheaper than shuffles here.
  static CAPSULE_AVX2_INLINE void Widen(const float* p, __m256, __m256d* lo, __m256d* hi) {
    *lo = _mm256_cvtps_pd(_mm_loadu_ps(p));
    *hi = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
  }
};

CAPSULE_AVX2_INLINE void WidenLanes(__m256 v, __m256d* lo, __m256d* hi) {
  *lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
  *hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

struct LoadBF16 {
  using T = c10::BFloat16;
  // bfloat16 is the high half of a float32: widen to 32 bits and shift, exact.
  static CAPSULE_AVX2_INLINE __m256 Load8(const c10::BFloat16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static CAPSULE_AVX2_INLINE void Widen(const c10::BFloat16*, __m256 v, __m256d* lo, __m256d* hi) {
    WidenLanes(v, lo, hi);
  }
};

struct LoadF16 {
  using T = c10::Half;
  static CAPSULE_AVX2_INLINE __m256 Load8(const c10::Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static CAPSULE_AVX2_INLINE void Widen(const c10::Half*, __m256 v, __m256d* lo, __m256d* hi) {
    WidenLanes(v, lo, hi);
  }
};

// Software prefetch distance. The hardware prefetcher alone leaves a single thread at ~15 GB/s on
// a DRAM-resident float32 tensor here (Zen 3); asking for the line 2 KiB ahead gave ~19 GB/s and
// costs nothing when the data is in cache. Prefetches never fault, so running past the end is fine.
constexpr int64_t kPrefetchBytes = 2048;

CAPSULE_AVX2_INLINE void Prefetch(const void* p, int64_t ahead) {
  _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T0);
}

CAPSULE_AVX2_INLINE double HorizontalSum(__m256d a, __m256d b, __m256d c, __m256d d) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(a, b), _mm256_add_pd(c, d)));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// float32 / bf16 / fp16 run: 16 elements per iteration, widened to double for sum and sum of
// squares (four independent accumulators each, to hide the add/FMA latency); min, max and the
// zero count stay in float lanes. No per-element branch and no masking: non-finite lanes simply
// poison sumsq, and the caller rescans the run.
//
// Throughput is bound by the vector ports, not by memory: the float-to-double conversions compete
// with the adds. Half of the sum accumulators therefore add through the FMA units (x * 1 + s, exact
// like an add), which balances the ports and measured ~13% faster than plain adds on Zen 3.
template <class L>
CAPSULE_AVX2 RunSums VectorRunFloat(const typename L::T* p, int64_t n) {
  const __m256 zero_f = _mm256_setzero_ps();
  const __m256d one = _mm256_set1_pd(1.0);
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  __m256 mn = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256i zeros = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Prefetch(p + i, kPrefetchBytes);
    const __m256 a = L::Load8(p + i);
    const __m256 b = L::Load8(p + i + 8);
    mn = _mm256_min_ps(mn, _mm256_min_ps(a, b));
    mx = _mm256_max_ps(mx, _mm256_max_ps(a, b));
    // An all-ones compare mask is -1 as an integer; subtracting it counts.
    zeros = _mm256_sub_epi32(zeros, _mm256_castps_si256(_mm256_cmp_ps(a, zero_f, _CMP_EQ_OQ)));
    zeros = _mm256_sub_epi32(zeros, _mm256_castps_si256(_mm256_cmp_ps(b, zero_f, _CMP_EQ_OQ)));
    __m256d a0, a1, b0, b1;
    L::Widen(p + i, a, &a0, &a1);
    L::Widen(p + i + 8, b, &b0, &b1);
    s0 = _mm256_fmadd_pd(a0, one, s0);
    s1 = _mm256_add_pd(s1, a1);
    s2 = _mm256_fmadd_pd(b0, one, s2);
    s3 = _mm256_add_pd(s3, b1);
    q0 = _mm256_fmadd_pd(a0, a0, q0);
    q1 = _mm256_fmadd_pd(a1, a1, q1);
    q2 = _mm256_fmadd_pd(b0, b0, q2);
    q3 = _mm256_fmadd_pd(b1, b1, q3);
  }
  RunSums r;
  r.sum = HorizontalSum(s0, s1, s2, s3);
  r.sumsq = HorizontalSum(q0, q1, q2, q3);
  alignas(32) float mn_lanes[8], mx_lanes[8];
  alignas(32) int32_t zero_lanes[8];
  _mm256_store_ps(mn_lanes, mn);
  _mm256_store_ps(mx_lanes, mx);
  _mm256_store_si256(reinterpret_cast<__m256i*>(zero_lanes), zeros);
  float fmn = mn_lanes[0], fmx = mx_lanes[0];
  for (int l = 0; l < 8; ++l) {
    fmn = std::min(fmn, mn_lanes[l]);
    fmx = std::max(fmx, mx_lanes[l]);
    r.zero += zero_lanes[l];
  }
  double tail_sum = 0, tail_sumsq = 0;
  for (; i < n; ++i) {
    const float v = static_cast<float>(p[i]);
    const double d = v;
    tail_sum += d;
    tail_sumsq += d * d;
    fmn = std::min(fmn, v);
    fmx = std::max(fmx, v);
    r.zero += v == 0;
  }
  r.sum += tail_sum;
  r.sumsq += tail_sumsq;
  r.min = fmn;
  r.max = fmx;
  return r;
}

CAPSULE_AVX2 RunSums VectorRunDouble(const double* p, int64_t n) {
  const __m256d zero_d = _mm256_setzero_pd();
  __m256d s0 = zero_d, s1 = zero_d, s2 = zero_d, s3 = zero_d;
  __m256d q0 = zero_d, q1 = zero_d, q2 = zero_d, q3 = zero_d;
  __m256d mn = _mm256_set1_pd(kInf);
  __m256d mx = _mm256_set1_pd(-kInf);
  __m256i zeros = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Prefetch(p + i, kPrefetchBytes);
    Prefetch(p + i, kPrefetchBytes + 64);
    const __m256d a = _mm256_loadu_pd(p + i);
    const __m256d b = _mm256_loadu_pd(p + i + 4);
    const __m256d c = _mm256_loadu_pd(p + i + 8);
    const __m256d d = _mm256_loadu_pd(p + i + 12);
    mn = _mm256_min_pd(mn, _mm256_min_pd(_mm256_min_pd(a, b), _mm256_min_pd(c, d)));
    mx = _mm256_max_pd(mx, _mm256_max_pd(_mm256_max_pd(a, b), _mm256_max_pd(c, d)));
    zeros = _mm256_sub_epi64(zeros, _mm256_castpd_si256(_mm256_cmp_pd(a, zero_d, _CMP_EQ_OQ)));
    zeros = _mm256_sub_epi64(zeros, _mm256_castpd_si256(_mm256_cmp_pd(b, zero_d, _CMP_EQ_OQ)));
    zeros = _mm256_sub_epi64(zeros, _mm256_castpd_si256(_mm256_cmp_pd(c, zero_d, _CMP_EQ_OQ)));
    zeros = _mm256_sub_epi64(zeros, _mm256_castpd_si256(_mm256_cmp_pd(d, zero_d, _CMP_EQ_OQ)));
    s0 = _mm256_add_pd(s0, a);
    s1 = _mm256_add_pd(s1, b);
    s2 = _mm256_add_pd(s2, c);
    s3 = _mm256_add_pd(s3, d);
    q0 = _mm256_fmadd_pd(a, a, q0);
    q1 = _mm256_fmadd_pd(b, b, q1);
    q2 = _mm256_fmadd_pd(c, c, q2);
    q3 = _mm256_fmadd_pd(d, d, q3);
  }
  RunSums r;
  r.sum = HorizontalSum(s0, s1, s2, s3);
  r.sumsq = HorizontalSum(q0, q1, q2, q3);
  alignas(32) double mn_lanes[4], mx_lanes[4];
  alignas(32) int64_t zero_lanes[4];
  _mm256_store_pd(mn_lanes, mn);
  _mm256_store_pd(mx_lanes, mx);
  _mm256_store_si256(reinterpret_cast<__m256i*>(zero_lanes), zeros);
  double dmn = mn_lanes[0], dmx = mx_lanes[0];
  for (int l = 0; l < 4; ++l) {
    dmn = std::min(dmn, mn_lanes[l]);
    dmx = std::max(dmx, mx_lanes[l]);
    r.zero += zero_lanes[l];
  }
  double tail_sum = 0, tail_sumsq = 0;
  for (; i < n; ++i) {
    const double v = p[i];
    tail_sum += v;
    tail_sumsq += v * v;
    dmn = std::min(dmn, v);
    dmx = std::max(dmx, v);
    r.zero += v == 0;
  }
  r.sum += tail_sum;
  r.sumsq += tail_sumsq;
  r.min = dmn;
  r.max = dmx;
  return r;
}

RunSums VectorRun(const float* p, int64_t n) { return VectorRunFloat<LoadF32>(p, n); }
RunSums VectorRun(const c10::BFloat16* p, int64_t n) { return VectorRunFloat<LoadBF16>(p, n); }
RunSums VectorRun(const c10::Half* p, int64_t n) { return VectorRunFloat<LoadF16>(p, n); }
RunSums VectorRun(const double* p, int64_t n) { return VectorRunDouble(p, n); }

template <typename T>
constexpr bool kHasVectorRun = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                               std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;

bool CpuHasVectorKernel() {
  static const bool has = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
    // clang's __builtin_cpu_supports does not know "f16c": ask CPUID leaf 1 directly. AVX2 above
    // already implies the OS saves the YMM state F16C needs.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  }();
  return has;
}

#else  // !CAPSULE_HEALTH_STATS_X86

template <typename T>
constexpr bool kHasVectorRun = false;
template <typename T>
RunSums VectorRun(const T*, int64_t) {
  return RunSums();
}
bool CpuHasVectorKernel() { return false; }

#endif  // CAPSULE_HEALTH_STATS_X86

// Strided runs are copied into a buffer of this many elements so the vector kernel can read them;
// 512 keeps the buffer in L1 and the per-piece reductions negligible.
constexpr int64_t kGatherElements = 512;

// Reduces `n` elements `stride` apart starting at `p`; element i has logical index
// base + i * lstride (lstride > 0, so the first non-finite element of a run is its lowest index).
template <typename T>
void ScanRun(const T* p, int64_t stride, int64_t n, int64_t base, int64_t lstride, bool vectorize,
             Partial* acc) {
  if constexpr (kHasVectorRun<T>) {
    if (vectorize && n >= kMinVectorRun) {
      if (stride == 1) {
        const RunSums r = VectorRun(p, n);
        // A non-finite element (or an overflowing float64 square) poisons sumsq: rescan exactly.
        if (std::isfinite(r.sumsq)) {
          AddFiniteRun(r, n, acc);
        } else {
          ClassifyRun(p, 1, n, base, lstride, acc);
        }
        return;
      }
      alignas(32) T buffer[kGatherElements];
      for (int64_t off = 0; off < n; off += kGatherElements) {
        const int64_t len = std::min(kGatherElements, n - off);
        const T* q = p + off * stride;
        for (int64_t i = 0; i < len; ++i) buffer[i] = q[i * stride];
        const RunSums r = VectorRun(buffer, len);
        if (std::isfinite(r.sumsq)) {
          AddFiniteRun(r, len, acc);
        } else {
          ClassifyRun(q, stride, len, base + off * lstride, lstride, acc);
        }
      }
      return;
    }
  }
  ClassifyRun(p, stride, n, base, lstride, acc);
}

// How the pass walks the tensor: dimensions in memory order (outermost = largest stride), size-1
// dimensions dropped, neighbours merged where both the memory and the logical layout allow it.
// Walking memory in order keeps transposed and permuted views as fast as contiguous ones; each
// dimension also carries its logical (row-major) stride, so first_nonfinite_index is still the
// logical index. A contiguous tensor becomes a single run.
//
// Broadcast dimensions (stride 0, from expand()) repeat the same elements, so they are not walked
// at all: counts are multiplied by `repeat`, and min, max, mean and rms are those of the distinct
// elements. The first occurrence of an element has index 0 along every broadcast dimension, so
// logical indices computed without them are exact.
struct Geometry {
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;   // in elements, in memory
  c10::SmallVector<int64_t, 6> lstrides;  // row-major strides of the full logical shape
  int64_t repeat = 1;                     // product of the broadcast dimensions' sizes
  int64_t walk_numel = 1;                 // product of sizes
};

Geometry MakeGeometry(const at::Tensor& t) {
  struct Dim {
    int64_t size, stride, lstride;
  };
  Geometry g;
  c10::SmallVector<Dim, 6> dims;
  int64_t lstride = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.size(d);
    if (size != 1) {
      if (t.stride(d) == 0) {
        g.repeat *= size;
      } else {
        dims.push_back({size, t.stride(d), lstride});
      }
    }
    lstride *= size;
  }
  std::reverse(dims.begin(), dims.end());
  // Decreasing memory stride; stable, so ties (overlapping views) keep the logical order.
  std::stable_sort(dims.begin(), dims.end(),
                   [](const Dim& a, const Dim& b) { return a.stride > b.stride; });
  for (const Dim& d : dims) {
    if (!g.sizes.empty() && g.strides.back() == d.size * d.stride &&
        g.lstrides.back() == d.size * d.lstride) {
      g.sizes.back() *= d.size;
      g.strides.back() = d.stride;
      g.lstrides.back() = d.lstride;
    } else {
      g.sizes.push_back(d.size);
      g.strides.push_back(d.stride);
      g.lstrides.push_back(d.lstride);
    }
    g.walk_numel *= d.size;
  }
  if (g.sizes.empty()) {  // one distinct element
    g.sizes.push_back(1);
    g.strides.push_back(1);
    g.lstrides.push_back(1);
  }
  return g;
}

// Calls run(ptr, stride, length, logical_base, logical_stride) for positions [begin, end) of the
// walk, one call per stretch of the innermost dimension.
template <typename T, typename RunFn>
void ForEachRun(const T* data, const Geometry& g, int64_t begin, int64_t end, const RunFn& run) {
  const int64_t outer_dims = static_cast<int64_t>(g.sizes.size()) - 1;
  const int64_t inner = g.sizes[outer_dims];
  const int64_t inner_stride = g.strides[outer_dims];
  const int64_t inner_lstride = g.lstrides[outer_dims];
  c10::SmallVector<int64_t, 6> index(outer_dims, 0);
  int64_t row = begin / inner;
  int64_t col = begin % inner;
  int64_t offset = 0, loffset = 0;
  for (int64_t d = outer_dims - 1; d >= 0; --d) {
    index[d] = row % g.sizes[d];
    row /= g.sizes[d];
    offset += index[d] * g.strides[d];
    loffset += index[d] * g.lstrides[d];
  }
  for (int64_t pos = begin; pos < end;) {
    const int64_t len = std::min(inner - col, end - pos);
    run(data + offset + col * inner_stride, inner_stride, len, loffset + col * inner_lstride,
        inner_lstride);
    pos += len;
    col = 0;
    for (int64_t d = outer_dims - 1; d >= 0; --d) {
      offset += g.strides[d];
      loffset += g.lstrides[d];
      if (++index[d] < g.sizes[d]) break;
      offset -= index[d] * g.strides[d];
      loffset -= index[d] * g.lstrides[d];
      index[d] = 0;
    }
  }
}

// Reduces every chunk into its own Partial, in parallel; chunk c covers walk positions
// [c * kChunkElements, (c + 1) * kChunkElements). With LibTorch's OpenMP backend,
// at::parallel_for is a header template that forks only in a translation unit compiled with
// OpenMP (-fopenmp, which probe/CMakeLists.txt sets for this file); built without it, the loop
// runs on the calling thread, with the same result.
template <typename ChunkFn>
std::vector<Partial> ForEachChunk(int64_t numel, const ChunkFn& chunk_fn) {
  const int64_t chunks = (numel + kChunkElements - 1) / kChunkElements;
  std::vector<Partial> parts(static_cast<size_t>(chunks));
  auto reduce = [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = c * kChunkElements;
      chunk_fn(begin, std::min(numel, begin + kChunkElements), &parts[static_cast<size_t>(c)]);
    }
  };
  if (chunks == 1) {
    reduce(0, 1);  // skip the thread pool's fork/join for small tensors
  } else {
    at::parallel_for(0, chunks, /*grain_size=*/1, reduce);
  }
  return parts;
}

template <typename T>
HealthStats ComputeTyped(const at::Tensor& t, bool vectorize) {
  const T* data = static_cast<const T*>(t.data_ptr());
  const Geometry g = MakeGeometry(t);
  vectorize = vectorize && kHasVectorRun<T> && CpuHasVectorKernel();

  std::vector<Partial> parts =
      ForEachChunk(g.walk_numel, [&](int64_t begin, int64_t end, Partial* acc) {
        ForEachRun(data, g, begin, end,
                   [&](const T* p, int64_t stride, int64_t n, int64_t base, int64_t lstride) {
                     ScanRun(p, stride, n, base, lstride, vectorize, acc);
                   });
      });

  // Fixed chunk order: the only order in which the double sums are added.
  Partial total;
  for (const Partial& p : parts) {
    total.finite += p.finite;
    total.nan += p.nan;
    total.pos_inf += p.pos_inf;
    total.neg_inf += p.neg_inf;
    total.zero += p.zero;
    total.min = std::min(total.min, p.min);
    total.max = std::max(total.max, p.max);
    total.sum += p.sum;
    total.sumsq += p.sumsq;
    total.first_nonfinite = MinIndex(total.first_nonfinite, p.first_nonfinite);
  }

  HealthStats s;
  s.numel = t.numel();
  s.nan_count = total.nan * g.repeat;
  s.pos_inf_count = total.pos_inf * g.repeat;
  s.neg_inf_count = total.neg_inf * g.repeat;
  s.zero_count = total.zero * g.repeat;
  s.first_nonfinite_index = total.first_nonfinite;
  if (total.finite == 0) return s;

  s.min = total.min;
  s.max = total.max;
  s.absmax = std::max(std::fabs(total.min), std::fabs(total.max));
  const double count = static_cast<double>(total.finite);
  if (std::isfinite(total.sum) && std::isfinite(total.sumsq)) {
    s.mean = total.sum / count;
    s.rms = std::sqrt(total.sumsq / count);
    return s;
  }
  // Finite values so large that their sum or sum of squares overflowed (float64 only): a second
  // pass over x / absmax. absmax > 0 here, otherwise nothing could overflow.
  const double scale = s.absmax;
  std::vector<Partial> scaled = ForEachChunk(g.walk_numel, [&](int64_t begin, int64_t end,
                                                               Partial* acc) {
    ForEachRun(data, g, begin, end, [&](const T* p, int64_t stride, int64_t n, int64_t, int64_t) {
      ScaledSumsRun(p, stride, n, scale, acc);
    });
  });
  double sum = 0, sumsq = 0;
  for (const Partial& p : scaled) {
    sum += p.sum;
    sumsq += p.sumsq;
  }
  s.mean = scale * (sum / count);
  s.rms = scale * std::sqrt(sumsq / count);
  return s;
}

StatusOr<HealthStats> ComputeOnCpu(const at::Tensor& t, bool vectorize) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ComputeTyped<float>(t, vectorize);
    case at::kDouble:
      return ComputeTyped<double>(t, vectorize);
    case at::kBFloat16:
      return ComputeTyped<c10::BFloat16>(t, vectorize);
    case at::kHalf:
      return ComputeTyped<c10::Half>(t, vectorize);
    case at::kByte:
      return ComputeTyped<uint8_t>(t, vectorize);
    case at::kChar:
      return ComputeTyped<int8_t>(t, vectorize);
    case at::kShort:
      return ComputeTyped<int16_t>(t, vectorize);
    case at::kInt:
      return ComputeTyped<int32_t>(t, vectorize);
    case at::kLong:
      return ComputeTyped<int64_t>(t, vectorize);
    case at::kBool:
      return ComputeTyped<bool>(t, vectorize);
    default:
      return InvalidArgumentError(std::string("health stats: unsupported dtype ") +
                                  c10::toString(t.scalar_type()) +
                                  "; pass a real floating, integer or bool tensor");
  }
}

}  // namespace

StatusOr<HealthStats> ComputeHealthStats(const at::Tensor& tensor,
                                         const HealthStatsOptions& options) {
  if (!tensor.defined()) return HealthStats();
  try {
    if (tensor.layout() != at::kStrided) {
      return InvalidArgumentError(std::string("health stats: unsupported layout ") +
                                  c10::toString(tensor.layout()) + "; call to_dense() first");
    }
    if (tensor.is_meta()) {
      return InvalidArgumentError("health stats: meta tensor has no data");
    }
    if (tensor.numel() == 0) return HealthStats();
    // Efficient zero tensors (autograd's placeholders for zero gradients) have no storage to read.
    if (tensor._is_zerotensor()) {
      HealthStats s;
      s.numel = tensor.numel();
      s.zero_count = s.numel;
      return s;
    }
    at::NoGradGuard no_grad;
    at::Tensor t = tensor;
    if (!t.is_cpu()) t = t.to(at::kCPU);
    // A negative view stores -x and negates lazily; materialize so the bytes we read are the
    // values.
    if (t.is_neg()) t = t.resolve_neg();
    return ComputeOnCpu(t, options.vectorize);
  } catch (const c10::Error& e) {
    return InternalError(std::string("health stats: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InternalError(std::string("health stats: ") + e.what());
  }
}

}  // namespace capsule
