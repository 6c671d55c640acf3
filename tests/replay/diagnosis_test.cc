// The replay's two judgements on plain inputs (replay/internal/diagnosis.h): Diagnose over
// hand-made layer comparisons and bisect results, JudgeFidelity over a hand-made trigger and run.
#include "capsule/replay/internal/diagnosis.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/gate.h"

namespace capsule {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

struct Row {
  int index;
  const char* name;
  v1::Phase phase;
  v1::Verdict verdict;
};

struct DiagnoseCase {
  const char* what;
  v1::Fidelity fidelity;
  bool reference_anomalous;
  std::vector<Row> layers;
  const char* bisect_first_bad;  // nullptr: no bisect was run
  v1::Diagnosis diagnosis;
  const char* first_layer;  // nullptr: none
  v1::Phase first_phase;
  v1::DivergenceSource source;
};

constexpr auto F = v1::FORWARD;
constexpr auto B = v1::BACKWARD;
constexpr auto kOk = v1::OK;
constexpr auto kBad = v1::DIVERGED;

TEST(DiagnoseTest, Table) {
  const std::vector<DiagnoseCase> cases = {
      {"forward divergence names its layer",
       v1::REPRODUCED_EXACT,
       false,
       {{0, "embed", F, kOk}, {1, "blocks.0", F, kBad}, {2, "blocks.1", F, kBad}},
       nullptr,
       v1::NUMERICS,
       "blocks.0",
       F,
       v1::LAYERWISE},
      {"a manual capture with nothing to compare is judged by the layers, never transient",
       v1::NOT_CHECKED,
       false,
       {{0, "embed", F, kOk}, {1, "blocks.0", F, kBad}},
       nullptr,
       v1::NUMERICS,
       "blocks.0",
       F,
       v1::LAYERWISE},
      {"forward wins over an earlier backward entry",
       v1::REPRODUCED_APPROX,
       false,
       {{0, "embed", B, kBad}, {2, "blocks.1", F, kBad}},
       nullptr,
       v1::NUMERICS,
       "blocks.1",
       F,
       v1::LAYERWISE},
      {"backward only: the lowest index, whatever the order of the entries",
       v1::REPRODUCED_EXACT,
       false,
       {{3, "blocks.2", B, kBad}, {2, "blocks.1", B, kBad}, {1, "blocks.0", B, kOk}},
       nullptr,
       v1::NUMERICS,
       "blocks.1",
       B,
       v1::LAYERWISE},
      {"bisect alone names the layer when layerwise passes",
       v1::REPRODUCED_EXACT,
       false,
       {{0, "embed", F, kOk}},
       "blocks.3",
       v1::NUMERICS,
       "blocks.3",
       F,
       v1::BISECT},
      {"layerwise is preferred to a disagreeing bisect",
       v1::REPRODUCED_EXACT,
       false,
       {{1, "blocks.0", F, kBad}},
       "blocks.4",
       v1::NUMERICS,
       "blocks.0",
       F,
       v1::LAYERWISE},
      {"not reproduced is transient, even with a divergent layer",
       v1::NOT_REPRODUCED,
       false,
       {{1, "blocks.0", F, kBad}},
       nullptr,
       v1::TRANSIENT,
       "blocks.0",
       F,
       v1::LAYERWISE},
      {"an anomalous reference is data or model",
       v1::REPRODUCED_EXACT,
       true,
       {{1, "blocks.0", F, kBad}},
       "blocks.0",
       v1::DATA_OR_MODEL,
       "blocks.0",
       F,
       v1::LAYERWISE},
      {"everything agrees",
       v1::REPRODUCED_EXACT,
       false,
       {{0, "embed", F, kOk}, {0, "embed", B, kOk}},
       "",
       v1::NO_DIVERGENCE,
       nullptr,
       v1::PHASE_UNSPECIFIED,
       v1::DIVERGENCE_SOURCE_UNSPECIFIED},
  };
  for (const DiagnoseCase& c : cases) {
    v1::ReplayReport r;
    r.set_fidelity(c.fidelity);
    r.set_reference_anomalous(c.reference_anomalous);
    for (const Row& row : c.layers) {
      v1::LayerComparison& l = *r.add_layers();
      l.set_index(row.index);
      l.set_name(row.name);
      l.set_phase(row.phase);
      l.set_verdict(row.verdict);
    }
    if (c.bisect_first_bad != nullptr) {
      r.mutable_bisect()->set_strategy("bisect");
      r.mutable_bisect()->set_first_bad_layer(c.bisect_first_bad);
    }
    internal::Diagnose(r);
    EXPECT_EQ(r.diagnosis(), c.diagnosis) << c.what;
    EXPECT_EQ(r.has_first_divergent_layer(), c.first_layer != nullptr) << c.what;
    if (c.first_layer != nullptr) {
      EXPECT_EQ(r.first_divergent_layer(), c.first_layer) << c.what;
    }
    EXPECT_EQ(r.first_divergent_phase(), c.first_phase) << c.what;
    EXPECT_EQ(r.first_divergent_source(), c.source) << c.what;
    EXPECT_EQ(r.diagnosis_text(), "") << c.what;  // facts only
  }
}

// A capsule whose trigger watched `kind` with the observed value and threshold given, and the
// forward stats of one layer.
v1::Capsule Captured(v1::TriggerKind kind, double observed, double threshold = 0) {
  v1::Capsule c;
  c.mutable_trigger()->set_kind(kind);
  c.mutable_trigger()->set_observed(observed);
  c.mutable_trigger()->set_threshold(threshold);
  v1::LayerStats& l = *c.mutable_numerics()->add_layers();
  l.set_name("blocks.0");
  l.set_phase(v1::FORWARD);
  l.mutable_stats()->set_numel(8);
  l.mutable_stats()->set_min(-1);
  l.mutable_stats()->set_max(2);
  l.mutable_stats()->set_mean(0.5);
  l.mutable_stats()->set_rms(1.25);
  return c;
}

// A replayed run with the given loss and grad norm whose blocks.0 stats equal Captured's.
ProbeResult ReplayedRun(double loss, double grad_norm = 1.0) {
  ProbeResult r;
  r.loss_value = loss;
  r.grad_norm = grad_norm;
  r.backward_done = true;
  LayerRecord rec;
  rec.name = "blocks.0";
  rec.forward.numel = 8;
  rec.forward.min = -1;
  rec.forward.max = 2;
  rec.forward.mean = 0.5;
  rec.forward.rms = 1.25;
  r.layers.push_back(rec);
  return r;
}

v1::Fidelity Judge(const v1::Capsule& c, const ProbeResult& run) {
  v1::ReplayReport report;
  internal::JudgeFidelity(c, run, report);
  EXPECT_EQ(report.trigger(), c.trigger().kind());
  EXPECT_TRUE(report.captured_value() == c.trigger().observed() ||
              (std::isnan(report.captured_value()) && std::isnan(c.trigger().observed())));
  return report.fidelity();
}

TEST(JudgeFidelityTest, NonFiniteLossFiresAgainOrNot) {
  const v1::Capsule c = Captured(v1::NON_FINITE_LOSS, kNan);
  EXPECT_EQ(Judge(c, ReplayedRun(kNan)), v1::REPRODUCED_EXACT);
  EXPECT_EQ(Judge(c, ReplayedRun(4.25)), v1::NOT_REPRODUCED);
}

TEST(JudgeFidelityTest, DifferentLayerStatsMakeItApproximate) {
  const v1::Capsule c = Captured(v1::NON_FINITE_LOSS, kNan);
  ProbeResult run = ReplayedRun(kNan);
  run.layers[0].forward.rms = 1.2500000000000002;  // one ulp away
  EXPECT_EQ(Judge(c, run), v1::REPRODUCED_APPROX);
}

TEST(JudgeFidelityTest, SpikesCompareWithTheThreshold) {
  const v1::Capsule loss = Captured(v1::LOSS_SPIKE, 9.5, 7.0);
  EXPECT_EQ(Judge(loss, ReplayedRun(9.5)), v1::REPRODUCED_EXACT);
  EXPECT_EQ(Judge(loss, ReplayedRun(8.0)), v1::REPRODUCED_APPROX);
  EXPECT_EQ(Judge(loss, ReplayedRun(6.0)), v1::NOT_REPRODUCED);
  const v1::Capsule grad = Captured(v1::GRAD_NORM_SPIKE, 40.0, 10.0);
  EXPECT_EQ(Judge(grad, ReplayedRun(3.0, 40.0)), v1::REPRODUCED_EXACT);
  EXPECT_EQ(Judge(grad, ReplayedRun(3.0, 2.0)), v1::NOT_REPRODUCED);
}

TEST(JudgeFidelityTest, ExceptionFiresWhenTheRunThrows) {
  const v1::Capsule c = Captured(v1::EXCEPTION, 0);
  ProbeResult threw = ReplayedRun(0);
  threw.error = "layer blocks.0 threw";
  EXPECT_NE(Judge(c, threw), v1::NOT_REPRODUCED);
  EXPECT_EQ(Judge(c, ReplayedRun(0)), v1::NOT_REPRODUCED);
}

TEST(JudgeFidelityTest, ManualCaptureWithoutALossIsNotCheckedNeverNotReproduced) {
  // CaptureNow before EndStep: no observed value, no loss for the step in the history.
  v1::Capsule c = Captured(v1::MANUAL, kNan);
  c.mutable_step()->set_global_step(3);
  c.mutable_step()->add_history()->set_step(2);
  c.mutable_step()->mutable_history(0)->set_loss(4.0);
  v1::ReplayReport report;
  internal::JudgeFidelity(c, ReplayedRun(4.25), report);
  EXPECT_EQ(report.fidelity(), v1::NOT_CHECKED);
  EXPECT_NE(report.fidelity_detail().find("nothing to compare"), std::string::npos);
  // With a NaN loss recorded for the step, NaN is what was observed.
  v1::StepScalars& now = *c.mutable_step()->add_history();
  now.set_step(3);
  now.set_loss(kNan);
  EXPECT_EQ(Judge(c, ReplayedRun(kNan)), v1::REPRODUCED_EXACT);
}

TEST(JudgeFidelityTest, ExceptionDetailQuotesIt) {
  v1::Capsule c = Captured(v1::EXCEPTION, 0);
  c.mutable_trigger()->set_message("kernel exploded");
  v1::ReplayReport gone;
  internal::JudgeFidelity(c, ReplayedRun(1.33), gone);
  EXPECT_EQ(gone.fidelity_detail(),
            "the exception did not recur in the model's layers (captured: \"kernel exploded\"); "
            "replayed loss 1.33");
  ProbeResult threw = ReplayedRun(0);
  threw.error = "layer blocks.0 threw: bad shape";
  v1::ReplayReport again;
  internal::JudgeFidelity(c, threw, again);
  EXPECT_EQ(again.fidelity_detail(),
            "the exception recurred in the model's layers: \"layer blocks.0 threw: bad shape\" "
            "(captured: \"kernel exploded\")");
}

TEST(JudgeFidelityTest, AnAccumulatedStepsLossIsLeftToTheObjectiveStage) {
  // The trainer's loss over micro-batches equals one pass over them only when it normalises
  // right; judging it here would call a normaliser bug transient.
  v1::Capsule c = Captured(v1::MANUAL, 4.25);
  c.mutable_data()->set_micro_batches(4);
  v1::ReplayReport report;
  internal::JudgeFidelity(c, ReplayedRun(4.5), report);
  EXPECT_EQ(report.fidelity(), v1::NOT_CHECKED);
  EXPECT_NE(report.fidelity_detail().find("4 micro-batches"), std::string::npos);
  c.mutable_data()->set_micro_batches(1);
  EXPECT_EQ(Judge(c, ReplayedRun(4.5)), v1::NOT_REPRODUCED);
}

TEST(DiagnoseTest, AnOptimizerFindingExplainsBeforeTheNumerics) {
  v1::ReplayReport report;
  report.set_fidelity(v1::REPRODUCED_EXACT);
  v1::StageReport& s = *report.add_stages();
  s.set_stage(v1::STAGE_OPTIMIZER);
  s.set_ran(true);
  s.set_explains(true);
  v1::LayerComparison& l = *report.add_layers();
  l.set_name("blocks.1");
  l.set_phase(v1::FORWARD);
  l.set_verdict(v1::DIVERGED);
  internal::Diagnose(report);
  EXPECT_EQ(report.diagnosis(), v1::OPTIMIZER);
  EXPECT_EQ(report.first_divergent_layer(), "blocks.1");
}

TEST(DiagnoseTest, TheBackwardBisectNamesABlockTheForwardCannotSee) {
  // A detach() on the optimized path only: the forward is exact, layerwise comparison passes (or
  // was off), and only the backward bisect finds the block.
  v1::ReplayReport r;
  r.set_fidelity(v1::NOT_CHECKED);
  r.mutable_bisect()->set_strategy("bisect");
  r.mutable_backward_bisect()->set_strategy("bisect");
  r.mutable_backward_bisect()->set_first_bad_layer("blocks.2");
  internal::Diagnose(r);
  EXPECT_EQ(r.diagnosis(), v1::NUMERICS);
  EXPECT_EQ(r.first_divergent_layer(), "blocks.2");
  EXPECT_EQ(r.first_divergent_phase(), v1::BACKWARD);
  EXPECT_EQ(r.first_divergent_source(), v1::BISECT);
  // The forward bisect's layer comes first when it has one.
  r.mutable_bisect()->set_first_bad_layer("blocks.1");
  internal::Diagnose(r);
  EXPECT_EQ(r.first_divergent_layer(), "blocks.1");
  EXPECT_EQ(r.first_divergent_phase(), v1::FORWARD);
}

TEST(GateTest, AFailureIsGoneWhenNothingDivergesNothingFailsAndTheTriggerDoesNotFire) {
  v1::Capsule c = Captured(v1::NON_FINITE_LOSS, kNan);
  c.mutable_numerics()->set_first_anomalous_layer("blocks.2");
  v1::ReplayReport fixed;
  fixed.set_fidelity(v1::NOT_REPRODUCED);
  fixed.set_diagnosis(v1::TRANSIENT);
  GateVerdict v = JudgeGate(c, fixed);
  EXPECT_TRUE(v.passed) << v.reason;
  EXPECT_EQ(v.old_verdict, "NON_FINITE_LOSS at blocks.2");
  // The NaN still comes back: failing, even with every layer in agreement.
  v1::ReplayReport again = fixed;
  again.set_fidelity(v1::REPRODUCED_EXACT);
  EXPECT_FALSE(JudgeGate(c, again).passed);
  // A manual capture reproduces by design; only its layers and stages judge it.
  EXPECT_TRUE(JudgeGate(Captured(v1::MANUAL, 4.0), again).passed);
  // A layer that still diverges, or a failed triage finding, fails it.
  v1::ReplayReport diverged = fixed;
  v1::LayerComparison& l = *diverged.add_layers();
  l.set_name("blocks.1");
  l.set_phase(v1::FORWARD);
  l.set_verdict(v1::DIVERGED);
  v = JudgeGate(c, diverged);
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.reason, "the optimized path still diverges at blocks.1 (FORWARD)");
  v1::ReplayReport finding = fixed;
  v1::StageReport& s = *finding.add_stages();
  s.set_stage(v1::STAGE_DATA);
  v1::Finding& f = *s.add_findings();
  f.set_check("data.bad_sample");
  f.set_failed(true);
  EXPECT_EQ(JudgeGate(c, finding).reason, "a triage finding still fails: data.bad_sample");
}

TEST(JudgeFidelityTest, ManualCaptureReproducesTheStepItself) {
  const v1::Capsule c = Captured(v1::MANUAL, 4.25);
  EXPECT_EQ(Judge(c, ReplayedRun(4.25)), v1::REPRODUCED_EXACT);
  EXPECT_EQ(Judge(c, ReplayedRun(4.25 + 1e-9)), v1::REPRODUCED_APPROX);
  EXPECT_EQ(Judge(c, ReplayedRun(4.5)), v1::NOT_REPRODUCED);
}

}  // namespace
}  // namespace capsule
