// Every c10d op a data-parallel trainer issues, through capsule::Distributed over real Gloo
// process groups (one thread per rank, 2 and 3 ranks), on a two-layer perceptron written here
// with ATen's autograd (not the tiny_gpt sample): what the rings record, and what the run
// analysis (capsule::ranks) makes of a rank that never issues an all-gather and of a rank whose
// data ran out early.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "capsule/capture/distributed.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/triage.pb.h"
#include "capsule/ranks/run_analysis.h"
#include "tests/capture/gloo_ranks.h"

namespace capsule {
namespace {

// Runs `body(rank, distributed)` on `world` ranks at once (OnGlooRanks) with a `timeout_ms`
// collective timeout. A body that throws fails the test, unless `may_throw`. `agree`: the
// EndStep trigger agreement is on.
void OnRanks(int world, int timeout_ms, const std::function<void(int, Distributed&)>& body,
             bool may_throw = false, bool agree = false) {
  GlooRanksOptions o;
  o.timeout_ms = timeout_ms;
  o.may_throw = may_throw;
  o.agree = agree;
  OnGlooRanks(world, o, [&](int rank, const std::shared_ptr<Distributed>& d) { body(rank, *d); });
}

// A two-layer perceptron, 4 -> 8 -> 2, the same initial weights on every rank.
struct Mlp {
  at::Tensor w1 = at::linspace(-1, 1, 32).reshape({8, 4}).requires_grad_();
  at::Tensor w2 = at::linspace(1, -1, 16).reshape({2, 8}).requires_grad_();
  std::vector<at::Tensor> params() const { return {w1, w2}; }
  void Backward(int rank, int step) {
    const at::Tensor x = at::full({3, 4}, 0.25 * (rank + 1) + 0.125 * step);
    at::relu(x.matmul(w1.t())).matmul(w2.t()).pow(2).mean().backward();
  }
  at::Tensor FlatGrads() const { return at::cat({w1.grad().reshape(-1), w2.grad().reshape(-1)}); }
};

// `rank`'s capsule as the Monitor would write it: its Distributed section, step and trigger.
v1::Capsule CapsuleOf(Distributed& d, int64_t step, v1::TriggerKind kind) {
  v1::Capsule c;
  d.FillSection(&c);
  c.mutable_step()->set_global_step(step);
  c.mutable_trigger()->set_kind(kind);
  c.set_created_unix_micros(1780000000000000);
  return c;
}

v1::RunTriage Analyse(const std::vector<v1::Capsule>& capsules) {
  RunAnalysisInput input;
  for (size_t i = 0; i < capsules.size(); ++i) {
    if (capsules[i].has_distributed())
      input.Add("rank" + std::to_string(i) + ".capsule", capsules[i]);
  }
  return *AnalyseRun(input, RunAnalysisOptions{});
}

class DistributedOpsTest : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Ranks, DistributedOpsTest, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST_P(DistributedOpsTest, EveryOpATrainerIssuesIsInTheRingWithItsShapesAndPeer) {
  const int world = this->world();
  std::vector<v1::Capsule> capsules(world);
  OnRanks(world, 10000, [&](int rank, Distributed& d) {
    Mlp mlp;
    std::vector<at::Tensor> params = mlp.params();
    std::vector<at::Tensor> init{
        at::cat({mlp.w1.detach().reshape(-1), mlp.w2.detach().reshape(-1)})};
    d.Broadcast(init, 0, "init");
    d.OnBeginStep(0, params, {}, 0, 0, {});
    mlp.Backward(rank, 0);
    std::vector<at::Tensor> grads{mlp.FlatGrads()};  // 48 elements: a shard per rank for 2, 3
    d.AllReduce(grads, "grads");
    at::Tensor mine = grads[0].chunk(world)[rank].clone();
    std::vector<at::Tensor> gathered;
    for (int r = 0; r < world; ++r) gathered.push_back(at::empty_like(mine));
    d.AllGather(gathered, mine, "grads.gather");
    at::Tensor out = at::empty({2 * world});
    at::Tensor in = at::full({2 * world}, static_cast<float>(rank));
    d.AllToAll(out, in, "tokens");
    // Ranks 0 and 1 pass activations as a pipeline would; the others take no part.
    std::vector<at::Tensor> act{at::full({3, 8}, 1.0f + rank)};
    if (rank == 0) {
      d.Send(act, 1, "act");
      d.Recv(act, 1, "act.grad");
    } else if (rank == 1) {
      d.Recv(act, 0, "act");
      d.Send(act, 0, "act.grad");
    }
    d.Barrier("end");
    EXPECT_TRUE(at::allclose(out, at::arange(world).repeat_interleave(2).to(at::kFloat)));
    capsules[rank] = CapsuleOf(d, 0, v1::MANUAL);
  });
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(rank);
    const v1::Distributed& d = capsules[rank].distributed();
    std::vector<std::string> ops;
    for (const v1::Collective& c : d.collectives()) ops.push_back(c.op() + " " + c.tag());
    EXPECT_EQ(ops, (std::vector<std::string>{"broadcast init", "allreduce grads",
                                             "allgather grads.gather", "alltoall tokens",
                                             "barrier end"}));
    ASSERT_EQ(d.collectives_size(), 5);
    for (int i = 0; i < d.collectives_size(); ++i) {
      EXPECT_EQ(d.collectives(i).sequence(), static_cast<uint64_t>(i));  // p2p takes none
      EXPECT_EQ(d.collectives(i).state(), v1::COMPLETED);
    }
    EXPECT_EQ(d.collectives(1).numel(), 48);
    const v1::Collective& ag = d.collectives(2);
    EXPECT_EQ(ag.numel(), 48 / world);
    EXPECT_EQ(ag.out_shapes_size(), world);
    ASSERT_EQ(d.point_to_point_size(), rank < 2 ? 2 : 0);
    if (rank < 2) {
      const v1::Collective& first = d.point_to_point(0);
      EXPECT_EQ(first.op(), rank == 0 ? "send" : "recv");
      EXPECT_EQ(first.tag(), "act");
      EXPECT_EQ(first.peer(), 1 - rank);
      EXPECT_EQ(first.sequence(), 0u);
      ASSERT_EQ(first.in_shapes_size(), 1);
      EXPECT_EQ(first.in_shapes(0).dims_size(), 2);
      EXPECT_EQ(first.state(), v1::COMPLETED);
      EXPECT_EQ(d.point_to_point(1).op(), rank == 0 ? "recv" : "send");
    }
  }
  const v1::RunTriage t = Analyse(capsules);
  EXPECT_EQ(t.findings_size(), 0) << RenderRunAnalysisText(t);
}

TEST_P(DistributedOpsTest, PerBucketReductionsAgreeOnTheWholeStep) {
  // A trainer that reduces its own flat buckets (one per layer here): rank `last`'s first bucket
  // is non-finite, its second finite. The agreement row speaks for the step, not its last bucket.
  const int world = this->world(), last = world - 1;
  std::vector<v1::Capsule> capsules(world);
  std::vector<GradReductionStats> second(world);
  OnRanks(
      world, 10000,
      [&](int rank, Distributed& d) {
        Mlp mlp;
        d.SetParameters(mlp.params());  // no Model: the fingerprint checksums these
        d.OnBeginStep(0, {}, {}, 0, 0, {});
        mlp.Backward(rank, 0);
        if (rank == last) mlp.w1.grad()[0][0] = NAN;
        at::Tensor b1 = mlp.w1.grad().view({-1}), b2 = mlp.w2.grad().view({-1});
        const at::Tensor before = b2.clone();
        d.ReduceBucket(b1, GradReduce::kMean, "grads.layer1");
        second[rank] = d.ReduceBucket(b2, GradReduce::kMean, "grads.layer2");
        EXPECT_FALSE(at::equal(before, b2));  // reduced in place
        const AgreementResult a = d.Agree(0, TriggerKind::kNone, 1);
        EXPECT_TRUE(a.ran && a.status.ok()) << a.status;
        capsules[rank] = CapsuleOf(d, 0, v1::MANUAL);
      },
      /*may_throw=*/false, /*agree=*/true);
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(rank);
    const v1::Distributed& d = capsules[rank].distributed();
    ASSERT_EQ(d.reductions_size(), 2);
    EXPECT_EQ(second[rank].local_non_finite, 0);
    const v1::GradReduction& r = d.reductions(1);
    ASSERT_EQ(r.rank_local_non_finite_size(), world);
    EXPECT_EQ(r.rank_local_non_finite(last), 1);
    EXPECT_NE(d.fingerprints(0).params(), "0000000000000000");
    EXPECT_EQ(d.fingerprints(0).params(), capsules[0].distributed().fingerprints(0).params());
  }
  EXPECT_NE(capsules[0].distributed().fingerprints(0).params(), "");
}

