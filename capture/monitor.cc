#include "capsule/capture/monitor.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <iostream>
#include <mutex>
#include <set>

#include "capsule/base/internal/sha256.h"
#include "capsule/capture/distributed.h"
#include "capsule/capture/internal/background_writer.h"
#include "capsule/capture/internal/capsule_builder.h"
#include "capsule/capture/internal/capture_writer.h"
#include "capsule/capture/internal/rerun_guard.h"
#include "capsule/capture/internal/step_snapshot.h"
#include "capsule/instrument/internal/layer_probe.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/snapshot/hashing.h"
#include "capsule/snapshot/rng_state.h"

namespace capsule {

const char* TriggerKindName(TriggerKind kind) {
  return v1::TriggerKind_Name(static_cast<v1::TriggerKind>(kind)).c_str();
}

using internal::FiredTrigger;
using internal::StepSnapshot;

namespace internal {
// A capsule built at EndStep and waiting for the optimizer step (OptimizerProbe::AfterStep).
struct PendingCapture {
  v1::Capsule capsule;
  std::optional<PrivateKey> key;
  StepReport report;
  std::string what;  // "NON_FINITE_LOSS at step 5"
};
}  // namespace internal

struct Monitor::State {
  Model* model = nullptr;
  PathKind path = PathKind::kOptimized;
  std::optional<StepSnapshot> snap;  // set by the first BeginStep
  std::deque<std::pair<int64_t, StepScalars>> history;
  std::deque<std::string> log;
  struct NamedRng {
    std::string name;
    std::function<std::string()> save;
    uint64_t seed;
    std::function<void(const std::string&)> restore;  // may be empty
  };
  std::vector<NamedRng> user_rngs;
  v1::Identity identity;
  std::map<TriggerKind, int64_t> last_capture_step;
  std::set<TriggerKind> quiet_kinds;  // rate-limited kinds already reported in this window
  std::deque<RunEvent> events;
  std::optional<GenerationInfo> generation;  // Monitor::SetGeneration
  OptimizerProbe* probe = nullptr;           // set while an OptimizerProbe is attached
  // Capsules waiting for the optimizer step, in capture order: a second capture in the same step
  // (a manual one after a trigger) waits beside the first, and both are written.
  std::vector<internal::PendingCapture> pending;
  // MonitorOptions::background_write: made at the first capsule it writes.
  std::unique_ptr<internal::BackgroundWriter> writer;
  int in_background = 0;  // capsules queued whose write is not collected yet
  // What the loss handed with the step's marked reduction fired (Distributed::StepEnd): the
  // trigger the other ranks learned from this rank's row.
  FiredTrigger loss_fired;
  // Held by every entry point that touches the state; recursive because they call each other
  // (BeginStep flushes, EndStep captures). Never held across a collective, so that the watchdog
  // of a Distributed can capture while the training thread waits in one.
  std::recursive_timed_mutex mu;
};

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

at::Tensor CopyIfDefined(const at::Tensor& t) { return t.defined() ? t.detach().clone() : t; }

// The last values of one scalar in the history, oldest first, for SpikeThreshold.
std::vector<double> Recent(const std::deque<std::pair<int64_t, StepScalars>>& history,
                           std::optional<double> StepScalars::*field) {
  std::vector<double> v;
  v.reserve(history.size());
  for (const auto& entry : history) {
    const std::optional<double>& x = entry.second.*field;
    if (x) v.push_back(*x);
  }
  return v;
}

// The capture re-run: the step again from its snapshot (same RNG stream, batch and thread count),
// layer by layer. The trainer's RNG position after its own step and its thread count come back
// however the re-run ends.
StatusOr<ProbeResult> RerunStep(LayerSequence& seq, const StepSnapshot& snap) {
  internal::RerunGuard guard;
  CAPSULE_RETURN_IF_ERROR(guard.Enter(snap.torch_rngs, snap.intra_op_threads));
  StatusOr<ProbeResult> probe = ProbeStep(seq, snap.batch.tensors, ProbeOptions());
  CAPSULE_RETURN_IF_ERROR(guard.Restore());
  if (!probe.ok()) return probe.status().WithContext("capture re-run");
  return probe;
}

// The first trigger `s` fires against the history before it; kind kNone when none does.
FiredTrigger CheckTriggers(const MonitorOptions& options,
                           const std::deque<std::pair<int64_t, StepScalars>>& history,
                           const StepScalars& s) {
  FiredTrigger f;
  if (options.trigger_non_finite_loss && s.loss && !std::isfinite(*s.loss)) {
    return {TriggerKind::kNonFiniteLoss, *s.loss, 0, "loss is not finite"};
  }
  if (options.trigger_non_finite_grad && s.grad_norm && !std::isfinite(*s.grad_norm)) {
    return {TriggerKind::kNonFiniteGrad, *s.grad_norm, 0, "gradient norm is not finite"};
  }
  if (options.trigger_loss_spike && s.loss) {
    auto t = SpikeThreshold(Recent(history, &StepScalars::loss), options.loss_spike);
    if (t && *s.loss > *t) {
      return {TriggerKind::kLossSpike, *s.loss, *t,
              "loss " + DescribeSpikeRule(options.loss_spike)};
    }
  }
  if (options.trigger_grad_norm_spike && s.grad_norm) {
    auto t = SpikeThreshold(Recent(history, &StepScalars::grad_norm), options.grad_norm_spike);
    if (t && *s.grad_norm > *t) {
      return {TriggerKind::kGradNormSpike, *s.grad_norm, *t,
              "grad norm " + DescribeSpikeRule(options.grad_norm_spike)};
    }
  }
  return f;
}

}  // namespace

