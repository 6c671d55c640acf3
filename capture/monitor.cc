#include "capsule/capture/monitor.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "capsule/base/sha256.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/version.h"
#include "capsule/probe/environment.h"
#include "capsule/probe/hashing.h"
#include "capsule/probe/layer_probe.h"
#include "capsule/probe/tensor_codec.h"
#include "capsule/probe/trigger_rule.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {

const char* TriggerKindName(TriggerKind kind) {
  return v1::TriggerKind_Name(static_cast<v1::TriggerKind>(kind)).c_str();
}

struct Monitor::Snapshot {
  int64_t step = 0;
  DataCursor cursor;
  StepBatch batch;
  std::vector<RngBlobData> torch_rngs;
  std::vector<RngBlobData> user_rngs;
  int intra_op_threads = 1;
  int64_t wall_micros = 0;
};

struct Monitor::IdentityState {
  v1::Identity identity;
};

namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

at::Tensor CopyIfDefined(const at::Tensor& t) { return t.defined() ? t.detach().clone() : t; }

// Robust spike threshold over the last `window` values: median + max(k * 1.4826 * MAD,
// min_rel * |median|). nullopt until `warmup` finite values exist.
std::optional<double> SpikeThreshold(const std::deque<std::pair<int64_t, StepScalars>>& history,
                                     std::optional<double> StepScalars::*field, int window,
                                     int warmup, double k, double min_rel) {
  std::vector<double> v;
  v.reserve(window);
  for (auto it = history.rbegin(); it != history.rend() && (int)v.size() < window; ++it) {
    const std::optional<double>& x = it->second.*field;
    if (x && std::isfinite(*x)) v.push_back(*x);
  }
  if ((int)v.size() < warmup || v.empty()) return std::nullopt;
  auto median_of = [](std::vector<double>& a) {
    const size_t mid = a.size() / 2;
    std::nth_element(a.begin(), a.begin() + mid, a.end());
    double m = a[mid];
    if (a.size() % 2 == 0) m = (m + *std::max_element(a.begin(), a.begin() + mid)) / 2;
    return m;
  };
  const double median = median_of(v);
  for (double& x : v) x = std::fabs(x - median);
  const double mad = median_of(v);
  return median + std::max(k * 1.4826 * mad, min_rel * std::fabs(median));
}

std::string FormatValue(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!partial.empty() && ::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(errno, "cannot create capsule directory", partial);
      }
    }
    if (i < dir.size()) partial += dir[i];
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("capsule directory " + dir + " is not a directory");
  }
  return Status::Ok();
}

void FillStats(const HealthStats& s, v1::HealthStats* out) {
  out->set_numel(s.numel);
  out->set_nan_count(s.nan_count);
  out->set_pos_inf_count(s.pos_inf_count);
  out->set_neg_inf_count(s.neg_inf_count);
  out->set_zero_count(s.zero_count);
  out->set_min(s.min);
  out->set_max(s.max);
  out->set_absmax(s.absmax);
  out->set_mean(s.mean);
  out->set_rms(s.rms);
  out->set_first_nonfinite_index(s.first_nonfinite_index);
}

void FillScalars(int64_t step, const StepScalars& s, v1::StepScalars* out) {
  out->set_step(step);
  if (s.loss) out->set_loss(*s.loss);
  if (s.grad_norm) out->set_grad_norm(*s.grad_norm);
  if (s.update_norm) out->set_update_norm(*s.update_norm);
  if (s.param_norm) out->set_param_norm(*s.param_norm);
  if (s.learning_rate) out->set_learning_rate(*s.learning_rate);
  if (s.weight_decay) out->set_weight_decay(*s.weight_decay);
  if (s.loss_scale) out->set_loss_scale(*s.loss_scale);
}

std::string TriggerFileName(TriggerKind kind) { return TriggerKindName(kind); }

}  // namespace

Monitor::Monitor(MonitorOptions options)
    : options_(std::move(options)), identity_(std::make_unique<IdentityState>()) {}