TEST_P(DistributedOpsTest, AnOpTheBackendLacksIsRecordedFailedWithItsErrorAndRethrown) {
  // Gloo (LibTorch 1.13) has no reduce-scatter: the call fails at once on every rank.
  const int world = this->world();
  std::vector<v1::Capsule> capsules(world);
  OnRanks(world, 10000, [&](int rank, Distributed& d) {
    at::Tensor out = at::empty({4});
    std::vector<at::Tensor> in;
    for (int r = 0; r < world; ++r) in.push_back(at::full({4}, 1.0f));
    EXPECT_THROW(d.ReduceScatter(out, in, "grads.shard"), c10::Error);
    capsules[rank] = CapsuleOf(d, 0, v1::COLLECTIVE_ERROR);
  });
  for (const v1::Capsule& c : capsules) {
    ASSERT_EQ(c.distributed().collectives_size(), 1);
    const v1::Collective& rs = c.distributed().collectives(0);
    EXPECT_EQ(rs.op(), "reduce_scatter");
    EXPECT_EQ(rs.reduce_op(), "sum");
    EXPECT_EQ(rs.in_shapes_size(), world);
    ASSERT_EQ(rs.out_shapes_size(), 1);
    EXPECT_EQ(rs.out_shapes(0).dims(0), 4);
    EXPECT_EQ(rs.state(), v1::FAILED);
    EXPECT_NE(rs.error().find("does not support reduce_scatter"), std::string::npos) << rs.error();
  }
}