Monitor::Monitor(MonitorOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {}

Monitor::~Monitor() {
  if (distributed_) {
    distributed_->SetIncidentHandler(nullptr);
    distributed_->SetLossTriggerCheck(nullptr);
  }
  Flush();
  WaitForWrites();
  state_->writer.reset();
}

void Monitor::WaitForWrites() {
  std::lock_guard<std::recursive_timed_mutex> lock(state_->mu);
  // The writer thread never takes this lock: waiting for it here cannot deadlock.
  if (state_->writer) state_->writer->Drain();
  CollectWrites();
}

void Monitor::CollectWrites() {
  if (!state_->writer) return;
  for (internal::FinishedWrite& w : state_->writer->TakeFinished()) {
    --state_->in_background;
    FinishReport(w.report.status, w.what, &w.report);
  }
}

Status Monitor::WriteOrQueue(v1::Capsule& capsule, const TensorDataViews* held,
                             std::optional<PrivateKey>& key, const std::string& what, bool incident,
                             StepReport* report) {
  // An incident comes from another thread or a dying collective: written at once.
  if (options_.background_write && !incident) {
    if (!state_->writer) {
      state_->writer = std::make_unique<internal::BackgroundWriter>(
          options_, options_.background_queue_depth, options_.background_signal_wait_seconds);
    }
    const std::string path = internal::FreeCapturedCapsulePath(capsule, options_);
    internal::WriteJob job{std::move(capsule), held ? *held : TensorDataViews(), std::move(key),
                           what, *report};
    job.report.capsule_path = path;
    if (state_->writer->Push(job)) {
      ++state_->in_background;
      report->capsule_path = path;
      report->queued = true;
      return Status::Ok();
    }
    // The queue is full: written here, as without a background writer (Push left the job, and
    // its held bytes are still the parameters', which the trainer has not moved yet).
    Log("capsule: " + what + ": the background queue is full (" +
        std::to_string(options_.background_queue_depth) + "); written in the trainer's thread");
    CAPSULE_ASSIGN_OR_RETURN(report->capsule_path,
                             internal::WriteCapturedCapsule(
                                 job.capsule, options_, job.key ? &*job.key : nullptr, &job.held));
    return Status::Ok();
  }
  CAPSULE_ASSIGN_OR_RETURN(
      report->capsule_path,
      internal::WriteCapturedCapsule(capsule, options_, key ? &*key : nullptr, held));
  return Status::Ok();
}

void Monitor::AttachDistributed(std::shared_ptr<Distributed> distributed) {
  std::lock_guard<std::recursive_timed_mutex> lock(state_->mu);
  if (distributed_) {
    distributed_->SetIncidentHandler(nullptr);
    distributed_->SetLossTriggerCheck(nullptr);
  }
  distributed_ = std::move(distributed);
  if (!distributed_) return;
  options_.rank = distributed_->rank();
  options_.world_size = distributed_->world_size();
  distributed_->SetIncidentHandler([this](TriggerKind kind, const std::string& reason) {
    return CaptureIncident(kind, reason);
  });
  // The loss triggers, before the step's marked reduction: its row tells every rank what fired.
  distributed_->SetLossTriggerCheck([this](std::optional<double> loss) {
    std::lock_guard<std::recursive_timed_mutex> held(state_->mu);
    StepScalars s;
    s.loss = loss;
    state_->loss_fired = loss ? CheckTriggers(options_, state_->history, s) : FiredTrigger();
    return state_->loss_fired.kind;
  });
}

bool Monitor::CaptureIncident(TriggerKind kind, const std::string& reason) {
  // Another thread: wait for the training thread's current call to finish, but not forever (it
  // may be the one that is stuck, in a model call that never returns).
  std::unique_lock<std::recursive_timed_mutex> lock(state_->mu, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::seconds(10))) {
    Emit("capsule: " + std::string(TriggerKindName(kind)) +
         ": no capsule (the training thread has held the Monitor for 10 s)");
    return false;
  }
  if (!state_->snap) {
    Emit("capsule: " + std::string(TriggerKindName(kind)) + ": no capsule (no step began)");
    return false;
  }
  FiredTrigger f;
  f.kind = kind;
  // No value for replay to compare: the rank may have stopped before the step's loss, or after
  // its optimizer step (BuildAndWrite notes it); a replay then checks that the step runs through.
  f.observed = NAN;
  f.rule = kind == TriggerKind::kHang ? "no collective completed within the hang period"
                                      : "a collective failed on this rank";
  Log(reason);
  StepReport r = Capture(f, reason, /*incident=*/true);
  return !r.capsule_path.empty();
}

