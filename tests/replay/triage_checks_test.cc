// Each check of the data, objective and gradients stages on a language model's batch
// (replay/internal/triage.h), one by one: a hand-built batch that makes it fire, and a near miss
// where it must not. The assertions hold the structured fields (check, failed, value, threshold,
// sample and parameter); the sentences are only required to be there. Last, every check name the
// stages emit is documented in cli/capsule.md.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/triage.h"
#include "tests/replay/stage_test_util.h"

namespace capsule::internal {
namespace {

using stage_test::FailedChecks;
using stage_test::Find;
using stage_test::FindAll;
using stage_test::kPad;
using stage_test::kVocab;
using stage_test::PaddedBatch;

// Logits where sample b's target logit stands `margins[b]` above the other V - 1 (all 0): every
// target token of the sample has the loss MarginLoss(margins[b]).
at::Tensor MarginLogits(const LayerBatch& b, const std::vector<double>& margins) {
  at::Tensor logits = at::zeros({b.labels.size(0), b.labels.size(1), kVocab}, at::kDouble);
  const at::Tensor m = at::tensor(margins, at::kDouble)
                           .view({-1, 1, 1})
                           .expand({b.labels.size(0), b.labels.size(1), 1});
  logits.scatter_(2, b.labels.clamp(0, kVocab - 1).unsqueeze(-1), m.contiguous());
  return logits;
}

double MarginLoss(double margin) {
  return std::log(static_cast<double>(kVocab - 1) + std::exp(margin)) - margin;
}

// Random logits: every token has its own loss, so each reduction of them differs.
at::Tensor RandomLogits(const LayerBatch& b, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return 2 * at::randn({b.labels.size(0), b.labels.size(1), kVocab}, g, at::kDouble);
}

// FP64 cross-entropy of each position of `logits` [B, T, V] against `labels` [B, T], counted where
// `in` is set; what each reduction of it is.
struct Sums {
  at::Tensor seq_sum, seq_n;  // [B]
  double sum = 0, n = 0;
};

Sums Count(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& in) {
  const at::Tensor nll =
      -at::log_softmax(logits, -1).gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  const at::Tensor w = in.to(at::kDouble);
  Sums s;
  s.seq_sum = (nll * w).sum(1);
  s.seq_n = w.sum(1);
  s.sum = s.seq_sum.sum().item<double>();
  s.n = s.seq_n.sum().item<double>();
  return s;
}

// The reductions the objective stage names, by hand, for a batch declared shifted.
struct Reductions {
  double token_sum, token_mean, sequence_mean, other_alignment, every_position, mask_ignored;
  double targets;
};

Reductions Reduce(const LayerBatch& b, const at::Tensor& logits) {
  const at::Tensor valid = b.labels.ne(-100).logical_and(b.loss_mask.ne(0));
  const Sums s = Count(logits, b.labels, valid);
  Reductions r;
  r.targets = s.n;
  r.token_sum = s.sum;
  r.token_mean = s.sum / s.n;
  double means = 0;
  int seqs = 0;
  for (int64_t i = 0; i < b.labels.size(0); ++i) {
    const double n = s.seq_n[i].item<double>();
    if (n == 0) continue;
    means += s.seq_sum[i].item<double>() / n;
    ++seqs;
  }
  r.sequence_mean = means / seqs;
  // labels[i + 1] as the target of position i.
  const int64_t t = b.labels.size(1);
  const at::Tensor next = b.labels.slice(1, 1, t);
  const Sums o = Count(logits.slice(1, 0, t - 1), next,
                       next.ne(-100).logical_and(b.loss_mask.slice(1, 1, t).ne(0)));
  r.other_alignment = o.sum / o.n;
  r.every_position = s.sum / static_cast<double>(b.labels.numel());
  const Sums any = Count(logits, b.labels, b.labels.ne(-100));
  r.mask_ignored = any.sum / any.n;
  return r;
}

struct Case {
  LayerBatch batch;
  at::Tensor logits;
  v1::Capsule capsule;
  double model_loss = 0;