TEST_P(DistributedOpsTest, ARankThatNeverIssuesAnAllGatherIsNamedWithTheAllGatherTheOthersWaitIn) {
  // Step 1: rank `last` never reaches the all-gather of the metrics (stuck in its own code until
  // the others' group timeout has passed); the others wait in it and fail.
  const int world = this->world(), last = world - 1;
  std::vector<v1::Capsule> capsules(world);
  OnRanks(
      world, 1000,
      [&](int rank, Distributed& d) {
        Mlp mlp;
        for (int step = 0; step < 2; ++step) {
          d.OnBeginStep(step, mlp.params(), {}, 0, step, {});
          mlp.Backward(rank, step);
          std::vector<at::Tensor> grads{mlp.FlatGrads()};
          d.AllReduce(grads, "grads");
          if (step == 1 && rank == last) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
            capsules[rank] = CapsuleOf(d, step, v1::HANG);
            return;
          }
          std::vector<at::Tensor> all;
          for (int r = 0; r < world; ++r) all.push_back(at::empty({1}));
          try {
            d.AllGather(all, at::full({1}, 0.5f), "metrics");
          } catch (const std::exception&) {
            capsules[rank] = CapsuleOf(d, step, v1::COLLECTIVE_ERROR);
            throw;
          }
        }
      },
      /*may_throw=*/true);
  for (int r = 0; r < last; ++r) {
    const v1::Distributed& d = capsules[r].distributed();
    ASSERT_EQ(d.collectives_size(), 4) << r;
    EXPECT_EQ(d.collectives(3).op(), "allgather");
    EXPECT_EQ(d.collectives(3).state(), v1::FAILED);
  }
  const v1::RunTriage t = Analyse(capsules);
  ASSERT_GE(t.findings_size(), 1) << RenderRunAnalysisText(t);
  const v1::TriageFinding& f = t.findings(0);
  EXPECT_EQ(f.check(), "hang.stuck_rank") << RenderRunAnalysisText(t);
  ASSERT_EQ(f.ranks_size(), 1);
  EXPECT_EQ(f.ranks(0), last);
  EXPECT_NE(f.detail().find("never issued sequence 3 (allgather metrics, step 1)"),
            std::string::npos)
      << f.detail();
  EXPECT_EQ(t.ranks(0).last_collective(), "allgather metrics (FAILED)");
  EXPECT_EQ(t.ranks(last).role(), "culprit");
  EXPECT_EQ(t.ranks(0).role(), "victim");
}

TEST_P(DistributedOpsTest, ARankWhoseDataRanOutIsUnevenDataFromTheStepNumbers) {
  // Rank `last` has data for 2 steps, the others for 3: it finishes its loop and its process
  // writes no capsule; the others wait in step 2's reduction until the group's timeout.
  const int world = this->world(), last = world - 1;
  std::vector<v1::Capsule> capsules(world);
  OnRanks(
      world, 1000,
      [&](int rank, Distributed& d) {
        Mlp mlp;
        const int steps = rank == last ? 2 : 3;
        for (int step = 0; step < steps; ++step) {
          d.OnBeginStep(step, mlp.params(), {}, 0, step, {});
          mlp.Backward(rank, step);
          std::vector<at::Tensor> grads{mlp.FlatGrads()};
          try {
            d.AllReduce(grads, "grads");
          } catch (const std::exception&) {
            capsules[rank] = CapsuleOf(d, step, v1::COLLECTIVE_ERROR);
            throw;
          }
        }
        d.Finish();
        if (rank == last) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      },
      /*may_throw=*/true);
  ASSERT_FALSE(capsules[0].distributed().finished().empty());
  EXPECT_EQ(capsules[0].distributed().finished(0).rank(), last);
  EXPECT_EQ(capsules[0].distributed().finished(0).last_step(), 1);
  const v1::RunTriage t = Analyse(capsules);
  ASSERT_GE(t.findings_size(), 1) << RenderRunAnalysisText(t);
  const v1::TriageFinding& f = t.findings(0);
  EXPECT_EQ(f.check(), "hang.uneven_data") << RenderRunAnalysisText(t);
  EXPECT_NE(f.detail().find("rank " + std::to_string(last) +
                            " finished its training loop after step 1 while the others went on "
                            "to step 2"),
            std::string::npos)
      << f.detail();
}

}  // namespace
}  // namespace capsule