void Monitor::AttachModel(Model* model, PathKind path) {
  state_->model = model;
  state_->path = path;
}

void Monitor::SetWeightsCheckpoint(const std::string& path) { options_.weights_checkpoint = path; }

Status Monitor::SetIdentity(const IdentityInfo& info) {
  v1::Identity& id = state_->identity;
  id.Clear();
  Status first_error;
  for (const IdentityInfo::File& f : info.files) {
    auto h = HashFile(f.path);
    if (!h.ok()) {
      Emit("capsule: cannot hash " + f.role + " file: " + h.status().message());
      if (first_error.ok()) first_error = h.status();
      continue;
    }
    v1::FileIdentity& out = *id.add_files();
    out.set_role(f.role);
    out.set_name(h->name);
    out.set_path(h->path);
    out.set_size_bytes(h->size_bytes);
    out.set_sha256(h->sha256);
  }
  id.set_chat_template(info.chat_template);
  id.set_config_text(info.config_text);
  if (!info.config_text.empty()) {
    StatusOr<std::string> config_hash = Sha256Hex(info.config_text);
    if (config_hash.ok()) {
      id.set_config_sha256(*config_hash);
    } else {
      Emit("capsule: cannot hash the config text: " + config_hash.status().message());
      if (first_error.ok()) first_error = config_hash.status();
    }
  }
  id.set_code_revision(info.code_revision);
  return first_error;
}

void Monitor::RegisterRng(const std::string& name, std::function<std::string()> save,
                          uint64_t seed) {
  state_->user_rngs.push_back({name, std::move(save), seed, nullptr});
}

void Monitor::RegisterRng(const std::string& name, std::function<std::string()> save, uint64_t seed,
                          std::function<void(const std::string&)> restore) {
  state_->user_rngs.push_back({name, std::move(save), seed, std::move(restore)});
}

