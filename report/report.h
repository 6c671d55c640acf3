// Bug reports from a capsule: BuildReportModel collects the facts a bug report needs (trigger,
// step history, identity hashes, environment, the per-layer stats around the first anomaly and,
// given a replay result, the triage stages and the per-layer divergence) into a plain
// ReportModel; the Render* functions print that one model as Markdown (for an issue),
// self-contained HTML with inline SVG charts, or JSON. Keeping the facts apart from their
// presentation means the three formats can never disagree (cli/capsule.md, "report", lists what
// each shows).
//
//   capsule::ReportOptions options;
//   options.file_name = "run-step5.capsule";
//   options.file_sha256 = capsule::Sha256Hex(file_bytes);
//   capsule::ReportModel m = capsule::BuildReportModel(*d.capsule, d.envelope, nullptr, options);
//   std::string md = capsule::RenderMarkdown(m);
//
// Every string taken from the capsule is untrusted: the renderers escape it for their format.
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_REPORT_REPORT_H_
#define CAPSULE_REPORT_REPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/format/envelope.h"
#include "capsule/format/redact.h"
#include "capsule/proto/replay_report.pb.h"

namespace capsule::v1 {
class InputTrust;
class ParityReport;
class ReplayReport;
}  // namespace capsule::v1

namespace capsule {

// What to leave out of the report (the capsule itself is not changed; `capsule redact` does that):
// text is raw sample text, tokens are token ids and labels, paths reduces file paths to their base
// names, host is the host name. Parsed with ParseRedactItemList (format/redact.h).
using ReportRedaction = RedactItems;

// How much of a capsule a report shows. A capsule from a stranger may hold a 100 MB run name or
// twenty million token ids; every string and list is cut to these sizes in the ReportModel, so
// all three formats stay readable, and each cut is counted in ReportModel::left_out. The
// defaults keep a Markdown report within a GitHub issue body (65,536 characters).
struct ReportLimits {
  // Each name, message or value from the capsule or the replay result. A triage finding's detail
  // gets twice this: it is a sentence that carries the numbers and names the sample or the
  // parameters, and is no use cut in the middle.
  size_t text_bytes = 256;
  size_t config_text_bytes = 4096;  // the resolved config
  size_t raw_text_bytes = 512;      // each sequence's raw sample text
  size_t log_line_bytes = 240;      // each log line, and the log's error
  int history_points = 512;         // the newest steps of the history (chart and table)
  int layers = 128;                 // layer stats kept, centred on the first anomaly
  int divergence_rows = 128;        // replay rows kept, centred on the first divergence
  int sequences = 8;                // the first sequences of the batch
  int tokens_per_sequence = 64;     // the first token ids of each sequence
  int files = 32;                   // identity files
  int libraries = 32;               // environment libraries
  int log_lines = 40;               // the newest log lines
  int warnings = 16;                // replay warnings
  int stages = 8;                   // triage stages of the replay (it runs five)
  int findings = 16;                // findings of each triage stage, the failed ones first
  // RenderMarkdown leaves out whole sections, least essential first, to stay within this.
  size_t markdown_chars = 65536;
};

struct ReportOptions {
  // The capsule file's name as the report shows it and uses in the commands; reduced to its base
  // name, since the receiver of a bug report has the attachment, not the sender's directory.
  std::string file_name = "CAPSULE";
  // Sha256Hex of the capsule file's bytes; empty leaves it out.
  std::string file_sha256;
  // How far the command that reads the capsule trusts it (proto/report.proto), for the JSON's
  // "trust"; null leaves it out. Not owned; copied.
  const v1::InputTrust* trust = nullptr;
  ReportRedaction redact;
  // Rows of the step-history table (the newest ones); the chart always shows the whole history.
  int max_history_rows = 16;
  // Layers on each side of the first anomaly in the layer table.
  int layer_context = 3;
  // Rows of the layer table when no layer is anomalous.
  int max_layer_rows = 20;
  ReportLimits limits;
};

struct ReportKeyValue {
  std::string key;
  std::string value;
};

struct ReportHistoryRow {
  int64_t step = 0;
  std::optional<double> loss;
  std::optional<double> grad_norm;
  bool trigger = false;  // the step the capsule was captured at
};

struct ReportFile {
  std::string role;
  std::string name;
  std::string path;  // base name when paths are redacted
  int64_t size_bytes = 0;
  std::string sha256;
};

struct ReportLayerRow {
  int index = 0;  // LayerStats.index
  std::string name;
  std::string phase;  // "forward" / "backward"
  int64_t numel = 0;
  int64_t nan = 0;
  int64_t pos_inf = 0;
  int64_t neg_inf = 0;
  double absmax = 0;
  double rms = 0;
  bool anomalous = false;
  bool first_anomaly = false;  // the capsule's first anomalous layer
};

struct ReportDivergenceRow {
  int index = 0;
  std::string name;
  std::string phase;
  std::string tensor;
  double max_abs_err = 0;
  double max_rel_err = 0;
  int64_t nonfinite_mismatch = 0;
  double rtol = 0;
  // The bound applied is atol_applied + rtol * |ref|, and worst_ratio the worst error as a
  // multiple of it; nullopt when the replay report did not record them.
  std::optional<double> atol_applied;
  std::optional<double> worst_ratio;
  std::string verdict;  // "OK" / "DIVERGED"
  bool first_divergent = false;
};

struct ReportSequence {
  std::string sample_id;
  int64_t token_count = 0;
  std::vector<int64_t> token_ids;  // empty when redacted or dropped from the capsule
  std::string raw_text;            // empty when redacted
};

// One triage stage of the replay, in the order replay ran them (data, objective, gradients,
// optimizer, numerics): the first that explains is the diagnosis.
struct ReportStage {
  std::string name;  // StageName (report/replay_text.h): "data", "objective", ...
  bool ran = false;
  std::string skipped_reason;  // why it did not run; empty when it ran
  bool explains = false;       // a finding failed
  // StageVerdict (report/replay_text.h): "passed", "FAILED" or "skipped", as `capsule replay`
  // prints it.
  std::string verdict;
  // The failed findings first, then the notes, each group in the replay's order; at most
  // ReportLimits::findings, so a failed finding is never cut for a note.
  std::vector<v1::Finding> findings;  // the replay's own, texts cut to the report's limits
};

struct ReportReplay {
  std::string diagnosis;  // enum name, e.g. "NUMERICS"
  std::string diagnosis_text;
  std::string fidelity;
  std::string fidelity_detail;
  double captured_value = 0;
  double replayed_value = 0;
  std::string first_divergent_layer;  // empty when none
  std::string first_divergent_phase;
  double optimized_loss = 0;
  double reference_loss = 0;
  bool reference_anomalous = false;
  std::vector<ReportStage> stages;  // empty for a replay result that has none
  std::vector<ReportDivergenceRow> layers;
  // Bisect summary; strategy is empty when no bisect was run.
  std::string bisect_strategy;
  std::string bisect_first_bad_layer;
  int bisect_probes = 0;
  int bisect_probe_bound = 0;
  int bisect_layers = 0;
  std::vector<std::string> warnings;
  // The replay's parity mode (replay/parity.h), rendered by report/parity_text.h; null when it did
  // not run.
  std::shared_ptr<const v1::ParityReport> parity;
};

struct ReportModel {
  // Trust: "verified", "unsigned" or "not checked", and a warning shown first when not verified,
  // or when the capsule was made from one no trusted key vouches for.
  std::string signature;
  std::string signer_key_id;  // hex; empty when unsigned
  std::string trust_warning;
  // How the capsule was made from others (DescribeDerivation, format/derivation.h), oldest first.
  std::vector<std::string> derivations;
  std::shared_ptr<const v1::InputTrust> trust;  // ReportOptions::trust; null when not given
  std::string file_name;
  std::string file_sha256;
  std::vector<std::string> redacted;  // what this report leaves out, e.g. {"text", "host"}
  // The private data this report shows, as redaction items with what they are, e.g.
  // {"text", "raw sample text of 2 sequences"}: said at the top, with the --redact to drop it.
  std::vector<ReportKeyValue> private_data;

