#include "capsule/capture/internal/capsule_builder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "capsule/base/internal/printable.h"
#include "capsule/format/validate.h"
#include "capsule/format/version.h"
#include "capsule/snapshot/checkpoint.h"
#include "capsule/snapshot/hashing.h"
#include "capsule/snapshot/internal/environment.h"
#include "capsule/snapshot/internal/tensor_codec.h"

namespace capsule::internal {
namespace {

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

Status Embed(const std::string& name, const at::Tensor& t, v1::TensorRole role,
             const std::string& layer, v1::Capsule& c) {
  v1::TensorBlob& blob = *c.add_tensors();
  CAPSULE_RETURN_IF_ERROR(TensorToBlob(name, t, &blob));
  blob.set_role(role);
  blob.set_layer(layer);
  return Status::Ok();
}

// A parameter whose bytes stay in the tensor (BuiltCapsule::tensor_data).
Status EmbedHeld(const std::string& name, const at::Tensor& t, const std::string& layer,
                 BuiltCapsule& built) {
  v1::Capsule& c = built.capsule;
  v1::TensorBlob& blob = *c.add_tensors();
  CAPSULE_ASSIGN_OR_RETURN(at::Tensor held, TensorToBlobHeld(name, t, &blob));
  blob.set_role(v1::PARAMETER);
  blob.set_layer(layer);
  built.tensor_data.resize(static_cast<size_t>(c.tensors_size()));
  built.tensor_data.back() = TensorBytes(held);
  built.held.push_back(std::move(held));
  return Status::Ok();
}

void FillTrigger(const CaptureContext& context, v1::Capsule& c) {
  v1::Trigger& trig = *c.mutable_trigger();
  trig.set_kind(static_cast<v1::TriggerKind>(context.fired.kind));
  trig.set_observed(context.fired.observed);
  trig.set_threshold(context.fired.threshold);
  trig.set_rule(context.fired.rule);
  trig.set_wall_time_unix_micros(context.now_unix_micros);
  trig.set_message(context.message);
}

void FillStep(const StepSnapshot& snap, const CaptureContext& context, v1::Capsule& c) {
  v1::StepInfo& step = *c.mutable_step();
  step.set_global_step(snap.step);
  step.set_micro_batch(snap.batch.micro_batch);
  step.set_tokens_seen(snap.batch.tokens_seen);
  step.set_epoch(snap.cursor.epoch);
  for (const auto& [s, scalars] : context.history) FillScalars(s, scalars, step.add_history());
}

// Per-sequence records plus the exact tensors the model consumed.
Status FillData(const StepSnapshot& snap, v1::Capsule& c) {
  const LayerBatch& lb = snap.batch.tensors;
  v1::DataBatch& data = *c.mutable_data();
  data.set_labels_shifted(lb.labels_shifted);
  data.set_eval_mode(!lb.training);
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
      seq.set_response_mask(mask_bytes(lb.response_mask, b));
      seq.set_token_count(ids.size(1));
      if (b < (int64_t)snap.batch.raw_text.size()) {
        // A raw sample is bytes: a byte-level tokenizer's window may cut a character in two.
        // Text that is not UTF-8 is kept exactly, in raw_bytes, rather than losing the capsule.
        const std::string& raw = snap.batch.raw_text[b];
        if (IsUtf8(raw)) {
          seq.set_raw_text(raw);
        } else {
          seq.set_raw_bytes(raw);
          c.add_capture_notes("data.sequences[" + std::to_string(b) +
                              "]: raw sample is not valid UTF-8; stored in raw_bytes");
        }
      }
      if (b < (int64_t)snap.batch.sample_ids.size()) seq.set_sample_id(snap.batch.sample_ids[b]);
    }
  }
  // Micro-batches: which one each sequence was in. Sizes that do not add up to the batch are the
  // trainer's slip; the capsule keeps the batch and says so rather than recording a wrong split.
  const std::vector<int64_t>& sizes = snap.batch.micro_batch_sizes;
  int64_t total = 0;
  bool sizes_ok = true;
  for (int64_t n : sizes) {
    sizes_ok &= n >= 0;
    total += n;
  }
  if (!sizes.empty() && sizes_ok && total == data.sequences_size()) {
    data.set_micro_batches(static_cast<int32_t>(sizes.size()));
    int seq = 0;
    for (size_t m = 0; m < sizes.size(); ++m) {
      for (int64_t k = 0; k < sizes[m]; ++k) {
        data.mutable_sequences(seq++)->set_micro_batch(static_cast<int32_t>(m));
      }
    }
  } else if (!sizes.empty()) {
    c.add_capture_notes("data.micro_batches: micro_batch_sizes add up to " + std::to_string(total) +
                        ", not to the batch's " + std::to_string(data.sequences_size()) +
                        " sequences; not recorded");
  }
  const LossSpec& loss = snap.batch.loss;
  v1::Objective& obj = *c.mutable_objective();
  obj.set_reduction(static_cast<v1::LossReduction>(loss.reduction));
  if (std::isfinite(loss.normalizer) && loss.normalizer >= 0) {
    obj.set_normalizer(loss.normalizer);
  } else {
    c.add_capture_notes("objective.normalizer: " + std::to_string(loss.normalizer) +
                        " is not a count; not recorded");
  }
  obj.set_ranks(std::max(loss.ranks, 0));
  obj.set_ignore_index(loss.ignore_index);
  obj.set_kind(static_cast<v1::ObjectiveKind>(loss.kind));
  if (loss.label_smoothing >= 0 && loss.label_smoothing <= 1) {
    obj.set_label_smoothing(loss.label_smoothing);
  } else {
    c.add_capture_notes("objective.label_smoothing: " + std::to_string(loss.label_smoothing) +
                        " is not in [0, 1]; not recorded");
  }

