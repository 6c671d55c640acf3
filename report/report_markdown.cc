// RenderMarkdown: the report as GitHub-flavoured Markdown, ready to paste into an issue.

#include <algorithm>
#include <sstream>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/printable_line.h"
#include "capsule/base/internal/strings.h"
#include "capsule/report/internal/parity_section.h"
#include "capsule/report/internal/text.h"
#include "capsule/report/replay_tool.h"
#include "capsule/report/report.h"

namespace capsule {
namespace {

using internal::MarkdownEscape;

std::string Opt(const std::optional<double>& v) { return v ? FormatSignificant(*v, 6) : "-"; }

// A code fence longer than any backtick run in `text`, so untrusted text cannot close it.
std::string Fence(const std::string& text) {
  size_t longest = 0;
  size_t run = 0;
  for (const char ch : text) {
    run = ch == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return std::string(std::max<size_t>(3, longest + 1), '`');
}

// A fence longer than any run of backticks in `raw`, so the capsule's text cannot close it.
void CodeBlock(std::ostream& out, const std::string& lang, const std::string& raw) {
  const std::string text = Printable(raw, LineBreaks::kKeep);
  const std::string fence = Fence(text);
  out << fence << lang << "\n" << text;
  if (!text.empty() && text.back() != '\n') out << "\n";
  out << fence << "\n";
}

// Untrusted multi-line text: an HTML <pre> block, escaped. A Markdown code fence would show
// entities literally, and could not be escaped at all.
// (GitHub neither links nor notifies inside <pre>.)
void Pre(std::ostream& out, const std::string& text) {
  out << "<pre>" << internal::HtmlEscape(text);
  if (!text.empty() && text.back() != '\n') out << "\n";
  out << "</pre>\n";
}

// The per-layer statistics, one row per layer and phase; every cell escaped for Markdown.
void LayerTable(std::ostream& out, const std::vector<ReportLayerRow>& rows) {
  out << "| # | layer | phase | numel | nan | +inf | -inf | absmax | rms | |\n"
      << "|---:|---|---|---:|---:|---:|---:|---:|---:|---|\n";
  for (const auto& r : rows) {
    const char* mark = r.first_anomaly ? "**← first anomaly**" : (r.anomalous ? "anomalous" : "");
    out << "| " << r.index << " | " << MarkdownEscape(r.name) << " | " << r.phase << " | "
        << r.numel << " | " << r.nan << " | " << r.pos_inf << " | " << r.neg_inf << " | "
        << FormatSignificant(r.absmax, 6) << " | " << FormatSignificant(r.rms, 6) << " | " << mark
        << " |\n";
  }
}

void KeyValueTable(std::ostream& out, const std::vector<ReportKeyValue>& rows) {
  out << "| | |\n|---|---|\n";
  for (const auto& kv : rows) {
    out << "| " << MarkdownEscape(kv.key) << " | " << MarkdownEscape(kv.value) << " |\n";
  }
}

// A collapsed <details> block (GitHub and GitLab render it), for sections a reader opens on demand.
void Details(std::ostream& out, const std::string& summary) {
  out << "<details><summary>" << MarkdownEscape(summary) << "</summary>\n\n";
}

// Characters, as GitHub counts an issue body's length (UTF-8 continuation bytes are not counted).
size_t Utf8Length(const std::string& s) {
  size_t n = 0;
  for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

// What the size limits cut, and the sections left out to fit an issue body; empty when nothing.
std::string LeftOutNote(const ReportModel& m, const std::vector<std::string>& dropped) {
  if (m.left_out.empty() && dropped.empty()) return "";
  std::ostringstream out;
  out << "> **Shortened to stay readable:** ";
  for (size_t i = 0; i < m.left_out.size(); ++i) {
    out << (i ? "; " : "") << MarkdownEscape(m.left_out[i]);
  }
  if (!dropped.empty()) {
    out << (m.left_out.empty() ? "" : "; ") << "to fit "
        << FormatCount(static_cast<int64_t>(m.markdown_chars))
        << " characters, these sections are left out: ";
    for (size_t i = 0; i < dropped.size(); ++i) out << (i ? ", " : "") << dropped[i];
  }
  out << ". The capsule holds everything: `capsule report --format html` and `capsule inspect "
         "--json` show more.\n\n";
  return out.str();
}

// One function per section, in page order; each writes nothing when it has nothing to show.

void Title(std::ostream& out, const ReportModel& m) {
  if (!m.trust_warning.empty()) {
    out << "> **WARNING: " << MarkdownEscape(m.trust_warning) << ".**\n\n";
  }
  out << "## capsule report: " << MarkdownEscape(m.trigger_kind) << " at step " << m.step
      << " in run \"" << MarkdownEscape(m.run_name) << "\"\n\n";
  out << "**Summary:** " << MarkdownEscape(m.summary) << "\n\n";
}

// Who signed the capsule and how far to trust it, before any of its contents.
void Provenance(std::ostream& out, const ReportModel& m) {
  out << "| | |\n|---|---|\n";
  // Not a code span: a name with backticks in it would end the span early.
  out << "| capsule | " << MarkdownEscape(m.file_name) << " |\n";
  if (!m.file_sha256.empty()) out << "| capsule sha256 | `" << m.file_sha256 << "` |\n";
  out << "| signature | " << m.signature;
  if (!m.signer_key_id.empty()) out << ", ed25519 key `" << m.signer_key_id << "`";
  out << " |\n";
  out << "| written | capsule " << MarkdownEscape(m.writer_version) << " at " << m.created
      << " |\n";
  for (const std::string& d : m.derivations) out << "| made from | " << MarkdownEscape(d) << " |\n";
  if (!m.model_registry_name.empty()) {
    out << "| model | " << MarkdownEscape(m.model_registry_name);
    if (!m.model_path.empty()) out << " (" << m.model_path << " path)";
    out << " |\n";
  }
  if (!m.redacted.empty()) {
    out << "| left out of this report | ";
    for (size_t i = 0; i < m.redacted.size(); ++i) out << (i ? ", " : "") << m.redacted[i];
    out << " |\n";
  }
  out << "\n";
}

// What private data follows, and how to leave it out: the sender reads this before pasting.
void PrivateData(std::ostream& out, const ReportModel& m) {
  if (m.private_data.empty()) return;
  out << "> **Contains private data:** ";
  std::string items;
  for (size_t i = 0; i < m.private_data.size(); ++i) {
    out << (i ? "; " : "") << MarkdownEscape(m.private_data[i].value);
    items += (i ? "," : "") + m.private_data[i].key;
  }
  out << ". Leave it out with `" << flags::kRedact << " " << items << "`.\n\n";
}

// The replay's verdict, when a replay report was given: diagnosis, fidelity, both paths' losses
// and the first divergent layer.
void Diagnosis(std::ostream& out, const ReportModel& m) {
  if (!m.replay) return;
  const ReportReplay& r = *m.replay;
  out << "### Diagnosis\n\n";
  out << "- diagnosis: **" << MarkdownEscape(r.diagnosis) << "**";
  if (!r.diagnosis_text.empty()) out << " — " << MarkdownEscape(r.diagnosis_text);
  out << "\n- fidelity: " << MarkdownEscape(r.fidelity);
  if (!r.fidelity_detail.empty()) out << " (" << MarkdownEscape(r.fidelity_detail) << ")";
  out << "\n- captured value " << FormatSignificant(r.captured_value, 6) << ", replayed value "
      << FormatSignificant(r.replayed_value, 6) << "\n";
  out << "- loss: optimized " << FormatSignificant(r.optimized_loss, 6) << ", reference "
      << FormatSignificant(r.reference_loss, 6)
      << (r.reference_anomalous ? " (reference anomalous too)" : "") << "\n";
  out << "- first divergent layer: "
      << (r.first_divergent_layer.empty() ? std::string("none")
                                          : "**" + MarkdownEscape(r.first_divergent_layer) +
                                                "** (" + r.first_divergent_phase + ")")
      << "\n\n";
}

// One line per stage and its findings under it, failed first (the model's order). A check name
// is set in <code> rather than a code span: inside backticks the escapes would show literally, and
// a backtick in the name would end the span.
void Triage(std::ostream& out, const ReportModel& m) {
  if (!m.replay || m.replay->stages.empty()) return;
  out << "### Triage\n\n";
  for (const ReportStage& s : m.replay->stages) {
    out << "- **" << MarkdownEscape(s.name) << "**: ";
    if (s.ran && s.explains) {
      out << "**" << s.verdict << "**";
    } else {
      out << s.verdict;
    }
    if (!s.ran && !s.skipped_reason.empty()) out << " (" << MarkdownEscape(s.skipped_reason) << ")";
    out << "\n";
    for (const v1::Finding& f : s.findings) {
      out << "  - " << (f.failed() ? "**FAIL** " : "ok ") << "<code>" << MarkdownEscape(f.check())
          << "</code>";
      if (!f.detail().empty()) out << ": " << MarkdownEscape(f.detail());
      out << "\n";
    }
  }
  out << "\n";
}

void Trigger(std::ostream& out, const ReportModel& m) {
  out << "### Trigger\n\n";
  out << "- kind: " << MarkdownEscape(m.trigger_kind) << "\n";
  out << "- observed: " << FormatSignificant(m.trigger_observed, 6) << ", threshold "
      << FormatSignificant(m.trigger_threshold, 6) << "\n";
  if (!m.trigger_rule.empty()) out << "- rule: " << MarkdownEscape(m.trigger_rule) << "\n";
  if (!m.trigger_message.empty()) {
    out << "- message: " << MarkdownEscape(m.trigger_message) << "\n";
  }
  if (!m.capture_rerun.empty()) out << "- capture re-run: " << m.capture_rerun << "\n";
  out << "- step " << m.step << " (micro-batch " << m.micro_batch << ", epoch " << m.epoch << ", "
      << m.tokens_seen << " tokens seen)\n\n";
}

void History(std::ostream& out, const ReportModel& m) {
  if (m.history.empty()) return;
  const size_t from = static_cast<size_t>(m.history_table_from);
  out << "### Step history (last " << m.history.size() - from << " of " << m.history.size()
      << " steps)\n\n";
  out << "| step | loss | grad norm | |\n|---:|---:|---:|---|\n";
  for (size_t i = from; i < m.history.size(); ++i) {
    const ReportHistoryRow& h = m.history[i];
    if (h.trigger) {
      out << "| **" << h.step << "** | **" << Opt(h.loss) << "** | **" << Opt(h.grad_norm)
          << "** | **← trigger** |\n";
    } else {
      out << "| " << h.step << " | " << Opt(h.loss) << " | " << Opt(h.grad_norm) << " | |\n";
    }
  }
  out << "\n";
}

void LayerStats(std::ostream& out, const ReportModel& m) {
  if (m.layers.empty()) return;
  out << "### Per-layer stats";
  if (!m.first_anomalous_layer.empty()) {
    out << " around the first anomaly: " << MarkdownEscape(m.first_anomalous_layer) << " ("
        << m.first_anomalous_phase << ")";
    if (!m.anomaly_reason.empty()) out << ", " << MarkdownEscape(m.anomaly_reason);
  } else {
    out << " (no anomalous layer)";
  }
  out << "\n\n";
  LayerTable(out, m.layer_window);
  out << "\n";
  if (m.layer_window.size() < m.layers.size()) {
    Details(out, "All " + std::to_string(m.layers.size()) + " layer stats");
    LayerTable(out, m.layers);
    out << "\n</details>\n\n";
  }
}

// The reference/optimized comparison, up to the first divergent layer.
void Divergence(std::ostream& out, const ReportModel& m) {
  if (!m.replay) return;
  const ReportReplay& r = *m.replay;
  if (!r.layers.empty()) {
    out << "### Per-layer divergence (optimized vs reference)\n\n";
    // Per row, the bound applied and the worst error as a multiple of it (above 1 fails).
    out << "| # | layer | phase | max abs | allowed: atol + rtol·\\|ref\\| | err/allowed | max rel "
           "| non-finite | verdict |\n"
        << "|---:|---|---|---:|---:|---:|---:|---:|---|\n";
    for (const auto& l : r.layers) {
      std::string name = MarkdownEscape(l.name);
      if (!l.tensor.empty()) name += " (" + MarkdownEscape(l.tensor) + ")";
      std::string verdict = MarkdownEscape(l.verdict);
      if (l.first_divergent) verdict = "**" + verdict + " ← first divergence**";
      out << "| " << l.index << " | " << name << " | " << l.phase << " | "
          << FormatSignificant(l.max_abs_err, 6) << " | "
          << (l.atol_applied ? FormatSignificant(*l.atol_applied, 3) + " + " +
                                   FormatSignificant(l.rtol, 3) + "·\\|ref\\|"
                             : std::string("-"))
          << " | " << (l.worst_ratio ? FormatSignificant(*l.worst_ratio, 3) : std::string("-"))
          << " | " << FormatSignificant(l.max_rel_err, 6) << " | " << l.nonfinite_mismatch << " | "
          << verdict << " |\n";
    }
    out << "\n";
  }
  if (!r.bisect_strategy.empty()) {
    out << "**Bisect** (" << MarkdownEscape(r.bisect_strategy) << "): first bad layer "
        << (r.bisect_first_bad_layer.empty()
                ? std::string("none")
                : "**" + MarkdownEscape(r.bisect_first_bad_layer) + "**")
        << " after " << r.bisect_probes << " probes (bound " << r.bisect_probe_bound << ") over "
        << r.bisect_layers << " layers.\n\n";
  }
  for (const auto& w : r.warnings) out << "> replay warning: " << MarkdownEscape(w) << "\n\n";
}

void Identity(std::ostream& out, const ReportModel& m) {
  out << "### Identity\n\n| | |\n|---|---|\n";
  out << "| model sha256 | `" << MarkdownEscape(m.model_sha256.empty() ? "-" : m.model_sha256)
      << "` |\n";
  out << "| model parameters | " << m.model_parameter_count << " |\n";
  out << "| config sha256 | `" << MarkdownEscape(m.config_sha256.empty() ? "-" : m.config_sha256)
      << "` |\n";
  if (!m.code_revision.empty()) {
    out << "| code revision | " << MarkdownEscape(m.code_revision) << " |\n";
  }
  out << "\n";
  if (!m.files.empty()) {
    out << "| role | name | path | size | sha256 |\n|---|---|---|---:|---|\n";
    for (const auto& f : m.files) {
      out << "| " << MarkdownEscape(f.role) << " | " << MarkdownEscape(f.name) << " | "
          << MarkdownEscape(f.path) << " | " << f.size_bytes << " | `" << MarkdownEscape(f.sha256)
          << "` |\n";
    }
    out << "\n";
  }
  if (!m.config_text.empty()) {
    Details(out, "Config text");
    Pre(out, m.config_text);
    out << "\n</details>\n\n";
  }
}

void EnvironmentAndPlacement(std::ostream& out, const ReportModel& m) {
  if (!m.environment.empty()) {
    out << "### Environment\n\n";
    KeyValueTable(out, m.environment);
    out << "\n";
  }
  if (!m.placement.empty()) {
    out << "### Placement\n\n";
    KeyValueTable(out, m.placement);
    out << "\n";
  }
}

void Batch(std::ostream& out, const ReportModel& m) {
  if (m.sequences.empty()) return;
  Details(out, "Batch: " + std::to_string(m.sequences.size()) + " sequences");
  out << "| sample | tokens | token ids | raw text |\n|---|---:|---|---|\n";
  for (const auto& s : m.sequences) {
    std::string ids;
    for (size_t i = 0; i < s.token_ids.size(); ++i) {
      ids += (i ? " " : "") + std::to_string(s.token_ids[i]);
    }
    out << "| " << MarkdownEscape(s.sample_id) << " | " << s.token_count << " | "
        << (ids.empty() ? "-" : ids) << " | "
        << (s.raw_text.empty() ? "-" : MarkdownEscape(s.raw_text)) << " |\n";
  }
  out << "\n</details>\n\n";
}

void Log(std::ostream& out, const ReportModel& m) {
  if (m.log_lines.empty() && m.log_error.empty()) return;
  Details(out, "Trainer log (" + std::to_string(m.log_lines.size()) + " lines)");
  // One line per record, whatever a record holds: a line break inside one shows as "\n".
  std::ostringstream text;
  for (const auto& l : m.log_lines) PrintableLine(text) << l;
  if (!m.log_error.empty()) PrintableLine(text) << "error: " << m.log_error;
  Pre(out, text.str());
  out << "\n</details>\n\n";
}

// The commands that verify and replay this capsule, quoted for a shell.
void Commands(std::ostream& out, const ReportModel& m) {
  out << "### Verify and replay\n\n";
  CodeBlock(out, "sh", m.verify_command + "\n" + m.replay_command + "\n");
  out << "\n";
  if (!m.file_sha256.empty()) {
    out << "capsule sha256 `" << m.file_sha256 << "`";
    if (!m.signer_key_id.empty()) out << ", signer key id `" << m.signer_key_id << "`";
    out << "\n";
  } else if (!m.signer_key_id.empty()) {
    out << "signer key id `" << m.signer_key_id << "`\n";
  }
}

}  // namespace

std::string RenderMarkdown(const ReportModel& m) {
  // The sections in page order. Those with a name may be left out, highest `drop_order` first,
  // when the report would not fit in m.markdown_chars (a GitHub issue body); the others are small
  // by construction (ReportLimits caps every string in them).
  struct Section {
    void (*render)(std::ostream&, const ReportModel&);
    const char* name;  // nullptr: always kept
    int drop_order;
    std::string text;
  };
  std::vector<Section> sections = {
      {Title, nullptr, 0, {}},
      {Provenance, nullptr, 0, {}},
      {PrivateData, nullptr, 0, {}},
      {Diagnosis, nullptr, 0, {}},
      // What explains the failure: the last named section to go.
      {Triage, "triage", 1, {}},
      {Trigger, nullptr, 0, {}},
      {History, "step history", 3, {}},
      {LayerStats, "layer stats", 4, {}},
      {Divergence, "replay comparison", 2, {}},
      {internal::ParityMarkdown, "parity", 2, {}},
      {Identity, "identity", 5, {}},
      {EnvironmentAndPlacement, "environment", 6, {}},
      {Batch, "batch", 8, {}},
      {Log, "trainer log", 7, {}},
      {Commands, nullptr, 0, {}},
  };
  size_t total = 0;
  for (Section& s : sections) {
    std::ostringstream out;
    s.render(out, m);
    s.text = out.str();
    total += Utf8Length(s.text);
  }
  std::vector<std::string> dropped;
  // Room for the note that says what was left out.
  const size_t reserve = std::min<size_t>(2048, m.markdown_chars / 4);
  const size_t budget = m.markdown_chars - reserve;
  while (total > budget) {
    Section* largest_order = nullptr;
    for (Section& s : sections) {
      if (s.name == nullptr || s.text.empty()) continue;
      if (largest_order == nullptr || s.drop_order > largest_order->drop_order) largest_order = &s;
    }
    if (largest_order == nullptr) break;
    total -= Utf8Length(largest_order->text);
    largest_order->text.clear();
    dropped.emplace_back(largest_order->name);
  }
  std::string page;
  for (size_t i = 0; i < sections.size(); ++i) {
    page += sections[i].text;
    if (sections[i].render == Provenance) page += LeftOutNote(m, dropped);
  }
  return page;
}

}  // namespace capsule
