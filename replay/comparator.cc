#include "capsule/replay/comparator.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "capsule/base/internal/strings.h"

namespace capsule {

// ---------------------------------------------------------------------------------------------
// Default tolerances by candidate dtype: the one table (README.md repeats it). How each row was
// measured, and the margins it leaves: docs/TOLERANCES.md.
Tolerance DefaultTolerance(at::ScalarType candidate_dtype) {
  switch (candidate_dtype) {
    case at::kDouble:
      return {1e-10, 1e-8};
    case at::kFloat:
      return {2e-5, 1e-5};
    case at::kBFloat16:
      return {1e-1, 5e-2};
    case at::kHalf:
      return {3e-2, 3e-2};
    default:
      // Integers and bool: the optimized path must produce the same values.
      return {0, 0};
  }
}

Tolerance ResolveTolerance(const CompareOptions& options, const std::string& layer_name,
                           at::ScalarType candidate_dtype) {
  const auto it = options.layer_tolerance.find(layer_name);
  if (it != options.layer_tolerance.end()) return it->second;
  if (options.tolerance) return *options.tolerance;
  return DefaultTolerance(candidate_dtype);
}

namespace {

// Elements converted to FP64 per step: bounds the temporary memory (1 MiB per side) whatever the
// tensor size, and keeps the chunks large enough that the per-chunk ATen calls do not dominate.
constexpr int64_t kChunkElements = int64_t{1} << 17;

bool IsSupported(const at::Tensor& t) {
  return t.layout() == at::kStrided && !t.is_complex() && !t.is_quantized() &&
         t.device().type() != at::kMeta;
}

Status ValidateTolerance(const Tolerance& tol, const std::string& what) {
  // !(x >= 0) also refuses NaN; +inf is allowed and means "never fails".
  if (!(tol.atol >= 0) || !(tol.rtol >= 0)) {
    return InvalidArgumentError("compare: " + what + " tolerance must be >= 0 (atol " +
                                FormatSignificant(tol.atol, 6) + ", rtol " +
                                FormatSignificant(tol.rtol, 6) + ")");
  }
  return Status::Ok();
}

Status ValidateOptions(const CompareOptions& options) {
  if (options.tolerance) CAPSULE_RETURN_IF_ERROR(ValidateTolerance(*options.tolerance, "global"));
  for (const auto& [layer, tol] : options.layer_tolerance) {
    CAPSULE_RETURN_IF_ERROR(ValidateTolerance(tol, "layer '" + layer + "'"));
  }
  if (!(options.max_fail_fraction >= 0 && options.max_fail_fraction <= 1)) {
    return InvalidArgumentError("compare: max_fail_fraction must be in [0, 1], got " +
                                FormatSignificant(options.max_fail_fraction, 6));
  }
  return Status::Ok();
}

std::string ShapeString(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(t.size(i));
  }
  return s + "]";
}

// Both non-finite: the same NaN-ness, or the same infinity.
bool SameNonFinite(double c, double r) {
  if (std::isnan(c) || std::isnan(r)) return std::isnan(c) && std::isnan(r);
  return c == r;
}

// at::argmax's convention: the first maximum, and a NaN is larger than everything.
int64_t RowArgmax(const double* row, int64_t width) {
  int64_t best = 0;
  double best_value = row[0];
  for (int64_t j = 1; j < width && !std::isnan(best_value); ++j) {
    if (std::isnan(row[j]) || row[j] > best_value) {
      best = j;
      best_value = row[j];
    }
  }
  return best;
}

// Running sums of one comparison; partial sums per chunk keep the FP64 accumulation error small.
struct Accumulator {
  double max_abs = 0;
  double max_rel = 0;
  double sum_d2 = 0, sum_r2 = 0, sum_c2 = 0, dot = 0;
  int64_t mismatch = 0;
  int64_t failed = 0;
  int64_t first_mismatch = -1;
  double mismatch_c = 0, mismatch_r = 0;
  int64_t worst = -1;  // the failing finite element with the largest |c - r|
  double worst_err = -1, worst_c = 0, worst_r = 0;
  int64_t rows = 0, rows_agree = 0;
  double ref_absmax = 0;
  double max_ratio = 0;  // max |c - r| / (atol + rtol * |r|) over finite pairs
};

// `atol` is the effective absolute term (already scaled by max |r| in kReferenceMax mode).
void AccumulateChunk(const double* c, const double* r, int64_t n, int64_t offset, double atol,
                     double rtol, Accumulator& acc) {
  double d2 = 0, r2 = 0, c2 = 0, dot = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double cv = c[k];
    const double rv = r[k];
    const bool c_finite = std::isfinite(cv);
    const bool r_finite = std::isfinite(rv);
    if (r_finite) acc.ref_absmax = std::max(acc.ref_absmax, std::abs(rv));
    if (c_finite && r_finite) {
      const double err = std::abs(cv - rv);
      const double ref_abs = std::abs(rv);
      acc.max_abs = std::max(acc.max_abs, err);
      if (ref_abs > 0) acc.max_rel = std::max(acc.max_rel, err / ref_abs);
      d2 += err * err;
      r2 += rv * rv;
      c2 += cv * cv;
      dot += cv * rv;
      const double allowed = atol + rtol * ref_abs;
      if (err > 0) {
        acc.max_ratio = std::max(
            acc.max_ratio, allowed > 0 ? err / allowed : std::numeric_limits<double>::infinity());
      }
      if (err > allowed) {
        ++acc.failed;
        if (err > acc.worst_err) {
          acc.worst_err = err;
          acc.worst = offset + k;
          acc.worst_c = cv;
          acc.worst_r = rv;
        }
      }
    } else if (c_finite || r_finite || !SameNonFinite(cv, rv)) {
      ++acc.mismatch;
      ++acc.failed;
      if (acc.first_mismatch < 0) {
        acc.first_mismatch = offset + k;
        acc.mismatch_c = cv;
        acc.mismatch_r = rv;
      }
    }
  }
  acc.sum_d2 += d2;
  acc.sum_r2 += r2;
  acc.sum_c2 += c2;
  acc.dot += dot;
}

