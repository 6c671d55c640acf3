// Monitor: the trainer-side hook. It watches each step's scalars and, when a step goes wrong
// (non-finite loss or gradients, a loss or grad-norm spike, an exception, or on request), writes
// one signed capsule describing that step — and training goes on.
//
// Armed, it costs a few scalar checks per step plus a cheap snapshot at BeginStep (RNG states, the
// data cursor and a copy of the batch's index tensors). Only when a trigger fires does it do real
// work: it re-runs the failing step from the snapshot through the model's LayerSequence (same RNG,
// batch and thread count) with per-layer instrumentation, records whether the re-run fires the
// trigger again (the rule replay uses too, instrument/trigger_rule.h), and writes the capsule
// atomically. The trainer's parameters, gradients and RNG states are left exactly as they were.
// Nothing in here throws or aborts: a failed capture (no key, unwritable directory, full disk, a
// model that throws) is reported in the StepReport and the log, and the trainer carries on.
//
//   capsule::Monitor monitor(options);
//   monitor.AttachModel(&model, capsule::PathKind::kOptimized);
//   for (...) {
//     monitor.BeginStep(step, cursor, batch);
//     ... forward, backward ...
//     capsule::StepReport r = monitor.EndStep({.loss = loss, .grad_norm = gn});
//     if (r.triggered) std::cerr << r.summary << "\n";
//     optimizer.step();
//   }
//
// Thread safety: a Monitor is used from the training thread; with a Distributed attached, its
// watchdog (and a backend thread that is taking the process down) may also write a capsule
// through it, which the Monitor serializes with the training thread's calls.
#ifndef CAPSULE_CAPTURE_MONITOR_H_
#define CAPSULE_CAPTURE_MONITOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/capture/generation.h"
#include "capsule/capture/spike_rule.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/format/signing.h"
#include "capsule/format/validate.h"
#include "capsule/instrument/trigger_rule.h"
#include "capsule/model/layer_sequence.h"
#include "capsule/model/model.h"

namespace capsule {
namespace internal {
struct FiredTrigger;
struct PendingCapture;
}  // namespace internal
class OptimizerProbe;
class Distributed;

enum class WeightPolicy { kAll = 1, kAnomalousLayer = 2, kNone = 3 };  // = capsule.v1.WeightPolicy

// TriggerKind (capsule.v1.TriggerKind values) and the rule for whether a re-run fires a trigger
// again live in instrument/trigger_rule.h, which replay shares.
const char* TriggerKindName(TriggerKind kind);  // "NON_FINITE_LOSS", ...

struct MonitorOptions {
  // Where capsules go; created (with parents) on first capture.
  std::string capsule_dir = "capsules";
  // PEM Ed25519 private key (mode 0600). Empty: capsules are written unsigned. A path that cannot
  // be loaded makes each capture fail with the reason (training continues).
  std::string signing_key_path;
  // Names the run in file names: <run>-step<N>-rank<R>-<trigger>.capsule.
  std::string run_name = "run";

  // Rate limits, so a diverged run does not fill the disk or stall on captures that keep failing:
  // at most `max_capsules` capture attempts per Monitor, and at most one per trigger kind within
  // `min_steps_between_same_kind` steps. A failed attempt (full disk, unwritable directory, bad
  // key) counts like a written capsule: each attempt re-runs the step, and a cause that failed
  // once will usually fail again.
  int max_capsules = 8;
  int64_t min_steps_between_same_kind = 100;

  // Which weights to embed. kAll falls back to kAnomalousLayer when the parameters exceed
  // `max_weight_bytes`. Without embedded weights replay needs --weights.
  WeightPolicy weight_policy = WeightPolicy::kAll;
  uint64_t max_weight_bytes = uint64_t{256} << 20;
  // The checkpoint file holding the weights the trainer runs with (the one it loaded, or one it
  // just saved; Monitor::SetWeightsCheckpoint changes it): a state dict saved by torch.save or
  // torch::pickle_save, or a TorchScript module archive (snapshot/checkpoint.h), read as data. A
  // capsule that does not embed every weight names it (path, size and SHA-256 of the file, each
  // tensor's hash, and whether it still holds this step's weights) so that replay can load it; a
  // large model's capsule then stays small and replays in full. A relative path is recorded
  // relative to capsule_dir, where replay looks for it. Empty: none.
  std::string weights_checkpoint;

  // Scalar history kept (and stored in capsules) and log lines kept.
  int history_length = 64;
  int log_lines = 200;

