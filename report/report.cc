#include "capsule/report/report.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <map>
#include <sstream>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/base/internal/shell.h"
#include "capsule/base/internal/strings.h"
#include "capsule/format/derivation.h"
#include "capsule/format/json.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/proto/report.pb.h"
#include "capsule/report/internal/text.h"
#include "capsule/report/replay_text.h"
#include "capsule/report/replay_tool.h"

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

// Applies ReportLimits while the model is built: cuts strings and lists, and keeps count of what
// it cut for ReportModel::left_out.
class Limiter {
 public:
  explicit Limiter(const ReportLimits& limits) : limits(limits) {}

  // `s` cut to `max_bytes` (default: text_bytes) at a character boundary, with the cut counted.
  std::string Text(const std::string& s, size_t max_bytes = 0) {
    const size_t max = max_bytes > 0 ? max_bytes : limits.text_bytes;
    const std::string_view head = TruncateUtf8(s, max);
    if (head.size() == s.size()) return s;
    ++strings_cut;
    return std::string(head) + " \u2026 (" +
           FormatCount(static_cast<int64_t>(s.size() - head.size())) + " more bytes)";
  }

  // Notes `count` entries of `what` left out (nothing when count is 0).
  void LeftOut(int64_t count, const std::string& what) {
    if (count > 0) notes.push_back(FormatCount(count) + " more " + what);
  }

  // [from, to) of `count` entries, `max` of them centred on `anchor` (or the first `max` when
  // anchor < 0), with the rest noted as `what`.
  std::pair<int, int> Window(int count, int anchor, int max, const std::string& what) {
    max = std::max(1, max);
    if (count <= max) return {0, count};
    int from = anchor < 0 ? 0 : std::max(0, anchor - max / 2);
    from = std::min(from, count - max);
    LeftOut(count - max, what + " (" + FormatCount(from) + " before and " +
                             FormatCount(count - from - max) + " after the ones shown)");
    return {from, from + max};
  }

  std::vector<std::string> Finish() {
    if (strings_cut > 0) {
      notes.push_back(FormatCount(strings_cut) + (strings_cut == 1 ? " string" : " strings") +
                      " cut short (marked \u2026)");
    }
    return std::move(notes);
  }

  const ReportLimits& limits;

 private:
  std::vector<std::string> notes;
  int64_t strings_cut = 0;
};

ReportLayerRow LayerRow(const v1::LayerStats& l, Limiter& cap) {
  ReportLayerRow r;
  r.index = l.index();
  r.name = cap.Text(l.name());
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

void FillEnvironment(const v1::Environment& e, const ReportRedaction& redact, Limiter& cap,
                     std::vector<ReportKeyValue>* out) {
  auto add = [out, &cap](std::string key, const std::string& value) {
    out->push_back({cap.Text(key), value.empty() ? "-" : cap.Text(value)});
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
  int shown = 0;
  for (const auto& [name, version] : libs) {
    if (shown++ == cap.limits.libraries) break;
    add("library " + name, version);
  }
  cap.LeftOut(static_cast<int64_t>(libs.size()) - cap.limits.libraries, "libraries");
  if (!redact.host) add("host", e.hostname());
}

// The replay's finding with every text it carries cut to the report's limits.
v1::Finding FindingRow(const v1::Finding& f, Limiter& cap) {
  v1::Finding row = f;
  row.set_check(cap.Text(f.check()));
  row.set_detail(cap.Text(f.detail(), 2 * cap.limits.text_bytes));
  row.set_sample_id(cap.Text(f.sample_id()));
  row.set_parameter(cap.Text(f.parameter()));
  for (v1::Fact& fact : *row.mutable_facts()) {
    fact.set_name(cap.Text(fact.name()));
    fact.set_text(cap.Text(fact.text()));
    for (std::string& item : *fact.mutable_items()) item = cap.Text(item);
  }
  return row;
}

ReportStage StageRow(const v1::StageReport& s, Limiter& cap) {
  ReportStage row;
  row.name = StageName(s.stage());
  row.ran = s.ran();
  row.skipped_reason = cap.Text(s.skipped_reason());
  row.explains = s.explains();
  row.verdict = StageVerdict(s);
  // Failed findings before the notes, so that the cap below never keeps a note and cuts what
  // explains the failure. Indices first: only the kept findings are copied and cut to size.
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < s.findings_size(); ++i) {
      if (s.findings(i).failed() == (pass == 0)) order.push_back(i);
    }
  }
  const int kept = std::min(static_cast<int>(order.size()), std::max(0, cap.limits.findings));
  for (int i = 0; i < kept; ++i) row.findings.push_back(FindingRow(s.findings(order[i]), cap));
  cap.LeftOut(static_cast<int64_t>(order.size()) - kept,
              "findings of the " + row.name + " triage stage");
  return row;
}