std::string Reason(const TensorComparison& out, const Accumulator& acc) {
  if (acc.mismatch > 0) {
    return "non-finite mismatch at " + std::to_string(acc.mismatch) + " of " +
           std::to_string(out.numel) + " elements; first at index " +
           std::to_string(acc.first_mismatch) + ": " + FormatSignificant(acc.mismatch_c, 6) +
           " vs ref " + FormatSignificant(acc.mismatch_r, 6);
  }
  const bool scaled = out.atol_scale == AtolScale::kReferenceMax;
  std::string reason = std::to_string(out.failed) + " of " + std::to_string(out.numel) +
                       " elements (" + FormatSignificant(100.0 * out.fail_fraction, 6) +
                       "%) exceed " +
                       (scaled ? "atol*max|ref|+rtol*|ref| (atol " : "atol+rtol*|ref| (atol ") +
                       FormatSignificant(out.tolerance_used.atol, 6) +
                       (scaled ? ", max|ref| " + FormatSignificant(out.reference_absmax, 6) : "") +
                       ", rtol " + FormatSignificant(out.tolerance_used.rtol, 6) + ")";
  if (acc.worst >= 0) {
    reason += "; worst at index " + std::to_string(acc.worst) + ": " +
              FormatSignificant(acc.worst_c, 6) + " vs ref " + FormatSignificant(acc.worst_r, 6);
  }
  return reason;
}

// Chunk `start`..`end` of a flat tensor as contiguous CPU FP64.
at::Tensor Fp64Chunk(const at::Tensor& flat, int64_t start, int64_t end) {
  return flat.slice(0, start, end)
      .to(at::TensorOptions().dtype(at::kDouble).device(at::kCPU))
      .contiguous();
}

// max |r| over the finite elements, for kReferenceMax (which needs it before the main pass).
double FiniteAbsMax(const at::Tensor& flat, int64_t chunk) {
  double m = 0;
  for (int64_t start = 0; start < flat.numel(); start += chunk) {
    const int64_t end = std::min(flat.numel(), start + chunk);
    const at::Tensor r = Fp64Chunk(flat, start, end);
    const double* p = r.data_ptr<double>();
    for (int64_t k = 0; k < end - start; ++k) {
      if (std::isfinite(p[k])) m = std::max(m, std::abs(p[k]));
    }
  }
  return m;
}