  TriageInput Input() const {
    TriageInput in;
    in.capsule = &capsule;
    in.batch = &batch;
    in.logits = logits;
    in.model_loss = model_loss;
    return in;
  }
};

// Four right-padded samples with random logits, the model's loss the declared token mean.
Case RandomCase(uint64_t seed, v1::LossReduction reduction = v1::TOKEN_MEAN) {
  Case c;
  c.batch = PaddedBatch({12, 4, 7, 2}, 16, seed);
  c.logits = RandomLogits(c.batch, seed + 100);
  c.capsule.mutable_objective()->set_reduction(reduction);
  c.model_loss = Reduce(c.batch, c.logits).token_mean;
  return c;
}

// Full-length samples (no padding) whose target logits stand out by `margins`.
Case MarginCase(const std::vector<double>& margins, uint64_t seed = 3) {
  Case c;
  c.batch = PaddedBatch(std::vector<int64_t>(margins.size(), 12), 12, seed);
  c.logits = MarginLogits(c.batch, margins);
  c.model_loss = Reduce(c.batch, c.logits).token_mean;
  return c;
}

// ---- data ----------------------------------------------------------------------------------

TEST(TriageChecksTest, LabelsOutsideTheVocabularyNameTheSample) {
  Case c = MarginCase({4, 4, 4});
  c.capsule.mutable_data()->add_sequences()->set_sample_id("s0");
  c.capsule.mutable_data()->add_sequences()->set_sample_id("s1");
  c.capsule.mutable_data()->add_sequences()->set_sample_id("s2");
  for (int64_t i : {70, 71, 72}) c.capsule.mutable_data()->mutable_cursor()->add_sample_indices(i);
  // The edges of the vocabulary and the ignore index are legal labels: no finding.
  c.batch.labels[1][2] = kVocab - 1;
  c.batch.labels[1][3] = 0;
  c.batch.labels[1][4] = -100;
  EXPECT_TRUE(FindAll(RunDataStage(c.Input()), "data.label_out_of_vocab").empty());

  c.batch.labels[1][2] = kVocab;
  c.batch.labels[1][3] = -1;
  const v1::StageReport r = RunDataStage(c.Input());
  const auto found = FindAll(r, "data.label_out_of_vocab");
  ASSERT_EQ(found.size(), 1u) << r.DebugString();
  const v1::Finding& f = *found[0];
  EXPECT_TRUE(f.failed());
  EXPECT_TRUE(r.explains());
  EXPECT_EQ(f.value(), 2);
  EXPECT_EQ(f.threshold(), 0);
  ASSERT_TRUE(f.has_sample_index());
  EXPECT_EQ(f.sample_index(), 1);
  EXPECT_EQ(f.sample_id(), "s1");
  ASSERT_TRUE(f.has_dataset_index());
  EXPECT_EQ(f.dataset_index(), 71);
  EXPECT_FALSE(f.detail().empty());
}

// The data stage judges real tokens only (cli/capsule.md, TRIAGE CHECKS): a filler label outside
// the vocabulary on padding (attention mask 0), out of the loss (loss mask 0), is not bad data.
TEST(TriageChecksTest, ALabelOutsideTheVocabularyOnPaddingIsNotBadData) {
  Case c = RandomCase(71);
  const at::Tensor padding = c.batch.attention_mask.eq(0);
  ASSERT_GT(padding.sum().item<int64_t>(), 0);
  ASSERT_TRUE(c.batch.loss_mask.masked_select(padding).eq(0).all().item<bool>());
  c.batch.labels.masked_fill_(padding, -1);
  const v1::StageReport r = RunDataStage(c.Input());
  ASSERT_TRUE(r.ran()) << r.skipped_reason();
  EXPECT_TRUE(Find(r, "data.label_out_of_vocab") == nullptr) << r.DebugString();
  EXPECT_FALSE(r.explains());
}

TEST(TriageChecksTest, AHighButConsistentSampleIsAHardSampleNote) {
  // Sample 2's tokens are predicted better than random (loss below log V), but far worse than
  // the others'.
  const Case c = MarginCase({4, 4, 1, 4});
  ASSERT_LT(MarginLoss(1), std::log(kVocab));
  const v1::StageReport r = RunDataStage(c.Input());
  const auto found = FindAll(r, "data.hard_sample");
  ASSERT_EQ(found.size(), 1u) << r.DebugString();
  const v1::Finding& f = *found[0];
  EXPECT_FALSE(f.failed());
  EXPECT_EQ(f.value(), 0);  // no token at or above log V
  EXPECT_EQ(f.threshold(), kBadSampleUniformFraction);
  ASSERT_TRUE(f.has_sample_index());
  EXPECT_EQ(f.sample_index(), 2);
  EXPECT_FALSE(f.detail().empty());
  EXPECT_TRUE(Find(r, "data.bad_sample") == nullptr);
  EXPECT_TRUE(FailedChecks(r).empty());

  // Less than kBadSampleExcessNats above the others: neither hard nor bad.
  const Case near = MarginCase({4, 4, 2.5, 4});
  ASSERT_LT(MarginLoss(2.5) - MarginLoss(4), kBadSampleExcessNats);
  const v1::StageReport n = RunDataStage(near.Input());
  EXPECT_TRUE(Find(n, "data.hard_sample") == nullptr) << n.DebugString();
  EXPECT_TRUE(Find(n, "data.bad_sample") == nullptr);
}

TEST(TriageChecksTest, ASampleNoBetterThanRandomAmongLearnedOnesIsBadData) {
  // Sample 1's target is below the other logits: every token's loss is above log V.
  Case c = MarginCase({4, -1, 4, 4});
  c.capsule.mutable_data()->mutable_cursor()->add_sample_indices(5);
  c.capsule.mutable_data()->mutable_cursor()->add_sample_indices(9);
  const v1::StageReport r = RunDataStage(c.Input());
  const auto found = FindAll(r, "data.bad_sample");
  ASSERT_EQ(found.size(), 1u) << r.DebugString();
  const v1::Finding& f = *found[0];
  EXPECT_TRUE(f.failed());
  EXPECT_TRUE(r.explains());
  EXPECT_EQ(f.value(), 1);  // every token at or above log V
  EXPECT_EQ(f.threshold(), kBadSampleUniformFraction);
  ASSERT_TRUE(f.has_sample_index());
  EXPECT_EQ(f.sample_index(), 1);
  ASSERT_TRUE(f.has_dataset_index());
  EXPECT_EQ(f.dataset_index(), 9);
  EXPECT_FALSE(f.detail().empty());

  // The same sample while the others have not learned the batch (their loss above 0.75 log V):
  // bad cannot be told from hard, a note.
  const Case unlearned = MarginCase({0.5, -1, 0.5, 0.5});
  ASSERT_GT(MarginLoss(0.5), kLearnedFractionOfLogV * std::log(kVocab));
  ASSERT_GE(MarginLoss(-1) - MarginLoss(0.5), kBadSampleExcessNats);
  const v1::StageReport u = RunDataStage(unlearned.Input());
  EXPECT_TRUE(Find(u, "data.bad_sample") == nullptr) << u.DebugString();
  const v1::Finding* hard = Find(u, "data.hard_sample");
  ASSERT_NE(hard, nullptr) << u.DebugString();
  EXPECT_FALSE(hard->failed());
  EXPECT_EQ(hard->value(), 1);
  EXPECT_EQ(hard->sample_index(), 1);
}

TEST(TriageChecksTest, ThePerSampleLossNoteGivesTheLargestExcess) {
  const Case c = MarginCase({4, 3, 2.5, 3.5});
  const v1::StageReport r = RunDataStage(c.Input());
  const auto found = FindAll(r, "data.per_sample_loss");
  ASSERT_EQ(found.size(), 1u) << r.DebugString();
  const v1::Finding& f = *found[0];
  EXPECT_FALSE(f.failed());
  // Sample 2 against the median of the others (margins 4, 3, 3.5: 3.5).
  EXPECT_NEAR(f.value(), MarginLoss(2.5) - MarginLoss(3.5), 1e-12);
  EXPECT_EQ(f.threshold(), kBadSampleExcessNats);
  ASSERT_TRUE(f.has_sample_index());
  EXPECT_EQ(f.sample_index(), 2);
  EXPECT_FALSE(f.detail().empty());
  EXPECT_TRUE(FailedChecks(r).empty());

  // One sample with targets has no others to be measured against: no note.
  const Case one = MarginCase({4});
  const v1::StageReport o = RunDataStage(one.Input());
  ASSERT_TRUE(o.ran()) << o.skipped_reason();
  EXPECT_TRUE(Find(o, "data.per_sample_loss") == nullptr) << o.DebugString();
}

// ---- objective -----------------------------------------------------------------------------

TEST(TriageChecksTest, TheModelsLossIsHeldToTheDeclaredReduction) {
  for (v1::LossReduction red : {v1::TOKEN_MEAN, v1::SEQUENCE_MEAN, v1::TOKEN_SUM}) {
    Case c = RandomCase(41, red);
    const Reductions h = Reduce(c.batch, c.logits);
    const double declared = red == v1::TOKEN_SUM       ? h.token_sum
                            : red == v1::SEQUENCE_MEAN ? h.sequence_mean
                                                       : h.token_mean;
    c.model_loss = declared * (1 + 1e-8);
    const v1::StageReport ok = RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(ok, "objective.loss_matches");
    ASSERT_NE(f, nullptr) << ok.DebugString();
    EXPECT_FALSE(f->failed()) << "reduction " << red;
    EXPECT_NEAR(f->value(), 1e-8, 1e-9);
    EXPECT_EQ(f->threshold(), kLossMatchRelTol);
    EXPECT_FALSE(f->detail().empty());
    EXPECT_TRUE(FailedChecks(ok).empty()) << ok.DebugString();

    c.model_loss = declared * (1 + 1e-5);
    const v1::StageReport bad = RunObjectiveStage(c.Input());
    f = Find(bad, "objective.loss_matches");
    ASSERT_NE(f, nullptr) << bad.DebugString();
    EXPECT_TRUE(f->failed()) << "reduction " << red;
    EXPECT_NEAR(f->value(), 1e-5, 1e-7);
    EXPECT_TRUE(bad.explains());
  }
}

// The variant each named check stands for, as the model's loss.
struct Variant {
  const char* check;
  v1::LossReduction declared;
  double Reductions::*loss;
};

TEST(TriageChecksTest, ALossThatIsAnotherReductionIsNamed) {
  const Variant variants[] = {
      {"objective.reduction_sum", v1::TOKEN_MEAN, &Reductions::token_sum},
      {"objective.reduction_sum", v1::SEQUENCE_MEAN, &Reductions::token_sum},
      {"objective.reduction_sequence_mean", v1::TOKEN_MEAN, &Reductions::sequence_mean},
      {"objective.reduction_sequence_mean", v1::TOKEN_SUM, &Reductions::sequence_mean},
      {"objective.reduction_token_mean", v1::SEQUENCE_MEAN, &Reductions::token_mean},
      {"objective.reduction_token_mean", v1::TOKEN_SUM, &Reductions::token_mean},
      {"objective.labels_alignment", v1::TOKEN_MEAN, &Reductions::other_alignment},
      {"objective.masked_positions_counted", v1::TOKEN_MEAN, &Reductions::every_position},
      {"objective.loss_mask_ignored", v1::TOKEN_MEAN, &Reductions::mask_ignored},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(std::string(v.check) + " declared " + v1::LossReduction_Name(v.declared));
    Case c = RandomCase(43, v.declared);
    c.model_loss = Reduce(c.batch, c.logits).*v.loss;
    const v1::StageReport r = RunObjectiveStage(c.Input());
    EXPECT_EQ(FailedChecks(r), (std::vector<std::string>{"objective.loss_matches", v.check}))
        << r.DebugString();
    const v1::Finding* f = Find(r, v.check);
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_TRUE(f->failed());
    EXPECT_LE(f->value(), kLossMatchRelTol);
    EXPECT_EQ(f->threshold(), kLossMatchRelTol);
    EXPECT_FALSE(f->detail().empty());

    // Just off the variant: the loss is no longer named as it.
    c.model_loss *= 1 + 1e-5;
    const v1::StageReport off = RunObjectiveStage(c.Input());
    EXPECT_EQ(FailedChecks(off),
              (std::vector<std::string>{"objective.loss_matches", "objective.unexplained"}))
        << off.DebugString();
  }
}

TEST(TriageChecksTest, ALossThatIsNoVariantIsUnexplained) {
  Case c = RandomCase(47);
  const Reductions h = Reduce(c.batch, c.logits);
  c.model_loss = 1.7 * h.token_mean;
  const v1::StageReport r = RunObjectiveStage(c.Input());
  const v1::Finding* f = Find(r, "objective.unexplained");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_NEAR(f->value(), 1.7, 1e-12);
  EXPECT_EQ(f->threshold(), 1);
  EXPECT_FALSE(f->detail().empty());
  // A matching loss names no variant at all.
  c.model_loss = h.token_mean;
  const v1::StageReport ok = RunObjectiveStage(c.Input());
  for (const char* check :
       {"objective.unexplained", "objective.reduction_sum", "objective.reduction_sequence_mean",
        "objective.reduction_token_mean", "objective.labels_alignment",
        "objective.masked_positions_counted", "objective.loss_mask_ignored"}) {
    EXPECT_TRUE(Find(ok, check) == nullptr) << check << ": " << ok.DebugString();
  }
}

TEST(TriageChecksTest, TargetsPredictedFromPaddingAreInTheLoss) {
  Case c = RandomCase(53);
  {
    const v1::StageReport r = RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(r, "objective.padding_in_loss");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed());
    EXPECT_EQ(f->value(), 0);
    EXPECT_EQ(f->threshold(), 0);
    EXPECT_FALSE(f->detail().empty());
  }
  // The loss mask set on the padding too: its pad-id labels are targets, predicted from padding.
  c.batch.loss_mask = c.batch.labels.ne(-100).to(at::kLong);
  const double padded = c.batch.attention_mask.eq(0).sum().item<double>();
  ASSERT_EQ(padded, 4 + 12 + 9 + 14);
  c.model_loss = Reduce(c.batch, c.logits).token_mean;
  const v1::StageReport r = RunObjectiveStage(c.Input());
  const v1::Finding* f = Find(r, "objective.padding_in_loss");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->value(), padded);
  EXPECT_EQ(f->threshold(), 0);
  EXPECT_TRUE(r.explains());
  // Without an attention mask nothing is known to be padding: no finding.
  c.batch.attention_mask = at::Tensor();
  EXPECT_TRUE(Find(RunObjectiveStage(c.Input()), "objective.padding_in_loss") == nullptr);
}

