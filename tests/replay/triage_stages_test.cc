// The triage stages (replay/internal/triage.h) on hand-built batches: each check on ordinary,
// legal data of a right-padded decoder (pad id in the inputs, labels -100 or the pad id at padded
// positions, loss mask 0 there), and on the faults each check exists for.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/diagnosis.h"
#include "capsule/replay/internal/triage.h"
#include "tests/replay/stage_test_util.h"

namespace capsule {
namespace {

using stage_test::Find;
using stage_test::FindAll;
using stage_test::kPad;
using stage_test::kVocab;
using stage_test::PaddedBatch;

// Logits of a model that has learned the batch: the target's logit stands out by `margin`.
at::Tensor LearnedLogits(const LayerBatch& b, double margin = 4.0) {
  at::Tensor targets = b.labels.clamp_min(0);
  at::Tensor logits = at::zeros({b.labels.size(0), b.labels.size(1), kVocab}, at::kDouble);
  logits.scatter_(2, targets.unsqueeze(-1), margin);
  return logits;
}

// The FP64 token mean the stages compute, for a model loss that matches it.
double TokenMean(const LayerBatch& b, const at::Tensor& logits) {
  const at::Tensor valid = b.labels.ne(-100).logical_and(b.loss_mask.ne(0));
  const at::Tensor nll =
      -at::log_softmax(logits, -1).gather(-1, b.labels.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  return (nll * valid.to(at::kDouble)).sum().item<double>() / valid.sum().item<double>();
}

struct Case {
  LayerBatch batch;
  at::Tensor logits;
  v1::Capsule capsule;
  internal::TriageInput Input() const {
    internal::TriageInput in;
    in.capsule = &capsule;
    in.batch = &batch;
    in.logits = logits;
    in.model_loss = TokenMean(batch, logits);
    return in;
  }
};

Case MakeCase(const std::vector<int64_t>& lengths, int64_t seq, uint64_t seed,
              v1::LossReduction reduction = v1::TOKEN_MEAN, bool ignore_pad = false) {
  Case c;
  c.batch = PaddedBatch(lengths, seq, seed, ignore_pad);
  c.logits = LearnedLogits(c.batch);
  c.capsule.mutable_objective()->set_reduction(reduction);
  return c;
}

int Failed(const v1::StageReport& r) {
  int n = 0;
  for (const auto& f : r.findings()) n += f.failed();
  return n;
}

TEST(TriageStagesTest, CleanRightPaddedBatchesHaveNoFailedFinding) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    for (bool ignore_pad : {false, true}) {
      const Case c = MakeCase({12, 4, 7, 2}, 16, seed, v1::TOKEN_MEAN, ignore_pad);
      const internal::TriageInput in = c.Input();
      const v1::StageReport data = internal::RunDataStage(in);
      const v1::StageReport obj = internal::RunObjectiveStage(in);
      ASSERT_TRUE(data.ran() && obj.ran()) << data.skipped_reason() << obj.skipped_reason();
      EXPECT_EQ(Failed(data), 0) << "seed " << seed << ": " << data.DebugString();
      EXPECT_EQ(Failed(obj), 0) << "seed " << seed << ": " << obj.DebugString();
    }
  }
}

TEST(TriageStagesTest, AnAllPaddingSampleIsANoteUnderATokenMean) {
  for (v1::LossReduction red : {v1::TOKEN_MEAN, v1::TOKEN_SUM, v1::LOSS_REDUCTION_UNSPECIFIED}) {
    const Case c = MakeCase({10, 0, 6}, 12, 3, red);
    const v1::StageReport r = internal::RunDataStage(c.Input());
    const v1::Finding* f = Find(r, "data.empty_sample");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed()) << f->detail();
    EXPECT_EQ(f->sample_index(), 1);
    EXPECT_FALSE(r.explains());
  }
  // A per-sequence mean of it is 0/0: bad data.
  const Case c = MakeCase({10, 0, 6}, 12, 3, v1::SEQUENCE_MEAN);
  const v1::StageReport r = internal::RunDataStage(c.Input());
  const v1::Finding* f = Find(r, "data.empty_sample");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->failed());
  EXPECT_TRUE(r.explains());
}

TEST(TriageStagesTest, WithAnEmptySampleTheDiagnosisFollowsTheNumerics) {
  const Case c = MakeCase({10, 0, 6}, 12, 5);
  v1::ReplayReport report;
  report.set_fidelity(v1::REPRODUCED_EXACT);
  *report.add_stages() = internal::RunDataStage(c.Input());
  *report.add_stages() = internal::RunObjectiveStage(c.Input());
  v1::LayerComparison& l = *report.add_layers();
  l.set_index(2);
  l.set_name("blocks.1");
  l.set_phase(v1::FORWARD);
  l.set_verdict(v1::DIVERGED);
  internal::Diagnose(report);
  EXPECT_EQ(report.diagnosis(), v1::NUMERICS);
  EXPECT_EQ(report.first_divergent_layer(), "blocks.1");
}

