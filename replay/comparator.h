// Comparator: how far a candidate tensor (the OPTIMIZED path's) is from a reference tensor (the
// REFERENCE path's), as numbers and a verdict.
//
// Both tensors are read in FP64, element by element, in one pass. An element fails when
// |c - r| > atol + rtol * |r| (the numpy.allclose rule); a position where one side is finite and
// the other is not, or where the NaN/Inf patterns differ, is a non-finite mismatch and always a
// divergence. The layer diverges when it has a non-finite mismatch or when more than
// max_fail_fraction of its elements fail. atol/rtol come from, in order of precedence, the
// per-layer override, the global override, and DefaultTolerance(candidate dtype). With
// AtolScale::kReferenceMax, atol is a fraction of the reference's largest magnitude instead of an
// absolute amount, which makes the rule independent of the tensor's scale: use it for gradients,
// whose scale follows the loss normalization (comparator.cc has the measurements). The result
// carries the error metrics alongside the verdict; printing them is a renderer's job.
//
//   capsule::CompareOptions options;
//   options.layer_tolerance["lm_head"] = {1e-4, 1e-3};
//   CAPSULE_ASSIGN_OR_RETURN(capsule::TensorComparison c,
//                            capsule::CompareTensors(optimized, reference, "lm_head", options,
//                                                    /*logits=*/true));
//   if (c.diverged) Report(c.reason, c.max_abs_err, *c.top1_agreement);
//
// Thread safety: CompareTensors is reentrant; the caller must not write to either tensor while it
// runs. CompareOptions and TensorComparison are plain values.
#ifndef CAPSULE_REPLAY_COMPARATOR_H_
#define CAPSULE_REPLAY_COMPARATOR_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "capsule/base/status.h"

namespace capsule {

// Per-element tolerance: |c - r| <= atol + rtol * |r| passes.
struct Tolerance {
  double atol = 0;
  double rtol = 0;

  friend bool operator==(const Tolerance& a, const Tolerance& b) {
    return a.atol == b.atol && a.rtol == b.rtol;
  }
  friend bool operator!=(const Tolerance& a, const Tolerance& b) { return !(a == b); }
};

// The tolerance a candidate of this dtype gets when no override applies (the table, with the
// measurements behind it, is in comparator.cc; the README repeats it). The same numbers serve both
// AtolScale modes. Integer and bool candidates must match exactly ({0, 0}).
Tolerance DefaultTolerance(at::ScalarType candidate_dtype);

// What atol is measured in.
enum class AtolScale {
  // atol is in the tensor's own units: |c - r| <= atol + rtol * |r|. Right for activations of a
  // known scale.
  kAbsolute,
  // atol is a fraction of M = max |r| over the finite reference elements:
  // |c - r| <= atol * M + rtol * |r|. Scale-free, so one tolerance fits tensors of any magnitude
  // (gradients, whose size is set by the loss normalization). An all-zero reference has M = 0: then
  // only rtol * |r| = 0 is allowed, i.e. the candidate must be zero too.
  kReferenceMax,
};

struct CompareOptions {
  // Global override of the dtype default; nullopt (default): use DefaultTolerance.
  std::optional<Tolerance> tolerance;
  // Per-layer overrides by layer name ("blocks.3"); win over `tolerance`. Default: none.
  std::map<std::string, Tolerance> layer_tolerance;
  // The layer diverges when failed / numel exceeds this. Default 0: any failing element is a
  // divergence. Must be in [0, 1]. Non-finite mismatches diverge whatever this is.
  double max_fail_fraction = 0;
  // Default kAbsolute (the rule as the design states it); kReferenceMax is recommended for
  // gradients.
  AtolScale atol_scale = AtolScale::kAbsolute;
};

// The tolerance CompareTensors would use for `layer_name` and a candidate of `candidate_dtype`.
Tolerance ResolveTolerance(const CompareOptions& options, const std::string& layer_name,
                           at::ScalarType candidate_dtype);

struct TensorComparison {
  int64_t numel = 0;
  // Over the positions where both sides are finite (0 when there is none):
  double max_abs_err = 0;  // max |c - r|
  double max_rel_err = 0;  // max |c - r| / |r| over r != 0; an error at r == 0 shows in max_abs_err
  double rms_err_rel = 0;  // rms(c - r) / rms(r); 0 when both are 0, +inf when only rms(r) is 0
  double cosine = 1;       // <c, r> / (|c| |r|); 1 when both are all zeros, 0 when only one is
  double reference_absmax = 0;  // max |r| over the finite reference elements (0 when none)
  // Positions where isfinite(c) != isfinite(r), or both non-finite but not the same value (NaN vs
  // Inf, +Inf vs -Inf). Equal non-finite positions (both NaN, same-signed Inf) are not errors.
  int64_t nonfinite_mismatch = 0;
  // Elements with |c - r| > atol + rtol * |r| (atol scaled as atol_scale says), plus the non-finite
  // mismatches.
  int64_t failed = 0;
  double fail_fraction = 0;  // failed / numel; 0 for an empty tensor
  // Only when CompareTensors is asked to treat the pair as logits: the fraction of rows (last
  // dimension = classes) whose argmax agrees; NaN counts as the largest value, as in at::argmax.
  // 1 when there are no rows.
  std::optional<double> top1_agreement;
  Tolerance tolerance_used;
  AtolScale atol_scale = AtolScale::kAbsolute;
  // The absolute term actually applied: tolerance_used.atol, times max |r| in kReferenceMax mode.
  double atol_applied = 0;
  // How close the worst finite element came to failing: max over finite pairs of
  // |c - r| / (atol_applied + rtol * |r|). Above 1 means at least one element fails; 0.5 means
  // every error is at most half of what was allowed. +inf when an element differs where nothing
  // was allowed (atol_applied and r both 0). Non-finite mismatches are counted apart.
  double worst_ratio = 0;
  bool diverged = false;
  // Why it diverged, e.g. "3 of 4096 elements (0.073%) exceed atol+rtol*|ref| (atol 2e-05,
  // rtol 1e-05); worst at index 17: 0.51 vs ref 0.5"; empty when it did not.
  std::string reason;
};

// Compares `candidate` with `reference` (any floating or integer dtypes, any strides, any device).
// Both are read as CPU FP64 a chunk at a time, so the FP64 copies stay small; a non-contiguous
// tensor is first made contiguous in its own dtype. `logits`: also compute
// top1_agreement over the last dimension. Errors: kInvalidArgument for undefined, complex or
// non-strided tensors, different shapes, or options out of range (negative or NaN tolerances,
// max_fail_fraction outside [0, 1]); kInternal when LibTorch fails.
StatusOr<TensorComparison> CompareTensors(const at::Tensor& candidate, const at::Tensor& reference,
                                          const std::string& layer_name,
                                          const CompareOptions& options, bool logits = false);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_COMPARATOR_H_