StatusOr<TensorComparison> CompareImpl(const at::Tensor& candidate, const at::Tensor& reference,
                                       const std::string& layer_name, const CompareOptions& options,
                                       bool logits) {
  TensorComparison out;
  out.tolerance_used = ResolveTolerance(options, layer_name, candidate.scalar_type());
  out.atol_scale = options.atol_scale;
  out.numel = candidate.numel();

  // Logits are read whole rows at a time so each chunk holds complete rows for the argmax.
  const int64_t width = candidate.dim() == 0 ? 1 : candidate.size(-1);
  int64_t chunk = kChunkElements;
  if (logits && width > 0) chunk = std::max<int64_t>(1, kChunkElements / width) * width;

  Accumulator acc;
  if (out.numel > 0) {
    // Flat views in logical (row-major) order: indices in the reason match t.view(-1).
    const at::Tensor c_flat = candidate.detach().contiguous().view({-1});
    const at::Tensor r_flat = reference.detach().contiguous().view({-1});
    double atol = out.tolerance_used.atol;
    if (out.atol_scale == AtolScale::kReferenceMax && std::isfinite(atol)) {
      atol *= FiniteAbsMax(r_flat, chunk);
    }
    out.atol_applied = atol;
    for (int64_t start = 0; start < out.numel; start += chunk) {
      const int64_t end = std::min(out.numel, start + chunk);
      const at::Tensor c = Fp64Chunk(c_flat, start, end);
      const at::Tensor r = Fp64Chunk(r_flat, start, end);
      const double* cp = c.data_ptr<double>();
      const double* rp = r.data_ptr<double>();
      AccumulateChunk(cp, rp, end - start, start, atol, out.tolerance_used.rtol, acc);
      if (logits && width > 0) {
        for (int64_t row = 0; row < (end - start) / width; ++row) {
          ++acc.rows;
          if (RowArgmax(cp + row * width, width) == RowArgmax(rp + row * width, width)) {
            ++acc.rows_agree;
          }
        }
      }
    }
  }

  out.max_abs_err = acc.max_abs;
  out.reference_absmax = acc.ref_absmax;
  out.max_rel_err = acc.max_rel;
  out.worst_ratio = acc.max_ratio;
  if (acc.sum_r2 > 0) {
    out.rms_err_rel = std::sqrt(acc.sum_d2) / std::sqrt(acc.sum_r2);
  } else {
    out.rms_err_rel = acc.sum_d2 > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  }
  if (acc.sum_c2 > 0 && acc.sum_r2 > 0) {
    // Square roots taken apart so that the product cannot overflow.
    out.cosine = std::clamp(acc.dot / (std::sqrt(acc.sum_c2) * std::sqrt(acc.sum_r2)), -1.0, 1.0);
  } else {
    out.cosine = acc.sum_c2 == acc.sum_r2 ? 1.0 : 0.0;
  }
  out.nonfinite_mismatch = acc.mismatch;
  out.failed = acc.failed;
  out.fail_fraction =
      out.numel > 0 ? static_cast<double>(out.failed) / static_cast<double>(out.numel) : 0.0;
  if (logits) {
    out.top1_agreement =
        acc.rows > 0 ? static_cast<double>(acc.rows_agree) / static_cast<double>(acc.rows) : 1.0;
  }
  out.diverged = out.nonfinite_mismatch > 0 || out.fail_fraction > options.max_fail_fraction;
  if (out.diverged) out.reason = Reason(out, acc);
  return out;
}

}  // namespace

StatusOr<TensorComparison> CompareTensors(const at::Tensor& candidate, const at::Tensor& reference,
                                          const std::string& layer_name,
                                          const CompareOptions& options, bool logits) {
  const std::string where = "compare '" + layer_name + "': ";
  if (!candidate.defined() || !reference.defined()) {
    return InvalidArgumentError(where + "undefined tensor");
  }
  if (!IsSupported(candidate) || !IsSupported(reference)) {
    return InvalidArgumentError(where + "only strided real tensors can be compared (got " +
                                std::string(c10::toString(candidate.scalar_type())) + " and " +
                                c10::toString(reference.scalar_type()) + ")");
  }
  if (candidate.sizes() != reference.sizes()) {
    return InvalidArgumentError(where + "shape " + ShapeString(candidate) +
                                " differs from the reference's " + ShapeString(reference));
  }
  CAPSULE_RETURN_IF_ERROR(ValidateOptions(options));
  try {
    return CompareImpl(candidate, reference, layer_name, options, logits);
  } catch (const c10::Error& e) {
    return InternalError(where + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InternalError(where + e.what());
  }
}

}  // namespace capsule
