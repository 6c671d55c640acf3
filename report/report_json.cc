// RenderJson: the report's facts as one JSON object, members in a fixed order.

#include <sstream>

#include "capsule/report/internal/text.h"
#include "capsule/report/report.h"

namespace capsule {
namespace {

using internal::JsonNumber;
using internal::JsonString;

// Tracks whether a separator is due, so members can be emitted in a straight line of code.
class JsonWriter {
 public:
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  JsonWriter& Key(const std::string& key) {
    Separate();
    out_ += JsonString(key) + ":";
    after_key_ = true;
    return *this;
  }
  void String(const std::string& v) { Raw(JsonString(v)); }
  void Number(double v) { Raw(JsonNumber(v)); }
  void Int(int64_t v) { Raw(std::to_string(v)); }
  void Bool(bool v) { Raw(v ? "true" : "false"); }
  void Null() { Raw("null"); }
  void OptNumber(const std::optional<double>& v) { v ? Number(*v) : Null(); }
  void StringOrNull(const std::string& v) { v.empty() ? Null() : String(v); }
  std::string Take() { return std::move(out_); }

 private:
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty() && !first_.back()) out_ += ',';
    if (!first_.empty()) first_.back() = false;
  }
  void Raw(const std::string& text) {
    Separate();
    out_ += text;
  }
  void Open(char c) {
    Separate();
    out_ += c;
    first_.push_back(true);
  }
  void Close(char c) {
    first_.pop_back();
    out_ += c;
  }

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

void KeyValues(JsonWriter& w, const std::vector<ReportKeyValue>& kvs) {
  w.BeginObject();
  for (const auto& kv : kvs) w.Key(kv.key).String(kv.value);
  w.EndObject();
}

void Layer(JsonWriter& w, const ReportLayerRow& l) {
  w.BeginObject();
  w.Key("index").Int(l.index);
  w.Key("name").String(l.name);
  w.Key("phase").String(l.phase);
  w.Key("numel").Int(l.numel);
  w.Key("nan").Int(l.nan);
  w.Key("pos_inf").Int(l.pos_inf);
  w.Key("neg_inf").Int(l.neg_inf);
  w.Key("absmax").Number(l.absmax);
  w.Key("rms").Number(l.rms);
  w.Key("anomalous").Bool(l.anomalous);
  w.Key("first_anomaly").Bool(l.first_anomaly);
  w.EndObject();
}

void Replay(JsonWriter& w, const ReportReplay& r) {
  w.BeginObject();
  w.Key("diagnosis").String(r.diagnosis);
  w.Key("diagnosis_text").String(r.diagnosis_text);
  w.Key("fidelity").String(r.fidelity);
  w.Key("fidelity_detail").String(r.fidelity_detail);
  w.Key("captured_value").Number(r.captured_value);
  w.Key("replayed_value").Number(r.replayed_value);
  w.Key("first_divergent_layer").StringOrNull(r.first_divergent_layer);
  w.Key("first_divergent_phase").StringOrNull(r.first_divergent_phase);
  w.Key("optimized_loss").Number(r.optimized_loss);
  w.Key("reference_loss").Number(r.reference_loss);
  w.Key("reference_anomalous").Bool(r.reference_anomalous);
  w.Key("layers").BeginArray();
  for (const auto& l : r.layers) {
    w.BeginObject();
    w.Key("index").Int(l.index);
    w.Key("name").String(l.name);
    w.Key("phase").String(l.phase);
    w.Key("tensor").String(l.tensor);
    w.Key("max_abs_err").Number(l.max_abs_err);
    w.Key("max_rel_err").Number(l.max_rel_err);
    w.Key("nonfinite_mismatch").Int(l.nonfinite_mismatch);
    w.Key("rtol").Number(l.rtol);
    w.Key("verdict").String(l.verdict);
    w.Key("first_divergent").Bool(l.first_divergent);
    w.EndObject();
  }
  w.EndArray();
  w.Key("bisect");
  if (r.bisect_strategy.empty()) {
    w.Null();
  } else {
    w.BeginObject();
    w.Key("strategy").String(r.bisect_strategy);
    w.Key("first_bad_layer").StringOrNull(r.bisect_first_bad_layer);
    w.Key("probes").Int(r.bisect_probes);
    w.Key("probe_bound").Int(r.bisect_probe_bound);
    w.Key("layers").Int(r.bisect_layers);
    w.EndObject();
  }
  w.Key("warnings").BeginArray();
  for (const auto& s : r.warnings) w.String(s);
  w.EndArray();
  w.EndObject();
}

}  // namespace