  std::string run_name;
  std::string writer_version;
  std::string created;  // RFC 3339 UTC, from the capsule's own timestamp
  std::string summary;  // one line: trigger, step, run (and diagnosis)

  std::string trigger_kind;
  double trigger_observed = 0;
  double trigger_threshold = 0;
  std::string trigger_rule;
  std::string trigger_message;
  std::string capture_rerun;  // empty when no re-run was made
  int64_t step = 0;
  int64_t micro_batch = 0;
  int64_t epoch = 0;
  int64_t tokens_seen = 0;

  std::vector<ReportHistoryRow> history;  // the whole history, oldest first
  int history_table_from = 0;             // index of the first row the table shows

  std::string model_registry_name;
  std::string model_path;  // "optimized" / "reference" / ""
  std::string model_sha256;
  int64_t model_parameter_count = 0;
  std::vector<ReportFile> files;
  std::string config_sha256;
  std::string config_text;
  std::string code_revision;

  std::vector<ReportKeyValue> environment;  // stable order; libraries sorted by name
  std::vector<ReportKeyValue> placement;

  std::string first_anomalous_layer;
  std::string first_anomalous_phase;
  std::string anomaly_reason;
  std::vector<ReportLayerRow> layers;        // every LayerStats entry, in capsule order
  std::vector<ReportLayerRow> layer_window;  // the rows the table shows
  int layer_window_from = 0;                 // index into `layers` of layer_window[0]

  std::vector<ReportSequence> sequences;
  std::vector<std::string> log_lines;
  std::string log_error;

  std::optional<ReportReplay> replay;

  std::string verify_command;
  std::string replay_command;

  // What ReportLimits cut, one note each ("19,999,872 more token ids of sequence 0").
  std::vector<std::string> left_out;
  size_t markdown_chars = 65536;  // ReportLimits::markdown_chars
};

ReportModel BuildReportModel(const v1::Capsule& capsule, const EnvelopeInfo& envelope,
                             const v1::ReplayReport* replay, const ReportOptions& options);

// A replay result as `capsule replay --json` prints it: protobuf's JSON mapping with the .proto's
// field names, every field present but first_divergent_layer, which is absent when no layer
// diverged. One line with a trailing newline.
std::string ReplayReportToJson(const v1::ReplayReport& report);

// Parses what ReplayReportToJson prints (and older output, where "first_divergent_layer" was
// null). kInvalidArgument when it is not a ReplayReport.
StatusOr<std::unique_ptr<v1::ReplayReport>> ParseReplayReportJson(std::string_view json);

std::string RenderMarkdown(const ReportModel& model);
std::string RenderHtml(const ReportModel& model);
std::string RenderJson(const ReportModel& model);

}  // namespace capsule

#endif  // CAPSULE_REPORT_REPORT_H_
