#include "capsule/report/parity_text.h"

#include <algorithm>
#include <cmath>

#include "capsule/base/internal/strings.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/report/internal/text.h"

namespace capsule {
namespace {

std::string Num(double v) { return FormatSignificant(v, 3); }

std::string ScheduleText(const v1::ParitySchedule& s) {
  std::string text = "prefill " + std::to_string(s.prefill());
  if (s.chunk() < s.prefill()) text += " in chunks of " + std::to_string(s.chunk());
  if (s.prefill() < s.sequence_length()) {
    text += ", then " + std::to_string(s.sequence_length() - s.prefill()) + " decode steps";
  }
  return text;
}

std::string ToleranceText(const v1::ParityTolerance& t) {
  return t.dtype() + " tolerance atol " + Num(t.atol()) + ", rtol " + Num(t.rtol());
}

const v1::ParityFinding* FailedFinding(const v1::ParityReport& r) {
  for (const v1::ParityFinding& f : r.findings()) {
    if (f.failed()) return &f;
  }
  return nullptr;
}

}  // namespace

std::string ParityCheckSentence(const v1::ParityFinding& f) {
  const std::string at = " in " + f.layer() + " at position " + std::to_string(f.position());
  const std::string& c = f.check();
  if (c == "adapter.merged_twice") {
    return c + ": the merged weight " + f.tensor() + at + " holds " + Num(f.value()) +
           "x the adapter's delta (1 for a merge): the merge was applied twice";
  }
  if (c == "adapter.merge_rounding") {
    return c + ": the merged weight " + f.tensor() + at + " is off base + delta by " +
           Num(f.value()) + " epsilons of its dtype (a merge in that dtype stays within " +
           Num(f.threshold()) + "): the merge was rounded in a coarser dtype";
  }
  if (c == "tokenizer.training_vs_inference" || c == "template.training_vs_inference" ||
      c == "adapter.training_vs_inference") {
    return c + ": the generation step's " + f.tensor() +
           " (its SHA-256) is not the one the training run recorded";
  }
  if (c == "stop_token.ignored") {
    return c + ": stop token " + Num(f.value()) + " generated at position " +
           std::to_string(f.position()) +
           " and decoding went on: the stop list is not honoured, or not the model's";
  }
  if (c == "cache.quant_scale") {
    return c + ": a " + f.tensor() + " cache with quantisation scale " + Num(f.value()) +
           ": a quantised cache needs a positive scale, and a float cache none";
  }
  if (c == "eval.dropout") {
    return c + ": two eval-mode runs differ by up to " + Num(f.value()) +
           ": something random (dropout) is on while decoding";
  }
  if (c == "position_ids.padding") {
    return c + ": the cached position ids differ" + at + " (by " + Num(f.value()) +
           "): the decode step numbers its tokens differently from the prompt (left padding?)";
  }
  if (c == "cache.rerotated_key") {
    return c + ": cached keys of positions already decoded change" + at +
           ": the cache's rotated keys are rotated again";
  }
  if (c == "rope.absolute_position") {
    return c + ": the new keys differ" + at + " (max abs err " + Num(f.value()) +
           "): they are rotated by a position other than their absolute one";
  }
  if (c == "cache.value") return c + ": the cached values differ" + at;
  if (c == "attention.causal_mask_offset") {
    return c +
           ": the step's attention weighs keys the whole-sequence mask hides, or hides keys "
           "it weighs," +
           at + ": the causal mask ignores the cache's offset (T_q != T_k)";
  }
  if (c == "attention.kv_head_map") {
    return c + ": keys, values and the mask agree but the attention weights differ" + at +
           " (max abs err " + Num(f.value()) + "): query heads read the wrong kv head";
  }
  if (c == "attention.scores") {
    return c + ": keys, values and the mask agree but the attention weights differ" + at;
  }
  return c + ": the layer's output differs" + at + " while its cache and attention agree";
}

std::string ParitySentence(const v1::ParityReport& r) {
  const std::string how =
      " (" + ScheduleText(r.schedule()) + "; " + ToleranceText(r.tolerance()) + ")";
  if (!r.diverged()) {
    const v1::ParityFinding* f = FailedFinding(r);
    return "no divergence: the incremental decode matches the whole-sequence forward at every "
           "position and layer" +
           how + (f != nullptr ? "; but " + ParityCheckSentence(*f) : "");
  }
  std::string text = "decode departs from the whole-sequence forward at position " +
                     std::to_string(r.first_divergent_position()) + ", layer " +
                     r.first_divergent_layer() + " (error " + Num(r.worst_ratio()) +
                     "x its tolerance: " + Num(r.candidate_value()) + " vs reference " +
                     Num(r.reference_value()) + ")" + how;
  if (!r.first_cached_tensor().empty()) {
    text += "; first cached tensor to differ: " + r.first_cached_tensor() + " of " +
            r.first_cached_layer() + " at position " + std::to_string(r.first_cached_position());
  }
  if (const v1::ParityFinding* f = FailedFinding(r)) text += "; " + ParityCheckSentence(*f);
  return text;
}

std::string ParityTable(const v1::ParityReport& r) {
  std::string out = "position  step     worst layer   error/tol\n";
  for (const v1::ParityPosition& p : r.positions()) {
    std::string line = std::to_string(p.position());
    line.resize(10, ' ');
    line += p.decoded() ? "decode   " : "prefill  ";
    std::string layer = p.worst_layer();
    layer.resize(14, ' ');
    line += layer + Num(p.worst_ratio());
    if (p.diverged()) line += "  DIVERGED";
    out += line + "\n";
  }
  for (const v1::ParityTensor& t : r.tensors()) {
    if (!t.has_first_divergent_position()) continue;
    out += "cached " + t.tensor() + " of " + t.layer() + " differs from position " +
           std::to_string(t.first_divergent_position()) + " (max abs err " + Num(t.max_abs_err()) +
           ", " + Num(t.candidate_value()) + " vs reference " + Num(t.reference_value()) + ")\n";
  }
  return out;
}

std::string ParityChartSvg(const v1::ParityReport& r) {
  const int n = r.positions_size();
  const int bar = 14, height = 120, top = 10, width = std::max(1, n) * bar + 40;
  // Log10 of the error over its tolerance, from 1e-4 (bottom) to 1e4 (top): 1 sits mid-height.
  auto y_of = [&](double ratio) {
    const double l = std::clamp(std::log10(std::max(ratio, 1e-12)), -4.0, 4.0);
    return top + static_cast<int>((4.0 - l) / 8.0 * height);
  };
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"parity-chart\" width=\"" +
                    std::to_string(width) + "\" height=\"" + std::to_string(height + 30) +
                    "\" role=\"img\" aria-label=\"error per position over its tolerance\">";
  for (int i = 0; i < n; ++i) {
    const v1::ParityPosition& p = r.positions(i);
    const int x = 30 + i * bar;
    const int y = y_of(p.worst_ratio());
    svg += "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" +
           std::to_string(bar - 2) + "\" height=\"" + std::to_string(top + height - y) +
           "\" fill=\"" +
           (p.diverged()  ? "#c0392b"
            : p.decoded() ? "#2980b9"
                          : "#7f8c8d") +
           "\"><title>position " + std::to_string(p.position()) + ": " +
           internal::HtmlEscape(p.worst_layer()) + " " + Num(p.worst_ratio()) +
           "x tolerance</title></rect>";
  }
  const std::string tol_y = std::to_string(y_of(1.0));
  svg += "<line x1=\"28\" x2=\"" + std::to_string(width) + "\" y1=\"" + tol_y + "\" y2=\"" + tol_y +
         "\" stroke=\"#000\" stroke-dasharray=\"4 2\"/>";
  svg += "<text x=\"0\" y=\"" + tol_y + "\" font-size=\"10\">tol</text>";
  svg += "<text x=\"30\" y=\"" + std::to_string(top + height + 20) +
         "\" font-size=\"10\">position 0.." + std::to_string(std::max(0, n - 1)) +
         " (grey prefill, blue decode, red diverged)</text></svg>";
  return svg;
}

}  // namespace capsule
