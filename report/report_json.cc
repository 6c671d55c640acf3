// RenderJson: the report's facts as a capsule.v1.CapsuleReport (proto/report.proto), printed with
// protobuf's JSON mapping.

#include "capsule/format/json.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/proto/report.pb.h"
#include "capsule/report/report.h"

namespace capsule {
namespace {

using Json = v1::CapsuleReport;

// Sets an `optional` string field unless `value` is empty: absent is how the JSON says "none".
template <typename Setter>
void SetIfPresent(const std::string& value, Setter set) {
  if (!value.empty()) set(value);
}

void FillKeyValues(const std::vector<ReportKeyValue>& kvs,
                   google::protobuf::RepeatedPtrField<Json::KeyValue>* out) {
  for (const auto& kv : kvs) {
    Json::KeyValue& o = *out->Add();
    o.set_key(kv.key);
    o.set_value(kv.value);
  }
}

void FillLayer(const ReportLayerRow& l, Json::Layer* o) {
  o->set_index(l.index);
  o->set_name(l.name);
  o->set_phase(l.phase);
  o->set_numel(l.numel);
  o->set_nan(l.nan);
  o->set_pos_inf(l.pos_inf);
  o->set_neg_inf(l.neg_inf);
  o->set_absmax(l.absmax);
  o->set_rms(l.rms);
  o->set_anomalous(l.anomalous);
  o->set_first_anomaly(l.first_anomaly);
}

void FillReplay(const ReportReplay& r, Json::Replay* o) {
  o->set_diagnosis(r.diagnosis);
  o->set_diagnosis_text(r.diagnosis_text);
  o->set_fidelity(r.fidelity);
  o->set_fidelity_detail(r.fidelity_detail);
  o->set_captured_value(r.captured_value);
  o->set_replayed_value(r.replayed_value);
  if (r.parity) *o->mutable_parity() = *r.parity;
  SetIfPresent(r.first_divergent_layer, [o](const auto& v) { o->set_first_divergent_layer(v); });
  SetIfPresent(r.first_divergent_phase, [o](const auto& v) { o->set_first_divergent_phase(v); });
  o->set_optimized_loss(r.optimized_loss);
  o->set_reference_loss(r.reference_loss);
  o->set_reference_anomalous(r.reference_anomalous);
  for (const auto& l : r.layers) {
    Json::DivergenceRow& row = *o->add_layers();
    row.set_index(l.index);
    row.set_name(l.name);
    row.set_phase(l.phase);
    row.set_tensor(l.tensor);
    row.set_max_abs_err(l.max_abs_err);
    row.set_max_rel_err(l.max_rel_err);
    row.set_nonfinite_mismatch(l.nonfinite_mismatch);
    row.set_rtol(l.rtol);
    if (l.atol_applied) row.set_atol_applied(*l.atol_applied);
    if (l.worst_ratio) row.set_worst_ratio(*l.worst_ratio);
    row.set_verdict(l.verdict);
    row.set_first_divergent(l.first_divergent);
  }
  if (!r.bisect_strategy.empty()) {
    Json::Bisect& b = *o->mutable_bisect();
    b.set_strategy(r.bisect_strategy);
    SetIfPresent(r.bisect_first_bad_layer, [&b](const auto& v) { b.set_first_bad_layer(v); });
    b.set_probes(r.bisect_probes);
    b.set_probe_bound(r.bisect_probe_bound);
    b.set_layers(r.bisect_layers);
  }
  for (const auto& w : r.warnings) o->add_warnings(w);
  for (const auto& s : r.stages) {
    Json::Stage& stage = *o->add_stages();
    stage.set_stage(s.name);
    stage.set_ran(s.ran);
    stage.set_skipped_reason(s.skipped_reason);
    stage.set_explains(s.explains);
    stage.set_verdict(s.verdict);
    for (const v1::Finding& f : s.findings) *stage.add_findings() = f;
  }
}

}  // namespace

std::string RenderJson(const ReportModel& m) {
  Json j;
  SetIfPresent(m.trust_warning, [&j](const auto& v) { j.set_warning(v); });
  j.set_file(m.file_name);
  SetIfPresent(m.file_sha256, [&j](const auto& v) { j.set_file_sha256(v); });
  j.set_signature(m.signature);
  SetIfPresent(m.signer_key_id, [&j](const auto& v) { j.set_signer_key_id(v); });
  for (const auto& r : m.redacted) j.add_redacted(r);
  for (const auto& d : m.derivations) j.add_derivations(d);
  if (m.trust != nullptr) *j.mutable_trust() = *m.trust;
  for (const auto& note : m.left_out) j.add_left_out(note);
  FillKeyValues(m.private_data, j.mutable_private_data());
  j.set_summary(m.summary);
  j.set_run_name(m.run_name);
  j.set_writer_version(m.writer_version);
  j.set_created(m.created);

  Json::Trigger& t = *j.mutable_trigger();
  t.set_kind(m.trigger_kind);
  t.set_observed(m.trigger_observed);
  t.set_threshold(m.trigger_threshold);
  t.set_rule(m.trigger_rule);
  t.set_message(m.trigger_message);
  SetIfPresent(m.capture_rerun, [&t](const auto& v) { t.set_capture_rerun(v); });

  Json::Step& step = *j.mutable_step();
  step.set_global_step(m.step);
  step.set_micro_batch(m.micro_batch);
  step.set_epoch(m.epoch);
  step.set_tokens_seen(m.tokens_seen);

  for (const auto& h : m.history) {
    Json::HistoryRow& row = *j.add_history();
    row.set_step(h.step);
    if (h.loss) row.set_loss(*h.loss);
    if (h.grad_norm) row.set_grad_norm(*h.grad_norm);
    row.set_trigger(h.trigger);
  }

  Json::Model& model = *j.mutable_model();
  SetIfPresent(m.model_registry_name, [&model](const auto& v) { model.set_registry_name(v); });
  SetIfPresent(m.model_path, [&model](const auto& v) { model.set_path(v); });

  Json::Identity& id = *j.mutable_identity();
  SetIfPresent(m.model_sha256, [&id](const auto& v) { id.set_model_sha256(v); });
  id.set_model_parameter_count(m.model_parameter_count);
  SetIfPresent(m.config_sha256, [&id](const auto& v) { id.set_config_sha256(v); });
  id.set_config_text(m.config_text);
  SetIfPresent(m.code_revision, [&id](const auto& v) { id.set_code_revision(v); });
  for (const auto& f : m.files) {
    Json::File& file = *id.add_files();
    file.set_role(f.role);
    file.set_name(f.name);
    file.set_path(f.path);
    file.set_size_bytes(f.size_bytes);
    file.set_sha256(f.sha256);
  }

  FillKeyValues(m.environment, j.mutable_environment());
  FillKeyValues(m.placement, j.mutable_placement());

  Json::Anomaly& anomaly = *j.mutable_anomaly();
  SetIfPresent(m.first_anomalous_layer, [&anomaly](const auto& v) { anomaly.set_layer(v); });
  SetIfPresent(m.first_anomalous_phase, [&anomaly](const auto& v) { anomaly.set_phase(v); });
  SetIfPresent(m.anomaly_reason, [&anomaly](const auto& v) { anomaly.set_reason(v); });
  for (const auto& l : m.layers) FillLayer(l, j.add_layers());

  for (const auto& s : m.sequences) {
    Json::Sequence& seq = *j.add_data();
    seq.set_sample_id(s.sample_id);
    seq.set_token_count(s.token_count);
    for (const int64_t id_value : s.token_ids) seq.add_token_ids(id_value);
    seq.set_raw_text(s.raw_text);
  }

  Json::Log& log = *j.mutable_log();
  for (const auto& l : m.log_lines) log.add_lines(l);
  log.set_error(m.log_error);

  if (m.replay) FillReplay(*m.replay, j.mutable_replay());

  j.mutable_commands()->set_verify(m.verify_command);
  j.mutable_commands()->set_replay(m.replay_command);
  return MessageToJson(j) + "\n";
}

}  // namespace capsule