TEST(TriageChecksTest, TheDeclaredNormalizerMustCountTheTargets) {
  Case c = RandomCase(59);
  const double targets = Reduce(c.batch, c.logits).targets;
  ASSERT_EQ(targets, 11 + 3 + 6 + 1);
  c.capsule.mutable_objective()->set_normalizer(targets);
  {
    const v1::StageReport r = RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(r, "objective.normalizer");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed());
    EXPECT_EQ(f->value(), targets);
    EXPECT_EQ(f->threshold(), targets);
    EXPECT_FALSE(f->detail().empty());
  }
  // Every position of the batch, padding included.
  c.capsule.mutable_objective()->set_normalizer(static_cast<double>(c.batch.labels.numel()));
  {
    const v1::StageReport r = RunObjectiveStage(c.Input());
    const v1::Finding* f = Find(r, "objective.normalizer");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_TRUE(f->failed());
    EXPECT_EQ(f->value(), 64);
    EXPECT_EQ(f->threshold(), targets);
    EXPECT_TRUE(r.explains());
  }
  // A normaliser over several ranks, or under a declared sum, is not judged.
  c.capsule.mutable_objective()->set_ranks(2);
  EXPECT_TRUE(Find(RunObjectiveStage(c.Input()), "objective.normalizer") == nullptr);
  c.capsule.mutable_objective()->set_ranks(1);
  c.capsule.mutable_objective()->set_reduction(v1::TOKEN_SUM);
  c.model_loss = Reduce(c.batch, c.logits).token_sum;
  EXPECT_TRUE(Find(RunObjectiveStage(c.Input()), "objective.normalizer") == nullptr);
}

