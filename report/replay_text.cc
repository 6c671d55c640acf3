#include "capsule/report/replay_text.h"

#include "capsule/base/internal/strings.h"
#include "capsule/proto/replay_report.pb.h"

namespace capsule {
namespace {

constexpr char kNumerics[] = "numerics in the optimized path: ";
constexpr char kAgree[] =
    "no divergence: the optimized and reference paths agree within tolerance ";

// The layerwise entry Diagnose chose as the first divergence, or null.
const v1::LayerComparison* FirstDivergentEntry(const v1::ReplayReport& r) {
  if (!r.has_first_divergent_layer()) return nullptr;
  for (const auto& l : r.layers()) {
    if (l.verdict() == v1::DIVERGED && l.name() == r.first_divergent_layer() &&
        l.phase() == r.first_divergent_phase()) {
      return &l;
    }
  }
  return nullptr;
}

std::string Numerics(const v1::ReplayReport& r) {
  const std::string& layer = r.first_divergent_layer();
  if (!r.extract_layer().empty()) {
    return kNumerics + std::string("layer ") + layer +
           " diverges from the reference on its reference input (extract)";
  }
  const v1::BisectReport& b = r.bisect();
  const v1::LayerComparison* first = FirstDivergentEntry(r);
  if (r.first_divergent_source() == v1::BISECT || first == nullptr) {
    // The backward bisect names it when the forward one found nothing (Diagnose).
    const bool backward = r.first_divergent_phase() == v1::BACKWARD;
    const v1::BisectReport& named = backward ? r.backward_bisect() : b;
    return std::string(kNumerics) + (backward ? "backward " : "") + named.strategy() +
           " names first bad layer " + layer + " in " + std::to_string(named.probes()) +
           " composite runs";
  }
  std::string text =
      kNumerics + std::string("first divergent layer ") + layer + " (" +
      (first->phase() == v1::FORWARD ? "forward" : "backward") + ", " +
      (first->nonfinite_mismatch() > 0
           ? std::to_string(first->nonfinite_mismatch()) + " non-finite mismatches"
       : first->has_worst_ratio()
           ? "error " + FormatSignificant(first->worst_ratio(), 3) + "x what its tolerance allows"
           // A replay report written before worst_ratio existed.
           : "max rel err " + FormatSignificant(first->max_rel_err(), 3)) +
      ")";
  // A divergence in the backward phase is confirmed by the backward bisect, when it ran.
  const bool backward = first->phase() == v1::BACKWARD && r.has_backward_bisect();
  const v1::BisectReport& confirm = backward ? r.backward_bisect() : b;
  if ((backward || r.has_bisect()) && !confirm.strategy().empty()) {
    const std::string search = (backward ? "backward " : "") + confirm.strategy();
    text += confirm.first_bad_layer() == layer
                ? "; " + search + " confirms it in " + std::to_string(confirm.probes()) + " runs"
                : "; " + search + " points at " +
                      (confirm.first_bad_layer().empty() ? std::string("no layer")
                                                         : confirm.first_bad_layer()) +
                      " instead (errors may cancel downstream)";
  }
  if (r.has_features() && r.features().outcome() == v1::FeatureBisectReport::FOUND) {
    std::string names;
    for (const std::string& n : r.features().culprits()) names += (names.empty() ? "" : ", ") + n;
    text += "; it needs the optimization " + names;
  } else if (r.has_features() &&
             r.features().outcome() == v1::FeatureBisectReport::NOT_IN_SWITCHES) {
    text += "; it diverges with every optimization switch off";
  }
  return text;
}

// The first failed finding of the first stage that explains, for the diagnosis sentence.
std::string StageSentence(const v1::ReplayReport& r, v1::Stage stage) {
  for (const auto& s : r.stages()) {
    if (s.stage() != stage) continue;
    std::string text;
    for (const auto& f : s.findings()) {
      if (!f.failed()) continue;
      text += (text.empty() ? "" : "; ") + f.detail() + " [" + f.check() + "]";
    }
    return text;
  }
  return "";
}

}  // namespace

std::string StageVerdict(const v1::StageReport& stage) {
  return !stage.ran() ? "skipped" : stage.explains() ? "FAILED" : "passed";
}

std::string StageName(int stage) {
  switch (stage) {
    case v1::STAGE_DATA:
      return "data";
    case v1::STAGE_OBJECTIVE:
      return "objective";
    case v1::STAGE_NUMERICS:
      return "numerics";
    case v1::STAGE_GRADIENTS:
      return "gradients";
    case v1::STAGE_OPTIMIZER:
      return "optimizer";
    default:
      return "unknown";
  }
}

namespace {

std::string Sentence(const v1::ReplayReport& r) {
  switch (r.diagnosis()) {
    case v1::TRANSIENT:
      return "transient: the failure did not reproduce (" + r.fidelity_detail() + ")" +
             (r.has_repeat() ? "; reproduced in " + std::to_string(r.repeat().reproduced_runs()) +
                                   " of " + std::to_string(r.repeat().runs()) + " replays"
                             : "") +
             "; suspect hardware, a race or a nondeterministic kernel, and rerun elsewhere";
    case v1::DATA_OR_MODEL:
      return "data or model, not numerics: the FP64 reference path shows the same anomaly "
             "(reference loss " +
             FormatSignificant(r.reference_loss(), 3) +
             "); look at the step's samples, masks, labels and learning rate rather than "
             "skipping the batch";
    case v1::NUMERICS:
      return Numerics(r);
    case v1::DATA:
      return "bad data, before any numerics: " + StageSentence(r, v1::STAGE_DATA) +
             "; fix or drop that sample rather than skipping the step";
    case v1::OBJECTIVE:
      return "the objective, before any numerics: " + StageSentence(r, v1::STAGE_OBJECTIVE);
    case v1::GRADIENTS:
      return "the gradients, before any numerics: " + StageSentence(r, v1::STAGE_GRADIENTS);
    case v1::OPTIMIZER:
      return "the optimizer step, before any numerics: " + StageSentence(r, v1::STAGE_OPTIMIZER);
    case v1::NO_DIVERGENCE:
      return r.extract_layer().empty()
                 ? kAgree + std::string("on every compared layer")
                 : kAgree + std::string("on layer ") + r.extract_layer() + " (extract)";
    default:
      return "";
  }
}

}  // namespace

std::string DiagnosisSentence(const v1::ReplayReport& r) {
  std::string sentence = Sentence(r);
  if (!r.captured_first_module().empty()) {
    sentence += "; the capture recorded the first non-finite output at module " +
                r.captured_first_module() +
                " (the model was observed, not described as stages: describe it as stages for "
                "a layer-by-layer answer)";
  }
  return sentence;
}

}  // namespace capsule