void Monitor::Log(const std::string& line) {
  std::lock_guard<std::recursive_timed_mutex> lock(state_->mu);
  std::deque<std::string>& log = state_->log;
  log.push_back(line);
  while (static_cast<int>(log.size()) > options_.log_lines) log.pop_front();
}

void Monitor::AddEvent(int64_t step, const std::string& kind, const std::string& detail) {
  std::deque<RunEvent>& events = state_->events;
  events.push_back({step, kind, detail});
  while (events.size() > 64) events.pop_front();
}

Status Monitor::SetGeneration(std::optional<GenerationInfo> generation) {
  if (generation) CAPSULE_RETURN_IF_ERROR(generation->Validate());
  state_->generation = std::move(generation);
  return Status::Ok();
}

void Monitor::Emit(const std::string& line) const {
  if (options_.log_sink) {
    options_.log_sink(line);
  } else {
    std::cerr << line << "\n";
  }
}

void Monitor::BeginStep(int64_t step, const DataCursor& cursor, const StepBatch& batch) {
  std::lock_guard<std::recursive_timed_mutex> lock(state_->mu);
  if (!state_->pending.empty()) Flush();
  CollectWrites();
  state_->loss_fired = FiredTrigger();
  if (!state_->snap) state_->snap.emplace();
  StepSnapshot& s = *state_->snap;
  s.step = step;
  s.cursor = cursor;
  s.batch = batch;
  // Index tensors are small (batch x seq int64); copying them keeps the snapshot valid even if the
  // trainer reuses its buffers in place.
  s.batch.tensors.input_ids = CopyIfDefined(batch.tensors.input_ids);
  // `inputs` (features, images) can be large: the snapshot keeps the trainer's tensor, not a copy,
  // so the armed per-step cost stays small. A trainer that overwrites it in place before EndStep
  // must pass a fresh tensor (monitor.h).
  s.batch.tensors.labels = CopyIfDefined(batch.tensors.labels);
  s.batch.tensors.attention_mask = CopyIfDefined(batch.tensors.attention_mask);
  s.batch.tensors.loss_mask = CopyIfDefined(batch.tensors.loss_mask);
  s.batch.tensors.response_mask = CopyIfDefined(batch.tensors.response_mask);
  s.torch_rngs = SnapshotTorchRngs();
  s.user_rngs.clear();
  for (const State::NamedRng& r : state_->user_rngs) {
    try {
      s.user_rngs.push_back({r.name, v1::USER, "cpu", r.save(), r.seed});
    } catch (const std::exception& e) {
      Log("capsule: cannot save RNG " + r.name + ": " + e.what());
    }
  }
  s.intra_op_threads = at::get_num_threads();
  if (distributed_) {
    std::vector<at::Tensor> params;
    if (state_->model != nullptr) {
      for (const NamedTensor& p : state_->model->NamedParameters()) params.push_back(p.second);
    }
    std::vector<std::pair<std::string, std::string>> rngs;
    for (const std::vector<RngBlobData>* list : {&s.torch_rngs, &s.user_rngs}) {
      for (const RngBlobData& r : *list) rngs.emplace_back(r.name, r.state);
    }
    distributed_->OnBeginStep(step, params, rngs, cursor.epoch, cursor.offset, batch.sample_ids);
  }
}