TEST(TriageStagesTest, LabelsEqualInputsCountsOnlyPositionsInTheLoss) {
  // Mostly padding, labelled with the pad id (= the input there) and masked out of the loss.
  const Case c = MakeCase({4, 3, 5, 2}, 16, 7);
  const v1::StageReport r = internal::RunObjectiveStage(c.Input());
  const v1::Finding* f = Find(r, "objective.labels_equal_inputs");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed()) << f->detail();
  EXPECT_LT(f->value(), 0.2) << f->detail();
}

// Labels equal to the input `offset` positions on, in the loss.
Case ShiftedCase(int64_t offset, bool declared_shifted, uint64_t seed) {
  Case c = MakeCase({24, 24, 24}, 24, seed);
  const int64_t t = c.batch.labels.size(1);
  at::Tensor labels = at::full_like(c.batch.labels, -100);
  const int64_t lo = std::max<int64_t>(0, -offset), hi = std::min(t, t - offset);
  labels.slice(1, lo, hi).copy_(c.batch.input_ids.slice(1, lo + offset, hi + offset));
  c.batch.labels = labels;
  c.batch.loss_mask = at::ones_like(labels);
  c.batch.labels_shifted = declared_shifted;
  c.logits = LearnedLogits(c.batch);
  return c;
}

TEST(TriageStagesTest, EverySmallLabelShiftIsFoundAndNamed) {
  for (bool declared : {true, false}) {
    const int64_t right = declared ? 1 : 0;
    for (int64_t offset = right - 4; offset <= right + 4; ++offset) {
      const Case c = ShiftedCase(offset, declared, 11 + offset);
      const v1::StageReport r = internal::RunObjectiveStage(c.Input());
      const v1::Finding* f = Find(r, "objective.labels_equal_inputs");
      ASSERT_NE(f, nullptr) << r.DebugString();
      EXPECT_EQ(f->failed(), offset != right)
          << "offset " << offset << " declared shifted " << declared << ": " << f->detail();
      if (offset != right) {
        EXPECT_EQ(f->label_offset(), offset) << f->detail();
        EXPECT_NE(f->detail().find("shifted by " + std::to_string(offset)), std::string::npos)
            << f->detail();
      }
    }
  }
}

TEST(TriageStagesTest, APeriodicSequenceIsNotAShift) {
  // Period 2: the labels match the inputs at offsets 1, 3 and 5 equally; the declared one wins.
  Case c = MakeCase({20, 20}, 20, 1);
  c.batch.input_ids = at::arange(20, at::kLong).remainder(2).add(1).repeat({2, 1});
  c.batch.labels = c.batch.input_ids.roll(-1, 1);
  c.batch.labels.select(1, 19).fill_(-100);
  c.batch.loss_mask = at::ones_like(c.batch.labels);
  c.logits = LearnedLogits(c.batch);
  const v1::StageReport r = internal::RunObjectiveStage(c.Input());
  const v1::Finding* f = Find(r, "objective.labels_equal_inputs");
  ASSERT_NE(f, nullptr);
  EXPECT_FALSE(f->failed()) << f->detail();
}

// An accumulated step of two micro-batches whose trainer loss is `factor` times the token mean.
Case AccumulatedCase(double factor) {
  Case c = MakeCase({10, 6, 8, 3}, 12, 21);
  c.capsule.mutable_data()->set_micro_batches(2);
  for (int s = 0; s < 4; ++s) c.capsule.mutable_data()->add_sequences()->set_micro_batch(s / 2);
  c.capsule.mutable_step()->set_global_step(9);
  auto* h = c.capsule.mutable_step()->add_history();
  h->set_step(9);
  h->set_loss(factor * TokenMean(c.batch, c.logits));
  return c;
}

