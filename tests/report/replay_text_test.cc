// report/replay_text.h: the sentence for each diagnosis, phrased from the replay's facts. The
// expected strings are the ones the replayer used to write itself, so `capsule replay` prints the
// same words it always did.
#include "capsule/report/replay_text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "capsule/proto/replay_report.pb.h"

namespace capsule {
namespace {

v1::LayerComparison* AddLayer(v1::ReplayReport& r, int index, const std::string& name,
                              v1::Phase phase, v1::Verdict verdict) {
  v1::LayerComparison* l = r.add_layers();
  l->set_index(index);
  l->set_name(name);
  l->set_phase(phase);
  l->set_verdict(verdict);
  return l;
}

v1::ReplayReport Numerics(const std::string& layer, v1::Phase phase) {
  v1::ReplayReport r;
  r.set_diagnosis(v1::NUMERICS);
  r.set_first_divergent_layer(layer);
  r.set_first_divergent_phase(phase);
  r.set_first_divergent_source(v1::LAYERWISE);
  return r;
}

TEST(DiagnosisSentenceTest, Transient) {
  v1::ReplayReport r;
  r.set_diagnosis(v1::TRANSIENT);
  r.set_fidelity_detail("loss: captured nan, replayed 4.31");
  EXPECT_EQ(DiagnosisSentence(r),
            "transient: the failure did not reproduce (loss: captured nan, replayed 4.31); suspect "
            "hardware, a race or a nondeterministic kernel, and rerun elsewhere");
}

TEST(DiagnosisSentenceTest, DataOrModel) {
  v1::ReplayReport r;
  r.set_diagnosis(v1::DATA_OR_MODEL);
  r.set_reference_loss(12.3456);
  EXPECT_EQ(DiagnosisSentence(r),
            "data or model, not numerics: the FP64 reference path shows the same anomaly "
            "(reference loss 12.3); look at the step's samples, masks, labels and learning rate "
            "rather than skipping the batch");
}

TEST(DiagnosisSentenceTest, NumericsNamesTheLayerAndItsEvidence) {
  v1::ReplayReport r = Numerics("blocks.2", v1::FORWARD);
  AddLayer(r, 2, "blocks.1", v1::FORWARD, v1::OK);
  AddLayer(r, 3, "blocks.2", v1::FORWARD, v1::DIVERGED)->set_nonfinite_mismatch(64);
  EXPECT_EQ(DiagnosisSentence(r),
            "numerics in the optimized path: first divergent layer blocks.2 (forward, 64 "
            "non-finite mismatches)");

  v1::ReplayReport finite = Numerics("blocks.1", v1::BACKWARD);
  AddLayer(finite, 2, "blocks.1", v1::BACKWARD, v1::DIVERGED)->set_max_rel_err(0.0123456);
  EXPECT_EQ(DiagnosisSentence(finite),
            "numerics in the optimized path: first divergent layer blocks.1 (backward, max rel "
            "err 0.0123)");
  // With the bound's ratio (every report since it exists), the sentence says that instead: a
  // relative error on a near-zero reference is no measure of how bad a layer is.
  finite.mutable_layers(0)->set_worst_ratio(37.5);
  EXPECT_EQ(DiagnosisSentence(finite),
            "numerics in the optimized path: first divergent layer blocks.1 (backward, error 37.5x "
            "what its tolerance allows)");
}

TEST(DiagnosisSentenceTest, NumericsSaysWhetherBisectAgrees) {
  v1::ReplayReport r = Numerics("blocks.2", v1::FORWARD);
  AddLayer(r, 3, "blocks.2", v1::FORWARD, v1::DIVERGED)->set_nonfinite_mismatch(64);
  r.mutable_bisect()->set_strategy("bisect");
  r.mutable_bisect()->set_first_bad_layer("blocks.2");
  r.mutable_bisect()->set_probes(4);
  EXPECT_EQ(DiagnosisSentence(r),
            "numerics in the optimized path: first divergent layer blocks.2 (forward, 64 "
            "non-finite mismatches); bisect confirms it in 4 runs");
  r.mutable_bisect()->set_first_bad_layer("blocks.3");
  EXPECT_EQ(DiagnosisSentence(r),
            "numerics in the optimized path: first divergent layer blocks.2 (forward, 64 "
            "non-finite mismatches); bisect points at blocks.3 instead (errors may cancel "
            "downstream)");
  r.mutable_bisect()->clear_first_bad_layer();
  EXPECT_NE(DiagnosisSentence(r).find("; bisect points at no layer instead"), std::string::npos);
}

// A backward divergence is confirmed by the backward bisect, not by the forward one (which finds
// nothing when only the backward is wrong); the features bisect's culprit is named.
TEST(DiagnosisSentenceTest, NumericsInTheBackwardAndTheSwitchItNeeds) {
  v1::ReplayReport r = Numerics("blocks.2", v1::BACKWARD);
  AddLayer(r, 3, "blocks.2", v1::BACKWARD, v1::DIVERGED)->set_worst_ratio(80);
  r.mutable_bisect()->set_strategy("bisect");
  r.mutable_bisect()->set_probes(3);
  r.mutable_backward_bisect()->set_strategy("bisect");
  r.mutable_backward_bisect()->set_phase(v1::BACKWARD);
  r.mutable_backward_bisect()->set_first_bad_layer("blocks.2");
  r.mutable_backward_bisect()->set_probes(4);
  r.mutable_features()->set_outcome(v1::FeatureBisectReport::FOUND);
  r.mutable_features()->add_culprits("fused_gelu");
  EXPECT_EQ(DiagnosisSentence(r),
            "numerics in the optimized path: first divergent layer blocks.2 (backward, error 80x "
            "what its tolerance allows); backward bisect confirms it in 4 runs; it needs the "
            "optimization fused_gelu");
  r.mutable_features()->set_outcome(v1::FeatureBisectReport::NOT_IN_SWITCHES);
  r.mutable_features()->clear_culprits();
  EXPECT_NE(DiagnosisSentence(r).find("; it diverges with every optimization switch off"),
            std::string::npos);
}

TEST(DiagnosisSentenceTest, NumericsFoundByBisectAlone) {
  v1::ReplayReport r = Numerics("blocks.0", v1::FORWARD);
  r.set_first_divergent_source(v1::BISECT);
  AddLayer(r, 1, "blocks.0", v1::FORWARD, v1::OK);
  r.mutable_bisect()->set_strategy("linear");
  r.mutable_bisect()->set_first_bad_layer("blocks.0");
  r.mutable_bisect()->set_probes(8);
  EXPECT_EQ(DiagnosisSentence(r),
            "numerics in the optimized path: linear names first bad layer blocks.0 in 8 "
            "composite runs");
}

TEST(DiagnosisSentenceTest, NoDivergence) {
  v1::ReplayReport r;
  r.set_diagnosis(v1::NO_DIVERGENCE);
  EXPECT_EQ(DiagnosisSentence(r),
            "no divergence: the optimized and reference paths agree within tolerance on every "
            "compared layer");
}

TEST(DiagnosisSentenceTest, ExtractsSpeakOfTheirOneLayer) {
  v1::ReplayReport r = Numerics("blocks.6", v1::FORWARD);
  r.set_extract_layer("blocks.6");
  AddLayer(r, 7, "blocks.6", v1::FORWARD, v1::DIVERGED);
  EXPECT_EQ(DiagnosisSentence(r),
            "numerics in the optimized path: layer blocks.6 diverges from the reference on its "
            "reference input (extract)");
  v1::ReplayReport clean;
  clean.set_diagnosis(v1::NO_DIVERGENCE);
  clean.set_extract_layer("blocks.2");
  EXPECT_EQ(DiagnosisSentence(clean),
            "no divergence: the optimized and reference paths agree within tolerance on layer "
            "blocks.2 (extract)");
}

TEST(DiagnosisSentenceTest, UnspecifiedDiagnosisHasNoSentence) {
  EXPECT_EQ(DiagnosisSentence(v1::ReplayReport()), "");
}

}  // namespace
}  // namespace capsule