  // Triggers. A spike is judged on a log scale against a robust line through the recent history
  // (capture/spike_rule.h): at least `min_ratio` times the line's level at this step, `mads`
  // robust standard deviations of the residuals above it (or `max_rise` above it) and, for the
  // loss, `min_rise` nats above it, after `warmup` values. With these defaults
  // bench/spike_rule_rates.py found no false trigger in 90 clean runs of three models and caught
  // every garbage batch (README, "Triggers"). The loss's floor of 2 nats keeps a loss settled near
  // zero quiet on ordinary batches that are many times its level; 4 nats above it always fires,
  // however widely such a loss bounces. The gradient norm has no natural unit: its ratio is 1000
  // against the median, because near convergence a batch with one hard sample raises a ViT's
  // gradient norm 50-450x, so only an explosion should fire it (a non-finite one fires
  // trigger_non_finite_grad).
  bool trigger_non_finite_loss = true;
  bool trigger_non_finite_grad = true;
  bool trigger_loss_spike = true;
  bool trigger_grad_norm_spike = true;
  SpikeRule loss_spike = {/*window=*/50,    /*warmup=*/50,
                          /*mads=*/6.0,     /*min_ratio=*/2.0,
                          /*detrend=*/true, /*min_rise=*/2.0,  /*max_rise=*/4.0};
  SpikeRule grad_norm_spike = {/*window=*/50,     /*warmup=*/50,
                               /*mads=*/6.0,      /*min_ratio=*/1000.0,
                               /*detrend=*/false, /*min_rise=*/0.0,
                               /*max_rise=*/0.0};

  // Write capsules on a background thread (capture/internal/background_writer.h): the trainer is
  // held for the re-run, the build and a copy of the embedded tensor bytes (the next optimizer
  // step moves the weights) into buffers the writer keeps for the next capture, and goes on while
  // the capsule is encoded, compressed, signed and written. At most `background_queue_depth`
  // capsules wait or are being written; a capture that finds the queue full is written in the
  // trainer's thread, as with this off (nothing is dropped, and the memory held stays bounded).
  // Queued capsules are written before the Monitor is destroyed, at exit(), and on a fatal signal
  // (SIGTERM, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT), whose handler waits up to
  // `background_signal_wait_seconds` for them before the signal takes its course. Off: written
  // before EndStep returns, from the parameters themselves (no copy of the weights is made).
  bool background_write = false;
  int background_queue_depth = 2;
  double background_signal_wait_seconds = 10;

  // Re-run the failing step with per-layer instrumentation (forward and backward statistics, the
  // first anomalous layer, embedded layer inputs). Off: the capsule holds the snapshot only.
  bool rerun = true;

  // The parameters the trainer means to keep frozen: names or glob patterns (`*` any run of
  // characters, `?` one), recorded in every capsule (capsule.v1.ModelSpec.declared_frozen).
  // Replay's gradients stage fails a matching parameter that requires grad, gets a gradient or
  // was updated. Empty: nothing declared.
  std::vector<std::string> declared_frozen;

  // Where the trainer runs; recorded in the capsule (AttachDistributed sets them from the group).
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string device = "cpu";
  // Free-form annotations stored in every capsule.
  std::map<std::string, std::string> annotations;

