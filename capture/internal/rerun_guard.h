// Re-run guard: the capture re-run runs the failing step again on the step's RNG states and thread
// count, and the trainer must find its own RNG position and thread count unchanged afterwards.
// A RerunGuard saves both when constructed and puts them back when it goes out of scope, also when
// the re-run returns early or throws; Restore() does it earlier and reports a failure.
//
//   internal::RerunGuard guard;   // the trainer's state, saved
//   CAPSULE_RETURN_IF_ERROR(guard.Enter(snapshot.torch_rngs, snapshot.intra_op_threads));
//   StatusOr<ProbeResult> r = ProbeStep(seq, batch, {});
//   CAPSULE_RETURN_IF_ERROR(guard.Restore());
//
// BufferGuard does the same for the model's buffers (BatchNorm's running statistics).
//
// Thread safety: LibTorch's RNGs and thread count are process-wide; one guard at a time, on the
// thread that runs the re-run.
#ifndef CAPSULE_CAPTURE_INTERNAL_RERUN_GUARD_H_
#define CAPSULE_CAPTURE_INTERNAL_RERUN_GUARD_H_

#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/model.h"
#include "capsule/snapshot/rng_state.h"

namespace capsule::internal {

class RerunGuard {
 public:
  // Saves the torch RNG states and the intra-op thread count.
  RerunGuard();
  // Restore(), if it has not run; a failure there is dropped (nothing is left to tell).
  ~RerunGuard();
  RerunGuard(const RerunGuard&) = delete;
  RerunGuard& operator=(const RerunGuard&) = delete;

  // Puts the step's RNG states and thread count in place. kInvalidArgument for a thread count
  // below 1; otherwise the codes of RestoreTorchRngs.
  Status Enter(const std::vector<RngBlobData>& rngs, int intra_op_threads);

  // Puts the saved thread count and RNG states back. Runs once; later calls return OK.
  Status Restore();

 private:
  std::vector<RngBlobData> saved_rngs_;
  int saved_threads_;
  bool restored_ = false;
};

// The model's buffers (model/model.h NamedBuffers), saved when constructed and copied back when
// it goes out of scope: a re-run in training mode moves BatchNorm's running statistics, which the
// trainer must find as it left them.
class BufferGuard {
 public:
  explicit BufferGuard(const Model& model);
  ~BufferGuard();
  BufferGuard(const BufferGuard&) = delete;
  BufferGuard& operator=(const BufferGuard&) = delete;

 private:
  std::vector<NamedTensor> live_;  // the model's own buffers
  std::vector<at::Tensor> saved_;  // their values when the guard was made
};

}  // namespace capsule::internal

#endif  // CAPSULE_CAPTURE_INTERNAL_RERUN_GUARD_H_