TEST(TriageChecksTest, AnAccumulatedLossAveragedOverMicroBatchMeansIsNamed) {
  // Two micro-batches of 11 + 3 and 6 + 1 target tokens.
  Case c = RandomCase(61);
  c.capsule.mutable_data()->set_micro_batches(2);
  for (int s = 0; s < 4; ++s) c.capsule.mutable_data()->add_sequences()->set_micro_batch(s / 2);
  c.capsule.mutable_step()->set_global_step(9);
  v1::StepScalars& h = *c.capsule.mutable_step()->add_history();
  h.set_step(9);
  const at::Tensor valid = c.batch.labels.ne(-100).logical_and(c.batch.loss_mask.ne(0));
  const Sums s = Count(c.logits, c.batch.labels, valid);
  const double first =
      s.seq_sum.slice(0, 0, 2).sum().item<double>() / s.seq_n.slice(0, 0, 2).sum().item<double>();
  const double second =
      s.seq_sum.slice(0, 2, 4).sum().item<double>() / s.seq_n.slice(0, 2, 4).sum().item<double>();
  const double mean_of_means = (first + second) / 2;
  ASSERT_GT(std::abs(mean_of_means / c.model_loss - 1), 1e-3);

  h.set_loss(mean_of_means);
  const v1::StageReport r = RunObjectiveStage(c.Input());
  const v1::Finding* f = Find(r, "objective.accumulation_mean_of_means");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_LE(f->value(), kTrainerLossRelTol);
  EXPECT_EQ(f->threshold(), kTrainerLossRelTol);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_EQ(FailedChecks(r), std::vector<std::string>{"objective.accumulation_mean_of_means"});

  // The step's token mean: the declared loss, a passed objective.trainer_loss.
  h.set_loss(c.model_loss);
  const v1::StageReport ok = RunObjectiveStage(c.Input());
  EXPECT_TRUE(Find(ok, "objective.accumulation_mean_of_means") == nullptr) << ok.DebugString();
  ASSERT_NE(Find(ok, "objective.trainer_loss"), nullptr);
  EXPECT_FALSE(Find(ok, "objective.trainer_loss")->failed());
  // Just off the mean of means: not named as it.
  h.set_loss(mean_of_means * (1 + 1e-3));
  const v1::StageReport off = RunObjectiveStage(c.Input());
  EXPECT_TRUE(Find(off, "objective.accumulation_mean_of_means") == nullptr) << off.DebugString();
  EXPECT_EQ(FailedChecks(off), std::vector<std::string>{"objective.trainer_loss"});
}

