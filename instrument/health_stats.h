// Health statistics: a one-pass summary of a tensor's numerical health.
//
// For every layer output and gradient the capture re-run records how many elements are NaN, +Inf,
// -Inf or zero, the first non-finite element's position, and min/max/absmax/mean/rms over the
// finite elements (0 when there is none), exactly the fields of capsule.v1.HealthStats. They are
// computed in one fused pass over the tensor's memory, without temporary tensors, in parallel over
// fixed-size chunks with the intra-op thread pool; float32, bfloat16 and float16 use an AVX2 kernel
// when the CPU has AVX2, FMA and F16C, in its AVX-512 form when the CPU also has AVX-512F. Integer
// and bool tensors get the same fields (never non-finite). Tensors on another device are copied to
// the CPU first (a device kernel can replace that later); layouts other than strided and complex
// dtypes are refused with kInvalidArgument.
//
//   capsule::StatusOr<capsule::HealthStats> stats = capsule::ComputeHealthStats(output);
//   if (!stats.ok()) return stats.status();
//   if (!stats->finite()) {
//     Flag(layer, stats->nan_count, stats->first_nonfinite_index);
//   }
//
// Determinism: the pass walks memory in storage order (so transposed views run as fast as
// contiguous ones) while tracking each element's logical index. Chunk boundaries depend only on
// the tensor's shape and strides, and partial results are combined in chunk order, so the result
// is bit-identical for any intra-op thread count. The AVX-512 form computes exactly what the AVX2
// kernel computes, so it is also bit-identical on every CPU that has the vector kernel. Mean and
// rms of the same values in another layout, or from the scalar kernel
// (HealthStatsOptions::vectorize), may differ in the last bits. With flush-denormal mode on
// (at::globalContext().setFlushDenormal(true)) the CPU reads denormals as zero, and so does this
// function.
//
// Thread safety: ComputeHealthStats is reentrant; the caller must not write to the tensor while it
// runs. It uses at::parallel_for, so it inherits ATen's intra-op thread pool settings.
#ifndef CAPSULE_INSTRUMENT_HEALTH_STATS_H_
#define CAPSULE_INSTRUMENT_HEALTH_STATS_H_

#include <ATen/Tensor.h>

#include <cstdint>

#include "capsule/base/status.h"

namespace capsule {

// Mirrors capsule.v1.HealthStats field for field.
struct HealthStats {
  int64_t numel = 0;
  int64_t nan_count = 0;
  int64_t pos_inf_count = 0;
  int64_t neg_inf_count = 0;
  int64_t zero_count = 0;  // +0 and -0
  // Over the finite elements only; 0 when there is none. absmax = max(|min|, |max|),
  // rms = sqrt(mean(x^2)).
  double min = 0;
  double max = 0;
  double absmax = 0;
  double mean = 0;
  double rms = 0;
  // Flat row-major index of the first NaN/Inf in logical order (the order of
  // t.contiguous().view(-1), whatever the strides); -1 if none.
  int64_t first_nonfinite_index = -1;

  int64_t nonfinite_count() const { return nan_count + pos_inf_count + neg_inf_count; }
  bool finite() const { return nonfinite_count() == 0; }
};

struct HealthStatsOptions {
  // true (default): use the AVX2 kernel for floating dtypes when the CPU supports it. false: the
  // portable scalar kernel, for cross-checking; same counts, min and max, and mean/rms equal up to
  // rounding.
  bool vectorize = true;
};

// Undefined and empty tensors give numel 0 and all other fields at their defaults. Errors:
// kInvalidArgument for complex, quantized or other unsupported dtypes, non-strided layouts (sparse,
// mkldnn) and meta tensors; kInternal if LibTorch fails (e.g. copying a device tensor to the CPU).
StatusOr<HealthStats> ComputeHealthStats(const at::Tensor& t,
                                         const HealthStatsOptions& options = HealthStatsOptions());

}  // namespace capsule

#endif  // CAPSULE_INSTRUMENT_HEALTH_STATS_H_
