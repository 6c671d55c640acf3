// RNG state snapshots: every torch generator (the CPU default generator and one per CUDA device)
// as tagged blobs {name, kind, device, state bytes}, restorable bit for bit.
//
// The Monitor snapshots them at BeginStep so that the capture re-run and replay see the same
// random numbers (dropout masks, sampling) the failing step saw. User RNGs (a data sampler) are
// registered with the Monitor and stored next to these.
//
//   std::vector<capsule::RngBlobData> rngs = capsule::SnapshotTorchRngs();
//   ... run the step ...
//   CAPSULE_RETURN_IF_ERROR(capsule::RestoreTorchRngs(rngs));   // same random stream again
//
// Thread safety: each call locks the generator it reads or writes; it does not stop another
// thread from drawing numbers in between.
#ifndef CAPSULE_SNAPSHOT_RNG_STATE_H_
#define CAPSULE_SNAPSHOT_RNG_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capsule/base/status.h"

namespace capsule {

struct RngBlobData {
  std::string name;    // "torch.cpu", "torch.cuda:0", or a user name
  int kind = 0;        // capsule.v1.RngKind
  std::string device;  // "cpu", "cuda:0"
  std::string state;   // opaque bytes (the generator's get_state())
  uint64_t seed = 0;   // current_seed() where known
};

// The CPU generator, and each CUDA device's generator when CUDA is available.
std::vector<RngBlobData> SnapshotTorchRngs();

// Restores the torch generators among `blobs` (user RNGs are skipped). kInvalidArgument for a
// state of the wrong size; kFailedPrecondition for a CUDA generator on a host without that device.
Status RestoreTorchRngs(const std::vector<RngBlobData>& blobs);

}  // namespace capsule

#endif  // CAPSULE_SNAPSHOT_RNG_STATE_H_
