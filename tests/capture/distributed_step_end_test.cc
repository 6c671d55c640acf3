// The step's agreement row carried by its last gradient reduction (Distributed::StepEnd), over
// real Gloo process groups (one thread per rank, 2 to 4 ranks), on a small perceptron written
// here with ATen's autograd: the same verdicts as the separate agreement all-reduce, without that
// collective; and the fallbacks (a dtype that cannot carry the row, a step with no marked
// reduction) that still agree.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <tuple>
#include <vector>

#include "capsule/capture/distributed.h"
#include "capsule/capture/monitor.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/capture/gloo_ranks.h"

namespace capsule {
namespace {

// Runs `body(rank, distributed)` on `world` ranks at once (OnGlooRanks), with the trigger
// agreement on. A body that throws fails the test.
void OnRanks(int world, const std::function<void(int, std::shared_ptr<Distributed>)>& body) {
  GlooRanksOptions o;
  o.timeout_ms = 20000;
  OnGlooRanks(world, o, [&](int rank, const std::shared_ptr<Distributed>& d) { body(rank, d); });
}

// A perceptron 4 -> 8 -> 2 with a hidden bias: three parameters, the same on every rank.
struct Mlp {
  at::Tensor w1 = at::linspace(-1, 1, 32).reshape({8, 4}).requires_grad_();
  at::Tensor b1 = at::linspace(-0.5, 0.5, 8).requires_grad_();
  at::Tensor w2 = at::linspace(1, -1, 16).reshape({2, 8}).requires_grad_();
  std::vector<at::Tensor> params() const { return {w1, b1, w2}; }
  // This rank's loss (its inputs differ by rank); `nan`: one input is NaN.
  double Backward(int rank, bool nan) {
    for (at::Tensor p : params()) p.mutable_grad() = at::Tensor();
    at::Tensor x = at::full({3, 4}, 0.25 * (rank + 1));
    if (nan) x[0][0] = NAN;
    at::Tensor loss = at::tanh(x.matmul(w1.t()) + b1).matmul(w2.t()).pow(2).mean();
    loss.backward();
    return loss.item<double>();
  }
  // SGD, skipped (on every rank alike) when the reduced gradients are not finite.
  void Update() {
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : params()) {
      if (!at::isfinite(p.grad()).all().item<bool>()) return;
    }
    for (at::Tensor p : params()) p.sub_(p.grad(), 0.01);
  }
};

// The collectives `capsule`'s ring holds for `step`, by tag.
std::vector<std::string> TagsAt(const v1::Capsule& capsule, int64_t step) {
  std::vector<std::string> tags;
  for (const v1::Collective& c : capsule.distributed().collectives()) {
    if (c.step() == step) tags.push_back(c.tag());
  }
  return tags;
}

class StepEndTest : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  bool marked() const { return std::get<1>(GetParam()); }
};

INSTANTIATE_TEST_SUITE_P(Ranks, StepEndTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks" +
                                  (std::get<1>(info.param) ? "Marked" : "Separate");
                         });

