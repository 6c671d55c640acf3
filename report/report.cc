#include "capsule/report/report.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <map>
#include <sstream>

#include "capsule/base/sha256.h"
#include "capsule/base/strings.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/report/internal/json.h"
#include "capsule/report/internal/text.h"
#include "capsule/report/replay_text.h"

namespace capsule {
namespace {

using internal::BaseName;

std::string PhaseName(v1::Phase p) {
  switch (p) {
    case v1::FORWARD:
      return "forward";
    case v1::BACKWARD:
      return "backward";
    default:
      return "";
  }
}

std::string PathName(v1::ExecutionPath p) {
  switch (p) {
    case v1::REFERENCE:
      return "reference";
    case v1::OPTIMIZED:
      return "optimized";
    default:
      return "";
  }
}

std::string Join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

// The commands are meant to be pasted into a shell: quote a file name that needs it.
std::string ShellQuote(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-' ||
           ch == '+' || ch == '/';
  });
  if (plain) return s;
  std::string out = "'";
  for (const char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

ReportLayerRow LayerRow(const v1::LayerStats& l) {
  ReportLayerRow r;
  r.index = l.index();
  r.name = l.name();
  r.phase = PhaseName(l.phase());
  r.numel = l.stats().numel();
  r.nan = l.stats().nan_count();
  r.pos_inf = l.stats().pos_inf_count();
  r.neg_inf = l.stats().neg_inf_count();
  r.absmax = l.stats().absmax();
  r.rms = l.stats().rms();
  r.anomalous = l.anomalous();
  return r;
}

void FillEnvironment(const v1::Environment& e, const ReportRedaction& redact,
                     std::vector<ReportKeyValue>* out) {
  auto add = [out](std::string key, std::string value) {
    out->push_back({std::move(key), value.empty() ? "-" : std::move(value)});
  };
  add("capsule version", e.capsule_version());
  add("torch", e.torch_version());
  add("intra-op threads", std::to_string(e.intra_op_threads()));
  add("inter-op threads", std::to_string(e.inter_op_threads()));
  add("deterministic algorithms", e.deterministic_algorithms() ? "yes" : "no");
  add("compiler", e.compiler());
  add("OS", e.os());
  add("kernel", e.kernel());
  add("CPU", e.cpu_model());
  add("CPU flags", Join({e.cpu_flags().begin(), e.cpu_flags().end()}, " "));
  add("BLAS", e.blas());
  add("CUDA devices", Join({e.cuda_devices().begin(), e.cuda_devices().end()}, ", "));
  add("CUDA version", e.cuda_version());
  // protobuf maps iterate in no fixed order; the report must be stable.
  const std::map<std::string, std::string> libs(e.libraries().begin(), e.libraries().end());
  for (const auto& [name, version] : libs) add("library " + name, version);
  if (!redact.host) add("host", e.hostname());
}

ReportReplay ReplayModel(const v1::ReplayReport& r) {
  ReportReplay m;
  m.diagnosis = v1::Diagnosis_Name(r.diagnosis());
  // `capsule replay --json` output carries the sentence it printed; a report shows the same one.
  m.diagnosis_text = r.diagnosis_text().empty() ? DiagnosisSentence(r) : r.diagnosis_text();
  m.fidelity = v1::Fidelity_Name(r.fidelity());
  m.fidelity_detail = r.fidelity_detail();
  m.captured_value = r.captured_value();
  m.replayed_value = r.replayed_value();
  m.first_divergent_layer = r.first_divergent_layer();
  m.first_divergent_phase = PhaseName(r.first_divergent_phase());
  m.optimized_loss = r.optimized_loss();
  m.reference_loss = r.reference_loss();
  m.reference_anomalous = r.reference_anomalous();
  bool marked = false;
  for (const auto& l : r.layers()) {
    ReportDivergenceRow row;
    row.index = l.index();
    row.name = l.name();
    row.phase = PhaseName(l.phase());
    row.tensor = l.tensor();
    row.max_abs_err = l.max_abs_err();
    row.max_rel_err = l.max_rel_err();
    row.nonfinite_mismatch = l.nonfinite_mismatch();
    row.rtol = l.rtol();
    row.verdict = v1::Verdict_Name(l.verdict());
    if (!marked && !r.first_divergent_layer().empty() && l.name() == r.first_divergent_layer() &&
        l.phase() == r.first_divergent_phase()) {
      row.first_divergent = marked = true;
    }
    m.layers.push_back(std::move(row));
  }
  if (r.has_bisect() && !r.bisect().strategy().empty()) {
    m.bisect_strategy = r.bisect().strategy();
    m.bisect_first_bad_layer = r.bisect().first_bad_layer();
    m.bisect_probes = r.bisect().probes();
    m.bisect_probe_bound = r.bisect().probe_bound();
    m.bisect_layers = r.bisect().layers();
  }
  m.warnings.assign(r.warnings().begin(), r.warnings().end());
  return m;
}

}  // namespace

std::string ReplayReportToJson(const v1::ReplayReport& report) {
  return internal::PrintJson(report);
}

StatusOr<std::unique_ptr<v1::ReplayReport>> ParseReplayReportJson(std::string_view json) {
  auto report = std::make_unique<v1::ReplayReport>();
  google::protobuf::util::JsonParseOptions options;
  // A newer replay may add fields; the report shows what it knows.
  options.ignore_unknown_fields = true;
  const auto st = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), report.get(), options);
  if (!st.ok()) {
    return InvalidArgumentError("not a replay report (capsule replay --json output): " +
                                std::string(st.message()));
  }
  return report;
}