Monitor::~Monitor() = default;

void Monitor::AttachModel(Model* model, PathKind path) {
  model_ = model;
  path_ = path;
}

Status Monitor::SetIdentity(const IdentityInfo& info) {
  v1::Identity& id = identity_->identity;
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
  if (!info.config_text.empty()) id.set_config_sha256(Sha256Hex(info.config_text));
  id.set_code_revision(info.code_revision);
  return first_error;
}

void Monitor::RegisterRng(const std::string& name, std::function<std::string()> save,
                          uint64_t seed) {
  user_rngs_.push_back({name, std::move(save), seed});
}

void Monitor::Log(const std::string& line) {
  log_.push_back(line);
  while (static_cast<int>(log_.size()) > options_.log_lines) log_.pop_front();
}

void Monitor::Emit(const std::string& line) const {
  if (options_.log_sink) {
    options_.log_sink(line);
  } else {
    std::cerr << line << "\n";
  }
}

void Monitor::BeginStep(int64_t step, const DataCursor& cursor, const StepBatch& batch) {
  if (!snap_) snap_ = std::make_unique<Snapshot>();
  Snapshot& s = *snap_;
  s.step = step;
  s.cursor = cursor;
  s.batch = batch;
  // Index tensors are small (batch x seq int64); copying them keeps the snapshot valid even if the
  // trainer reuses its buffers in place.
  s.batch.tensors.input_ids = CopyIfDefined(batch.tensors.input_ids);
  s.batch.tensors.labels = CopyIfDefined(batch.tensors.labels);
  s.batch.tensors.attention_mask = CopyIfDefined(batch.tensors.attention_mask);
  s.batch.tensors.loss_mask = CopyIfDefined(batch.tensors.loss_mask);
  s.torch_rngs = SnapshotTorchRngs();
  s.user_rngs.clear();
  for (const NamedRng& r : user_rngs_) {
    try {
      s.user_rngs.push_back({r.name, v1::USER, "cpu", r.save(), r.seed});
    } catch (const std::exception& e) {
      Log("capsule: cannot save RNG " + r.name + ": " + e.what());
    }
  }
  s.intra_op_threads = at::get_num_threads();
  s.wall_micros = 0;
}

Monitor::Fired Monitor::CheckTriggers(const StepScalars& s) const {
  Fired f;
  if (options_.trigger_non_finite_loss && s.loss && !std::isfinite(*s.loss)) {
    return {TriggerKind::kNonFiniteLoss, *s.loss, 0, "loss is not finite"};
  }
  if (options_.trigger_non_finite_grad && s.grad_norm && !std::isfinite(*s.grad_norm)) {
    return {TriggerKind::kNonFiniteGrad, *s.grad_norm, 0, "gradient norm is not finite"};
  }
  const std::string rule = "> median(last " + std::to_string(options_.spike_window) + ") + max(" +
                           FormatValue(options_.spike_mads) + "*1.4826*MAD, " +
                           FormatValue(options_.spike_min_relative) + "*|median|)";
  if (options_.trigger_loss_spike && s.loss) {
    auto t =
        SpikeThreshold(history_, &StepScalars::loss, options_.spike_window, options_.spike_warmup,
                       options_.spike_mads, options_.spike_min_relative);
    if (t && *s.loss > *t) return {TriggerKind::kLossSpike, *s.loss, *t, "loss " + rule};
  }
  if (options_.trigger_grad_norm_spike && s.grad_norm) {
    auto t =
        SpikeThreshold(history_, &StepScalars::grad_norm, options_.spike_window,
                       options_.spike_warmup, options_.spike_mads, options_.spike_min_relative);
    if (t && *s.grad_norm > *t) {
      return {TriggerKind::kGradNormSpike, *s.grad_norm, *t, "grad norm " + rule};
    }
  }
  return f;
}