TEST_P(StepEndTest, ANanLossOnOneRankCapturesTheStepOnEveryRank) {
  // Five steps; at step 3 the last rank's loss is NaN. Every rank writes a capsule of step 3:
  // that rank NON_FINITE_LOSS, the others PEER_TRIGGER, whether the rows come with the marked
  // reduction or in the separate agreement; with the marker, no agreement collective runs.
  const int world = this->world(), last = world - 1;
  constexpr int kSteps = 5, kNanStep = 3;
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("capsule-step-end-" + std::to_string(::getpid()) + "-" +
                           std::to_string(world) + (marked() ? "m" : "s"));
  std::filesystem::remove_all(dir);
  std::vector<std::vector<StepReport>> reports(world, std::vector<StepReport>(kSteps));
  std::vector<v1::Capsule> rings(world);
  OnRanks(world, [&](int rank, std::shared_ptr<Distributed> d) {
    MonitorOptions o;
    o.capsule_dir = dir + "/rank" + std::to_string(rank);
    o.log_sink = [](const std::string&) {};
    Monitor m(o);
    m.AttachDistributed(d);
    Mlp mlp;
    d->SetParameters(mlp.params());
    for (int step = 0; step < kSteps; ++step) {
      StepBatch batch;
      batch.tensors.inputs = at::zeros({3, 4});
      m.BeginStep(step, {}, batch);
      const double loss = mlp.Backward(rank, rank == last && step == kNanStep);
      const std::vector<at::Tensor> params = mlp.params();
      for (size_t i = 0; i < params.size(); ++i) {
        if (marked() && i + 1 == params.size()) {
          d->ReduceGradients({params[i]}, GradReduce::kMean, "grads", Distributed::StepEnd{loss});
        } else {
          d->ReduceGradients({params[i]}, GradReduce::kMean);
        }
      }
      StepScalars s;
      s.loss = loss;  // no grad_norm: only the loss triggers fire
      reports[rank][step] = m.EndStep(s);
      mlp.Update();
    }
    m.WaitForWrites();
    d->FillSection(&rings[rank]);
    m.AttachDistributed(nullptr);
  });
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const StepReport& r = reports[rank][step];
      EXPECT_TRUE(r.status.ok()) << r.status;
      if (step != kNanStep) {
        EXPECT_FALSE(r.triggered) << r.summary;
      } else {
        EXPECT_TRUE(r.triggered);
        EXPECT_EQ(r.trigger, rank == last ? TriggerKind::kNonFiniteLoss : TriggerKind::kPeerTrigger)
            << r.summary;
        EXPECT_FALSE(r.capsule_path.empty()) << r.summary;
        EXPECT_TRUE(std::filesystem::exists(r.capsule_path)) << r.capsule_path;
      }
      // Three gradient all-reduces per step, and the agreement's own only without the marker.
      std::vector<std::string> want = {"grads", "grads", "grads"};
      if (!marked()) want.push_back("capsule.agree");
      EXPECT_EQ(TagsAt(rings[rank], step), want);
    }
    const v1::TriggerAgreement& a = rings[rank].distributed().agreement();
    EXPECT_EQ(a.step(), kSteps - 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_P(StepEndTest, TheCarriedRowsFindDesyncedReplicasAndASumThatShouldBeAMean) {
  // Rank 1's weights differ (its checksum is in 16-bit parts of a float32 row), and the gradients
  // are summed where the rank-local loss needs a mean: the same findings as the separate rows.
  const int world = this->world();
  std::vector<AgreementResult> results(world);
  std::vector<v1::Capsule> rings(world);
  OnRanks(world, [&](int rank, std::shared_ptr<Distributed> d) {
    Mlp mlp;
    if (rank == 1) {
      at::NoGradGuard no_grad;
      mlp.w2.add_(1e-3);
    }
    d->OnBeginStep(0, mlp.params(), {}, 0, 0, {});
    mlp.Backward(0, false);  // every rank the same inputs: the sum is `world` times the mean
    if (marked()) {
      d->ReduceGradients(mlp.params(), GradReduce::kSum, "grads", Distributed::StepEnd{});
    } else {
      d->ReduceGradients(mlp.params(), GradReduce::kSum);
    }
    results[rank] = d->Agree(0, TriggerKind::kNone, /*loss_ranks=*/1);
    d->FillSection(&rings[rank]);
  });
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const AgreementResult& a = results[rank];
    ASSERT_TRUE(a.ran && a.status.ok()) << a.status;
    EXPECT_EQ(a.rows_carried, marked());
    EXPECT_TRUE(a.fired.empty());
    EXPECT_EQ(a.desynced_ranks, std::vector<int>{1});
    EXPECT_TRUE(a.reduction_not_a_mean);
    // Rank 1's gradients differ a little from the others' (its weights do).
    EXPECT_NEAR(a.reduction_ratio, world, 0.05 * world);
    const v1::GradReduction& rec = rings[rank].distributed().reductions(0);
    ASSERT_EQ(rec.rank_local_norms_size(), world);
    EXPECT_NEAR(rec.rank_local_norms(rank), rec.local_norm(), 1e-6 * rec.local_norm());
    EXPECT_EQ(rings[rank].distributed().collectives_size(), marked() ? 1 : 2);
  }
}