ReportModel BuildReportModel(const v1::Capsule& c, const EnvelopeInfo& envelope,
                             const v1::ReplayReport* replay, const ReportOptions& options) {
  const ReportRedaction& redact = options.redact;
  ReportModel m;
  m.signature = SignatureStateName(envelope.signature);
  if (envelope.signature_algorithm != kSigAlgNone) m.signer_key_id = HexEncode(envelope.key_id);
  if (envelope.signature == SignatureState::kUnsigned) {
    m.trust_warning =
        "this capsule is UNSIGNED: nothing shows who wrote it or that it is unaltered; treat its "
        "contents as untrusted";
  } else if (envelope.signature == SignatureState::kNotChecked) {
    m.trust_warning = "this capsule's signature was NOT CHECKED: signer key " + m.signer_key_id +
                      " is not a trusted key (--pubkey); treat its contents as untrusted";
  }
  m.file_name = BaseName(options.file_name);
  m.file_sha256 = options.file_sha256;
  const bool left_out[] = {redact.text, redact.tokens, redact.paths, redact.host};
  for (size_t i = 0; i < std::size(kRedactItemNames); ++i) {
    if (left_out[i]) m.redacted.emplace_back(kRedactItemNames[i]);
  }

  m.run_name = c.run_name();
  m.writer_version = c.writer_version();
  m.created = FormatUnixMicrosUtc(c.created_unix_micros());

  const v1::Trigger& t = c.trigger();
  m.trigger_kind = v1::TriggerKind_Name(t.kind());
  m.trigger_observed = t.observed();
  m.trigger_threshold = t.threshold();
  m.trigger_rule = t.rule();
  m.trigger_message = t.message();
  if (t.capture_rerun() != v1::REPRODUCTION_UNSPECIFIED) {
    m.capture_rerun = v1::Reproduction_Name(t.capture_rerun());
  }
  m.step = c.step().global_step();
  m.micro_batch = c.step().micro_batch();
  m.epoch = c.step().epoch();
  m.tokens_seen = c.step().tokens_seen();
  for (const auto& h : c.step().history()) {
    ReportHistoryRow row;
    row.step = h.step();
    if (h.has_loss()) row.loss = h.loss();
    if (h.has_grad_norm()) row.grad_norm = h.grad_norm();
    row.trigger = h.step() == m.step;
    m.history.push_back(row);
  }
  m.history_table_from =
      std::max(0, static_cast<int>(m.history.size()) - std::max(1, options.max_history_rows));

  m.model_registry_name = c.model().registry_name();
  m.model_path = PathName(c.model().trainer_path());
  const v1::Identity& id = c.identity();
  m.model_sha256 = id.model_sha256();
  m.model_parameter_count = id.model_parameter_count();
  for (const auto& f : id.files()) {
    m.files.push_back({f.role(), f.name(), redact.paths ? BaseName(f.path()) : f.path(),
                       f.size_bytes(), f.sha256()});
  }
  m.config_sha256 = id.config_sha256();
  m.config_text = id.config_text();
  m.code_revision = id.code_revision();

  if (c.has_environment()) FillEnvironment(c.environment(), redact, &m.environment);
  if (c.has_placement()) {
    const v1::Placement& p = c.placement();
    m.placement = {
        {"rank", std::to_string(p.rank())},
        {"world size", std::to_string(p.world_size())},
        {"local rank", std::to_string(p.local_rank())},
        {"data / tensor / pipeline parallel rank",
         std::to_string(p.data_parallel_rank()) + " / " + std::to_string(p.tensor_parallel_rank()) +
             " / " + std::to_string(p.pipeline_parallel_rank())},
        {"device", p.device().empty() ? "-" : p.device()}};
  }

  const v1::Numerics& n = c.numerics();
  m.first_anomalous_layer = n.first_anomalous_layer();
  m.first_anomalous_phase =
      m.first_anomalous_layer.empty() ? "" : PhaseName(n.first_anomalous_phase());
  m.anomaly_reason = n.anomaly_reason();
  int anchor = -1;
  for (const auto& l : n.layers()) {
    ReportLayerRow row = LayerRow(l);
    if (anchor < 0 && !m.first_anomalous_layer.empty() && l.name() == m.first_anomalous_layer &&
        l.phase() == n.first_anomalous_phase()) {
      row.first_anomaly = true;
      anchor = static_cast<int>(m.layers.size());
    }
    m.layers.push_back(std::move(row));
  }
  if (anchor < 0) {
    // No named first anomaly: centre on the first flagged layer, if any.
    for (size_t i = 0; i < m.layers.size() && anchor < 0; ++i) {
      if (m.layers[i].anomalous) anchor = static_cast<int>(i);
    }
  }
  const int count = static_cast<int>(m.layers.size());
  int from = 0;
  int to = std::min(count, options.max_layer_rows);
  if (anchor >= 0) {
    from = std::max(0, anchor - options.layer_context);
    to = std::min(count, anchor + options.layer_context + 1);
  }
  m.layer_window_from = from;
  m.layer_window.assign(m.layers.begin() + from, m.layers.begin() + to);

  for (const auto& s : c.data().sequences()) {
    ReportSequence seq;
    seq.sample_id = s.sample_id();
    seq.token_count = s.token_ids_size() > 0 ? s.token_ids_size() : s.token_count();
    if (!redact.tokens) seq.token_ids.assign(s.token_ids().begin(), s.token_ids().end());
    if (!redact.text) seq.raw_text = s.raw_text();
    m.sequences.push_back(std::move(seq));
  }
  m.log_lines.assign(c.log().lines().begin(), c.log().lines().end());
  m.log_error = c.log().error();

  if (replay != nullptr) m.replay = ReplayModel(*replay);

  std::ostringstream summary;
  summary << m.trigger_kind << " at step " << m.step << " of run \"" << m.run_name
          << "\" (observed " << FormatSignificant(m.trigger_observed, 6);
  if (m.trigger_threshold != 0)
    summary << ", threshold " << FormatSignificant(m.trigger_threshold, 6);
  summary << ")";
  if (!m.first_anomalous_layer.empty()) {
    summary << "; first anomalous layer " << m.first_anomalous_layer;
    if (!m.anomaly_reason.empty()) summary << " (" << m.anomaly_reason << ")";
  }
  if (m.replay) {
    summary << "; diagnosis " << m.replay->diagnosis;
    if (!m.replay->first_divergent_layer.empty()) {
      summary << ", first divergent layer " << m.replay->first_divergent_layer;
    }
  }
  m.summary = summary.str();

  const std::string trust =
      envelope.signature == SignatureState::kUnsigned ? "--allow-unsigned" : "--pubkey SIGNER.pub";
  const std::string file = ShellQuote(m.file_name);
  m.verify_command = "capsule verify " + file + " --pubkey SIGNER.pub";
  m.replay_command = "capsule replay " + file + " --plugin <model plugin> " + trust + " --bisect";
  return m;
}

}  // namespace capsule