  const std::pair<const char*, const at::Tensor*> batch_tensors[] = {
      {"input_ids", &lb.input_ids}, {"inputs", &lb.inputs},
      {"labels", &lb.labels},       {"attention_mask", &lb.attention_mask},
      {"loss_mask", &lb.loss_mask}, {"response_mask", &lb.response_mask}};
  for (const auto& [name, t] : batch_tensors) {
    if (!t->defined()) continue;
    CAPSULE_RETURN_IF_ERROR(Embed(name, *t, v1::BATCH_INPUT, "", c));
    data.add_tensor_names(name);
  }
  return Status::Ok();
}

void FillRng(const StepSnapshot& snap, v1::Capsule& c) {
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
}

void FillPlacement(const MonitorOptions& options, v1::Capsule& c) {
  v1::Placement& place = *c.mutable_placement();
  place.set_rank(options.rank);
  place.set_world_size(options.world_size);
  place.set_local_rank(options.local_rank);
  place.set_data_parallel_rank(options.rank);
  place.set_device(options.device);
}

// The re-run's per-layer statistics, whether it fired the trigger again, and the first anomalous
// layer with its inputs and output (so the layer replays alone). Returns that layer's index, or -1.
StatusOr<int> FillRerun(const ProbeResult& r, const CaptureContext& context, v1::Capsule& c) {
  const FiredTrigger& fired = context.fired;
  const RerunOutcome outcome = RerunOutcomeOf(r);
  v1::Trigger& trig = *c.mutable_trigger();
  const bool reproduced = TriggerFiresAgain(fired.kind, fired.observed, fired.threshold, outcome);
  trig.set_capture_rerun(reproduced ? v1::RERUN_REPRODUCED : v1::RERUN_NOT_REPRODUCED);
  trig.set_rerun_observed(WatchedValue(fired.kind, outcome));
  if (!r.error.empty()) c.mutable_log()->set_error(r.error);

  v1::Numerics& num = *c.mutable_numerics();
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
  // What the sequence saw inside its layers (module hooks), after the layers, numbered on from
  // them. The first non-finite forward output among them is a finer first anomaly than its layer.
  const int base = static_cast<int>(r.layers.size());
  int first_observed = -1;
  for (size_t k = 0; k < r.observed.size(); ++k) {
    const ObservedRecord& o = r.observed[k];
    v1::LayerStats& ls = *num.add_layers();
    ls.set_index(base + static_cast<int>(k));
    ls.set_name(o.name);
    ls.set_phase(o.backward ? v1::BACKWARD : v1::FORWARD);
    if (o.value.defined()) FillTensorMeta(o.value, ls.mutable_meta());
    FillStats(o.stats, ls.mutable_stats());
    ls.set_anomalous(!o.stats.finite());
    if (!o.backward && !o.stats.finite() && first_observed < 0)
      first_observed = static_cast<int>(k);
  }
  const int anomalous = r.first_anomalous;
  if (anomalous < 0) return anomalous;
  const LayerRecord& rec = r.layers[anomalous];
  num.set_first_anomalous_layer(rec.name);
  num.set_first_anomalous_index(anomalous);
  num.set_first_anomalous_phase(r.anomaly_phase == AnomalyPhase::kBackward ? v1::BACKWARD
                                                                           : v1::FORWARD);
  num.set_anomaly_reason(r.anomaly_reason);
  if (first_observed >= 0) {
    const ObservedRecord& o = r.observed[first_observed];
    num.set_first_anomalous_layer(o.name);
    num.set_first_anomalous_index(base + first_observed);
    num.set_first_anomalous_phase(v1::FORWARD);
    num.set_anomaly_reason(std::to_string(o.stats.nan_count) + " NaN, " +
                           std::to_string(o.stats.pos_inf_count + o.stats.neg_inf_count) +
                           " Inf in the forward output of module " + o.name +
                           " (seen inside layer " + rec.name + ")");
  }
  for (size_t k = 0; k < rec.inputs.size(); ++k) {
    if (!rec.inputs[k].defined()) continue;
    CAPSULE_RETURN_IF_ERROR(Embed(rec.name + "/input." + std::to_string(k), rec.inputs[k],
                                  v1::LAYER_INPUT, rec.name, c));
  }
  if (rec.output.defined()) {
    CAPSULE_RETURN_IF_ERROR(
        Embed(rec.name + "/output", rec.output,
              context.path == PathKind::kOptimized ? v1::OPTIMIZED_OUTPUT : v1::REFERENCE_OUTPUT,
              rec.name, c));
  }
  return anomalous;
}