ReportReplay ReplayModel(const v1::ReplayReport& r, Limiter& cap) {
  ReportReplay m;
  m.diagnosis = v1::Diagnosis_Name(r.diagnosis());
  // `capsule replay --json` output carries the sentence it printed; a report shows the same one.
  m.diagnosis_text =
      cap.Text(r.diagnosis_text().empty() ? DiagnosisSentence(r) : r.diagnosis_text(), 1024);
  m.fidelity = v1::Fidelity_Name(r.fidelity());
  m.fidelity_detail = cap.Text(r.fidelity_detail(), 1024);
  m.captured_value = r.captured_value();
  m.replayed_value = r.replayed_value();
  m.first_divergent_layer = cap.Text(r.first_divergent_layer());
  m.first_divergent_phase = PhaseName(r.first_divergent_phase());
  m.optimized_loss = r.optimized_loss();
  m.reference_loss = r.reference_loss();
  m.reference_anomalous = r.reference_anomalous();
  for (int i = 0; i < r.stages_size() && i < cap.limits.stages; ++i) {
    m.stages.push_back(StageRow(r.stages(i), cap));
  }
  cap.LeftOut(r.stages_size() - cap.limits.stages, "triage stages");
  int anchor = -1;
  for (int i = 0; i < r.layers_size() && anchor < 0; ++i) {
    if (!r.first_divergent_layer().empty() && r.layers(i).name() == r.first_divergent_layer() &&
        r.layers(i).phase() == r.first_divergent_phase()) {
      anchor = i;
    }
  }
  const auto [from, to] =
      cap.Window(r.layers_size(), anchor, cap.limits.divergence_rows, "replay comparison rows");
  for (int i = from; i < to; ++i) {
    const v1::LayerComparison& l = r.layers(i);
    ReportDivergenceRow row;
    row.index = l.index();
    row.name = cap.Text(l.name());
    row.phase = PhaseName(l.phase());
    row.tensor = cap.Text(l.tensor());
    row.max_abs_err = l.max_abs_err();
    row.max_rel_err = l.max_rel_err();
    row.nonfinite_mismatch = l.nonfinite_mismatch();
    row.rtol = l.rtol();
    if (l.has_atol_applied()) row.atol_applied = l.atol_applied();
    if (l.has_worst_ratio()) row.worst_ratio = l.worst_ratio();
    row.verdict = v1::Verdict_Name(l.verdict());
    row.first_divergent = i == anchor;
    m.layers.push_back(std::move(row));
  }
  if (r.has_bisect() && !r.bisect().strategy().empty()) {
    m.bisect_strategy = cap.Text(r.bisect().strategy());
    m.bisect_first_bad_layer = cap.Text(r.bisect().first_bad_layer());
    m.bisect_probes = r.bisect().probes();
    m.bisect_probe_bound = r.bisect().probe_bound();
    m.bisect_layers = r.bisect().layers();
  }
  for (int i = 0; i < r.warnings_size() && i < cap.limits.warnings; ++i) {
    m.warnings.push_back(cap.Text(r.warnings(i), 1024));
  }
  cap.LeftOut(r.warnings_size() - cap.limits.warnings, "replay warnings");
  if (r.has_parity()) m.parity = std::make_shared<const v1::ParityReport>(r.parity());
  return m;
}

