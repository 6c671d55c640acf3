#include "capsule/instrument/health_stats.h"

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
// GCC 12's AVX-512 intrinsics return their "undefined" vectors by initializing a variable from
// itself (GCC bug 105593), which -Wuninitialized then reports wherever they are inlined.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define CAPSULE_HEALTH_STATS_X86 1
// The library is built for baseline x86-64; only these functions use AVX2 or AVX-512 and they run
// only after a runtime CPU check, so no separate translation unit or global -mavx2 is needed.
#define CAPSULE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CAPSULE_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define CAPSULE_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define CAPSULE_AVX512_INLINE __attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) inline
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

// Loaders give eight (AVX2) or sixteen (AVX-512) elements as float32 lanes (for min, max and the
// zero count) and widen them to two vectors of doubles (for the sums). Every conversion is exact.
CAPSULE_AVX2_INLINE void WidenLanes(__m256 v, __m256d* lo, __m256d* hi) {
  *lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
  *hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

// +0 or -0, as the AVX2 kernel's compare counts them (a denormal too in flush-denormal mode).
CAPSULE_AVX512_INLINE __mmask16 IsZeroLanes16(__m512 v) {
  return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ);
}

CAPSULE_AVX512_INLINE void WidenLanes16(__m512 v, __m512d* lo, __m512d* hi) {
  *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

struct LoadF32 {
  using T = float;
  static CAPSULE_AVX2_INLINE __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
  // Converting straight from memory saves the lane extract; loads are cheaper than shuffles here.
  static CAPSULE_AVX2_INLINE void Widen(const float* p, __m256, __m256d* lo, __m256d* hi) {
    *lo = _mm256_cvtps_pd(_mm_loadu_ps(p));
    *hi = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
  }
  static CAPSULE_AVX512_INLINE __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
  static CAPSULE_AVX512_INLINE __mmask16 IsZero16(__m512 v) { return IsZeroLanes16(v); }
  // Straight from memory too (~15% faster than the extract on Zen 5 with GCC). clang 14 instead
  // splits the second 8-float load into scalar inserts, so there it takes the lane extract.
  static CAPSULE_AVX512_INLINE void Widen16(const float* p, __m512 v, __m512d* lo, __m512d* hi) {
#if defined(__clang__)
    (void)p;
    WidenLanes16(v, lo, hi);
#else
    (void)v;
    *lo = _mm512_cvtps_pd(_mm256_loadu_ps(p));
    *hi = _mm512_cvtps_pd(_mm256_loadu_ps(p + 8));
#endif
  }
};

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
  static CAPSULE_AVX512_INLINE __m512 Load16(const c10::BFloat16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static CAPSULE_AVX512_INLINE __mmask16 IsZero16(__m512 v) { return IsZeroLanes16(v); }
  static CAPSULE_AVX512_INLINE void Widen16(const c10::BFloat16*, __m512 v, __m512d* lo,
                                            __m512d* hi) {
    WidenLanes16(v, lo, hi);
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
  static CAPSULE_AVX512_INLINE __m512 Load16(const c10::Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Widened float16 values are never denormal, so zero is all magnitude bits clear: the same
  // count, and clang 14 otherwise folds the compare into one on float16 that it scalarizes.
  static CAPSULE_AVX512_INLINE __mmask16 IsZero16(__m512 v) {
    return _mm512_testn_epi32_mask(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
  }
  static CAPSULE_AVX512_INLINE void Widen16(const c10::Half*, __m512 v, __m512d* lo, __m512d* hi) {
    WidenLanes16(v, lo, hi);
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
// Element j of every 16 goes to double lane j of the sums (s0 holds elements 0-3, s1 4-7, s2 8-11,
// s3 12-15), the lanes are combined by HorizontalSum, and the tail of fewer than 16 elements is
// added last. This order is the kernel's contract: replay compares captured statistics bit for
// bit, so every vector kernel, on every CPU, must add in exactly this order, and pick the same
// zero as this one when the minimum or maximum is a zero.
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

// The AVX2 kernel's minimum (kMax false) or maximum of elements [0, main_end) of a run, from the
// 16 float lanes of VectorRunFloat512 (lane j: the extreme of elements j, j + 16, ...). AVX2 lane l
// holds elements l and l + 8 of every 16, so its extreme has the value of 16-lane l or l + 8, and
// the lane reduction keeps the lowest lane that has the overall extreme. Only a zero extreme has
// two encodings: vminps and vmaxps keep their second operand on a tie, so an AVX2 lane whose
// extreme is zero ends on the last zero it saw, which a walk back along that lane finds (in a
// step or two unless zeros are rare). A denormal compares equal to zero in flush-denormal mode,
// and vminps then returns a zero of its sign.
template <bool kMax, typename T>
float Avx2LaneExtreme(const float (&lanes16)[16], const T* p, int64_t main_end) {
  auto pick = [](float a, float b) { return kMax ? std::max(a, b) : std::min(a, b); };
  float lane[8];
  for (int l = 0; l < 8; ++l) lane[l] = pick(lanes16[l], lanes16[l + 8]);
  float extreme = lane[0];
  for (int l = 0; l < 8; ++l) extreme = pick(extreme, lane[l]);
  if (extreme != 0) return extreme;
  for (int l = 0; l < 8; ++l) {
    if (lane[l] != 0) continue;
    for (int64_t k = main_end - 8 + l; k >= 0; k -= 8) {
      const float v = static_cast<float>(p[k]);
      if (v == 0) return std::copysign(0.0f, v);
    }
  }
  return extreme;  // not reached: some lane saw the zero
}

// The AVX-512 form of VectorRunFloat, for CPUs that have it: the same 16 double lanes of sums,
// each in a zmm pair (s_lo = AVX2's s0|s1, s_hi = s2|s3), so sum and sumsq are bit-identical to
// the AVX2 kernel's, and so are min and max (see Avx2LaneExtreme); half the instructions make it
// about 1.6x as fast on a single run.
struct Lanes16 {
  __m512d s_lo, s_hi, q_lo, q_hi;
  __m512 mn, mx;
  __m512i zeros;
};

CAPSULE_AVX512_INLINE Lanes16 StartLanes16() {
  Lanes16 st;
  st.s_lo = _mm512_setzero_pd();
  st.s_hi = st.s_lo;
  st.q_lo = st.s_lo;
  st.q_hi = st.s_lo;
  st.mn = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  st.mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  st.zeros = _mm512_setzero_si512();
  return st;
}

template <class L>
CAPSULE_AVX512_INLINE void Step16(const typename L::T* p, Lanes16* st) {
  const __m512 v = L::Load16(p);
  st->mn = _mm512_min_ps(st->mn, v);
  st->mx = _mm512_max_ps(st->mx, v);
  const __mmask16 is_zero = L::IsZero16(v);
  st->zeros = _mm512_mask_add_epi32(st->zeros, is_zero, st->zeros, _mm512_set1_epi32(1));
  __m512d lo, hi;
  L::Widen16(p, v, &lo, &hi);
  // Plain adds: x * 1 + s through the FMA units (as the AVX2 kernel does) rounds the same.
  st->s_lo = _mm512_add_pd(st->s_lo, lo);
  st->s_hi = _mm512_add_pd(st->s_hi, hi);
  st->q_lo = _mm512_fmadd_pd(lo, lo, st->q_lo);
  st->q_hi = _mm512_fmadd_pd(hi, hi, st->q_hi);
}

// Reduces the lanes and adds the tail p[i, n) as VectorRunFloat does.
template <class L>
CAPSULE_AVX512_INLINE RunSums FinishLanes16(const Lanes16& st, const typename L::T* p, int64_t i,
                                            int64_t n) {
  RunSums r;
  r.sum = HorizontalSum(_mm512_castpd512_pd256(st.s_lo), _mm512_extractf64x4_pd(st.s_lo, 1),
                        _mm512_castpd512_pd256(st.s_hi), _mm512_extractf64x4_pd(st.s_hi, 1));
  r.sumsq = HorizontalSum(_mm512_castpd512_pd256(st.q_lo), _mm512_extractf64x4_pd(st.q_lo, 1),
                          _mm512_castpd512_pd256(st.q_hi), _mm512_extractf64x4_pd(st.q_hi, 1));
  alignas(64) float mn_lanes[16], mx_lanes[16];
  _mm512_store_ps(mn_lanes, st.mn);
  _mm512_store_ps(mx_lanes, st.mx);
  float fmn = Avx2LaneExtreme<false>(mn_lanes, p, i);
  float fmx = Avx2LaneExtreme<true>(mx_lanes, p, i);
  r.zero = _mm512_reduce_add_epi32(st.zeros);
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

template <class L>
CAPSULE_AVX512 RunSums VectorRunFloat512(const typename L::T* p, int64_t n) {
  Lanes16 st = StartLanes16();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Prefetch(p + i, kPrefetchBytes);
    Step16<L>(p + i, &st);
  }
  return FinishLanes16<L>(st, p, i, n);
}

// Two full chunks at once, each a contiguous run with its own lanes: the result for each is
// exactly VectorRunFloat512's. One run alone is bound by the latency of the sumsq FMA chains (one
// FMA per 16 elements on each); interleaving a second, independent run lets the core overlap them,
// which makes the pair ~1.3x as fast as two single runs.
template <class L>
CAPSULE_AVX512 void VectorRunPairFloat512(const typename L::T* p0, const typename L::T* p1,
                                          RunSums* r0, RunSums* r1) {
  constexpr int64_t n = kChunkElements;
  static_assert(n % 16 == 0, "a chunk leaves no tail");
  Lanes16 st0 = StartLanes16();
  Lanes16 st1 = StartLanes16();
  int64_t i = 0;
  for (; i < n; i += 16) {
    Prefetch(p0 + i, kPrefetchBytes);
    Prefetch(p1 + i, kPrefetchBytes);
    Step16<L>(p0 + i, &st0);
    Step16<L>(p1 + i, &st1);
  }
  *r0 = FinishLanes16<L>(st0, p0, i, n);
  *r1 = FinishLanes16<L>(st1, p1, i, n);
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

enum class VectorIsa { kNone, kAvx2, kAvx512 };

VectorIsa CpuVectorIsa() {
  static const VectorIsa isa = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return VectorIsa::kNone;
    // clang's __builtin_cpu_supports does not know "f16c": ask CPUID leaf 1 directly. AVX2 above
    // already implies the OS saves the YMM state F16C needs.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & bit_F16C) == 0) return VectorIsa::kNone;
    // Also true only when the OS saves the ZMM and mask registers.
    return __builtin_cpu_supports("avx512f") ? VectorIsa::kAvx512 : VectorIsa::kAvx2;
  }();
  return isa;
}

bool CpuHasVectorKernel() { return CpuVectorIsa() != VectorIsa::kNone; }

template <class L>
RunSums VectorRunFloatDispatch(const typename L::T* p, int64_t n) {
  return CpuVectorIsa() == VectorIsa::kAvx512 ? VectorRunFloat512<L>(p, n)
                                              : VectorRunFloat<L>(p, n);
}

RunSums VectorRun(const float* p, int64_t n) { return VectorRunFloatDispatch<LoadF32>(p, n); }
RunSums VectorRun(const c10::BFloat16* p, int64_t n) {
  return VectorRunFloatDispatch<LoadBF16>(p, n);
}
RunSums VectorRun(const c10::Half* p, int64_t n) { return VectorRunFloatDispatch<LoadF16>(p, n); }
RunSums VectorRun(const double* p, int64_t n) { return VectorRunDouble(p, n); }

void VectorRunPair(const float* p0, const float* p1, RunSums* r0, RunSums* r1) {
  VectorRunPairFloat512<LoadF32>(p0, p1, r0, r1);
}
void VectorRunPair(const c10::BFloat16* p0, const c10::BFloat16* p1, RunSums* r0, RunSums* r1) {
  VectorRunPairFloat512<LoadBF16>(p0, p1, r0, r1);
}
void VectorRunPair(const c10::Half* p0, const c10::Half* p1, RunSums* r0, RunSums* r1) {
  VectorRunPairFloat512<LoadF16>(p0, p1, r0, r1);
}

template <typename T>
constexpr bool kHasVectorRun = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                               std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;
template <typename T>
constexpr bool kHasVectorRunPair =
    std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;

// VectorRunPair needs AVX-512; the AVX2 kernel is bound by instruction throughput, not latency, so
// interleaving two runs would not help it anyway.
bool CpuHasVectorRunPair() { return CpuVectorIsa() == VectorIsa::kAvx512; }

#else  // !CAPSULE_HEALTH_STATS_X86

template <typename T>
constexpr bool kHasVectorRun = false;
template <typename T>
RunSums VectorRun(const T*, int64_t) {
  return RunSums();
}
template <typename T>
constexpr bool kHasVectorRunPair = false;
template <typename T>
void VectorRunPair(const T*, const T*, RunSums*, RunSums*) {}
bool CpuHasVectorKernel() { return false; }
bool CpuHasVectorRunPair() { return false; }

#endif  // CAPSULE_HEALTH_STATS_X86

// Strided runs are copied into a buffer of this many elements so the vector kernel can read them;
// 512 keeps the buffer in L1 and the per-piece reductions negligible.
constexpr int64_t kGatherElements = 512;

// Adds a contiguous run's vector-kernel result. A non-finite element (or an overflowing float64
// square) poisons sumsq: then the run is rescanned exactly.
template <typename T>
void AddVectorRun(const RunSums& r, const T* p, int64_t n, int64_t base, int64_t lstride,
                  Partial* acc) {
  if (std::isfinite(r.sumsq)) {
    AddFiniteRun(r, n, acc);
  } else {
    ClassifyRun(p, 1, n, base, lstride, acc);
  }
}

// Reduces `n` elements `stride` apart starting at `p`; element i has logical index
// base + i * lstride (lstride > 0, so the first non-finite element of a run is its lowest index).
template <typename T>
void ScanRun(const T* p, int64_t stride, int64_t n, int64_t base, int64_t lstride, bool vectorize,
             Partial* acc) {
  if constexpr (kHasVectorRun<T>) {
    if (vectorize && n >= kMinVectorRun) {
      if (stride == 1) {
        AddVectorRun(VectorRun(p, n), p, n, base, lstride, acc);
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
// [c * kChunkElements, (c + 1) * kChunkElements) and goes to parts[c]. range_fn(first, last, parts)
// reduces chunks [first, last), which the thread pool hands out in ranges whose bounds depend on
// the thread count, so each chunk's Partial must not depend on the range. With LibTorch's OpenMP
// backend, at::parallel_for is a header template that forks only in a translation unit compiled
// with OpenMP (-fopenmp, which instrument/CMakeLists.txt sets for this file); built without it, the
// loop runs on the calling thread, with the same result.
template <typename RangeFn>
std::vector<Partial> ForEachChunkRange(int64_t numel, const RangeFn& range_fn) {
  const int64_t chunks = (numel + kChunkElements - 1) / kChunkElements;
  std::vector<Partial> parts(static_cast<size_t>(chunks));
  auto reduce = [&](int64_t first, int64_t last) { range_fn(first, last, parts.data()); };
  if (chunks == 1) {
    reduce(0, 1);  // skip the thread pool's fork/join for small tensors
  } else {
    at::parallel_for(0, chunks, /*grain_size=*/1, reduce);
  }
  return parts;
}

// The same, one chunk at a time: chunk_fn(begin, end, acc) reduces walk positions [begin, end).
template <typename ChunkFn>
std::vector<Partial> ForEachChunk(int64_t numel, const ChunkFn& chunk_fn) {
  return ForEachChunkRange(numel, [&](int64_t first, int64_t last, Partial* parts) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = c * kChunkElements;
      chunk_fn(begin, std::min(numel, begin + kChunkElements), &parts[c]);
    }
  });
}

template <typename T>
HealthStats ComputeTyped(const at::Tensor& t, bool vectorize) {
  const T* data = static_cast<const T*>(t.data_ptr());
  const Geometry g = MakeGeometry(t);
  vectorize = vectorize && kHasVectorRun<T> && CpuHasVectorKernel();
  // A walk that is a single contiguous run (every contiguous tensor) has one run per chunk; then a
  // thread reduces its full chunks two at a time with VectorRunPair where the CPU has it. Each
  // chunk's Partial is the same as when it is reduced alone, so the pairing, which shifts with the
  // thread pool's ranges, cannot change the result.
  const bool pair_chunks = kHasVectorRunPair<T> && vectorize && g.sizes.size() == 1 &&
                           g.strides[0] == 1 && CpuHasVectorRunPair();

  std::vector<Partial> parts =
      ForEachChunkRange(g.walk_numel, [&](int64_t first, int64_t last, Partial* out) {
        int64_t c = first;
        if constexpr (kHasVectorRunPair<T>) {
          const int64_t lstride = g.lstrides[0];
          for (; pair_chunks && c + 2 <= last && (c + 2) * kChunkElements <= g.walk_numel; c += 2) {
            const int64_t begin = c * kChunkElements;
            const T* p0 = data + begin;
            const T* p1 = p0 + kChunkElements;
            RunSums r0, r1;
            VectorRunPair(p0, p1, &r0, &r1);
            AddVectorRun(r0, p0, kChunkElements, begin * lstride, lstride, &out[c]);
            AddVectorRun(r1, p1, kChunkElements, (begin + kChunkElements) * lstride, lstride,
                         &out[c + 1]);
          }
        }
        for (; c < last; ++c) {
          const int64_t begin = c * kChunkElements;
          ForEachRun(data, g, begin, std::min(g.walk_numel, begin + kChunkElements),
                     [&](const T* p, int64_t stride, int64_t n, int64_t base, int64_t lstride) {
                       ScanRun(p, stride, n, base, lstride, vectorize, &out[c]);
                     });
        }
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