TEST(TriageStagesTest, ATrainerLossOffTheDeclaredObjectiveFails) {
  {
    const Case c = AccumulatedCase(1.0 + 1e-7);
    const v1::StageReport r = internal::RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(r, "objective.trainer_loss");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed());
    EXPECT_FALSE(r.explains());
  }
  {
    // Twice: the accumulated loss was not divided by the two micro-batches.
    const Case c = AccumulatedCase(2.0);
    const v1::StageReport r = internal::RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(r, "objective.accumulation_not_divided");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_TRUE(f->failed());
    v1::ReplayReport report;
    report.set_fidelity(v1::NOT_CHECKED);
    *report.add_stages() = r;
    internal::Diagnose(report);
    EXPECT_EQ(report.diagnosis(), v1::OBJECTIVE);
  }
  {
    Case c = AccumulatedCase(1.3);
    const v1::StageReport r = internal::RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(r, "objective.trainer_loss");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_TRUE(f->failed()) << f->detail();
    EXPECT_TRUE(r.explains());
    // Averaged over two data-parallel ranks, the loss need not be this rank's batch's: a note.
    c.capsule.mutable_objective()->set_ranks(2);
    const v1::StageReport two = internal::RunObjectiveStage(c.Input());
    ASSERT_NE(Find(two, "objective.trainer_loss"), nullptr);
    EXPECT_FALSE(Find(two, "objective.trainer_loss")->failed());
  }
}

TEST(TriageStagesTest, TheTrainerLossToleranceFollowsThePathsPrecision) {
  // A path 1e-3 from the reference (a bfloat16 model) may report a loss 1e-3 off.
  Case c = AccumulatedCase(1.0 + 1e-3);
  internal::TriageInput in = c.Input();
  EXPECT_TRUE(Find(internal::RunObjectiveStage(in), "objective.trainer_loss")->failed());
  in.optimized_loss = in.model_loss * (1 + 1e-3);
  EXPECT_FALSE(Find(internal::RunObjectiveStage(in), "objective.trainer_loss")->failed());
}

TEST(TriageStagesTest, PromptTokensInTheLossAreFoundWhenAResponseMaskIsDeclared) {
  Case c = MakeCase({12, 12}, 12, 31);
  c.batch.response_mask = at::ones_like(c.batch.labels);
  c.batch.response_mask.slice(1, 0, 5).fill_(0);  // a 5-token prompt
  {
    const v1::StageReport r = internal::RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(r, "objective.prompt_in_loss");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_TRUE(f->failed());
    EXPECT_EQ(f->value(), 10);
  }
  // The prompt out of the loss: a pass.
  c.batch.labels.slice(1, 0, 5).fill_(-100);
  const v1::StageReport r = internal::RunObjectiveStage(c.Input());
  const v1::Finding* f = Find(r, "objective.prompt_in_loss");
  ASSERT_NE(f, nullptr);
  EXPECT_FALSE(f->failed()) << f->detail();
  EXPECT_EQ(Failed(r), 0) << r.DebugString();
}

void AddParameter(v1::Capsule& c, const std::string& name, bool requires_grad) {
  v1::TensorBlob& t = *c.add_tensors();
  t.set_name(name);
  t.set_role(v1::PARAMETER);
  t.mutable_meta()->set_requires_grad(requires_grad);
}

TEST(TriageStagesTest, ADeclaredFrozenParameterThatIsTrainedFails) {
  v1::Capsule c;
  c.mutable_model()->add_declared_frozen("embed.*");
  c.mutable_model()->add_declared_frozen("blocks.?.norm.weight");
  c.mutable_model()->add_declared_frozen("no_such_parameter");
  AddParameter(c, "embed.weight", false);
  AddParameter(c, "blocks.0.norm.weight", false);
  AddParameter(c, "blocks.1.norm.weight", true);  // trainable, though declared frozen
  AddParameter(c, "blocks.1.mlp.weight", true);   // not declared
  internal::TriageInput in;
  in.capsule = &c;
  {
    const v1::StageReport r = internal::RunGradientsStage(in);
    ASSERT_TRUE(r.ran());
    ASSERT_EQ(Failed(r), 1) << r.DebugString();
    const v1::Finding* f = Find(r, "gradients.declared_frozen_trained");
    EXPECT_EQ(f->parameter(), "blocks.1.norm.weight");
    const v1::Finding* unmatched = Find(r, "gradients.declared_frozen_unmatched");
    ASSERT_NE(unmatched, nullptr);
    EXPECT_FALSE(unmatched->failed());
  }
  // Not requiring grad, but the optimizer step moved it.
  c.mutable_tensors(2)->mutable_meta()->set_requires_grad(false);
  v1::ParamStep& p = *c.mutable_optimizer()->add_params();
  p.set_name("embed.weight");
  p.set_requires_grad(false);
  p.set_update_norm(0.5);
  c.mutable_optimizer()->set_observed_after(true);
  const v1::StageReport r = internal::RunGradientsStage(in);
  ASSERT_EQ(Failed(r), 1) << r.DebugString();
  EXPECT_EQ(Find(r, "gradients.declared_frozen_trained")->parameter(), "embed.weight");
  // Frozen as declared: no failed finding.
  p.set_update_norm(0);
  EXPECT_EQ(Failed(internal::RunGradientsStage(in)), 0);
}

}  // namespace
}  // namespace capsule