// A loss mask of another shape than the labels (the capsule embeds each batch tensor as its own
// blob; a model that does not read the mask replays fine) must not throw out of the stages: the
// attention and response masks of another shape are ignored there, and InLoss ignores such a loss
// mask too.
TEST(TriageChecksTest, ALossMaskOfAnotherShapeDoesNotThrow) {
  Case c = RandomCase(67);
  c.batch.loss_mask = at::ones({4, 17}, at::kLong);
  v1::StageReport data, objective;
  ASSERT_NO_THROW(data = RunDataStage(c.Input()));
  ASSERT_NO_THROW(objective = RunObjectiveStage(c.Input()));
  for (const v1::StageReport* r : {&data, &objective}) {
    EXPECT_TRUE(r->ran() || !r->skipped_reason().empty()) << r->DebugString();
  }
}

// ---- gradients -----------------------------------------------------------------------------

ParameterGrad Grad(const std::string& name, const std::string& layer, at::Tensor grad) {
  return ParameterGrad{name, layer, std::move(grad)};
}

at::Tensor Floats(std::vector<float> v) { return at::tensor(v, at::kFloat); }

TEST(TriageChecksTest, ParametersTheLossDoesNotReachAreNamedByLayer) {
  const std::vector<ParameterGrad> grads = {
      Grad("embed.weight", "embed", Floats({0.5f, -0.25f})),
      Grad("blocks.0.fc.weight", "blocks.0", Floats({1e-30f, 0})),  // tiny, not zero
      Grad("blocks.0.fc.bias", "blocks.0", Floats({2})),
      Grad("blocks.1.fc.weight", "blocks.1", at::Tensor()),  // none
      Grad("blocks.1.fc.bias", "blocks.1", Floats({0, 0})),  // exactly zero
      Grad("blocks.1.norm.weight", "blocks.1", Floats({3})),
      Grad("head.weight", "head", Floats({0})),  // exactly zero
  };
  TriageInput in;
  in.parameter_grads = &grads;
  const v1::StageReport r = RunGradientsStage(in);
  ASSERT_TRUE(r.ran()) << r.skipped_reason();
  const auto found = FindAll(r, "gradients.disconnected");
  ASSERT_EQ(found.size(), 2u) << r.DebugString();
  EXPECT_TRUE(found[0]->failed());
  EXPECT_EQ(found[0]->value(), 2);  // blocks.1: none and exactly zero
  EXPECT_EQ(found[0]->threshold(), 0);
  EXPECT_FALSE(found[0]->detail().empty());
  EXPECT_TRUE(found[1]->failed());
  EXPECT_EQ(found[1]->value(), 1);  // head
  EXPECT_TRUE(r.explains());

  // Every parameter reached, however weakly: nothing fails.
  const std::vector<ParameterGrad> reached = {
      Grad("blocks.0.fc.weight", "blocks.0", Floats({1e-30f, 0})),
      Grad("blocks.1.fc.bias", "blocks.1", Floats({0, -1e-20f})),
  };
  in.parameter_grads = &reached;
  const v1::StageReport ok = RunGradientsStage(in);
  EXPECT_TRUE(FindAll(ok, "gradients.disconnected").empty()) << ok.DebugString();
  EXPECT_FALSE(ok.explains());
}

