// Minimize: shrink a capsule's batch to the smallest input for which the same check still fails,
// then say what the failure needs.
//
// The check is the replay's verdict on the original capsule: its diagnosis and, for NUMERICS, the
// first divergent layer and phase, or, for a triage stage, the first failed finding's check. A
// candidate (a subset of the sequences, then a prefix of each) "still fails" when its replay gives
// that same verdict. The search is delta debugging over the sequences (halves, then single
// sequences, as far as the budget allows), then a binary search for the shortest prefix, which
// also says what the failure needs ("fails only with T >= 17": a kernel's tail block). Each
// candidate is a complete capsule: the batch tensors, per-sequence records and cursor are cut
// alike, the recorded per-layer inputs of the original batch are dropped, and a trigger other than
// a non-finite one becomes MANUAL (its threshold was for the whole batch).
//
//   MinimizeOptions options;
//   options.max_replays = 48;
//   CAPSULE_ASSIGN_OR_RETURN(MinimizeResult r, MinimizeCapsule(capsule, registry, options));
//   // *r.capsule: sign and write it; r.needs: what the failure needs
//
// Thread safety: as ReplayCapsule.
#ifndef CAPSULE_REPLAY_MINIMIZE_H_
#define CAPSULE_REPLAY_MINIMIZE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/replay/model_registry.h"
#include "capsule/replay/replayer.h"

namespace capsule {

struct MinimizeOptions {
  ReplayOptions replay;  // how each candidate is replayed (default: forward layerwise, no bisect)
  int max_replays = 64;  // the search stops here and keeps the smallest failing candidate so far
  std::function<void(const std::string&)> progress;  // one line per replay
};

struct MinimizeResult {
  MinimizeResult();
  ~MinimizeResult();
  MinimizeResult(MinimizeResult&&) noexcept;
  MinimizeResult& operator=(MinimizeResult&&) noexcept;

  // The smallest candidate that fails alike (the original when none smaller does).
  std::unique_ptr<v1::Capsule> capsule;
  std::string verdict;  // the check held constant: "NUMERICS at blocks.2 (FORWARD)", ...
  int64_t sequences_before = 0, sequences_after = 0;
  int64_t length_before = 0, length_after = 0;
  int replays = 0;  // replays made, the original's included
  bool budget_exhausted = false;
  std::vector<std::string> needs;  // what the failure needs, one sentence each
};

// kFailedPrecondition when the original capsule does not fail (nothing to keep failing) or has no
// token batch to cut; the codes of ReplayCapsule otherwise.
StatusOr<MinimizeResult> MinimizeCapsule(const v1::Capsule& capsule, const ModelRegistry& registry,
                                         const MinimizeOptions& options);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_MINIMIZE_H_