// The checkpoint's path as the capsule records it: absolute as the trainer gave it, or else
// relative to the capsule's directory, where replay resolves a relative path (so a capsule and
// its checkpoint moved together still find each other).
std::string RecordedCheckpointPath(const std::string& path, const std::string& capsule_dir) {
  namespace fs = std::filesystem;
  if (fs::path(path).is_absolute()) return path;
  std::error_code ec;
  const fs::path file = fs::absolute(path, ec);
  if (ec) return path;
  const fs::path from = fs::weakly_canonical(fs::absolute(capsule_dir, ec), ec);
  if (ec) return file.string();
  const fs::path to = fs::weakly_canonical(file.parent_path(), ec) / file.filename();
  if (ec) return file.string();
  const fs::path relative = to.lexically_relative(from);
  return relative.empty() ? to.string() : relative.string();
}

// A checkpoint's tensors split by what the model calls them: a state dict holds its buffers
// beside its parameters. Anything the model does not call a buffer counts as a parameter, so a
// stray tensor is a difference, never silently dropped.
struct CheckpointParts {
  std::vector<NamedTensor> params;
  std::vector<NamedTensor> buffers;
};

CheckpointParts SplitCheckpoint(const std::vector<NamedTensor>& tensors,
                                const std::vector<NamedTensor>& model_buffers) {
  std::set<std::string> buffer_names;
  for (const NamedTensor& b : model_buffers) buffer_names.insert(b.first);
  CheckpointParts parts;
  for (const NamedTensor& t : tensors) {
    (buffer_names.count(t.first) != 0 ? parts.buffers : parts.params).push_back(t);
  }
  return parts;
}

// The model's buffers that the checkpoint also holds, to compare like with like: a checkpoint of
// parameters alone is still the step's weights.
std::vector<NamedTensor> BuffersNamedIn(const std::vector<NamedTensor>& model_buffers,
                                        const std::vector<NamedTensor>& in_checkpoint) {
  std::set<std::string> names;
  for (const NamedTensor& b : in_checkpoint) names.insert(b.first);
  std::vector<NamedTensor> out;
  for (const NamedTensor& b : model_buffers) {
    if (names.count(b.first) != 0) out.push_back(b);
  }
  return out;
}