TEST(TriageChecksTest, ThePerLayerNormNoteRanksTheLayers) {
  const std::vector<ParameterGrad> grads = {
      Grad("a.weight", "a", Floats({3, 0})),
      Grad("a.bias", "a", Floats({4})),        // norm 5
      Grad("b.weight", "b", Floats({12, 5})),  // norm 13
      Grad("c.weight", "c", Floats({1})),
  };
  TriageInput in;
  in.parameter_grads = &grads;
  const v1::StageReport r = RunGradientsStage(in);
  const auto found = FindAll(r, "gradients.per_layer_norm");
  ASSERT_EQ(found.size(), 1u) << r.DebugString();
  EXPECT_FALSE(found[0]->failed());
  EXPECT_NEAR(found[0]->value(), 13, 1e-12);
  EXPECT_EQ(found[0]->threshold(), 0);
  EXPECT_FALSE(found[0]->detail().empty());
  EXPECT_TRUE(FailedChecks(r).empty());
  // No backward ran: no note, and the stage is skipped.
  in.parameter_grads = nullptr;
  const v1::StageReport none = RunGradientsStage(in);
  EXPECT_FALSE(none.ran());
  EXPECT_FALSE(none.skipped_reason().empty());
  EXPECT_TRUE(Find(none, "gradients.per_layer_norm") == nullptr);
}

