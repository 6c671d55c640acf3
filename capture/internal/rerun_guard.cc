#include "capsule/capture/internal/rerun_guard.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace capsule::internal {

RerunGuard::RerunGuard()
    : saved_rngs_(SnapshotTorchRngs()), saved_threads_(at::get_num_threads()) {}

RerunGuard::~RerunGuard() {
  try {
    (void)Restore();
  } catch (...) {
    // A destructor must not throw, and the re-run's own error is the one worth reporting.
  }
}

Status RerunGuard::Enter(const std::vector<RngBlobData>& rngs, int intra_op_threads) {
  if (intra_op_threads <= 0) return InvalidArgumentError("intra-op thread count must be positive");
  CAPSULE_RETURN_IF_ERROR(RestoreTorchRngs(rngs));
  if (at::get_num_threads() != intra_op_threads) at::set_num_threads(intra_op_threads);
  return Status::Ok();
}

Status RerunGuard::Restore() {
  if (restored_) return Status::Ok();
  restored_ = true;
  if (at::get_num_threads() != saved_threads_) at::set_num_threads(saved_threads_);
  return RestoreTorchRngs(saved_rngs_);
}

BufferGuard::BufferGuard(const Model& model) : live_(model.NamedBuffers()) {
  at::NoGradGuard no_grad;
  saved_.reserve(live_.size());
  for (const NamedTensor& b : live_) saved_.push_back(b.second.detach().clone());
}

BufferGuard::~BufferGuard() {
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < live_.size(); ++i) {
      at::Tensor target = live_[i].second;  // shares the buffer's storage
      target.copy_(saved_[i]);
    }
  } catch (...) {
    // A destructor must not throw; a buffer that cannot be written back was not written either.
  }
}

}  // namespace capsule::internal