TEST(StepEndRowTest, ANonFiniteCountPastSixteenBitsComesBackWhole) {
  // The count travels in 16-bit parts of a float32 row: 70,001 NaNs need two of them.
  constexpr int world = 2;
  std::vector<v1::Capsule> rings(world);
  OnRanks(world, [&](int rank, std::shared_ptr<Distributed> d) {
    d->OnBeginStep(0, {}, {}, 0, 0, {});
    at::Tensor bucket = at::ones({80000}, at::kFloat);
    if (rank == 1) bucket.narrow(0, 0, 70001).fill_(NAN);
    d->ReduceBucket(bucket, GradReduce::kMean, "grads", Distributed::StepEnd{1.0});
    const AgreementResult a = d->Agree(0, TriggerKind::kNone, 1);
    EXPECT_TRUE(a.rows_carried);
    EXPECT_EQ(bucket.numel(), 80000);
    EXPECT_TRUE(std::isnan(bucket[0].item<float>()));
    EXPECT_EQ(bucket[79999].item<float>(), 1.0f);  // (1 + 1) / 2: the row did not shift it
    d->FillSection(&rings[rank]);
  });
  for (const v1::Capsule& c : rings) {
    ASSERT_EQ(c.distributed().reductions_size(), 1);
    const v1::GradReduction& r = c.distributed().reductions(0);
    ASSERT_EQ(r.rank_local_non_finite_size(), world);
    EXPECT_EQ(r.rank_local_non_finite(0), 0);
    EXPECT_EQ(r.rank_local_non_finite(1), 70001);
    EXPECT_EQ(c.distributed().collectives(0).numel(), 80000 + world * 10);
  }
}

TEST(StepEndFallbackTest, AHalfBucketOrNoMarkedReductionAgreesInItsOwnCollective) {
  // float16 holds integers only up to 2^11: the marked reduction cannot carry the row, and every
  // rank runs the separate agreement instead, as it does in a step with no marked reduction.
  for (const bool half : {true, false}) {
    SCOPED_TRACE(half ? "half bucket" : "no marked reduction");
    constexpr int world = 3, last = world - 1;
    std::vector<AgreementResult> results(world);
    std::vector<v1::Capsule> rings(world);
    OnRanks(world, [&](int rank, std::shared_ptr<Distributed> d) {
      d->OnBeginStep(0, {}, {}, 0, 0, {});
      at::Tensor bucket = at::full({6}, 1.0 + rank, half ? at::kHalf : at::kFloat);
      if (rank == last) bucket[2] = NAN;
      if (half) {
        d->ReduceBucket(bucket, GradReduce::kMean, "grads", Distributed::StepEnd{NAN});
      } else {
        std::vector<at::Tensor> t{bucket};
        d->AllReduce(t, "grads");  // a reduction the wrapper records, but no gradient health
      }
      results[rank] =
          d->Agree(0, rank == last ? TriggerKind::kNonFiniteLoss : TriggerKind::kNone, 1);
      d->FillSection(&rings[rank]);
    });
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const AgreementResult& a = results[rank];
      ASSERT_TRUE(a.ran && a.status.ok()) << a.status;
      EXPECT_FALSE(a.rows_carried);
      ASSERT_EQ(a.fired.size(), 1u);
      EXPECT_EQ(a.fired[0].first, last);
      EXPECT_EQ(a.fired[0].second, TriggerKind::kNonFiniteLoss);
      EXPECT_EQ(TagsAt(rings[rank], 0), (std::vector<std::string>{"grads", "capsule.agree"}));
      EXPECT_EQ(rings[rank].distributed().collectives(0).numel(), 6);
    }
  }
}

}  // namespace
}  // namespace capsule