void AddParameter(v1::Capsule& c, const std::string& name, bool requires_grad) {
  v1::TensorBlob& t = *c.add_tensors();
  t.set_name(name);
  t.set_role(v1::PARAMETER);
  t.mutable_meta()->set_requires_grad(requires_grad);
}

TEST(TriageChecksTest, TheDeclaredFrozenNoteCountsTheMatchedParameters) {
  v1::Capsule c;
  AddParameter(c, "embed.weight", false);
  AddParameter(c, "blocks.0.norm.weight", false);
  AddParameter(c, "blocks.1.norm.weight", false);
  AddParameter(c, "head.weight", true);
  TriageInput in;
  in.capsule = &c;
  // Nothing declared: no finding, and without a backward the stage is skipped.
  {
    const v1::StageReport r = RunGradientsStage(in);
    EXPECT_FALSE(r.ran());
    EXPECT_TRUE(Find(r, "gradients.declared_frozen") == nullptr) << r.DebugString();
  }
  c.mutable_model()->add_declared_frozen("embed.*");
  c.mutable_model()->add_declared_frozen("blocks.*.norm.weight");
  const v1::StageReport r = RunGradientsStage(in);
  ASSERT_TRUE(r.ran());
  const auto found = FindAll(r, "gradients.declared_frozen");
  ASSERT_EQ(found.size(), 1u) << r.DebugString();
  EXPECT_FALSE(found[0]->failed());
  EXPECT_EQ(found[0]->value(), 3);
  EXPECT_EQ(found[0]->threshold(), 0);
  EXPECT_FALSE(found[0]->detail().empty());
  EXPECT_TRUE(FailedChecks(r).empty()) << r.DebugString();
  EXPECT_TRUE(Find(r, "gradients.declared_frozen_unmatched") == nullptr);
}