// Names the checkpoint instead of embedding it: its file, every tensor's digest (buffers marked),
// and whether its parameters are this step's. A checkpoint that cannot be read loses the
// reference, not the capsule: the reason goes to the capture notes.
void FillWeightsReference(const std::string& path, const std::string& capsule_dir,
                          const std::vector<NamedTensor>& params,
                          const std::vector<NamedTensor>& buffers, v1::ModelSpec& ms,
                          std::vector<std::string>& notes) {
  StatusOr<LoadedCheckpoint> ckpt = LoadCheckpoint(path);
  const CheckpointParts parts =
      ckpt.ok() ? SplitCheckpoint(ckpt->tensors, buffers) : CheckpointParts{};
  const std::vector<NamedTensor> step_buffers = BuffersNamedIn(buffers, parts.buffers);
  StatusOr<std::vector<TensorDigestInfo>> digests =
      ckpt.ok() ? TensorDigests(parts.params)
                : StatusOr<std::vector<TensorDigestInfo>>(ckpt.status());
  StatusOr<std::vector<TensorDigestInfo>> buffer_digests = TensorDigests(parts.buffers);
  StatusOr<std::string> hash =
      ckpt.ok() ? CanonicalModelHash(parts.params) : StatusOr<std::string>(ckpt.status());
  StatusOr<std::vector<TensorDigestInfo>> current = TensorDigests(params);
  StatusOr<std::vector<TensorDigestInfo>> current_buffers = TensorDigests(step_buffers);
  for (const Status* s : {&digests.status(), &buffer_digests.status(), &hash.status(),
                          &current.status(), &current_buffers.status()}) {
    if (!s->ok()) {
      notes.push_back("capsule: the weights checkpoint cannot be named: " + s->ToString());
      return;
    }
  }
  v1::WeightsReference& ref = *ms.mutable_weights_reference();
  ref.set_path(RecordedCheckpointPath(path, capsule_dir));
  ref.set_size_bytes(ckpt->size_bytes);
  ref.set_file_sha256(ckpt->file_sha256);
  ref.set_format(ckpt->format);
  ref.set_tensors_sha256(*hash);
  std::vector<std::pair<TensorDigestInfo, bool>> all;
  for (const TensorDigestInfo& d : *digests) all.emplace_back(d, false);
  for (const TensorDigestInfo& d : *buffer_digests) all.emplace_back(d, true);
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.first.name < b.first.name; });
  for (const auto& [d, is_buffer] : all) {
    v1::TensorDigest& t = *ref.add_tensors();
    t.set_name(d.name);
    t.set_dtype(d.dtype);
    for (int64_t x : d.shape) t.add_shape(x);
    t.set_sha256(d.sha256);
    t.set_buffer(is_buffer);
  }
  const std::string differs = FirstDigestDifference(*digests, *current);
  ref.set_matches_step(differs.empty());
  notes.push_back(differs.empty()
                      ? "capsule: the weights are referenced, not embedded: checkpoint " + path +
                            " holds this step's weights"
                      : "capsule: checkpoint " + path +
                            " does not hold this step's weights (training moved them since): " +
                            differs + "; replay of the whole step needs a checkpoint of this step");
  const std::string buffers_differ = FirstDigestDifference(*buffer_digests, *current_buffers);
  if (!buffers_differ.empty()) {
    notes.push_back("capsule: checkpoint " + path +
                    " holds other buffers than the model has at capture (a training-mode "
                    "forward moves running statistics): " +
                    buffers_differ);
  }
}