  // Receives one line per capture (written, refused, failed). Default: stderr.
  std::function<void(const std::string&)> log_sink;
};

// What the trainer knows about the data position of a step.
struct DataCursor {
  int64_t epoch = 0;
  int64_t shard = 0;
  int64_t offset = 0;
  std::vector<int64_t> sample_indices;
  std::string sampler_rng;  // name of a RegisterRng() RNG that drives sampling
};

// How the trainer reduces per-token losses to the step's loss (capsule.v1.LossReduction).
enum class LossReduction { kUnspecified = 0, kTokenMean = 1, kTokenSum = 2, kSequenceMean = 3 };

// What the loss scores (capsule.v1.ObjectiveKind): a language model's tokens, or one class per
// sample (labels [batch], logits [batch, classes]).
enum class ObjectiveKind { kUnspecified = 0, kLanguageModel = 1, kClassification = 2 };

// What the trainer declares its loss to be; replay's objective stage holds the step to it.
struct LossSpec {
  LossReduction reduction = LossReduction::kUnspecified;  // unspecified: read as a token mean
  // What the step's loss sum is divided by (a token mean: the target tokens of every micro-batch
  // and rank); 0 when not declared.
  double normalizer = 0;
  int ranks = 0;  // data-parallel ranks the normaliser spans; 0 or 1: this rank alone
  int64_t ignore_index = -100;
  double label_smoothing = 0;                        // torch's label_smoothing, in [0, 1]
  ObjectiveKind kind = ObjectiveKind::kUnspecified;  // unspecified: replay reads the shapes
};

// One step's batch: the tensors the model consumes plus what identifies the samples. A step that
// accumulates gradients over micro-batches passes all of them as one batch (sequences in order)
// with `micro_batch_sizes`, so the capsule holds every micro-batch, not only the last.
struct StepBatch {
  LayerBatch tensors;
  std::vector<std::string> raw_text;    // per sequence; optional
  std::vector<std::string> sample_ids;  // per sequence; optional
  int64_t micro_batch = 0;
  int64_t tokens_seen = 0;  // before this step
  // Sequences in each micro-batch of the step, in order (summing to the batch size); empty: the
  // step is one micro-batch.
  std::vector<int64_t> micro_batch_sizes;
  LossSpec loss;
};

// Scalars the trainer reports at EndStep. Missing values are simply not checked.
struct StepScalars {
  std::optional<double> loss;
  std::optional<double> grad_norm;
  std::optional<double> update_norm;
  std::optional<double> param_norm;
  std::optional<double> learning_rate;
  std::optional<double> weight_decay;
  std::optional<double> loss_scale;
};

// A run event: something that changed the run at a step (capsule.v1.RunEvent).
struct RunEvent {
  int64_t step = 0;
  std::string kind;  // "data_mixture", "context_length", "resume", ...
  std::string detail;
};

// Files and texts that identify what the model was trained with; hashed once in SetIdentity.
struct IdentityInfo {
  struct File {
    std::string role;  // "tokenizer", "chat_template", "adapter", "config", ...
    std::string path;
  };
  std::vector<File> files;
  std::string chat_template;  // the template text
  std::string config_text;    // the resolved config as text
  std::string code_revision;
};

struct StepReport {
  bool triggered = false;
  TriggerKind trigger = TriggerKind::kNone;
  std::string summary;       // one line: what fired, and what happened to the capture
  std::string capsule_path;  // set when a capsule was written (or queued: see `queued`)
  // Handed to the background writer (MonitorOptions::background_write): capsule_path is where it
  // will be; the log line says when it is there, and WaitForWrites waits for it.
  bool queued = false;
  Status status;              // why the capture failed, when it did
  bool rate_limited = false;  // fired, but a rate limit suppressed the capsule
  std::string first_anomalous_layer;
  bool rerun_reproduced = false;
  // Built, and waiting for the optimizer step (OptimizerProbe::AfterStep writes it and returns
  // the final report).
  bool pending = false;
  // Where the capture held the trainer, in seconds of wall time (0 for a stage that did not run):
  // re-running the step with per-layer statistics, building the capsule (snapshot tensors,
  // weights, hashes, a named checkpoint), and encoding, compressing, signing and writing the file
  // until it is renamed into place (queued: copying the embedded bytes and queueing it).
  // bench/step_bench.cc's BM_CaptureLatency reports them as multiples of the step time.
  double rerun_seconds = 0;
  double build_seconds = 0;
  double write_seconds = 0;
};

class Monitor {
 public:
  explicit Monitor(MonitorOptions options);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // The model whose `path` the trainer runs (not owned; must outlive the Monitor). Without a model
  // captures hold the snapshot and scalars but no per-layer statistics.
  void AttachModel(Model* model, PathKind path);

  // A data-parallel run (capture/distributed.h): the capsule of every rank gets its Distributed
  // section, EndStep agrees on triggers with the other ranks, and the Distributed's watchdog and
  // failed collectives write HANG and COLLECTIVE_ERROR capsules through this Monitor. Sets rank,
  // world_size and local_rank from the group. The Distributed outlives nothing: the Monitor holds
  // it and detaches itself when destroyed.
  void AttachDistributed(std::shared_ptr<Distributed> distributed);

  // Hashes the files (once). Errors are returned and logged; capsules then lack those hashes.
  Status SetIdentity(const IdentityInfo& identity);

  // The trainer's weights are now those of this checkpoint (it loaded or saved it):
  // MonitorOptions::weights_checkpoint for the captures from here on.
  void SetWeightsCheckpoint(const std::string& path);

  // A trainer RNG (e.g. the data sampler) to store in capsules: `save` returns its state bytes.
  void RegisterRng(const std::string& name, std::function<std::string()> save, uint64_t seed = 0);
  // The same, with `restore` (state bytes from `save`) so that the capture re-run draws from this
  // RNG exactly as the step did: it is set to the step's state for the re-run and put back after.
  void RegisterRng(const std::string& name, std::function<std::string()> save, uint64_t seed,
                   std::function<void(const std::string&)> restore);

