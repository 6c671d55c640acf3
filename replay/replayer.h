// Replayer: re-runs a capsule and names the first semantic divergence.
//
// From the capsule alone (plus the model's registry entry) it checks and pins the environment
// (thread count, at most the CPUs this process may use; deterministic flag; a different torch
// version is refused unless forced), reads the embedded weights (or those of
// options.weights_path, or the checkpoint the capsule names, whose file hash is checked before it
// is parsed) and checks their canonical hash against the capsule's before it builds the model
// from the capsule's config, loads them and the capsule's buffers, then:
//   1. fidelity: restores the RNG and batch and runs the path the trainer ran; the trigger fires
//      again bitwise (REPRODUCED_EXACT), approximately, or not at all (NOT_REPRODUCED);
//   2. reference run: the same step on the REFERENCE path (FP64): does the anomaly show there too?
//   3. layerwise: every layer gets *the reference input of that layer*, cast to each path's dtype,
//      and the outputs are compared (forward) — and, with phase backward, the input and parameter
//      gradients for the reference upstream gradient. Errors do not propagate between layers, so
//      the first layer that diverges is the culprit;
//   4. bisect: composite runs, layers [0, k) OPTIMIZED and [k, n) REFERENCE, against the reference
//      run; the smallest bad k names the first bad layer in at most ceil(log2 n) + 1 runs. With
//      phase backward, a second search runs the composites forward and backward and compares
//      their parameter gradients (ReplayReport.backward_bisect);
//   5. diagnosis: TRANSIENT (not reproduced), DATA_OR_MODEL (reference shows it too), NUMERICS
//      (optimized path diverges at layer L) or NO_DIVERGENCE.
// The result is data (capsule.v1.ReplayReport), facts and no sentences; rendering it is the
// caller's job (report/replay_text.h phrases the diagnosis).
//
//   capsule::ReplayOptions options;
//   options.bisect = capsule::BisectMode::kBisect;
//   CAPSULE_ASSIGN_OR_RETURN(capsule::v1::ReplayReport r,
//                            capsule::ReplayCapsule(*decoded.capsule, registry, options));
//   if (r.diagnosis() == capsule::v1::NUMERICS) std::cout << r.first_divergent_layer() << "\n";
//
// Thread safety: one replay at a time per process: it sets LibTorch's global thread count,
// deterministic flag and default RNG state.
#ifndef CAPSULE_REPLAY_REPLAYER_H_
#define CAPSULE_REPLAY_REPLAYER_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/replay/comparator.h"
#include "capsule/replay/model_registry.h"
#include "capsule/replay/parity.h"

namespace capsule::v1 {
class ReplayReport;
}  // namespace capsule::v1

namespace capsule {

enum class BisectMode { kNone, kBisect, kLinear };

struct ReplayOptions {
  // A capsule file holding all the model's parameters (e.g. written with WeightPolicy kAll) to use
  // instead of the embedded ones. Its canonical model hash must equal the capsule's.
  std::string weights_path;
  // The checkpoint to load when the capsule names one (model.weights_reference) instead of
  // embedding every weight; empty: the path it recorded, a relative one taken from the capsule's
  // directory (capsule_path). The file's size and SHA-256 must be the recorded ones, checked before
  // it is parsed, and each tensor's hash the recorded one (the first that differs is named).
  std::string checkpoint_path;
  // The capsule's file, when it was read from one: a relative checkpoint path it records is
  // resolved against its directory. Empty: such a path is refused (give checkpoint_path).
  std::string capsule_path;
  // Go on despite a torch version or model hash mismatch, or a checkpoint that is not the file the
  // capsule names (parsed then, and compared tensor by tensor); each is reported as a warning.
  bool force = false;
  // Layerwise phases to compare. Default: forward only.
  bool forward = true;
  bool backward = false;
  BisectMode bisect = BisectMode::kNone;
  // Tolerances for the layerwise comparison (dtype defaults, global and per-layer overrides).
  CompareOptions compare;
  // Tolerances for the bisect oracle, which compares the final outputs of a composite run with the
  // reference run: errors accumulate over the optimized prefix, so the default is looser than the
  // per-layer one (DefaultBisectTolerance).
  std::optional<Tolerance> bisect_tolerance;
  // Called with a short line before each stage and probe (e.g. for a progress line).
  std::function<void(const std::string&)> progress;
  // Replay this many times, each from a fresh model and the capsule's RNG states, and record in
  // ReplayReport.repeat whether the runs were bitwise identical and the spread of each metric
  // that was not: evidence for or against TRANSIENT that one run cannot give. 1: once.
  int repeat = 1;
  // Turn on exactly these optimization switches of the model (Model::SetEnabledFeatures) before
  // replaying; nullopt: as the capsule's model spec has them.
  std::optional<std::vector<std::string>> features;
  // After the replay, find the smallest set of the model's switches whose enabling makes the first
  // divergent layer diverge (ReplayReport.features): a prefix search over the switches in the
  // model's order, ceil(log2 S) + 1 replays for one culprit among S switches.
  bool bisect_features = false;
  // Parity mode (replay/parity.h) into ReplayReport.parity: the whole sequence on the REFERENCE
  // path against the model's incremental decoder. It runs when this is set or the capsule has a
  // generation section, whose prompt_length and prefill_chunk give the prefill and chunk unless
  // parity_options sets them (nonzero). Its tolerances are parity_options.compare's.
  bool parity = false;
  // Adapter mode (ParityOptions::adapter_merge) when set; unset, it is float32 for a capsule
  // whose generation section says the adapter was merged and a model whose decoder has adapters.
  ParityOptions parity_options;
};

// The oracle's default tolerance for a candidate dtype (docs/TOLERANCES.md has the measurements).
Tolerance DefaultBisectTolerance(at::ScalarType candidate_dtype);

// kNotFound: model not registered; kFailedPrecondition: weights or environment mismatch without
// force (a weights mismatch names the first tensor that differs among those the capsule holds
// digests of), a checkpoint that is not the recorded file (refused before it is parsed), tokens
// redacted, weights missing; kInvalidArgument: a capsule without what replay needs; the codes of
// LoadCheckpoint for a named checkpoint that cannot be read.
StatusOr<v1::ReplayReport> ReplayCapsule(const v1::Capsule& capsule, const ModelRegistry& registry,
                                         const ReplayOptions& options);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_REPLAYER_H_