// The module a parameter or buffer belongs to: its name without the last component.
std::string ModuleOf(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

// The model's buffers beside its weights, under the same policy (all, or the anomalous layer's),
// each owned by the layer that owns a parameter of its module. Copied, not held: the trainer's
// next forward updates running statistics in place.
Status EmbedBuffers(const Model& model, const std::map<std::string, std::string>& owner,
                    WeightPolicy policy, const std::string& anomalous_name, BuiltCapsule& built) {
  const std::vector<NamedTensor> buffers = model.NamedBuffers();
  if (buffers.empty()) return Status::Ok();
  std::map<std::string, std::string> module_layer;  // module path -> layer
  for (const auto& [param, layer] : owner) module_layer.emplace(ModuleOf(param), layer);
  for (const NamedTensor& b : buffers) {
    const auto it = module_layer.find(ModuleOf(b.first));
    const std::string layer = it != module_layer.end() ? it->second : std::string();
    if (policy == WeightPolicy::kAnomalousLayer && layer != anomalous_name) continue;
    CAPSULE_RETURN_IF_ERROR(Embed(b.first, b.second, v1::BUFFER, layer, built.capsule));
  }
  return Status::Ok();
}

// The model spec, its hash and size, the re-run's sections and the weights the policy asks for.
Status FillModel(const ProbeResult* rerun, const CaptureContext& context,
                 const MonitorOptions& options, BuiltCapsule& built) {
  v1::Capsule& c = built.capsule;
  std::vector<std::string>& notes = built.notes;
  Model& model = *context.model;
  const ModelSpecInfo spec = model.Spec();
  LayerSequence& seq = model.Path(context.path);
  v1::ModelSpec& ms = *c.mutable_model();
  ms.set_registry_name(spec.registry_name);
  for (const std::string& pattern : options.declared_frozen) ms.add_declared_frozen(pattern);
  ms.set_config_json(spec.config_json);
  ms.set_trainer_path(static_cast<v1::ExecutionPath>(context.path));
  for (size_t i = 0; i < seq.size(); ++i) ms.add_layers(seq.name(i));

  const std::vector<NamedTensor> params = model.NamedParameters();
  CAPSULE_ASSIGN_OR_RETURN(std::string model_hash, CanonicalModelHash(params));
  c.mutable_identity()->set_model_sha256(model_hash);
  int64_t count = 0;
  uint64_t weight_bytes = 0;
  for (const NamedTensor& p : params) {
    count += p.second.numel();
    weight_bytes += static_cast<uint64_t>(p.second.numel()) * p.second.element_size();
  }
  c.mutable_identity()->set_model_parameter_count(count);

  WeightPolicy policy = options.weight_policy;
  if (policy == WeightPolicy::kAll && weight_bytes > options.max_weight_bytes) {
    policy = WeightPolicy::kAnomalousLayer;
    notes.push_back("capsule: weights are " + std::to_string(weight_bytes) +
                    " bytes, over the cap of " + std::to_string(options.max_weight_bytes) +
                    "; embedding the anomalous layer's only");
  }
  ms.set_weight_policy(static_cast<v1::WeightPolicy>(policy));
  if (policy != WeightPolicy::kAll && !options.weights_checkpoint.empty()) {
    FillWeightsReference(options.weights_checkpoint, options.capsule_dir, params,
                         model.NamedBuffers(), ms, notes);
  }
  std::map<std::string, std::string> owner;  // parameter name -> layer name
  for (size_t i = 0; i < seq.size(); ++i) {
    for (const NamedTensor& p : seq.LayerParameters(i)) owner[p.first] = seq.name(i);
  }

  int anomalous = -1;
  if (rerun != nullptr) {
    CAPSULE_ASSIGN_OR_RETURN(anomalous, FillRerun(*rerun, context, c));
  }
  if (policy == WeightPolicy::kNone) return Status::Ok();
  const std::string anomalous_name = anomalous >= 0 ? seq.name(anomalous) : "";
  for (const NamedTensor& p : params) {
    const std::string& layer = owner.count(p.first) ? owner[p.first] : std::string();
    if (policy == WeightPolicy::kAnomalousLayer && layer != anomalous_name) continue;
    CAPSULE_RETURN_IF_ERROR(EmbedHeld(p.first, p.second, layer, built));
  }
  return EmbedBuffers(model, owner, policy, anomalous_name, built);
}

// The log ring as the Monitor will hold it once `notes` are appended (at most log_lines lines).
void FillLog(const CaptureContext& context, const MonitorOptions& options,
             const std::vector<std::string>& notes, v1::Capsule& c) {
  std::vector<const std::string*> lines;
  for (const std::string& line : context.log_lines) lines.push_back(&line);
  for (const std::string& line : notes) lines.push_back(&line);
  const size_t keep = static_cast<size_t>(std::max(options.log_lines, 0));
  const size_t first = lines.size() > keep ? lines.size() - keep : 0;
  v1::LogRecord& log = *c.mutable_log();
  for (size_t i = first; i < lines.size(); ++i) log.add_lines(*lines[i]);
  if (context.fired.kind == TriggerKind::kException && log.error().empty()) {
    log.set_error(context.message);
  }
}

void FillGeneration(const GenerationInfo& g, v1::Generation& out) {
  out.set_prompt_length(g.prompt_length);
  out.set_prefill_chunk(g.prefill_chunk);
  v1::Sampling& s = *out.mutable_sampling();
  s.set_temperature(g.sampling.temperature);
  s.set_top_k(g.sampling.top_k);
  s.set_top_p(g.sampling.top_p);
  s.set_seed(g.sampling.seed);
  for (int64_t t : g.sampling.stop_tokens) s.add_stop_tokens(t);
  v1::KvCache& k = *out.mutable_cache();
  k.set_layout(g.cache.layout);
  k.set_dtype(g.cache.dtype);
  k.set_post_rotation_keys(g.cache.post_rotation_keys);
  k.set_quant_scale(g.cache.quant_scale);
  out.set_adapter_merged(g.adapter_merged);
  out.set_adapter_name(g.adapter_name);
  out.set_adapter_rank(g.adapter_rank);
  out.set_adapter_alpha(g.adapter_alpha);
  out.set_adapter_sha256(g.adapter_sha256);
  out.set_tokenizer_sha256(g.tokenizer_sha256);
  out.set_template_sha256(g.template_sha256);
}

}  // namespace