StepReport Monitor::EndStep(const StepScalars& scalars) {
  const int64_t step = snap_ ? snap_->step : 0;
  // Triggers compare against the history *before* this step.
  const Fired fired = CheckTriggers(scalars);
  history_.emplace_back(step, scalars);
  while (static_cast<int>(history_.size()) > options_.history_length) history_.pop_front();
  if (fired.kind == TriggerKind::kNone) return {};
  return Capture(fired, "");
}

StepReport Monitor::CaptureNow(const std::string& reason) {
  Fired f;
  f.kind = TriggerKind::kManual;
  f.rule = "manual capture";
  f.observed = NAN;
  if (!history_.empty() && snap_ && history_.back().first == snap_->step &&
      history_.back().second.loss) {
    f.observed = *history_.back().second.loss;
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
  Fired f;
  f.kind = TriggerKind::kException;
  f.rule = "the step threw";
  f.observed = NAN;
  Log("exception: " + what);
  return Capture(f, what);
}

StepReport Monitor::Capture(const Fired& fired, const std::string& message) {
  StepReport report;
  report.triggered = true;
  report.trigger = fired.kind;
  const int64_t step = snap_ ? snap_->step : 0;
  const std::string what =
      std::string(TriggerKindName(fired.kind)) + " at step " + std::to_string(step);
  if (capsules_written_ >= options_.max_capsules) {
    report.rate_limited = true;
    report.summary = what + ": no capsule (limit of " + std::to_string(options_.max_capsules) +
                     " per run reached)";
    Emit("capsule: " + report.summary);
    return report;
  }
  auto last = last_capture_step_.find(fired.kind);
  if (last != last_capture_step_.end() &&
      step - last->second < options_.min_steps_between_same_kind) {
    report.rate_limited = true;
    report.summary = what + ": no capsule (one " + TriggerKindName(fired.kind) + " capsule per " +
                     std::to_string(options_.min_steps_between_same_kind) + " steps)";
    // Say it once per window: a diverged run fires every step, and the log should not drown.
    if (!quiet_kinds_.count(fired.kind)) Emit("capsule: " + report.summary + "; not repeated");
    quiet_kinds_.insert(fired.kind);
    return report;
  }
  quiet_kinds_.erase(fired.kind);
  // The capture must never take the trainer down: everything below is fenced.
  Status s;
  try {
    s = BuildAndWrite(fired, message, &report);
  } catch (const c10::Error& e) {
    s = InternalError(std::string("capture failed: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    s = InternalError(std::string("capture failed: ") + e.what());
  } catch (...) {
    s = InternalError("capture failed: unknown exception");
  }
  report.status = s;
  if (s.ok()) {
    ++capsules_written_;
    last_capture_step_[fired.kind] = step;
    report.summary = what + ": wrote " + report.capsule_path;
    if (!report.first_anomalous_layer.empty()) {
      report.summary += " (first anomalous layer " + report.first_anomalous_layer + ")";
    }
  } else {
    report.summary = what + ": capsule not written: " + s.message();
  }
  Emit("capsule: " + report.summary);
  Log("capsule: " + report.summary);
  return report;
}

Status Monitor::BuildAndWrite(const Fired& fired, const std::string& message, StepReport* report) {
  if (!snap_) return FailedPreconditionError("EndStep/CaptureNow called before BeginStep");
  const Snapshot& snap = *snap_;
  // Load the key first: without it there is no capsule, and the re-run would be wasted.
  std::optional<PrivateKey> key;
  if (!options_.signing_key_path.empty()) {
    auto k = LoadPrivateKeyFile(options_.signing_key_path);
    if (!k.ok()) return k.status().WithContext("signing key");
    key = std::move(*k);
  }

  v1::Capsule c;
  const int64_t now = NowMicros();
  c.set_writer_version(CapsuleVersion());
  c.set_created_unix_micros(now);
  c.set_run_name(options_.run_name);
  for (const auto& [k, v] : options_.annotations) (*c.mutable_annotations())[k] = v;

  v1::Trigger& trig = *c.mutable_trigger();
  trig.set_kind(static_cast<v1::TriggerKind>(fired.kind));
  trig.set_observed(fired.observed);
  trig.set_threshold(fired.threshold);
  trig.set_rule(fired.rule);
  trig.set_wall_time_unix_micros(now);
  trig.set_message(message);

  v1::StepInfo& step = *c.mutable_step();
  step.set_global_step(snap.step);
  step.set_micro_batch(snap.batch.micro_batch);
  step.set_tokens_seen(snap.batch.tokens_seen);
  step.set_epoch(snap.cursor.epoch);
  for (const auto& [s, scalars] : history_) FillScalars(s, scalars, step.add_history());

  // Data: per-sequence records plus the exact tensors the model consumed.
  const LayerBatch& lb = snap.batch.tensors;
  v1::DataBatch& data = *c.mutable_data();
  data.set_labels_shifted(lb.labels_shifted);
  v1::DataCursor& cur = *data.mutable_cursor();
  cur.set_epoch(snap.cursor.epoch);
  cur.set_shard(snap.cursor.shard);
  cur.set_offset(snap.cursor.offset);
  for (int64_t i : snap.cursor.sample_indices) cur.add_sample_indices(i);
  cur.set_sampler_rng(snap.cursor.sampler_rng);
  if (lb.input_ids.defined() && lb.input_ids.dim() == 2) {
    const at::Tensor ids = lb.input_ids.to(at::kCPU).to(at::kLong).contiguous();
    const at::Tensor labels =
        lb.labels.defined() ? lb.labels.to(at::kCPU).to(at::kLong).contiguous() : at::Tensor();
    auto mask_bytes = [](const at::Tensor& m, int64_t row) {
      if (!m.defined()) return std::string();
      const at::Tensor r = m[row].to(at::kCPU).ne(0).to(at::kByte).contiguous();
      return std::string(reinterpret_cast<const char*>(r.data_ptr()), r.numel());
    };
    for (int64_t b = 0; b < ids.size(0); ++b) {
      v1::Sequence& seq = *data.add_sequences();
      const int64_t* p = ids[b].data_ptr<int64_t>();
      for (int64_t t = 0; t < ids.size(1); ++t) seq.add_token_ids(p[t]);
      if (labels.defined() && labels.dim() == 2 && labels.size(0) == ids.size(0)) {
        const at::Tensor row = labels[b].contiguous();
        const int64_t* q = row.data_ptr<int64_t>();
        for (int64_t t = 0; t < row.numel(); ++t) seq.add_labels(q[t]);
      }
      seq.set_attention_mask(mask_bytes(lb.attention_mask, b));
      seq.set_loss_mask(mask_bytes(lb.loss_mask, b));
      seq.set_token_count(ids.size(1));
      if (b < (int64_t)snap.batch.raw_text.size()) seq.set_raw_text(snap.batch.raw_text[b]);
      if (b < (int64_t)snap.batch.sample_ids.size()) seq.set_sample_id(snap.batch.sample_ids[b]);
    }
  }
  auto embed = [&](const std::string& name, const at::Tensor& t, v1::TensorRole role,
                   const std::string& layer) -> Status {
    v1::TensorBlob& blob = *c.add_tensors();
    CAPSULE_RETURN_IF_ERROR(TensorToBlob(name, t, &blob));
    blob.set_role(role);
    blob.set_layer(layer);
    return Status::Ok();
  };
  const std::pair<const char*, const at::Tensor*> batch_tensors[] = {
      {"input_ids", &lb.input_ids},
      {"labels", &lb.labels},
      {"attention_mask", &lb.attention_mask},
      {"loss_mask", &lb.loss_mask}};
  for (const auto& [name, t] : batch_tensors) {
    if (!t->defined()) continue;
    CAPSULE_RETURN_IF_ERROR(embed(name, *t, v1::BATCH_INPUT, ""));
    data.add_tensor_names(name);
  }

  *c.mutable_identity() = identity_->identity;

  for (const auto* list : {&snap.torch_rngs, &snap.user_rngs}) {
    for (const RngBlobData& r : *list) {
      v1::RngBlob& g = *c.mutable_rng()->add_generators();
      g.set_name(r.name);
      g.set_kind(static_cast<v1::RngKind>(r.kind));
      g.set_device(r.device);
      g.set_torch_version(TorchVersion());
      g.set_state(r.state);
      g.set_seed(r.seed);
    }
  }

  v1::Placement& place = *c.mutable_placement();
  place.set_rank(options_.rank);
  place.set_world_size(options_.world_size);
  place.set_local_rank(options_.local_rank);
  place.set_data_parallel_rank(options_.rank);
  place.set_device(options_.device);

  CollectEnvironment(c.mutable_environment());
  c.mutable_environment()->set_intra_op_threads(snap.intra_op_threads);

  v1::Numerics& num = *c.mutable_numerics();
  num.set_intra_op_threads(snap.intra_op_threads);
  num.set_path(static_cast<v1::ExecutionPath>(path_));
  num.set_first_anomalous_index(-1);

  if (model_ != nullptr) {
    const ModelSpecInfo spec = model_->Spec();
    LayerSequence& seq = model_->Path(path_);
    v1::ModelSpec& ms = *c.mutable_model();
    ms.set_registry_name(spec.registry_name);
    ms.set_config_json(spec.config_json);
    ms.set_trainer_path(static_cast<v1::ExecutionPath>(path_));
    for (size_t i = 0; i < seq.size(); ++i) ms.add_layers(seq.name(i));

    const std::vector<NamedTensor> params = model_->NamedParameters();
    CAPSULE_ASSIGN_OR_RETURN(std::string model_hash, CanonicalModelHash(params));
    c.mutable_identity()->set_model_sha256(model_hash);
    int64_t count = 0;
    uint64_t weight_bytes = 0;
    for (const NamedTensor& p : params) {
      count += p.second.numel();
      weight_bytes += static_cast<uint64_t>(p.second.numel()) * p.second.element_size();
    }
    c.mutable_identity()->set_model_parameter_count(count);

    WeightPolicy policy = options_.weight_policy;
    if (policy == WeightPolicy::kAll && weight_bytes > options_.max_weight_bytes) {
      policy = WeightPolicy::kAnomalousLayer;
      Log("capsule: weights are " + std::to_string(weight_bytes) + " bytes, over the cap of " +
          std::to_string(options_.max_weight_bytes) + "; embedding the anomalous layer's only");
    }
    ms.set_weight_policy(static_cast<v1::WeightPolicy>(policy));
    std::map<std::string, std::string> owner;  // parameter name -> layer name
    for (size_t i = 0; i < seq.size(); ++i) {
      for (const NamedTensor& p : seq.LayerParameters(i)) owner[p.first] = seq.name(i);
    }

    int anomalous = -1;
    if (options_.rerun) {
      // Re-run from the snapshot: same RNG stream, batch and thread count. The trainer's RNG
      // position after its own step is saved and put back afterwards.
      const std::vector<RngBlobData> after = SnapshotTorchRngs();
      const int threads_now = at::get_num_threads();
      CAPSULE_RETURN_IF_ERROR(RestoreTorchRngs(snap.torch_rngs));
      if (threads_now != snap.intra_op_threads) at::set_num_threads(snap.intra_op_threads);
      StatusOr<ProbeResult> probe = ProbeStep(seq, lb, ProbeOptions());
      if (threads_now != snap.intra_op_threads) at::set_num_threads(threads_now);
      CAPSULE_RETURN_IF_ERROR(RestoreTorchRngs(after));
      if (!probe.ok()) return probe.status().WithContext("capture re-run");
      const ProbeResult& r = *probe;
      const RerunOutcome outcome = RerunOutcomeOf(r);
      const bool reproduced =
          TriggerFiresAgain(fired.kind, fired.observed, fired.threshold, outcome);
      trig.set_capture_rerun(reproduced ? v1::RERUN_REPRODUCED : v1::RERUN_NOT_REPRODUCED);
      trig.set_rerun_observed(WatchedValue(fired.kind, outcome));
      report->rerun_reproduced = reproduced;
      if (!r.error.empty()) c.mutable_log()->set_error(r.error);
      for (const LayerRecord& rec : r.layers) {
        v1::LayerStats& ls = *num.add_layers();
        ls.set_index(rec.index);
        ls.set_name(rec.name);
        ls.set_phase(v1::FORWARD);
        if (rec.output.defined()) FillTensorMeta(rec.output, ls.mutable_meta());
        FillStats(rec.forward, ls.mutable_stats());
        ls.set_anomalous(!rec.forward.finite());
      }
      for (auto it = r.layers.rbegin(); it != r.layers.rend(); ++it) {
        if (!it->has_backward) continue;
        v1::LayerStats& ls = *num.add_layers();
        ls.set_index(it->index);
        ls.set_name(it->name);
        ls.set_phase(v1::BACKWARD);
        FillTensorMeta(it->grad, ls.mutable_meta());
        FillStats(it->backward, ls.mutable_stats());
        ls.set_anomalous(!it->backward.finite());
      }
      anomalous = r.first_anomalous;
      if (anomalous >= 0) {
        const LayerRecord& rec = r.layers[anomalous];
        num.set_first_anomalous_layer(rec.name);
        num.set_first_anomalous_index(anomalous);
        num.set_first_anomalous_phase(r.anomaly_phase == AnomalyPhase::kBackward ? v1::BACKWARD
                                                                                 : v1::FORWARD);
        num.set_anomaly_reason(r.anomaly_reason);
        report->first_anomalous_layer = rec.name;
        // The anomalous layer's inputs and output, so the layer replays alone.
        for (size_t k = 0; k < rec.inputs.size(); ++k) {
          if (!rec.inputs[k].defined()) continue;
          CAPSULE_RETURN_IF_ERROR(embed(rec.name + "/input." + std::to_string(k), rec.inputs[k],
                                        v1::LAYER_INPUT, rec.name));
        }
        if (rec.output.defined()) {
          CAPSULE_RETURN_IF_ERROR(
              embed(rec.name + "/output", rec.output,
                    path_ == PathKind::kOptimized ? v1::OPTIMIZED_OUTPUT : v1::REFERENCE_OUTPUT,
                    rec.name));
        }
      }
    }

    if (policy != WeightPolicy::kNone) {
      const std::string anomalous_name = anomalous >= 0 ? seq.name(anomalous) : "";
      for (const NamedTensor& p : params) {
        const std::string& layer = owner.count(p.first) ? owner[p.first] : std::string();
        if (policy == WeightPolicy::kAnomalousLayer && layer != anomalous_name) continue;
        CAPSULE_RETURN_IF_ERROR(embed(p.first, p.second, v1::PARAMETER, layer));
      }
    }
  }

  v1::LogRecord& log = *c.mutable_log();
  for (const std::string& line : log_) log.add_lines(line);
  if (fired.kind == TriggerKind::kException && log.error().empty()) log.set_error(message);

  CAPSULE_RETURN_IF_ERROR(MakeDirs(options_.capsule_dir));
  const std::string path =
      options_.capsule_dir + "/" +
      CapsuleFileName(options_.run_name, snap.step, options_.rank, TriggerFileName(fired.kind));
  WriteOptions wopts;
  wopts.signing_key = key ? &*key : nullptr;
  if (c.model().weight_policy() == v1::WEIGHTS_ALL) wopts.optional_flags |= kOptionalFlagHasWeights;
  CAPSULE_RETURN_IF_ERROR(WriteCapsuleFile(path, c, wopts));
  report->capsule_path = path;
  return Status::Ok();
}

}  // namespace capsule
