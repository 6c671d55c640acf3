// RenderHtml: the report as one self-contained HTML page with inline SVG charts. No scripts, no
// external resources (a bug report is opened offline, in any browser); every capsule string is
// HTML-escaped, since the capsule is untrusted input.

#include <algorithm>
#include <cmath>
#include <sstream>

#include "capsule/base/internal/printable_line.h"
#include "capsule/base/internal/strings.h"
#include "capsule/report/internal/parity_section.h"
#include "capsule/report/internal/text.h"
#include "capsule/report/replay_tool.h"
#include "capsule/report/report.h"

namespace capsule {
namespace {

using internal::HtmlEscape;

constexpr double kChartWidth = 800;
constexpr double kLeft = 60;  // room for the y-axis labels
constexpr double kRight = 20;
constexpr double kTop = 24;  // room for the flags above bars

std::string Opt(const std::optional<double>& v) { return v ? FormatSignificant(*v, 6) : "-"; }

// A log10 axis covering [lo, hi] decades; values at or below 0 sit on the floor.
struct LogAxis {
  int lo = -1;
  int hi = 1;
  double Fraction(double v) const {
    if (!(v > 0)) return 0;
    const double f = (std::log10(v) - lo) / (hi - lo);
    return std::clamp(f, 0.0, 1.0);
  }
};

// The whole decades around the finite positive values: activations and errors span many orders
// of magnitude, and a blow-up reads as a bar several decades above its neighbours.
LogAxis MakeLogAxis(const std::vector<double>& values) {
  double mn = 0, mx = 0;
  bool any = false;
  for (const double v : values) {
    if (!(v > 0) || !std::isfinite(v)) continue;
    mn = any ? std::min(mn, v) : v;
    mx = any ? std::max(mx, v) : v;
    any = true;
  }
  LogAxis a;
  if (!any) return a;
  a.lo = static_cast<int>(std::floor(std::log10(mn)));
  a.hi = static_cast<int>(std::ceil(std::log10(mx)));
  if (a.hi <= a.lo) a.hi = a.lo + 1;
  return a;
}

// Grid lines and "1eN" labels, at most about eight, on the decades of `a`.
void LogTicks(std::ostream& out, const LogAxis& a, double top, double height) {
  const int step = std::max(1, (a.hi - a.lo) / 8);
  for (int d = a.lo; d <= a.hi; d += step) {
    const double y = top + height * (1 - static_cast<double>(d - a.lo) / (a.hi - a.lo));
    out << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kChartWidth - kRight << "\" y1=\""
        << FormatFixed(y, 1) << "\" y2=\"" << FormatFixed(y, 1) << "\"/>"
        << "<text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\"" << FormatFixed(y + 4, 1)
        << "\" text-anchor=\"end\">1e" << d << "</text>\n";
  }
}

// Bar labels under the plot, rotated so long layer names fit.
void BarLabel(std::ostream& out, double x, double y, const std::string& text) {
  out << "<text class=\"label\" x=\"" << FormatFixed(x, 1) << "\" y=\"" << FormatFixed(y, 1)
      << "\" transform=\"rotate(40 " << FormatFixed(x, 1) << " " << FormatFixed(y, 1) << ")\">"
      << HtmlEscape(text) << "</text>\n";
}

// One bar per layer of the forward pass: its largest |activation| on a log scale, red where the
// layer held a NaN or Inf, so the first bad layer is the first red bar.
void AbsmaxChart(std::ostream& out, const ReportModel& m) {
  std::vector<const ReportLayerRow*> rows;
  for (const auto& l : m.layers) {
    if (l.phase == "forward") rows.push_back(&l);
  }
  if (rows.empty()) return;
  std::vector<double> values;
  for (const auto* r : rows) values.push_back(r->absmax);
  const LogAxis axis = MakeLogAxis(values);
  const double plot_h = 200;
  const double height = kTop + plot_h + 110;
  const double slot = (kChartWidth - kLeft - kRight) / rows.size();
  out << "<figure><svg id=\"chart-absmax\" viewBox=\"0 0 " << kChartWidth << " " << height
      << "\" width=\"" << kChartWidth << "\" height=\"" << height
      << "\" role=\"img\" aria-label=\"per-layer absmax of forward outputs, log scale\">\n";
  LogTicks(out, axis, kTop, plot_h);
  for (size_t i = 0; i < rows.size(); ++i) {
    const ReportLayerRow& r = *rows[i];
    const int64_t nonfinite = r.nan + r.pos_inf + r.neg_inf;
    const double x = kLeft + slot * i + slot * 0.15;
    const double w = slot * 0.7;
    // A non-finite output has no meaningful magnitude: draw it full height, red, and say why.
    const double f = nonfinite > 0 ? 1.0 : std::max(axis.Fraction(r.absmax), 0.01);
    const double h = plot_h * f;
    std::string cls = "bar";
    if (nonfinite > 0) cls += " nonfinite";
    if (r.anomalous) cls += " anomalous";
    if (r.first_anomaly) cls += " first-anomaly";
    out << "<rect class=\"" << cls << "\" x=\"" << FormatFixed(x, 1) << "\" y=\""
        << FormatFixed(kTop + plot_h - h, 1) << "\" width=\"" << FormatFixed(w, 1) << "\" height=\""
        << FormatFixed(h, 1) << "\"><title>" << HtmlEscape(r.name) << ": absmax "
        << FormatSignificant(r.absmax, 6);
    if (nonfinite > 0) {
      out << ", " << r.nan << " NaN, " << r.pos_inf << " +Inf, " << r.neg_inf << " -Inf";
    }
    out << "</title></rect>\n";
    if (nonfinite > 0) {
      out << "<text class=\"flag\" x=\"" << FormatFixed(x + w / 2, 1) << "\" y=\""
          << FormatFixed(kTop - 6, 1) << "\" text-anchor=\"middle\">" << (r.nan > 0 ? "NaN" : "Inf")
          << "</text>\n";
    }
    BarLabel(out, x + w / 2, kTop + plot_h + 14, r.name);
  }
  out << "</svg><figcaption>Forward output absmax per layer (log scale); red bars hold NaN or "
         "Inf.</figcaption></figure>\n";
}

// One panel of the history chart: a polyline through the finite values and a point per step.
void HistoryPanel(std::ostream& out, const ReportModel& m, bool loss, double top, double plot_h) {
  const char* series = loss ? "loss" : "grad-norm";
  const size_t n = m.history.size();
  double mn = 0, mx = 0;
  bool any = false;
  for (const auto& h : m.history) {
    const auto& v = loss ? h.loss : h.grad_norm;
    if (!v || !std::isfinite(*v)) continue;
    mn = any ? std::min(mn, *v) : *v;
    mx = any ? std::max(mx, *v) : *v;
    any = true;
  }
  if (!any || mx == mn) {
    mn -= 1;
    mx += 1;
  }
  const double plot_w = kChartWidth - kLeft - kRight;
  auto x_of = [&](size_t i) { return kLeft + (n > 1 ? plot_w * i / (n - 1) : plot_w / 2); };
  auto y_of = [&](double v) { return top + plot_h * (1 - (v - mn) / (mx - mn)); };
  out << "<text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\"" << FormatFixed(top + 4, 1)
      << "\" text-anchor=\"end\">" << FormatSignificant(mx, 6) << "</text><text class=\"tick\" x=\""
      << kLeft - 6 << "\" y=\"" << FormatFixed(top + plot_h + 4, 1) << "\" text-anchor=\"end\">"
      << FormatSignificant(mn, 6) << "</text><text class=\"series\" x=\"" << kLeft + 4 << "\" y=\""
      << FormatFixed(top - 6, 1) << "\">" << (loss ? "loss" : "grad norm") << "</text>\n";
  out << "<rect class=\"frame\" x=\"" << kLeft << "\" y=\"" << FormatFixed(top, 1) << "\" width=\""
      << FormatFixed(plot_w, 1) << "\" height=\"" << FormatFixed(plot_h, 1) << "\"/>\n";
  std::ostringstream pts;
  for (size_t i = 0; i < n; ++i) {
    const auto& v = loss ? m.history[i].loss : m.history[i].grad_norm;
    if (v && std::isfinite(*v))
      pts << (pts.tellp() > 0 ? " " : "") << FormatFixed(x_of(i), 1) << ","
          << FormatFixed(y_of(*v), 1);
  }
  out << "<polyline class=\"line " << series << "\" points=\"" << pts.str() << "\"/>\n";
  for (size_t i = 0; i < n; ++i) {
    const ReportHistoryRow& h = m.history[i];
    const auto& v = loss ? h.loss : h.grad_norm;
    if (!v) continue;  // the trainer did not report it for this step
    const bool finite = std::isfinite(*v);
    // A non-finite value is pinned to the top edge and drawn red, so the step still shows.
    out << "<circle class=\"point " << series << (finite ? "" : " nonfinite") << "\" cx=\""
        << FormatFixed(x_of(i), 1) << "\" cy=\"" << FormatFixed(finite ? y_of(*v) : top, 1)
        << "\" r=\"4\"><title>step " << h.step << ": " << FormatSignificant(*v, 6)
        << "</title></circle>\n";
  }
}

// Loss above, gradient norm below, over the steps the capsule recorded, with the trigger step
// marked: a spike or a run-up before the failure shows as it would on a training dashboard.
void HistoryChart(std::ostream& out, const ReportModel& m) {
  if (m.history.empty()) return;
  const double plot_h = 120;
  const double gap = 40;
  const double height = kTop + 2 * plot_h + gap + 40;
  out << "<figure><svg id=\"chart-history\" viewBox=\"0 0 " << kChartWidth << " " << height
      << "\" width=\"" << kChartWidth << "\" height=\"" << height
      << "\" role=\"img\" aria-label=\"loss and gradient norm per step\">\n";
  HistoryPanel(out, m, true, kTop, plot_h);
  HistoryPanel(out, m, false, kTop + plot_h + gap, plot_h);
  const size_t n = m.history.size();
  const double plot_w = kChartWidth - kLeft - kRight;
  for (size_t i = 0; i < n; ++i) {
    const double x = kLeft + (n > 1 ? plot_w * i / (n - 1) : plot_w / 2);
    if (m.history[i].trigger) {
      out << "<line id=\"trigger-marker\" class=\"trigger\" x1=\"" << FormatFixed(x, 1)
          << "\" x2=\"" << FormatFixed(x, 1) << "\" y1=\"" << kTop << "\" y2=\""
          << FormatFixed(kTop + 2 * plot_h + gap, 1) << "\"/><text class=\"trigger\" x=\""
          << FormatFixed(x - 4, 1) << "\" y=\"" << FormatFixed(kTop + 2 * plot_h + gap + 16, 1)
          << "\" text-anchor=\"end\">trigger (step " << m.history[i].step << ")</text>\n";
    }
    if (n <= 32 || i % ((n + 15) / 16) == 0) {
      out << "<text class=\"tick\" x=\"" << FormatFixed(x, 1) << "\" y=\""
          << FormatFixed(kTop + 2 * plot_h + gap + 32, 1) << "\" text-anchor=\"middle\">"
          << m.history[i].step << "</text>\n";
    }
  }
  out << "</svg><figcaption>Loss and gradient norm per step; the dashed line marks the trigger "
         "step, red points are non-finite.</figcaption></figure>\n";
}

// The replay's per-layer error between the reference and the optimized path, against the
// tolerance that judged it: the layer where the error first crosses its bound is the divergence.
void DivergenceChart(std::ostream& out, const ReportReplay& r) {
  std::vector<const ReportDivergenceRow*> rows;
  for (const auto& l : r.layers) {
    if (l.phase == "forward") rows.push_back(&l);
  }
  if (rows.empty()) return;
  // The error as a multiple of the bound each layer was held to, with the line at 1: the
  // threshold actually applied. Replay reports older than worst_ratio fall back to the maximum
  // relative error against rtol.
  bool ratios = false;
  for (const auto* l : rows) ratios |= l->worst_ratio.has_value();
  auto value = [ratios](const ReportDivergenceRow& l) {
    return ratios ? l.worst_ratio.value_or(0) : l.max_rel_err;
  };
  const double rtol = ratios ? 1.0 : rows.front()->rtol;
  std::vector<double> values = {rtol};
  for (const auto* l : rows) values.push_back(value(*l));
  const LogAxis axis = MakeLogAxis(values);
  const double plot_h = 200;
  const double height = kTop + plot_h + 110;
  const double slot = (kChartWidth - kLeft - kRight) / rows.size();
  out << "<figure><svg id=\"chart-divergence\" "
         "viewBox=\"0 0 "
      << kChartWidth << " " << height << "\" width=\"" << kChartWidth << "\" height=\"" << height
      << "\" role=\"img\" aria-label=\"per-layer max relative error, log scale\">\n";
  LogTicks(out, axis, kTop, plot_h);
  for (size_t i = 0; i < rows.size(); ++i) {
    const ReportDivergenceRow& l = *rows[i];
    const bool nonfinite = l.nonfinite_mismatch > 0 || !std::isfinite(value(l));
    const double x = kLeft + slot * i + slot * 0.15;
    const double w = slot * 0.7;
    const double f = nonfinite ? 1.0 : std::max(axis.Fraction(value(l)), 0.01);
    const double h = plot_h * f;
    std::string cls = "bar";
    if (l.verdict == "DIVERGED") cls += " diverged";
    if (nonfinite) cls += " nonfinite";
    if (l.first_divergent) cls += " first-divergent";
    out << "<rect class=\"" << cls << "\" x=\"" << FormatFixed(x, 1) << "\" y=\""
        << FormatFixed(kTop + plot_h - h, 1) << "\" width=\"" << FormatFixed(w, 1) << "\" height=\""
        << FormatFixed(h, 1) << "\"><title>" << HtmlEscape(l.name)
        << (ratios ? ": err/allowed " : ": max rel ") << FormatSignificant(value(l), 6) << ", "
        << HtmlEscape(l.verdict) << "</title></rect>\n";
    if (l.first_divergent) {
      out << "<text class=\"flag\" x=\"" << FormatFixed(x + w / 2, 1) << "\" y=\""
          << FormatFixed(kTop - 6, 1) << "\" text-anchor=\"middle\">first divergence</text>\n";
    }
    BarLabel(out, x + w / 2, kTop + plot_h + 14, l.name);
  }
  if (rtol > 0) {
    const double y = kTop + plot_h * (1 - axis.Fraction(rtol));
    out << "<line id=\"tolerance-line\" class=\"tolerance\" x1=\"" << kLeft << "\" x2=\""
        << kChartWidth - kRight << "\" y1=\"" << FormatFixed(y, 1) << "\" y2=\""
        << FormatFixed(y, 1) << "\" stroke-dasharray=\"6 4\"/><text class=\"tick\" x=\""
        << kChartWidth - kRight << "\" y=\"" << FormatFixed(y - 4, 1) << "\" text-anchor=\"end\">"
        << (ratios ? "allowed" : "rtol ") << (ratios ? std::string() : FormatSignificant(rtol, 6))
        << "</text>\n";
  }
  out << (ratios ? "</svg><figcaption>Worst error of the optimized path against the reference, "
                   "as a multiple of the tolerance each forward layer was held to (log scale); "
                   "the dashed line is what was allowed.</figcaption></figure>\n"
                 : "</svg><figcaption>Max relative error of the optimized path against the "
                   "reference, per forward layer (log scale); the dashed line is "
                   "rtol.</figcaption></figure>\n");
}

// Every cell escaped: keys and values come from the capsule, which may be hostile.
void KeyValueTable(std::ostream& out, const std::vector<ReportKeyValue>& rows) {
  out << "<table class=\"kv\">\n";
  for (const auto& kv : rows) {
    out << "<tr><th>" << HtmlEscape(kv.key) << "</th><td>" << HtmlEscape(kv.value)
        << "</td></tr>\n";
  }
  out << "</table>\n";
}

// The per-layer statistics the charts draw, as numbers (a chart is not searchable or copyable).
void LayerTable(std::ostream& out, const std::vector<ReportLayerRow>& rows) {
  out << "<table><tr><th>#</th><th>layer</th><th>phase</th><th>numel</th><th>nan</th>"
         "<th>+inf</th><th>-inf</th><th>absmax</th><th>rms</th><th></th></tr>\n";
  for (const auto& r : rows) {
    out << "<tr" << (r.anomalous ? " class=\"anomalous\"" : "") << "><td>" << r.index << "</td><td>"
        << HtmlEscape(r.name) << "</td><td>" << r.phase << "</td><td>" << r.numel << "</td><td>"
        << r.nan << "</td><td>" << r.pos_inf << "</td><td>" << r.neg_inf << "</td><td>"
        << FormatSignificant(r.absmax, 6) << "</td><td>" << FormatSignificant(r.rms, 6)
        << "</td><td>"
        << (r.first_anomaly ? "&larr; first anomaly" : (r.anomalous ? "anomalous" : ""))
        << "</td></tr>\n";
  }
  out << "</table>\n";
}

constexpr const char* kStyle =
    R"(body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:960px;color:#1b1f24;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left;font-variant-numeric:tabular-nums}
tr.anomalous td,tr.trigger td,tr.diverged td{background:#ffebe9;font-weight:600}
code,pre{font:12px ui-monospace,monospace;background:#f6f8fa}pre{padding:8px;overflow:auto;white-space:pre-wrap}
.warning{background:#fff1c2;border:2px solid #d4a72c;padding:10px 14px;font-weight:700;font-size:16px}
.summary{font-size:15px}figure{margin:12px 0}figcaption{color:#57606a;font-size:12px}
svg .bar{fill:#4c8bf5}svg .bar.anomalous{fill:#f0a030}svg .bar.nonfinite,svg .bar.diverged{fill:#d1242f}
svg .grid{stroke:#eaeef2}svg .frame{fill:none;stroke:#d0d7de}svg text{font:11px system-ui,sans-serif;fill:#1b1f24}
svg .flag{fill:#d1242f;font-weight:700}svg .line{fill:none;stroke-width:2}svg .line.loss{stroke:#4c8bf5}svg .line.grad-norm{stroke:#8250df}
svg .point.loss{fill:#4c8bf5}svg .point.grad-norm{fill:#8250df}svg .point.nonfinite{fill:#d1242f}
svg .trigger{stroke:#d1242f;stroke-dasharray:4 3}svg text.trigger{stroke:none;fill:#d1242f}svg .tolerance{stroke:#1b1f24;stroke-width:1.5}
)";

// One function per section, in page order; each writes nothing when it has nothing to show.

// A self-contained page: inline CSS and SVG only, no script and no outside resource (CSP), so
// the report opens the same offline and attached to an issue.
void Head(std::ostream& out, const ReportModel& m) {
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      // The page needs nothing from anywhere: forbid every fetch and every script outright.
      << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "style-src 'unsafe-inline'; img-src data:\">\n"
      << "<title>capsule report: " << HtmlEscape(m.trigger_kind) << " at step " << m.step
      << " in run " << HtmlEscape(m.run_name) << "</title>\n<style>" << kStyle
      << "</style></head>\n<body>\n";
}

void Title(std::ostream& out, const ReportModel& m) {
  if (!m.trust_warning.empty()) {
    out << "<p class=\"warning\" id=\"trust-warning\">WARNING: " << HtmlEscape(m.trust_warning)
        << ".</p>\n";
  }
  out << "<h1>capsule report: " << HtmlEscape(m.trigger_kind) << " at step " << m.step
      << " in run &quot;" << HtmlEscape(m.run_name) << "&quot;</h1>\n";
  out << "<p class=\"summary\"><b>Summary:</b> " << HtmlEscape(m.summary) << "</p>\n";
}

// Who signed the capsule and how far to trust it, before any of its contents, with what it was
// made from and what was redacted.
void Provenance(std::ostream& out, const ReportModel& m) {
  std::vector<ReportKeyValue> head = {{"capsule", m.file_name}};
  if (!m.file_sha256.empty()) head.push_back({"capsule sha256", m.file_sha256});
  head.push_back(
      {"signature", m.signature + (m.signer_key_id.empty() ? std::string()
                                                           : ", ed25519 key " + m.signer_key_id)});
  head.push_back({"written", "capsule " + m.writer_version + " at " + m.created});
  for (const std::string& d : m.derivations) head.push_back({"made from", d});
  if (!m.model_registry_name.empty()) {
    head.push_back({"model", m.model_registry_name +
                                 (m.model_path.empty() ? "" : " (" + m.model_path + " path)")});
  }
  if (!m.redacted.empty()) {
    std::string r;
    for (size_t i = 0; i < m.redacted.size(); ++i) r += (i ? ", " : "") + m.redacted[i];
    head.push_back({"left out of this report", r});
  }
  KeyValueTable(out, head);
  if (!m.private_data.empty()) {
    out << "<p class=\"warning\" id=\"private-data\">Contains private data: ";
    std::string items;
    for (size_t i = 0; i < m.private_data.size(); ++i) {
      out << (i ? "; " : "") << HtmlEscape(m.private_data[i].value);
      items += (i ? "," : "") + m.private_data[i].key;
    }
    out << ". Leave it out with <code>" << flags::kRedact << " " << items << "</code>.</p>\n";
  }
  if (!m.left_out.empty()) {
    out << "<p class=\"warning\" id=\"left-out\">Shortened to stay readable: ";
    for (size_t i = 0; i < m.left_out.size(); ++i) {
      out << (i ? "; " : "") << HtmlEscape(m.left_out[i]);
    }
    out << ". The capsule holds everything (<code>capsule inspect --json</code>).</p>\n";
  }
}

// The replay's verdict, when a replay report was given: diagnosis, fidelity, both paths' losses
// and the first divergent layer.
void Diagnosis(std::ostream& out, const ReportModel& m) {
  if (m.replay) {
    const ReportReplay& r = *m.replay;
    out << "<h2>Diagnosis</h2>\n<ul><li>diagnosis: <b>" << HtmlEscape(r.diagnosis) << "</b>";
    if (!r.diagnosis_text.empty()) out << " &mdash; " << HtmlEscape(r.diagnosis_text);
    out << "</li><li>fidelity: " << HtmlEscape(r.fidelity);
    if (!r.fidelity_detail.empty()) out << " (" << HtmlEscape(r.fidelity_detail) << ")";
    out << "</li><li>captured value " << FormatSignificant(r.captured_value, 6)
        << ", replayed value " << FormatSignificant(r.replayed_value, 6)
        << "</li><li>loss: optimized " << FormatSignificant(r.optimized_loss, 6) << ", reference "
        << FormatSignificant(r.reference_loss, 6)
        << (r.reference_anomalous ? " (reference anomalous too)" : "")
        << "</li><li>first divergent layer: "
        << (r.first_divergent_layer.empty() ? std::string("none")
                                            : "<b>" + HtmlEscape(r.first_divergent_layer) +
                                                  "</b> (" + r.first_divergent_phase + ")")
        << "</li></ul>\n";
  }
}

// A row per stage, its findings failed first (the model's order); a stage that explains the
// failure is marked like a diverged layer.
void Triage(std::ostream& out, const ReportModel& m) {
  if (!m.replay || m.replay->stages.empty()) return;
  out << "<h2>Triage</h2>\n<table id=\"triage\"><tr><th>stage</th><th>verdict</th>"
         "<th>findings</th></tr>\n";
  for (const ReportStage& s : m.replay->stages) {
    out << "<tr" << (s.ran && s.explains ? " class=\"diverged\"" : "") << "><td>"
        << HtmlEscape(s.name) << "</td><td>" << HtmlEscape(s.verdict);
    if (!s.ran && !s.skipped_reason.empty()) out << " (" << HtmlEscape(s.skipped_reason) << ")";
    out << "</td><td>";
    if (s.findings.empty()) out << "-";
    for (size_t i = 0; i < s.findings.size(); ++i) {
      const v1::Finding& f = s.findings[i];
      out << (i ? "<br>" : "") << (f.failed() ? "<b>FAIL</b> " : "ok ") << "<code>"
          << HtmlEscape(f.check()) << "</code>";
      if (!f.detail().empty()) out << ": " << HtmlEscape(f.detail());
    }
    out << "</td></tr>\n";
  }
  out << "</table>\n";
}

void Trigger(std::ostream& out, const ReportModel& m) {
  out << "<h2>Trigger</h2>\n<ul><li>kind: " << HtmlEscape(m.trigger_kind)
      << "</li><li>observed: " << FormatSignificant(m.trigger_observed, 6) << ", threshold "
      << FormatSignificant(m.trigger_threshold, 6) << "</li>";
  if (!m.trigger_rule.empty()) out << "<li>rule: " << HtmlEscape(m.trigger_rule) << "</li>";
  if (!m.trigger_message.empty())
    out << "<li>message: " << HtmlEscape(m.trigger_message) << "</li>";
  if (!m.capture_rerun.empty()) out << "<li>capture re-run: " << m.capture_rerun << "</li>";
  out << "<li>step " << m.step << " (micro-batch " << m.micro_batch << ", epoch " << m.epoch << ", "
      << m.tokens_seen << " tokens seen)</li></ul>\n";
}

void History(std::ostream& out, const ReportModel& m) {
  if (!m.history.empty()) {
    const size_t from = static_cast<size_t>(m.history_table_from);
    out << "<h2>Step history</h2>\n";
    HistoryChart(out, m);
    out << "<table><tr><th>step</th><th>loss</th><th>grad norm</th><th></th></tr>\n";
    for (size_t i = from; i < m.history.size(); ++i) {
      const ReportHistoryRow& h = m.history[i];
      out << "<tr" << (h.trigger ? " class=\"trigger\"" : "") << "><td>" << h.step << "</td><td>"
          << Opt(h.loss) << "</td><td>" << Opt(h.grad_norm) << "</td><td>"
          << (h.trigger ? "&larr; trigger" : "") << "</td></tr>\n";
    }
    out << "</table>\n";
  }
}

void LayerStats(std::ostream& out, const ReportModel& m) {
  if (!m.layers.empty()) {
    out << "<h2>Per-layer stats</h2>\n";
    if (!m.first_anomalous_layer.empty()) {
      out << "<p>First anomaly: <b>" << HtmlEscape(m.first_anomalous_layer) << "</b> ("
          << m.first_anomalous_phase << ")";
      if (!m.anomaly_reason.empty()) out << ", " << HtmlEscape(m.anomaly_reason);
      out << "</p>\n";
    } else {
      out << "<p>No anomalous layer.</p>\n";
    }
    AbsmaxChart(out, m);
    LayerTable(out, m.layer_window);
    if (m.layer_window.size() < m.layers.size()) {
      out << "<details><summary>All " << m.layers.size() << " layer stats</summary>\n";
      LayerTable(out, m.layers);
      out << "</details>\n";
    }
  }
}

// The reference/optimized comparison: the chart, then the rows up to the first divergent one.
void Divergence(std::ostream& out, const ReportModel& m) {
  if (m.replay) {
    const ReportReplay& r = *m.replay;
    if (!r.layers.empty()) {
      out << "<h2>Per-layer divergence (optimized vs reference)</h2>\n";
      DivergenceChart(out, r);
      out << "<table><tr><th>#</th><th>layer</th><th>phase</th><th>max abs</th>"
             "<th>allowed: atol + rtol&middot;|ref|</th><th>err/allowed</th><th>max rel</th>"
             "<th>non-finite</th><th>verdict</th></tr>\n";
      for (const auto& l : r.layers) {
        out << "<tr" << (l.first_divergent ? " class=\"diverged\"" : "") << "><td>" << l.index
            << "</td><td>" << HtmlEscape(l.name)
            << (l.tensor.empty() ? "" : " (" + HtmlEscape(l.tensor) + ")") << "</td><td>" << l.phase
            << "</td><td>" << FormatSignificant(l.max_abs_err, 6) << "</td><td>"
            << (l.atol_applied ? FormatSignificant(*l.atol_applied, 3) + " + " +
                                     FormatSignificant(l.rtol, 3) + "&middot;|ref|"
                               : std::string("-"))
            << "</td><td>"
            << (l.worst_ratio ? FormatSignificant(*l.worst_ratio, 3) : std::string("-"))
            << "</td><td>" << FormatSignificant(l.max_rel_err, 6) << "</td><td>"
            << l.nonfinite_mismatch << "</td><td>" << HtmlEscape(l.verdict)
            << (l.first_divergent ? " &larr; first divergence" : "") << "</td></tr>\n";
      }
      out << "</table>\n";
    }
    if (!r.bisect_strategy.empty()) {
      out << "<p><b>Bisect</b> (" << HtmlEscape(r.bisect_strategy) << "): first bad layer "
          << (r.bisect_first_bad_layer.empty()
                  ? std::string("none")
                  : "<b>" + HtmlEscape(r.bisect_first_bad_layer) + "</b>")
          << " after " << r.bisect_probes << " probes (bound " << r.bisect_probe_bound << ") over "
          << r.bisect_layers << " layers.</p>\n";
    }
    for (const auto& w : r.warnings) {
      out << "<p class=\"warning\">replay warning: " << HtmlEscape(w) << "</p>\n";
    }
  }
}

void Identity(std::ostream& out, const ReportModel& m) {
  out << "<h2>Identity</h2>\n";
  std::vector<ReportKeyValue> id = {
      {"model sha256", m.model_sha256.empty() ? "-" : m.model_sha256},
      {"model parameters", std::to_string(m.model_parameter_count)},
      {"config sha256", m.config_sha256.empty() ? "-" : m.config_sha256}};
  if (!m.code_revision.empty()) id.push_back({"code revision", m.code_revision});
  KeyValueTable(out, id);
  if (!m.files.empty()) {
    out << "<table><tr><th>role</th><th>name</th><th>path</th><th>size</th><th>sha256</th></tr>\n";
    for (const auto& f : m.files) {
      out << "<tr><td>" << HtmlEscape(f.role) << "</td><td>" << HtmlEscape(f.name) << "</td><td>"
          << HtmlEscape(f.path) << "</td><td>" << f.size_bytes << "</td><td><code>"
          << HtmlEscape(f.sha256) << "</code></td></tr>\n";
    }
    out << "</table>\n";
  }
  if (!m.config_text.empty()) {
    out << "<details><summary>Config text</summary><pre>" << HtmlEscape(m.config_text)
        << "</pre></details>\n";
  }
}

void EnvironmentAndPlacement(std::ostream& out, const ReportModel& m) {
  if (!m.environment.empty()) {
    out << "<h2>Environment</h2>\n";
    KeyValueTable(out, m.environment);
  }
  if (!m.placement.empty()) {
    out << "<h2>Placement</h2>\n";
    KeyValueTable(out, m.placement);
  }
}

void Batch(std::ostream& out, const ReportModel& m) {
  if (!m.sequences.empty()) {
    out << "<details><summary>Batch: " << m.sequences.size() << " sequences</summary>\n"
        << "<table><tr><th>sample</th><th>tokens</th><th>token ids</th><th>raw text</th></tr>\n";
    for (const auto& s : m.sequences) {
      std::string ids;
      for (size_t i = 0; i < s.token_ids.size(); ++i) {
        ids += (i ? " " : "") + std::to_string(s.token_ids[i]);
      }
      out << "<tr><td>" << HtmlEscape(s.sample_id) << "</td><td>" << s.token_count << "</td><td>"
          << (ids.empty() ? "-" : ids) << "</td><td>"
          << (s.raw_text.empty() ? "-" : HtmlEscape(s.raw_text)) << "</td></tr>\n";
    }
    out << "</table></details>\n";
  }
}

void Log(std::ostream& out, const ReportModel& m) {
  if (!m.log_lines.empty() || !m.log_error.empty()) {
    out << "<details><summary>Trainer log (" << m.log_lines.size() << " lines)</summary><pre>";
    // One line per record, whatever a record holds: a line break inside one shows as "\n".
    std::ostringstream text;
    for (const auto& l : m.log_lines) PrintableLine(text) << l;
    if (!m.log_error.empty()) PrintableLine(text) << "error: " << m.log_error;
    out << HtmlEscape(text.str());
    out << "</pre></details>\n";
  }
}

// The commands that verify and replay this capsule, quoted for a shell.
void Commands(std::ostream& out, const ReportModel& m) {
  out << "<h2>Verify and replay</h2>\n<pre>" << HtmlEscape(m.verify_command) << "\n"
      << HtmlEscape(m.replay_command) << "</pre>\n";
  if (!m.file_sha256.empty()) {
    out << "<p>capsule sha256 <code>" << HtmlEscape(m.file_sha256) << "</code>";
    if (!m.signer_key_id.empty())
      out << ", signer key id <code>" << HtmlEscape(m.signer_key_id) << "</code>";
    out << "</p>\n";
  }
}

void Foot(std::ostream& out) { out << "</body></html>\n"; }

}  // namespace

std::string RenderHtml(const ReportModel& m) {
  std::ostringstream out;
  Head(out, m);
  Title(out, m);
  Provenance(out, m);
  Diagnosis(out, m);
  Triage(out, m);
  Trigger(out, m);
  History(out, m);
  LayerStats(out, m);
  Divergence(out, m);
  internal::ParityHtml(out, m);
  Identity(out, m);
  EnvironmentAndPlacement(out, m);
  Batch(out, m);
  Log(out, m);
  Commands(out, m);
  Foot(out);
  return out.str();
}

}  // namespace capsule