// The signature state and the trust warning, derivations, the file and what redaction left out.
void FillTrust(const v1::Capsule& c, const EnvelopeInfo& envelope, const ReportOptions& options,
               Limiter& cap, ReportModel* m) {
  const ReportRedaction& redact = options.redact;
  m->signature = SignatureStateName(envelope.signature);
  if (envelope.signature_algorithm != kSigAlgNone) m->signer_key_id = HexEncode(envelope.key_id);
  if (envelope.signature == SignatureState::kUnsigned) {
    m->trust_warning =
        "this capsule is UNSIGNED: nothing shows who wrote it or that it is unaltered; treat its "
        "contents as untrusted";
  } else if (envelope.signature == SignatureState::kValidUnknownSigner) {
    m->trust_warning = "this capsule's signature is valid, but signer key " + m->signer_key_id +
                       " is not a trusted key (" + flags::kPubkey +
                       "): it is unaltered since that key signed "
                       "it, not proof of who holds the key; treat its contents as untrusted";
  } else if (envelope.signature == SignatureState::kNotChecked) {
    m->trust_warning = "this capsule's signature was NOT CHECKED: signer key " + m->signer_key_id +
                       " is not a trusted key (" + flags::kPubkey +
                       "); treat its contents as untrusted";
  }
  // Whoever signed it, what it was made from is only as trusted as its maker found it.
  for (const v1::Derivation& d : c.derivations()) m->derivations.push_back(DescribeDerivation(d));
  if (const v1::Derivation* d = UntrustedSource(c)) {
    m->trust_warning += std::string(m->trust_warning.empty() ? "" : "; and ") +
                        "this capsule was " + DescribeDerivation(*d) +
                        ": its contents come from a capsule no trusted key vouches for";
  }
  if (options.trust != nullptr) m->trust = std::make_shared<const v1::InputTrust>(*options.trust);
  m->file_name = cap.Text(BaseName(options.file_name));
  m->file_sha256 = options.file_sha256;
  const bool left_out[] = {redact.text, redact.tokens, redact.paths, redact.host};
  for (size_t i = 0; i < std::size(kRedactItemNames); ++i) {
    if (left_out[i]) m->redacted.emplace_back(kRedactItemNames[i]);
  }
}

// The run, the trigger, the step and the last steps of its history.
void FillTriggerAndHistory(const v1::Capsule& c, const ReportOptions& options, Limiter& cap,
                           ReportModel* m) {
  m->run_name = cap.Text(c.run_name());
  m->writer_version = cap.Text(c.writer_version());
  m->created = FormatUnixMicrosUtc(c.created_unix_micros());

  const v1::Trigger& t = c.trigger();
  m->trigger_kind = v1::TriggerKind_Name(t.kind());
  m->trigger_observed = t.observed();
  m->trigger_threshold = t.threshold();
  m->trigger_rule = cap.Text(t.rule());
  m->trigger_message = cap.Text(t.message(), 1024);
  if (t.capture_rerun() != v1::REPRODUCTION_UNSPECIFIED) {
    m->capture_rerun = v1::Reproduction_Name(t.capture_rerun());
  }
  m->step = c.step().global_step();
  m->micro_batch = c.step().micro_batch();
  m->epoch = c.step().epoch();
  m->tokens_seen = c.step().tokens_seen();
  const int history_count = c.step().history_size();
  const int history_from = std::max(0, history_count - std::max(1, options.limits.history_points));
  cap.LeftOut(history_from, "older steps of the history");
  for (int i = history_from; i < history_count; ++i) {
    const v1::StepScalars& h = c.step().history(i);
    ReportHistoryRow row;
    row.step = h.step();
    if (h.has_loss()) row.loss = h.loss();
    if (h.has_grad_norm()) row.grad_norm = h.grad_norm();
    row.trigger = h.step() == m->step;
    m->history.push_back(row);
  }
  m->history_table_from =
      std::max(0, static_cast<int>(m->history.size()) - std::max(1, options.max_history_rows));
}

