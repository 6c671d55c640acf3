// Data-parallel training of tiny_gpt over torch's c10d (ProcessGroupGloo on 127.0.0.1, a FileStore
// in the capsule directory), with capsule's Distributed attached to every rank's Monitor:
// `capsule-tiny-gpt train --world-size N`. The parent process forks one process per rank, waits
// for them and says how each ended.
//
// Faults (one rank R = --fault-rank, from step S = --inject-step):
//   rank-nan         R's forward overflows to NaN at S (its batch): R's pre-reduction gradients
//                    are non-finite, everyone's post-reduction ones are.
//   skip-collective  R skips the gradient all-reduce at S and goes on to the next collective.
//   count-mismatch   R all-reduces a gradient buffer without its last parameter from S.
//   no-average       every rank sums the gradients where its per-rank token mean needs a mean.
//   desync           R keeps its own initial weights (its broadcast lands in a temporary).
//   uneven-data      R's loader runs out one step before the others'.
//   stall            R stops in its data loader at S and never comes back (a stuck rank).
#ifndef CAPSULE_SAMPLES_TINY_GPT_TRAIN_DISTRIBUTED_H_
#define CAPSULE_SAMPLES_TINY_GPT_TRAIN_DISTRIBUTED_H_

#include <cstdint>
#include <string>

namespace capsule::tiny_gpt {

struct DistributedTrainOptions {
  int world_size = 2;
  int64_t steps = 20;
  int64_t layers = 2;
  uint64_t seed = 0;
  int64_t batch_size = 4;
  double lr = 3e-3;
  std::string capsule_dir = "capsules";
  std::string key;
  std::string run_name = "tiny";
  std::string fault = "none";
  int fault_rank = 1;
  int64_t fault_step = 3;
  std::string fault_layer = "blocks.1";  // rank-nan's layer
  double timeout_seconds = 10;           // the process group's
  double watchdog_seconds = -1;          // < 0: capsule's default (a quarter of the timeout)
  int64_t capture_at_step = -1;          // every rank captures this step (MANUAL)
  bool unarmed = false;                  // no Monitor and no Distributed (bench baseline)
  bool quiet = false;
  // Prints the median step time of rank 0 (bench/distributed_step_bench.sh reads it).
  bool timing = false;
  // Reduce each parameter's gradient on its own (ReduceBucket per parameter; unarmed: an
  // all-reduce per parameter), as a trainer without bucketing does: a collective-bound step.
  bool reduce_per_param = false;
};

// Forks the ranks and waits for them. 0 when every rank finished its steps; 1 when one failed
// (a collective error ends a rank); 2 for bad options.
int RunDistributedTrain(const DistributedTrainOptions& options);

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_TRAIN_DISTRIBUTED_H_