StatusOr<BuiltCapsule> BuildCapsule(const StepSnapshot& snapshot, const ProbeResult* rerun,
                                    const CaptureContext& context, const MonitorOptions& options) {
  BuiltCapsule built;
  v1::Capsule& c = built.capsule;
  c.set_writer_version(CapsuleVersion());
  c.set_created_unix_micros(context.now_unix_micros);
  c.set_run_name(options.run_name);
  for (const auto& [k, v] : options.annotations) (*c.mutable_annotations())[k] = v;

  FillTrigger(context, c);
  FillStep(snapshot, context, c);
  CAPSULE_RETURN_IF_ERROR(FillData(snapshot, c));
  *c.mutable_identity() = context.identity;
  FillRng(snapshot, c);
  FillPlacement(options, c);

  CollectEnvironment(c.mutable_environment());
  c.mutable_environment()->set_intra_op_threads(snapshot.intra_op_threads);
  v1::Numerics& num = *c.mutable_numerics();
  num.set_intra_op_threads(snapshot.intra_op_threads);
  num.set_path(static_cast<v1::ExecutionPath>(context.path));
  num.set_first_anomalous_index(-1);

  if (context.model != nullptr) {
    CAPSULE_RETURN_IF_ERROR(FillModel(rerun, context, options, built));
  }
  for (const RunEvent& e : context.events) {
    v1::RunEvent& out = *c.add_events();
    out.set_step(std::max<int64_t>(e.step, 0));
    out.set_kind(e.kind.empty() ? "event" : e.kind);
    out.set_detail(e.detail);
  }
  if (context.generation) FillGeneration(*context.generation, *c.mutable_generation());
  FillLog(context, options, built.notes, c);
  // Strings from outside (log lines, names, paths, config) that are not UTF-8 would make the
  // capsule invalid, and so lose it: keep them escaped, and say so.
  for (std::string& note : MakeStringsUtf8(&c)) {
    c.add_capture_notes(note);
    built.notes.push_back(std::move(note));
  }
  built.tensor_data.resize(static_cast<size_t>(c.tensors_size()));
  return built;
}

void OwnTensorBytes(BuiltCapsule* built) {
  v1::Capsule& c = built->capsule;
  for (size_t i = 0; i < built->tensor_data.size() && i < static_cast<size_t>(c.tensors_size());
       ++i) {
    const std::string_view bytes = built->tensor_data[i];
    if (!bytes.empty())
      c.mutable_tensors(static_cast<int>(i))->set_data(bytes.data(), bytes.size());
  }
  built->tensor_data.clear();
  built->held.clear();
}

}  // namespace capsule::internal