// The model, its files and config, the environment and the placement.
void FillIdentity(const v1::Capsule& c, const ReportOptions& options, Limiter& cap,
                  ReportModel* m) {
  const ReportRedaction& redact = options.redact;
  m->model_registry_name = cap.Text(c.model().registry_name());
  m->model_path = PathName(c.model().trainer_path());
  const v1::Identity& id = c.identity();
  m->model_sha256 = cap.Text(id.model_sha256());
  m->model_parameter_count = id.model_parameter_count();
  for (int i = 0; i < id.files_size() && i < options.limits.files; ++i) {
    const v1::FileIdentity& f = id.files(i);
    m->files.push_back({cap.Text(f.role()), cap.Text(f.name()),
                        cap.Text(redact.paths ? BaseName(f.path()) : f.path()), f.size_bytes(),
                        cap.Text(f.sha256())});
  }
  cap.LeftOut(id.files_size() - options.limits.files, "identity files");
  m->config_sha256 = cap.Text(id.config_sha256());
  m->config_text = cap.Text(id.config_text(), options.limits.config_text_bytes);
  m->code_revision = cap.Text(id.code_revision());

  if (c.has_environment()) FillEnvironment(c.environment(), redact, cap, &m->environment);
  if (c.has_placement()) {
    const v1::Placement& p = c.placement();
    m->placement = {
        {"rank", std::to_string(p.rank())},
        {"world size", std::to_string(p.world_size())},
        {"local rank", std::to_string(p.local_rank())},
        {"data / tensor / pipeline parallel rank",
         std::to_string(p.data_parallel_rank()) + " / " + std::to_string(p.tensor_parallel_rank()) +
             " / " + std::to_string(p.pipeline_parallel_rank())},
        {"device", p.device().empty() ? "-" : cap.Text(p.device())}};
  }
}

// The first anomaly and the rows of layer statistics around it.
void FillLayers(const v1::Capsule& c, const ReportOptions& options, Limiter& cap, ReportModel* m) {
  const v1::Numerics& n = c.numerics();
  m->first_anomalous_layer = cap.Text(n.first_anomalous_layer());
  m->first_anomalous_phase =
      m->first_anomalous_layer.empty() ? "" : PhaseName(n.first_anomalous_phase());
  m->anomaly_reason = cap.Text(n.anomaly_reason());
  // The capsule's first anomaly, or else its first flagged layer: what the rows centre on.
  int stats_anchor = -1;
  for (int i = 0; i < n.layers_size() && stats_anchor < 0; ++i) {
    const v1::LayerStats& l = n.layers(i);
    if (!n.first_anomalous_layer().empty() && l.name() == n.first_anomalous_layer() &&
        l.phase() == n.first_anomalous_phase()) {
      stats_anchor = i;
    }
  }
  const bool named_anomaly = stats_anchor >= 0;
  for (int i = 0; i < n.layers_size() && stats_anchor < 0; ++i) {
    if (n.layers(i).anomalous()) stats_anchor = i;
  }
  const auto [stats_from, stats_to] =
      cap.Window(n.layers_size(), stats_anchor, options.limits.layers, "layer stats");
  int anchor = -1;
  for (int i = stats_from; i < stats_to; ++i) {
    ReportLayerRow row = LayerRow(n.layers(i), cap);
    if (i == stats_anchor) {
      row.first_anomaly = named_anomaly;
      anchor = static_cast<int>(m->layers.size());
    }
    m->layers.push_back(std::move(row));
  }
  const int count = static_cast<int>(m->layers.size());
  int from = 0;
  int to = std::min(count, options.max_layer_rows);
  if (anchor >= 0) {
    from = std::max(0, anchor - options.layer_context);
    to = std::min(count, anchor + options.layer_context + 1);
  }
  m->layer_window_from = from;
  m->layer_window.assign(m->layers.begin() + from, m->layers.begin() + to);
}

// The batch's sequences (tokens and text unless redacted) and the tail of the log.
void FillDataAndLog(const v1::Capsule& c, const ReportOptions& options, Limiter& cap,
                    ReportModel* m) {
  const ReportRedaction& redact = options.redact;
  const v1::DataBatch& data = c.data();
  for (int i = 0; i < data.sequences_size() && i < options.limits.sequences; ++i) {
    const v1::Sequence& s = data.sequences(i);
    ReportSequence seq;
    seq.sample_id = cap.Text(s.sample_id());
    seq.token_count = s.token_ids_size() > 0 ? s.token_ids_size() : s.token_count();
    if (!redact.tokens) {
      const int shown = std::min(s.token_ids_size(), options.limits.tokens_per_sequence);
      seq.token_ids.assign(s.token_ids().begin(), s.token_ids().begin() + shown);
      cap.LeftOut(s.token_ids_size() - shown, "token ids of sequence " + std::to_string(i));
    }
    if (!redact.text) {
      // Raw bytes that are not UTF-8 are shown with those bytes escaped ("caf\xc3").
      seq.raw_text = s.raw_text().empty()
                         ? EscapeInvalidUtf8(cap.Text(s.raw_bytes(), options.limits.raw_text_bytes))
                         : cap.Text(s.raw_text(), options.limits.raw_text_bytes);
    }
    m->sequences.push_back(std::move(seq));
  }
  cap.LeftOut(data.sequences_size() - options.limits.sequences, "sequences of the batch");
  const int log_count = c.log().lines_size();
  const int log_from = std::max(0, log_count - options.limits.log_lines);
  cap.LeftOut(log_from, "older log lines");
  for (int i = log_from; i < log_count; ++i) {
    m->log_lines.push_back(cap.Text(c.log().lines(i), options.limits.log_line_bytes));
  }
  m->log_error = cap.Text(c.log().error(), 1024);
}