  // Adds or replaces an annotation stored in every later capsule (MonitorOptions::annotations).
  void Annotate(const std::string& key, const std::string& value) {
    options_.annotations[key] = value;
  }

  // Appends a line to the log ring stored in capsules.
  void Log(const std::string& line);

  // A run event (data-mixture switch, context-length change, checkpoint resume) that capsules
  // carry as an annotation of the run's history; the last 64 are kept.
  void AddEvent(int64_t step, const std::string& kind, const std::string& detail = "");

  // The batches from here on are generation steps (capture/generation.h): every later capsule
  // carries `generation`, and replay checks the decode against the whole-sequence forward. nullopt:
  // training steps again. kInvalidArgument (and nothing changes) for a field out of range.
  Status SetGeneration(std::optional<GenerationInfo> generation);

  // Snapshots RNG states, the cursor and the batch. Call before the step's forward pass. Token ids,
  // labels and masks are copied (they are small); batch.tensors.inputs is kept by reference, so
  // do not overwrite it in place before EndStep. A capsule still waiting for an optimizer step
  // that never came (OptimizerProbe::AfterStep not called) is written now, without it.
  void BeginStep(int64_t step, const DataCursor& cursor, const StepBatch& batch);

  // Records the scalars and runs the triggers; captures when one fires. Call before the optimizer
  // updates the parameters. With an OptimizerProbe attached the capsule is built here (the step
  // re-run needs the parameters before the update) and written by OptimizerProbe::AfterStep, with
  // the optimizer step in it: the report then says `pending`. With a Distributed attached, a
  // trigger agreement that failed (a dead or hung peer) is in the report's status (kUnavailable)
  // and summary, whether or not this rank fired.
  StepReport EndStep(const StepScalars& scalars);

  // Captures the current step (after BeginStep) now, with trigger MANUAL and `reason`.
  StepReport CaptureNow(const std::string& reason);

  // Runs `step_fn`; if it throws, captures the step with trigger EXCEPTION (the exception's text as
  // message) and returns the report instead of letting the exception escape.
  StepReport RunStep(const std::function<void()>& step_fn);

  // Writes the capsules still waiting for their optimizer step (also done by BeginStep and the
  // destructor), or queues them with MonitorOptions::background_write. Returns the report of the
  // last write (each is logged); an empty report when none was waiting.
  StepReport Flush();

  // Blocks until every capsule handed to the background writer is written (or has failed), and
  // logs each, as the next BeginStep or EndStep would. capsules_written() counts them after it.
  // The destructor waits too.
  void WaitForWrites();

  int capsules_written() const { return capsules_written_; }
  // Capture attempts that failed (each is counted against the rate limits too).
  int captures_failed() const { return captures_failed_; }
  const MonitorOptions& options() const { return options_; }

 private:
  friend class OptimizerProbe;
  struct State;  // snapshot, history, log ring, RNGs, identity, rate-limit bookkeeping
  // `incident`: a HANG or COLLECTIVE_ERROR capture from another thread or a failed collective:
  // from the snapshot, without a re-run (the model may be in use), written at once.
  StepReport Capture(const internal::FiredTrigger& fired, const std::string& message,
                     bool incident = false);
  Status BuildAndWrite(const internal::FiredTrigger& fired, const std::string& message,
                       const std::string& what, bool incident, StepReport* report);
  // Writes `capsule` here, its parameters' bytes in `held` (when not null), or queues both on the
  // background writer, which copies the held bytes before it returns. Sets report->capsule_path,
  // and `queued`.
  Status WriteOrQueue(v1::Capsule& capsule, const TensorDataViews* held,
                      std::optional<PrivateKey>& key, const std::string& what, bool incident,
                      StepReport* report);
  // Finishes the reports of the background writes that are done: counts and log lines.
  void CollectWrites();
  bool CaptureIncident(TriggerKind kind, const std::string& reason);
  // Writes the first pending capsule (OptimizerProbe fills its optimizer section first) and
  // finishes its report: counts, summary, log line.
  StepReport WritePending();
  void FinishReport(const Status& s, const std::string& what, StepReport* report);
  // For OptimizerProbe: the capsules waiting for the optimizer step (empty when none), and
  // attaching or detaching the probe.
  std::vector<v1::Capsule*> PendingCapsules();
  void SetOptimizerProbe(OptimizerProbe* probe);
  void Emit(const std::string& line) const;

  MonitorOptions options_;
  std::unique_ptr<State> state_;
  std::shared_ptr<Distributed> distributed_;
  int capsules_written_ = 0;
  int captures_failed_ = 0;
};

}  // namespace capsule

#endif  // CAPSULE_CAPTURE_MONITOR_H_
