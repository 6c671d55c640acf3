// The data and objective stages on a classifier's batch (replay/internal/classification_stage.h),
// on hand-made logits: what each check names, and the declared loss each is held to.
#include "capsule/replay/internal/classification_stage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "capsule/proto/capsule.pb.h"
#include "tests/replay/stage_test_util.h"

namespace capsule::internal {
namespace {

using stage_test::FailedChecks;
using stage_test::Find;
using stage_test::FindAll;

struct Case {
  v1::Capsule capsule;
  LayerBatch batch;
  at::Tensor logits;

  TriageInput Input() const {
    TriageInput in;
    in.capsule = &capsule;
    in.batch = &batch;
    in.logits = logits;
    return in;
  }
};

// Four samples of 3 classes.
Case Classifier() {
  Case c;
  c.batch.inputs = at::randn({4, 5}, at::TensorOptions().dtype(at::kFloat));
  c.batch.labels = at::tensor(std::vector<int64_t>{0, 2, 1, 2});
  c.logits = at::tensor(std::vector<double>{2, 0, 1, 0, 1, 3, 1, 1, 1, -1, 0, 2}).reshape({4, 3});
  c.capsule.mutable_objective()->set_kind(v1::CLASSIFICATION);
  return c;
}

// The FP64 cross-entropy of the samples with a target, by hand.
double Mean(const Case& c, double smoothing, bool sum = false, int64_t ignore = -100) {
  double total = 0;
  int n = 0;
  for (int64_t b = 0; b < 4; ++b) {
    const int64_t y = c.batch.labels[b].item<int64_t>();
    if (y == ignore) continue;
    double z = 0, all = 0;
    for (int64_t k = 0; k < 3; ++k) z += std::exp(c.logits[b][k].item<double>());
    for (int64_t k = 0; k < 3; ++k) all += std::log(z) - c.logits[b][k].item<double>();
    total += (1 - smoothing) * (std::log(z) - c.logits[b][y].item<double>()) + smoothing * all / 3;
    ++n;
  }
  return sum ? total : total / n;
}

TEST(ClassificationStageTest, ShapesOrTheDeclarationMakeABatchAClassifiers) {
  Case c = Classifier();
  EXPECT_TRUE(IsClassificationBatch(c.Input()));
  c.capsule.mutable_objective()->set_kind(v1::OBJECTIVE_KIND_UNSPECIFIED);
  EXPECT_TRUE(IsClassificationBatch(c.Input()));  // labels [B], logits [B, C]
  c.capsule.mutable_objective()->set_kind(v1::LANGUAGE_MODEL);
  EXPECT_FALSE(IsClassificationBatch(c.Input()));
}

TEST(ClassificationStageTest, ACleanBatchHasNoFailedFinding) {
  Case c = Classifier();
  TriageInput in = c.Input();
  in.model_loss = Mean(c, 0);
  const v1::StageReport data = RunClassificationDataStage(in);
  const v1::StageReport obj = RunClassificationObjectiveStage(in);
  EXPECT_TRUE(data.ran() && obj.ran()) << data.skipped_reason() << obj.skipped_reason();
  EXPECT_TRUE(FailedChecks(data).empty() && FailedChecks(obj).empty());
}

TEST(ClassificationStageTest, DataChecksNameTheSample) {
  Case c = Classifier();
  c.batch.labels[1] = 3;  // of 3 classes
  c.batch.inputs[3][2] = NAN;
  const v1::StageReport r = RunClassificationDataStage(c.Input());
  ASSERT_EQ(FailedChecks(r),
            (std::vector<std::string>{"data.non_finite_input", "data.label_out_of_range"}));
  EXPECT_EQ(r.findings(0).sample_index(), 3);
  EXPECT_EQ(r.findings(1).sample_index(), 1);
  c.batch.labels.fill_(-100);
  EXPECT_EQ(FailedChecks(RunClassificationDataStage(c.Input())),
            (std::vector<std::string>{"data.non_finite_input", "data.empty_batch"}));
}

TEST(ClassificationStageTest, ConstantTargetsAreANote) {
  Case c = Classifier();
  c.batch.labels.fill_(2);
  const v1::StageReport r = RunClassificationDataStage(c.Input());
  EXPECT_TRUE(FailedChecks(r).empty());
  bool noted = false;
  for (const v1::Finding& f : r.findings()) noted |= f.check() == "data.constant_targets";
  EXPECT_TRUE(noted);
}

TEST(ClassificationStageTest, TheDeclaredSmoothingIgnoreIndexAndReductionAreHeldTo) {
  Case c = Classifier();
  c.capsule.mutable_objective()->set_label_smoothing(0.2);
  c.capsule.mutable_objective()->set_ignore_index(1);
  TriageInput in = c.Input();
  in.model_loss = Mean(c, 0.2, false, 1);
  EXPECT_TRUE(FailedChecks(RunClassificationObjectiveStage(in)).empty());
  in.model_loss = Mean(c, 0, false, 1);  // no smoothing applied
  EXPECT_EQ(FailedChecks(RunClassificationObjectiveStage(in)),
            (std::vector<std::string>{"objective.loss_matches", "objective.label_smoothing"}));
  in.model_loss = Mean(c, 0.2, true, 1);  // the sum
  EXPECT_EQ(FailedChecks(RunClassificationObjectiveStage(in)),
            (std::vector<std::string>{"objective.loss_matches", "objective.reduction_sum"}));
  in.model_loss = Mean(c, 0.2, true, 1) / 4;  // divided by every sample, the ignored one too
  EXPECT_EQ(
      FailedChecks(RunClassificationObjectiveStage(in)),
      (std::vector<std::string>{"objective.loss_matches", "objective.masked_positions_counted"}));
}

TEST(ClassificationStageTest, TheTrainersLossIsHeldToTheStepModesLogits) {
  Case c = Classifier();
  v1::StepScalars& h = *c.capsule.mutable_step()->add_history();
  c.capsule.mutable_step()->set_global_step(7);
  h.set_step(7);
  Case step_mode = Classifier();
  step_mode.logits = c.logits * 2;
  h.set_loss(Mean(step_mode, 0));
  TriageInput in = c.Input();
  in.model_loss = Mean(c, 0);
  in.step_logits = step_mode.logits;
  EXPECT_TRUE(FailedChecks(RunClassificationObjectiveStage(in)).empty());
  h.set_loss(2 * Mean(step_mode, 0));
  EXPECT_EQ(FailedChecks(RunClassificationObjectiveStage(in)),
            (std::vector<std::string>{"objective.trainer_loss_matches", "objective.unexplained"}));
}

TEST(ClassificationStageTest, AMeanWhereTheTrainerDeclaresASumIsNamed) {
  Case c = Classifier();
  c.capsule.mutable_objective()->set_reduction(v1::TOKEN_SUM);
  TriageInput in = c.Input();
  in.model_loss = Mean(c, 0, true);
  const v1::StageReport ok = RunClassificationObjectiveStage(in);
  EXPECT_TRUE(FailedChecks(ok).empty()) << ok.DebugString();
  EXPECT_TRUE(Find(ok, "objective.reduction_token_mean") == nullptr);

  in.model_loss = Mean(c, 0);
  const v1::StageReport r = RunClassificationObjectiveStage(in);
  EXPECT_EQ(FailedChecks(r),
            (std::vector<std::string>{"objective.loss_matches", "objective.reduction_token_mean"}));
  const v1::Finding* f = Find(r, "objective.reduction_token_mean");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_LE(f->value(), kLossMatchRelTol);
  EXPECT_EQ(f->threshold(), kLossMatchRelTol);
  EXPECT_FALSE(f->detail().empty());
  // Just off the mean: unexplained, not named as it.
  in.model_loss = Mean(c, 0) * (1 + 1e-5);
  EXPECT_EQ(FailedChecks(RunClassificationObjectiveStage(in)),
            (std::vector<std::string>{"objective.loss_matches", "objective.unexplained"}));
}

TEST(ClassificationStageTest, ThePerSampleLossNoteGivesTheLargestCrossEntropy) {
  Case c = Classifier();
  c.capsule.mutable_data()->mutable_cursor()->add_sample_indices(40);
  c.capsule.mutable_data()->mutable_cursor()->add_sample_indices(41);
  c.capsule.mutable_data()->mutable_cursor()->add_sample_indices(42);
  c.capsule.mutable_data()->mutable_cursor()->add_sample_indices(43);
  // Sample 2's logits are uniform: its loss, log 3, is the worst of the batch.
  double worst = 0;
  int64_t worst_sample = -1;
  for (int64_t b = 0; b < 4; ++b) {
    const at::Tensor row = c.logits[b];
    const double loss =
        (row.exp().sum().log() - row[c.batch.labels[b].item<int64_t>()]).item<double>();
    if (loss > worst) {
      worst = loss;
      worst_sample = b;
    }
  }
  ASSERT_EQ(worst_sample, 2);
  const v1::StageReport r = RunClassificationDataStage(c.Input());
  const v1::Finding* f = Find(r, "data.per_sample_loss");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed());
  EXPECT_NEAR(f->value(), worst, 1e-12);
  EXPECT_NEAR(f->threshold(), std::log(3.0), 1e-15);
  ASSERT_TRUE(f->has_sample_index());
  EXPECT_EQ(f->sample_index(), 2);
  ASSERT_TRUE(f->has_dataset_index());
  EXPECT_EQ(f->dataset_index(), 42);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_TRUE(FailedChecks(r).empty());
  // No sample with a target: nothing to rank.
  c.batch.labels.fill_(-100);
  EXPECT_TRUE(Find(RunClassificationDataStage(c.Input()), "data.per_sample_loss") == nullptr);
}

TEST(ClassificationStageTest, NonFiniteInputsAreNamedForAtMostEightSamples) {
  Case c = Classifier();
  c.batch.inputs = at::randn({12, 5}, at::TensorOptions().dtype(at::kFloat));
  c.batch.labels = at::zeros({12}, at::kLong);
  c.logits = at::zeros({12, 3}, at::kDouble);
  EXPECT_TRUE(Find(RunClassificationDataStage(c.Input()), "data.non_finite_input") == nullptr);
  for (int64_t b = 1; b < 11; ++b) c.batch.inputs[b][b % 5] = b % 2 ? INFINITY : NAN;
  c.batch.inputs[3][0] = -INFINITY;
  const v1::StageReport r = RunClassificationDataStage(c.Input());
  std::vector<int> samples;
  for (const v1::Finding& f : r.findings()) {
    if (f.check() != "data.non_finite_input") continue;
    EXPECT_TRUE(f.failed());
    EXPECT_EQ(f.threshold(), 0);
    EXPECT_EQ(f.value(), f.sample_index() == 3 ? 2 : 1);
    samples.push_back(f.sample_index());
  }
  EXPECT_EQ(samples, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
}

}  // namespace
}  // namespace capsule::internal