std::string RenderJson(const ReportModel& m) {
  JsonWriter w;
  w.BeginObject();
  w.Key("warning").StringOrNull(m.trust_warning);
  w.Key("file").String(m.file_name);
  w.Key("file_sha256").StringOrNull(m.file_sha256);
  w.Key("signature").String(m.signature);
  w.Key("signer_key_id").StringOrNull(m.signer_key_id);
  w.Key("redacted").BeginArray();
  for (const auto& r : m.redacted) w.String(r);
  w.EndArray();
  w.Key("summary").String(m.summary);
  w.Key("run_name").String(m.run_name);
  w.Key("writer_version").String(m.writer_version);
  w.Key("created").String(m.created);

  w.Key("trigger").BeginObject();
  w.Key("kind").String(m.trigger_kind);
  w.Key("observed").Number(m.trigger_observed);
  w.Key("threshold").Number(m.trigger_threshold);
  w.Key("rule").String(m.trigger_rule);
  w.Key("message").String(m.trigger_message);
  w.Key("capture_rerun").StringOrNull(m.capture_rerun);
  w.EndObject();

  w.Key("step").BeginObject();
  w.Key("global_step").Int(m.step);
  w.Key("micro_batch").Int(m.micro_batch);
  w.Key("epoch").Int(m.epoch);
  w.Key("tokens_seen").Int(m.tokens_seen);
  w.EndObject();

  w.Key("history").BeginArray();
  for (const auto& h : m.history) {
    w.BeginObject();
    w.Key("step").Int(h.step);
    w.Key("loss").OptNumber(h.loss);
    w.Key("grad_norm").OptNumber(h.grad_norm);
    w.Key("trigger").Bool(h.trigger);
    w.EndObject();
  }
  w.EndArray();

  w.Key("model").BeginObject();
  w.Key("registry_name").StringOrNull(m.model_registry_name);
  w.Key("path").StringOrNull(m.model_path);
  w.EndObject();

  w.Key("identity").BeginObject();
  w.Key("model_sha256").StringOrNull(m.model_sha256);
  w.Key("model_parameter_count").Int(m.model_parameter_count);
  w.Key("config_sha256").StringOrNull(m.config_sha256);
  w.Key("config_text").String(m.config_text);
  w.Key("code_revision").StringOrNull(m.code_revision);
  w.Key("files").BeginArray();
  for (const auto& f : m.files) {
    w.BeginObject();
    w.Key("role").String(f.role);
    w.Key("name").String(f.name);
    w.Key("path").String(f.path);
    w.Key("size_bytes").Int(f.size_bytes);
    w.Key("sha256").String(f.sha256);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();

  w.Key("environment");
  KeyValues(w, m.environment);
  w.Key("placement");
  KeyValues(w, m.placement);

  w.Key("anomaly").BeginObject();
  w.Key("layer").StringOrNull(m.first_anomalous_layer);
  w.Key("phase").StringOrNull(m.first_anomalous_phase);
  w.Key("reason").StringOrNull(m.anomaly_reason);
  w.EndObject();
  w.Key("layers").BeginArray();
  for (const auto& l : m.layers) Layer(w, l);
  w.EndArray();

  w.Key("data").BeginArray();
  for (const auto& s : m.sequences) {
    w.BeginObject();
    w.Key("sample_id").String(s.sample_id);
    w.Key("token_count").Int(s.token_count);
    w.Key("token_ids").BeginArray();
    for (const int64_t id : s.token_ids) w.Int(id);
    w.EndArray();
    w.Key("raw_text").String(s.raw_text);
    w.EndObject();
  }
  w.EndArray();

  w.Key("log").BeginObject();
  w.Key("lines").BeginArray();
  for (const auto& l : m.log_lines) w.String(l);
  w.EndArray();
  w.Key("error").String(m.log_error);
  w.EndObject();

  w.Key("replay");
  if (m.replay) {
    Replay(w, *m.replay);
  } else {
    w.Null();
  }

  w.Key("commands").BeginObject();
  w.Key("verify").String(m.verify_command);
  w.Key("replay").String(m.replay_command);
  w.EndObject();
  w.EndObject();
  return w.Take() + "\n";
}

}  // namespace capsule