// ---- documentation -------------------------------------------------------------------------

// Every check name the triage stages emit (replay/internal/*.cc).
const char* const kStageChecks[] = {
    "data.bad_sample",
    "data.constant_targets",
    "data.empty_batch",
    "data.empty_sample",
    "data.hard_sample",
    "data.label_out_of_range",
    "data.label_out_of_vocab",
    "data.non_finite_input",
    "data.per_sample_loss",
    "gradients.declared_frozen",
    "gradients.declared_frozen_trained",
    "gradients.declared_frozen_unmatched",
    "gradients.disconnected",
    "gradients.per_layer_norm",
    "objective.accumulation_mean_of_means",
    "objective.accumulation_not_divided",
    "objective.label_smoothing",
    "objective.labels_alignment",
    "objective.labels_equal_inputs",
    "objective.loss_mask_ignored",
    "objective.loss_matches",
    "objective.masked_positions_counted",
    "objective.normalizer",
    "objective.padding_in_loss",
    "objective.prompt_in_loss",
    "objective.reduction_sequence_mean",
    "objective.reduction_sum",
    "objective.reduction_token_mean",
    "objective.trainer_loss",
    "objective.trainer_loss_matches",
    "objective.unexplained",
    "optimizer.clip_applied",
    "optimizer.clip_before_unscale",
    "optimizer.decay_on_excluded",
    "optimizer.frozen_in_optimizer",
    "optimizer.frozen_updated",
    "optimizer.lr_schedule",
    "optimizer.step_norms",
    "optimizer.step_on_overflow",
    "optimizer.update_matches",
};

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TriageChecksTest, EveryStageCheckIsDocumented) {
  const std::string doc = ReadText(std::string(CAPSULE_SOURCE_DIR) + "/cli/capsule.md");
  const size_t begin = doc.find("\n## TRIAGE CHECKS\n");
  ASSERT_NE(begin, std::string::npos) << "cli/capsule.md has no TRIAGE CHECKS section";
  const size_t end = doc.find("\n## ", begin + 1);
  const std::string section = doc.substr(begin, end == std::string::npos ? end : end - begin);
  for (const char* check : kStageChecks) {
    EXPECT_NE(section.find("| `" + std::string(check) + "` |"), std::string::npos)
        << check << " has no row in cli/capsule.md, TRIAGE CHECKS";
  }
}

TEST(TriageChecksTest, TheListOfStageChecksIsComplete) {
  // Every quoted check name in the stage sources is in kStageChecks (and so documented).
  const std::set<std::string> listed(std::begin(kStageChecks), std::end(kStageChecks));
  const std::regex name("\"((data|objective|gradients|optimizer)\\.[a-z_]+)\"");
  std::set<std::string> emitted;
  const std::filesystem::path dir = std::string(CAPSULE_SOURCE_DIR) + "/replay/internal";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".cc") continue;
    const std::string text = ReadText(entry.path());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), name);
         it != std::sregex_iterator(); ++it) {
      emitted.insert((*it)[1].str());
    }
  }
  ASSERT_FALSE(emitted.empty()) << "no check name found under " << dir;
  for (const std::string& check : emitted) {
    EXPECT_EQ(listed.count(check), 1u) << check << " is emitted but not in kStageChecks";
  }
  for (const std::string& check : listed) {
    EXPECT_EQ(emitted.count(check), 1u) << check << " is in kStageChecks but no stage emits it";
  }
}

}  // namespace
}  // namespace capsule::internal