// What the report shows that may be private, for the redaction advice.
void ListPrivateData(const v1::Capsule& c, const ReportRedaction& redact, ReportModel* m) {
  int with_text = 0;
  int with_tokens = 0;
  for (const ReportSequence& s : m->sequences) {
    with_text += !s.raw_text.empty();
    with_tokens += !s.token_ids.empty();
  }
  auto sequences = [](int n) { return std::to_string(n) + (n == 1 ? " sequence" : " sequences"); };
  if (with_text > 0)
    m->private_data.push_back({"text", "raw sample text of " + sequences(with_text)});
  if (with_tokens > 0) {
    m->private_data.push_back({"tokens", "token ids of " + sequences(with_tokens)});
  }
  const bool has_dirs = std::any_of(m->files.begin(), m->files.end(), [](const ReportFile& f) {
    return f.path.find('/') != std::string::npos;
  });
  if (has_dirs) m->private_data.push_back({"paths", "file paths with their directories"});
  if (!redact.host && !c.environment().hostname().empty()) {
    m->private_data.push_back({"host", "the host name"});
  }
}

// One sentence: the trigger, the first anomalous layer and the diagnosis.
void Summarize(ReportModel* m) {
  std::ostringstream summary;
  summary << m->trigger_kind << " at step " << m->step << " of run \"" << m->run_name
          << "\" (observed " << FormatSignificant(m->trigger_observed, 6);
  if (m->trigger_threshold != 0)
    summary << ", threshold " << FormatSignificant(m->trigger_threshold, 6);
  summary << ")";
  if (!m->first_anomalous_layer.empty()) {
    summary << "; first anomalous layer " << m->first_anomalous_layer;
    if (!m->anomaly_reason.empty()) summary << " (" << m->anomaly_reason << ")";
  }
  if (m->replay) {
    summary << "; diagnosis " << m->replay->diagnosis;
    if (!m->replay->first_divergent_layer.empty()) {
      summary << ", first divergent layer " << m->replay->first_divergent_layer;
    }
  }
  m->summary = summary.str();
}

// The commands that verify and replay the capsule.
void FillCommands(const v1::Capsule& c, const EnvelopeInfo& envelope, ReportModel* m) {
  const std::string trust =
      envelope.signature == SignatureState::kUnsigned ? flags::kAllowUnsigned : PubkeyArgument();
  // A name a shell could not be given as typed is shown escaped (base/internal/printable.h).
  const std::string file = ShellQuote(Printable(m->file_name));
  m->verify_command = "capsule verify " + file + " " + PubkeyArgument();
  const ReplayTool tool = ReplayToolFor(c);
  m->replay_command =
      tool.program + " replay " + file + " " + tool.model_args + " " + trust + " --bisect";
}

}  // namespace

std::string ReplayReportToJson(const v1::ReplayReport& report) {
  return MessageToJson(report) + "\n";
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
  Limiter cap(options.limits);
  ReportModel m;
  m.markdown_chars = options.limits.markdown_chars;
  FillTrust(c, envelope, options, cap, &m);
  FillTriggerAndHistory(c, options, cap, &m);
  FillIdentity(c, options, cap, &m);
  FillLayers(c, options, cap, &m);
  FillDataAndLog(c, options, cap, &m);
  ListPrivateData(c, redact, &m);
  if (replay != nullptr) m.replay = ReplayModel(*replay, cap);
  Summarize(&m);
  FillCommands(c, envelope, &m);
  m.left_out = cap.Finish();
  return m;
}

}  // namespace capsule