StepReport Monitor::EndStep(const StepScalars& scalars) {
  std::unique_lock<std::recursive_timed_mutex> lock(state_->mu);
  CollectWrites();
  const int64_t step = state_->snap ? state_->snap->step : 0;
  // Triggers compare against the history *before* this step.
  FiredTrigger fired = CheckTriggers(options_, state_->history, scalars);
  auto& history = state_->history;
  history.emplace_back(step, scalars);
  while (static_cast<int>(history.size()) > options_.history_length) history.pop_front();
  std::string message;
  if (distributed_) {
    const int loss_ranks = state_->snap ? state_->snap->batch.loss.ranks : 0;
    // The agreement is a collective: the Monitor is not held while it waits.
    lock.unlock();
    const AgreementResult a = distributed_->Agree(step, fired.kind, loss_ranks);
    lock.lock();
    // Rows that came with the marked reduction carry the loss trigger checked there: this rank
    // captures what the others were told it fired.
    if (a.rows_carried && fired.kind == TriggerKind::kNone) fired = state_->loss_fired;
    // A failed agreement already wrote its COLLECTIVE_ERROR capsule (when the Monitor could);
    // the trainer hears of it here, in the report's status and summary.
    if (a.ran && !a.status.ok()) {
      const std::string failed = "the trigger agreement at step " + std::to_string(step) +
                                 " failed (" + a.status.message() +
                                 "): the ranks did not learn each other's triggers";
      if (fired.kind == TriggerKind::kNone) {
        StepReport r;
        r.status = a.status;
        r.summary = failed;
        return r;
      }
      message = failed;
    }
    if (a.ran && a.status.ok()) message = a.summary;
    if (a.ran && a.status.ok() && fired.kind == TriggerKind::kNone) {
      // What replay re-runs on this rank is its own step: its loss is the value to come back.
      fired.observed = scalars.loss ? *scalars.loss : NAN;
      if (!a.fired.empty()) {
        fired.kind = TriggerKind::kPeerTrigger;
        fired.rule = "another rank fired at this step (trigger agreement)";
      } else if (!a.desynced_ranks.empty()) {
        fired.kind = TriggerKind::kReplicaDesync;
        fired.rule = "parameter checksums of the replicas differ at the step's start";
        std::string ranks;
        for (int r : a.desynced_ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        message = "ranks differing from the majority's parameters: " + ranks;
      } else if (a.reduction_not_a_mean) {
        fired.kind = TriggerKind::kGradReduction;
        fired.rule =
            "reduced gradient norm / mean of the ranks' local norms > 1 (a mean cannot be)";
        message = "the gradient reduction is not a mean: reduced norm / mean local norm = " +
                  std::to_string(a.reduction_ratio);
      }
    }
  }
  if (fired.kind == TriggerKind::kNone) return {};
  return Capture(fired, message);
}

StepReport Monitor::CaptureNow(const std::string& reason) {
  std::lock_guard<std::recursive_timed_mutex> lock(state_->mu);
  FiredTrigger f;
  f.kind = TriggerKind::kManual;
  f.rule = "manual capture";
  f.observed = NAN;
  const auto& history = state_->history;
  if (!history.empty() && state_->snap && history.back().first == state_->snap->step &&
      history.back().second.loss) {
    f.observed = *history.back().second.loss;
  }
  return Capture(f, reason);
}

StepReport Monitor::RunStep(const std::function<void()>& step_fn) {
  std::string what;
  try {
    step_fn();
    return {};
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  FiredTrigger f;
  f.kind = TriggerKind::kException;
  f.rule = "the step threw";
  f.observed = NAN;
  std::lock_guard<std::recursive_timed_mutex> lock(state_->mu);
  Log("exception: " + what);
  return Capture(f, what);
}

StepReport Monitor::Capture(const FiredTrigger& fired, const std::string& message, bool incident) {
  StepReport report;
  report.triggered = true;
  report.trigger = fired.kind;
  const int64_t step = state_->snap ? state_->snap->step : 0;
  const std::string what =
      std::string(TriggerKindName(fired.kind)) + " at step " + std::to_string(step);
  const int attempts = capsules_written_ + captures_failed_ +
                       static_cast<int>(state_->pending.size()) + state_->in_background;
  if (attempts >= options_.max_capsules) {
    report.rate_limited = true;
    report.summary = what + ": no capsule (limit of " + std::to_string(options_.max_capsules) +
                     " capture attempts per run reached: " + std::to_string(capsules_written_) +
                     " written, " + std::to_string(captures_failed_) + " failed)";
    Emit("capsule: " + report.summary);
    return report;
  }
  auto last = state_->last_capture_step.find(fired.kind);
  if (last != state_->last_capture_step.end() &&
      step - last->second < options_.min_steps_between_same_kind) {
    report.rate_limited = true;
    report.summary = what + ": no capsule (one " + TriggerKindName(fired.kind) + " capsule per " +
                     std::to_string(options_.min_steps_between_same_kind) + " steps)";
    // Say it once per window: a diverged run fires every step, and the log should not drown.
    // A capture asked for by hand is answered every time.
    if (fired.kind == TriggerKind::kManual) {
      Emit("capsule: " + report.summary);
    } else if (!state_->quiet_kinds.count(fired.kind)) {
      Emit("capsule: " + report.summary + "; not repeated");
    }
    state_->quiet_kinds.insert(fired.kind);
    return report;
  }
  state_->quiet_kinds.erase(fired.kind);
  // The capture must never take the trainer down: everything below is fenced.
  Status s;
  try {
    s = BuildAndWrite(fired, message, what, incident, &report);
  } catch (const c10::Error& e) {
    s = InternalError(std::string("capture failed: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    s = InternalError(std::string("capture failed: ") + e.what());
  } catch (...) {
    s = InternalError("capture failed: unknown exception");
  }
  report.status = s;
  // Written or not, the attempt opens this kind's window: retrying at every later step would
  // re-run each of them and most likely fail the same way.
  state_->last_capture_step[fired.kind] = step;
  if (s.ok() && report.pending) {
    state_->pending.back().what = what;
    state_->pending.back().report = report;
    report.summary = what + ": capsule built; written after the optimizer step";
    return report;
  }
  FinishReport(s, what, &report);
  return report;
}

std::vector<v1::Capsule*> Monitor::PendingCapsules() {
  std::vector<v1::Capsule*> out;
  for (internal::PendingCapture& p : state_->pending) out.push_back(&p.capsule);
  return out;
}

void Monitor::SetOptimizerProbe(OptimizerProbe* probe) { state_->probe = probe; }

StepReport Monitor::Flush() {
  std::lock_guard<std::recursive_timed_mutex> lock(state_->mu);
  StepReport report;
  while (!state_->pending.empty()) {
    try {
      report = WritePending();
    } catch (const std::exception& e) {
      // Nothing may escape into the trainer (this also runs in the destructor).
      report = StepReport{};
      report.triggered = true;
      FinishReport(InternalError(std::string("capture failed: ") + e.what()), "pending capsule",
                   &report);
    }
  }
  return report;
}

StepReport Monitor::WritePending() {
  internal::PendingCapture p = std::move(state_->pending.front());
  state_->pending.erase(state_->pending.begin());
  StepReport report = p.report;
  report.pending = false;
  if (!p.capsule.optimizer().observed_after()) {
    p.capsule.add_capture_notes(
        "optimizer: the step after the capture was not observed (OptimizerProbe::AfterStep was "
        "not called before the next step)");
  }
  const auto write_start = std::chrono::steady_clock::now();
  const Status s = WriteOrQueue(p.capsule, nullptr, p.key, p.what, /*incident=*/false, &report);
  report.write_seconds += SecondsSince(write_start);
  FinishReport(s, p.what, &report);
  return report;
}

void Monitor::FinishReport(const Status& s, const std::string& what, StepReport* out) {
  StepReport& report = *out;
  report.status = s;
  if (s.ok() && report.queued) {
    // Handed to the background writer: counted, and logged again, once CollectWrites sees it done.
    report.summary = what + ": capsule queued for " + report.capsule_path;
  } else if (s.ok()) {
    ++capsules_written_;
    report.summary = what + ": wrote " + report.capsule_path;
    if (!report.first_anomalous_layer.empty()) {
      report.summary += " (first anomalous layer " + report.first_anomalous_layer + ")";
    }
  } else {
    ++captures_failed_;
    report.summary = what + ": capsule not written: " + s.message() + "; further " +
                     TriggerKindName(report.trigger) + " triggers within " +
                     std::to_string(options_.min_steps_between_same_kind) + " steps are suppressed";
  }
  Emit("capsule: " + report.summary);
  Log("capsule: " + report.summary);
}

Status Monitor::BuildAndWrite(const FiredTrigger& fired, const std::string& message,
                              const std::string& what, bool incident, StepReport* report) {
  if (!state_->snap) return FailedPreconditionError("EndStep/CaptureNow called before BeginStep");
  const StepSnapshot& snap = *state_->snap;
  // Load the key first: without it there is no capsule, and the re-run would be wasted.
  CAPSULE_ASSIGN_OR_RETURN(std::optional<PrivateKey> key,
                           internal::LoadCaptureKey(options_.signing_key_path));

  internal::CaptureContext context;
  context.fired = fired;
  context.message = message;
  context.now_unix_micros = NowMicros();
  context.history.assign(state_->history.begin(), state_->history.end());
  context.log_lines.assign(state_->log.begin(), state_->log.end());
  context.identity = state_->identity;
  context.model = state_->model;
  context.path = state_->path;
  context.events.assign(state_->events.begin(), state_->events.end());
  context.generation = state_->generation;

  std::optional<ProbeResult> rerun;
  if (state_->model != nullptr && options_.rerun && !incident) {
    // User RNGs that can be restored draw in the re-run as they did in the step, and come back to
    // where the trainer left them however the re-run ends.
    std::vector<std::pair<const State::NamedRng*, std::string>> put_back;
    for (const State::NamedRng& r : state_->user_rngs) {
      if (!r.restore) continue;
      for (const RngBlobData& b : snap.user_rngs) {
        if (b.name != r.name) continue;
        put_back.emplace_back(&r, r.save());
        r.restore(b.state);
      }
    }
    const auto rerun_start = std::chrono::steady_clock::now();
    StatusOr<ProbeResult> probe = [&] {
      internal::BufferGuard buffers(*state_->model);  // running statistics stay the trainer's
      return RerunStep(state_->model->Path(state_->path), snap);
    }();
    report->rerun_seconds = SecondsSince(rerun_start);
    for (const auto& [r, state] : put_back) r->restore(state);
    if (!probe.ok()) return probe.status();
    rerun = std::move(*probe);
  }
  const auto build_start = std::chrono::steady_clock::now();
  CAPSULE_ASSIGN_OR_RETURN(
      internal::BuiltCapsule built,
      internal::BuildCapsule(snap, rerun ? &*rerun : nullptr, context, options_));
  if (distributed_) distributed_->FillSection(&built.capsule);
  const auto& history = state_->history;
  if (incident && !history.empty() && history.back().first == snap.step) {
    built.capsule.add_capture_notes(
        "weights: captured after this step's EndStep (by the watchdog or a failed collective), so "
        "they may already hold the step's optimizer update; a replay's loss need not match the "
        "step's");
  }
  report->build_seconds = SecondsSince(build_start);
  for (const std::string& note : built.notes) Log(note);
  const v1::Capsule& c = built.capsule;
  report->rerun_reproduced = c.trigger().capture_rerun() == v1::RERUN_REPRODUCED;
  report->first_anomalous_layer = c.numerics().first_anomalous_layer();
  const auto write_start = std::chrono::steady_clock::now();
  if (incident || state_->probe != nullptr) {
    // The parameters will move before the capsule is written (the trainer's optimizer step, or
    // the trainer thread running on while another thread captures): copy their bytes. (The
    // background writer copies them itself, into buffers it keeps.)
    internal::OwnTensorBytes(&built);
  }
  if (state_->probe != nullptr && !incident) {
    // The optimizer section comes from the trainer's own step, after this returns.
    state_->pending.push_back(
        internal::PendingCapture{std::move(built.capsule), std::move(key), {}, ""});
    report->pending = true;
    return Status::Ok();
  }

  CAPSULE_RETURN_IF_ERROR(
      WriteOrQueue(built.capsule, &built.tensor_data, key, what, incident, report));
  report->write_seconds = SecondsSince(write_start);
  return Status::Ok();
}

}  // namespace capsule
