// Distributed: the Monitor's view of a data-parallel run, built on torch's own c10d process group
// (Gloo on CPU, NCCL on GPU: the same calls), never a transport of its own.
//
// The trainer makes one Distributed per rank over its process group and store, issues its
// collectives through it, and attaches it to the Monitor. Then each rank's capsule carries:
//   - its placement and the run id every rank shares (rank 0 draws it; the store carries it);
//   - a ring of its last collectives (sequence number, op, tag, dtype, counts, shapes, state and
//     times), as PyTorch's Flight Recorder keeps them, and one of its point-to-point ops (the
//     same, with the peer);
//   - gradient health before and after the data-parallel reduction (ReduceGradients);
//   - a ring of per-step fingerprints (a checksum of the parameters at the step's start, of the
//     replicated and the rank-local RNG states, the cursor and the sample ids).
// Each step every rank's row (what fired, the local gradient health, the parameter checksum) is
// shared, so a trigger on any rank makes every rank capture the same step, and the replicas'
// checksums and the reduction's scale are checked on every step: the rows travel in the step's
// last gradient reduction when the trainer marks it (StepEnd), else in one small all-reduce of
// their own at EndStep. A watchdog thread writes a HANG capsule when a collective has not completed
// for `watchdog_seconds` and sets a store key that makes every other rank write its capsule too; a
// collective that fails on this rank (a peer closed the connection, the group's timeout, a size
// check) writes a COLLECTIVE_ERROR capsule before the error reaches the trainer, and so does a rank
// that dies in a collective (std::terminate from the backend's thread). `capsule triage DIR` reads
// them all.
//
//   auto store = c10::make_intrusive<c10d::FileStore>(path, world);
//   auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_options);
//   capsule::DistributedOptions d;
//   d.process_group = pg;
//   d.store = store;
//   d.timeout_seconds = 60;  // what the group was made with
//   auto dist = capsule::Distributed::Create(d);   // collective: every rank, same point
//   monitor.AttachDistributed(*dist);
//   for (...) {
//     monitor.BeginStep(step, cursor, batch);
//     ... forward, backward ...
//     (*dist)->ReduceGradients(params, capsule::GradReduce::kMean, "grads",
//                              capsule::Distributed::StepEnd{loss});   // carries the rows
//     monitor.EndStep({.loss = loss, .grad_norm = gn});   // gn: of the reduced gradients
//     optimizer.step();
//   }
//
// Collectives through the wrapper (all-reduce, broadcast, all-gather, reduce-scatter, all-to-all,
// barrier; send and receive) are synchronous (they return when complete) and are numbered from 0
// in the order this rank issues them; every rank must issue the same ones, which is what triage
// checks. A collective issued on the group directly is not recorded: triage cannot see a rank
// waiting in it. Nothing here stops training: capsule writes and store traffic are fenced, and the
// error of a failed collective reaches the trainer unchanged after the capsule is written.
//
// Thread safety: collectives, ReduceGradients and the Monitor hooks are called from the training
// thread; the watchdog and the backend's threads only read the rings under their lock.
#ifndef CAPSULE_CAPTURE_DISTRIBUTED_H_
#define CAPSULE_CAPTURE_DISTRIBUTED_H_

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/instrument/trigger_rule.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace capsule {

struct DistributedOptions {
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;  // required
  // The store the group was made with (or any store every rank shares): the run id, the dump key
  // and the heartbeats go through it. Null: no run id sharing (set run_id), no dump key, and the
  // watchdog only watches this rank.
  c10::intrusive_ptr<c10d::Store> store;
  // Empty: rank 0 draws one and shares it through the store.
  std::string run_id;
  std::string group_name = "default_pg";
  int local_rank = -1;  // -1: the rank (one host)
  std::string device = "cpu";
  // Collectives kept in the ring, and steps kept in the fingerprint ring.
  int ring_size = 2000;
  int fingerprint_ring = 64;
  // The process group's timeout as the trainer made it (seconds); recorded, and the default hang
  // period is a quarter of it (at most 5 minutes).
  double timeout_seconds = 1800;
  // A collective in flight for this long is a hang: the watchdog writes a HANG capsule and sets
  // the dump key. < 0: the default above; 0: no watchdog thread.
  double watchdog_seconds = -1;
  // How often the watchdog looks (also at the dump key and to write this rank's heartbeat).
  double watchdog_poll_seconds = 0.5;
  // Share each step's trigger, gradient health and parameter checksum (in the step's marked
  // reduction, Distributed::StepEnd, or else one all-reduce of 6 numbers per rank at EndStep):
  // any rank's trigger captures the step on every rank, and desynced replicas and a reduction
  // that sums where it should average fire REPLICA_DESYNC and GRAD_REDUCTION. Off: each rank
  // captures alone (every rank must set it alike).
  bool agree_on_triggers = true;
  // Names of the Monitor's RNGs (RegisterRng, or "torch.cpu" / "torch.cuda") whose state every
  // replica must share; the others are rank-local. Both are fingerprinted. LibTorch seeds each
  // process's "torch.cpu" generator on its own (two processes draw different numbers): it is
  // replicated only when the trainer seeds every rank alike (torch::manual_seed).
  std::vector<std::string> replicated_rngs;
};

enum class GradReduce {
  kMean = 1,  // all-reduce sum, then divide by the world size (each rank's loss is its own mean)
  kSum = 2,   // all-reduce sum only (each rank's loss is already divided by the global count)
};

// Gradient health around one reduction (also stored in the capsule's reductions ring).
struct GradReductionStats {
  int64_t step = 0;
  uint64_t sequence = 0;
  double local_norm = 0;
  int64_t local_non_finite = 0;
  double global_norm = 0;
  int64_t global_non_finite = 0;
  double divisor = 1;
};

// What the EndStep reduction found (Monitor::EndStep acts on it).
struct AgreementResult {
  bool ran = false;  // false: agreement is off, or this step was already agreed
  Status status;     // not ok: the reduction failed (a COLLECTIVE_ERROR capsule is written)
  std::vector<std::pair<int, TriggerKind>> fired;  // ranks that fired, and what
  std::vector<int> desynced_ranks;    // ranks whose parameter checksum differs from rank 0's
  bool reduction_not_a_mean = false;  // the reduced norm exceeds the mean of the local norms
  double reduction_ratio = 0;         // reduced norm / mean of local norms
  std::string summary;                // one line for the capsule's trigger message
  bool rows_carried = false;          // the rows came with the step's marked reduction
};

class Distributed {
 public:
  // Collective: every rank calls it at the same point (it shares the run id through the store and,
  // unless the trainer already did on every rank, sets the group's sequence number with
  // setSequenceNumberForGroup(); a trainer that sets it too does so before Create, never after
  // or from another thread meanwhile). Errors: kInvalidArgument without a process group;
  // kUnavailable when the store or the group fails.
  static StatusOr<std::shared_ptr<Distributed>> Create(const DistributedOptions& options);
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  // This rank's training loop ended (its data ran out, or its step count was reached): the store
  // tells the other ranks, whose capsules then record the last step it began, so that triage
  // tells a rank that ran out of data early from one that hangs. The destructor calls it, unless a
  // collective failed or an exception is unwinding the stack; call it yourself when the
  // Distributed outlives the loop. Fenced: never throws.
  void Finish();

  int rank() const;
  int world_size() const;
  const std::string& run_id() const;
  c10d::ProcessGroup& process_group();

  // Collectives through the wrapper: recorded in the ring, waited for, and on failure a
  // COLLECTIVE_ERROR capsule is written before the backend's error (a c10::Error) is rethrown.
  // `tag` names the call site in the ring ("grads", "init.broadcast").
  void AllReduce(std::vector<at::Tensor>& tensors, const std::string& tag,
                 const std::string& reduce_op = "sum");
  void Broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& tag);
  // `outputs` holds one tensor per rank, each shaped like `input`.
  void AllGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, const std::string& tag);
  // `inputs` holds one tensor per rank, each shaped like `output`.
  void ReduceScatter(at::Tensor& output, std::vector<at::Tensor>& inputs, const std::string& tag,
                     const std::string& reduce_op = "sum");
  // Equal parts of `input` along its first dimension to every rank, into `output`.
  void AllToAll(at::Tensor& output, at::Tensor& input, const std::string& tag);
  void Barrier(const std::string& tag);
  // Point-to-point: recorded in their own ring (Distributed.point_to_point), numbered per peer
  // and direction (this rank's n-th Send to a peer is that peer's n-th Recv from it), so that
  // they never shift the collectives' sequence numbers, which every rank shares.
  void Send(std::vector<at::Tensor>& tensors, int dst, const std::string& tag);
  void Recv(std::vector<at::Tensor>& tensors, int src, const std::string& tag);

  // The data-parallel gradient reduction of one flat bucket of gradients, in place: one
  // all-reduce, with the local norm and non-finite count before it and the global ones after it
  // (one pass over the bucket each when it is finite). A trainer that reduces its own buckets
  // calls it once per bucket; the step's agreement row combines them (norms as the root of the sum
  // of squares, counts added).
  GradReductionStats ReduceBucket(at::Tensor& bucket, GradReduce mode,
                                  const std::string& tag = "grads");
  // ReduceBucket over `params`' gradients (those defined): one contiguous gradient in place,
  // several flattened into one bucket and copied back.
  GradReductionStats ReduceGradients(const std::vector<at::Tensor>& params, GradReduce mode,
                                     const std::string& tag = "grads");

  // The step's last gradient reduction, marked: the step's agreement row (see StepEnd) travels
  // in this reduction's all-reduce instead of one of its own at EndStep. Each rank writes its row
  // at its own slot of a block appended to the bucket, zeros elsewhere, so the sum every rank gets
  // back holds every rank's row (an all-gather in the same collective). The bucket must be
  // float32 or float64 (integers up to 2^24 are exact in float32: the checksum and the counts
  // travel in 16-bit parts); any other dtype, or agree_on_triggers off, reduces as unmarked and
  // EndStep runs its own agreement all-reduce. Every rank must mark the same reduction (the
  // trainer's code does the same on every rank), and no gradient reduction may follow it in the
  // step: a later one's health is recorded, but not in the step's row. ReduceBucket copies the
  // bucket into one with room for the rows and back (world x 10 elements more); ReduceGradients
  // of several gradients makes that room in the flattening copy it makes anyway.
  //
  // What the row can carry is what each rank knows before the reduction: its loss (`loss`,
  // checked here against the loss triggers, NON_FINITE_LOSS and LOSS_SPIKE, so every rank learns
  // which ranks fired), its gradient health (REPLICA_DESYNC and GRAD_REDUCTION are decided from
  // the rows as before) and its parameter checksum. NON_FINITE_GRAD and GRAD_NORM_SPIKE are
  // checked at EndStep on the norm the trainer passes, after the reduction; that norm, taken from
  // the reduced gradients, is the same on every rank, so every rank fires alike without being
  // told. A trainer whose EndStep grad_norm is rank-local (taken before the reduction) or whose
  // EndStep loss differs from `loss` does not mark its reductions: the separate agreement shares
  // every trigger EndStep finds.
  struct StepEnd {
    std::optional<double> loss;  // this rank's loss for the step, as EndStep will get it
  };
  GradReductionStats ReduceBucket(at::Tensor& bucket, GradReduce mode, const std::string& tag,
                                  const StepEnd& last);
  GradReductionStats ReduceGradients(const std::vector<at::Tensor>& params, GradReduce mode,
                                     const std::string& tag, const StepEnd& last);
  // The parameters the step fingerprint checksums at each step's start (their values then),
  // for a trainer whose Monitor has no Model attached, or that replicates other tensors than
  // the Model's. Without it: the Monitor's Model's parameters.
  void SetParameters(std::vector<at::Tensor> params);

  // --- For the Monitor (capture/monitor.cc) ---
  // A capture the Distributed asks for: a HANG or COLLECTIVE_ERROR capsule of the current step,
  // from the snapshot and without a re-run (another thread may be in the model). `reason` is the
  // trigger message. Returns whether a capsule was written.
  // Replacing it (with nullptr: none) waits for a capture in flight through the old one.
  using IncidentHandler = std::function<bool(TriggerKind kind, const std::string& reason)>;
  void SetIncidentHandler(IncidentHandler handler);
  // The triggers a marked reduction (StepEnd) checks before its all-reduce: given the rank's loss
  // (nullopt: none handed), what fires on it (kNone: nothing). Without one, nothing fires there.
  using LossTriggerCheck = std::function<TriggerKind(std::optional<double> loss)>;
  void SetLossTriggerCheck(LossTriggerCheck check);
  // Step begins: the fingerprint of the parameters at the step's start, the RNG state bytes by
  // name, the cursor and the sample ids.
  void OnBeginStep(int64_t step, const std::vector<at::Tensor>& params,
                   const std::vector<std::pair<std::string, std::string>>& rng_states,
                   int64_t epoch, int64_t offset, const std::vector<std::string>& sample_ids);
  // Step ends: the reduction of every rank's row. `local` is what fired here (kNone: nothing);
  // `loss_ranks` the ranks the step's loss normaliser spans (LossSpec::ranks; <= 1: rank-local,
  // so the gradient reduction must be a mean). When the step's rows came with its marked
  // reduction (StepEnd) no collective runs here, and the row's trigger is the one that reduction
  // checked (`local` is not sent).
  AgreementResult Agree(int64_t step, TriggerKind local, int loss_ranks);
  // The rank's Distributed section and placement, into `capsule`.
  void FillSection(v1::Capsule* capsule);
  void SetPosition(const std::string& position);

  struct Impl;  // opaque; public so that the process's terminate handler can reach it

 private:
  explicit Distributed(std::unique_ptr<Impl> impl);
  // ReduceBucket of `buffer`'s first `n` elements; with `last`, the step's row goes in the rest.
  GradReductionStats Reduce(at::Tensor& buffer, int64_t n, GradReduce mode, const std::string& tag,
                            const StepEnd* last);
  GradReductionStats ReduceParams(const std::vector<at::Tensor>& params, GradReduce mode,
                                  const std::string& tag, const StepEnd* last);
  std::unique_ptr<Impl> impl_;
};

// A 64-bit checksum of bytes (four multiply-xorshift lanes; not cryptographic): a fingerprint to
// compare replicas by, at several GB/s so it can run every step.
uint64_t Checksum64(const void* data, size_t size, uint64_t seed = 0);

}  // namespace capsule

#endif  // CAPSULE_CAPTURE_DISTRIBUTED_H_
