// Step snapshot: what the Monitor copies at BeginStep so that a capture can re-run the step and
// describe it after the trainer has moved on (the RNG states before the step, the data cursor, the
// batch and the intra-op thread count).
//
//   internal::StepSnapshot snap;
//   snap.step = step;
//   snap.torch_rngs = SnapshotTorchRngs();
//   snap.intra_op_threads = at::get_num_threads();
//
// Thread safety: a plain value.
#ifndef CAPSULE_CAPTURE_INTERNAL_STEP_SNAPSHOT_H_
#define CAPSULE_CAPTURE_INTERNAL_STEP_SNAPSHOT_H_

#include <cstdint>
#include <vector>

#include "capsule/capture/monitor.h"
#include "capsule/snapshot/rng_state.h"

namespace capsule::internal {

struct StepSnapshot {
  int64_t step = 0;
  DataCursor cursor;
  StepBatch batch;                      // index tensors are copies, not the trainer's buffers
  std::vector<RngBlobData> torch_rngs;  // before the step's forward pass
  std::vector<RngBlobData> user_rngs;   // the RegisterRng() RNGs, same moment
  int intra_op_threads = 1;
};

}  // namespace capsule::internal

#endif  // CAPSULE_CAPTURE_INTERNAL_STEP_SNAPSHOT_H_
