// capsule::Distributed over real c10d process groups: two ranks as two threads of this process,
// each with its own ProcessGroupGloo on 127.0.0.1 over one HashStore.
#include "capsule/capture/distributed.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
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
#include <vector>

#include "capsule/capture/monitor.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/capture/gloo_ranks.h"

namespace capsule {
namespace {

TEST(Checksum64Test, EveryBitOfEveryByteChangesIt) {
  std::vector<unsigned char> bytes(67);  // two 32-byte blocks and a 3-byte tail
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 1);
  const uint64_t base = Checksum64(bytes.data(), bytes.size());
  EXPECT_EQ(Checksum64(bytes.data(), bytes.size()), base);
  EXPECT_NE(Checksum64(bytes.data(), bytes.size(), 1), base);
  EXPECT_NE(Checksum64(bytes.data(), bytes.size() - 1), base);
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      bytes[i] ^= static_cast<unsigned char>(1 << bit);
      EXPECT_NE(Checksum64(bytes.data(), bytes.size()), base) << "byte " << i << " bit " << bit;
      bytes[i] ^= static_cast<unsigned char>(1 << bit);
    }
  }
}

// Runs `body(rank, distributed)` on two ranks at once (OnGlooRanks). `before_create`, when given,
// runs on each rank's group before Distributed::Create; `handles`, when given, holds each rank's
// Distributed while its body runs (for Monitor::AttachDistributed); `incidents` collects what
// each rank's watchdog asked to capture.
void TwoRanks(const std::function<void(int, Distributed&)>& body, double watchdog_seconds = 0,
              std::vector<std::vector<std::pair<TriggerKind, std::string>>>* incidents = nullptr,
              const std::function<void(int, c10d::ProcessGroupGloo&)>& before_create = nullptr,
              std::vector<std::shared_ptr<Distributed>>* handles = nullptr) {
  GlooRanksOptions o;
  o.watchdog_seconds = watchdog_seconds;
  o.watchdog_poll_seconds = 0.05;
  o.before_create = before_create;
  std::mutex mu;
  OnGlooRanks(2, o, [&](int rank, const std::shared_ptr<Distributed>& dist) {
    if (incidents != nullptr) {
      dist->SetIncidentHandler([&, rank](TriggerKind kind, const std::string& reason) {
        std::lock_guard<std::mutex> lock(mu);
        (*incidents)[rank].emplace_back(kind, reason);
        return true;
      });
    }
    if (handles != nullptr) (*handles)[rank] = dist;
    body(rank, *dist);
    if (handles != nullptr) (*handles)[rank].reset();
    dist->SetIncidentHandler(nullptr);
  });
}

std::vector<at::Tensor> Params(int rank, double scale) {
  at::Tensor w = at::full({4, 3}, 1.0f + rank, at::kFloat).requires_grad_();
  at::Tensor b = at::full({5}, -2.0f, at::kFloat).requires_grad_();
  w.mutable_grad() = at::full({4, 3}, static_cast<float>(scale * (rank + 1)));
  b.mutable_grad() = at::full({5}, static_cast<float>(scale));
  return {w, b};
}

TEST(DistributedTest, AMeanReductionRecordsBothSidesAndAgreesOnTriggersAndReplicas) {
  std::vector<AgreementResult> results(2);
  std::vector<GradReductionStats> stats(2);
  std::vector<v1::Capsule> capsules(2);
  TwoRanks([&](int rank, Distributed& d) {
    std::vector<at::Tensor> params = Params(rank, 1.0);
    // Rank 1's weights differ from rank 0's: the replicas are desynced from the start.
    d.OnBeginStep(0, params, {{"sampler", "state-" + std::to_string(rank)}}, 0, 8, {"a", "b"});
    stats[rank] = d.ReduceGradients(params, GradReduce::kMean);
    results[rank] = d.Agree(0, rank == 1 ? TriggerKind::kNonFiniteLoss : TriggerKind::kNone, 1);
    d.FillSection(&capsules[rank]);
  });
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    // Local: 12 elements of (rank + 1) and 5 of 1. Global mean: 12 of 1.5 and 5 of 1.
    EXPECT_NEAR(stats[rank].local_norm, std::sqrt(12.0 * (rank + 1) * (rank + 1) + 5), 1e-6);
    EXPECT_NEAR(stats[rank].global_norm, std::sqrt(12 * 2.25 + 5), 1e-6);
    EXPECT_EQ(stats[rank].divisor, 2);
    const AgreementResult& a = results[rank];
    ASSERT_TRUE(a.ran && a.status.ok()) << a.status;
    ASSERT_EQ(a.fired.size(), 1u);
    EXPECT_EQ(a.fired[0].first, 1);
    EXPECT_EQ(a.fired[0].second, TriggerKind::kNonFiniteLoss);
    EXPECT_EQ(a.desynced_ranks, std::vector<int>{1});
    EXPECT_FALSE(a.reduction_not_a_mean) << a.reduction_ratio;
    const v1::Distributed& d = capsules[rank].distributed();
    ASSERT_EQ(d.collectives_size(), 2);
    EXPECT_EQ(d.collectives(0).sequence(), 0u);
    EXPECT_EQ(d.collectives(0).tag(), "grads");
    EXPECT_EQ(d.collectives(0).numel(), 17);
    EXPECT_EQ(d.collectives(0).state(), v1::COMPLETED);
    EXPECT_EQ(d.collectives(1).tag(), "capsule.agree");
    ASSERT_EQ(d.reductions_size(), 1);
    ASSERT_EQ(d.reductions(0).rank_local_norms_size(), 2);
    EXPECT_NEAR(d.reductions(0).rank_local_norms(1), std::sqrt(53.0), 1e-6);
    ASSERT_EQ(d.fingerprints_size(), 1);
    EXPECT_EQ(d.fingerprints(0).cursor_offset(), 8);
    EXPECT_EQ(capsules[rank].placement().rank(), rank);
    EXPECT_EQ(capsules[rank].placement().world_size(), 2);
    EXPECT_EQ(d.agreement().fired_size(), 1);
  }
  EXPECT_EQ(capsules[0].distributed().run_id(), capsules[1].distributed().run_id());
  EXPECT_NE(capsules[0].distributed().fingerprints(0).params(),
            capsules[1].distributed().fingerprints(0).params());
  EXPECT_NE(capsules[0].distributed().fingerprints(0).local_rng(),
            capsules[1].distributed().fingerprints(0).local_rng());
}

TEST(DistributedTest, AnRngClassTheTrainerHasNoneOfHasNoChecksum) {
  // The checksum of no state was sixteen zeros on every rank, which triage read as rank-local
  // RNGs seeded alike.
  std::vector<v1::Capsule> capsules(2);
  TwoRanks([&](int rank, Distributed& d) {
    d.OnBeginStep(0, Params(rank, 1.0), {}, 0, 0, {});
    d.FillSection(&capsules[rank]);
  });
  for (const v1::Capsule& c : capsules) {
    ASSERT_EQ(c.distributed().fingerprints_size(), 1);
    EXPECT_EQ(c.distributed().fingerprints(0).local_rng(), "");
    EXPECT_EQ(c.distributed().fingerprints(0).replicated_rng(), "");
    EXPECT_FALSE(c.distributed().fingerprints(0).params().empty());
  }
}

TEST(DistributedTest, ASequenceNumberTheTrainerSetIsKeptNotDrawnAgain) {
  // A trainer that set the group's sequence number and issued collectives before Create: drawing
  // the base again would renumber the group under the trainer's own logs.
  std::vector<uint64_t> before(2), base(2);
  std::vector<v1::Capsule> capsules(2);
  TwoRanks(
      [&](int rank, Distributed& d) {
        d.OnBeginStep(0, Params(rank, 1.0), {}, 0, 0, {});
        d.FillSection(&capsules[rank]);
        base[rank] = capsules[rank].distributed().sequence_base();
      },
      0, nullptr,
      [&](int rank, c10d::ProcessGroupGloo& pg) {
        pg.setSequenceNumberForGroup();
        std::vector<at::Tensor> t = {at::ones({3})};
        pg.allreduce(t)->wait();
        before[rank] = pg.getSequenceNumberForGroup();
      });
  EXPECT_EQ(before[0], before[1]);
  EXPECT_EQ(base[0], before[0]);
  EXPECT_EQ(base[1], before[1]);
}

TEST(DistributedTest, AFailedAgreementIsInTheStepReportNotAnEmptyOne) {
  // Rank 1 leaves right after Create; rank 0's EndStep agreement fails. The report said nothing.
  const std::string dir =
      std::filesystem::temp_directory_path() / ("capsule-agree-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::vector<std::shared_ptr<Distributed>> handles(2);
  StepReport report;
  TwoRanks(
      [&](int rank, Distributed&) {
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          return;  // its group closes: a dead peer
        }
        MonitorOptions o;
        o.capsule_dir = dir;
        o.log_sink = [](const std::string&) {};
        Monitor m(o);
        m.AttachDistributed(handles[0]);
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        StepBatch b;
        b.tensors.input_ids = at::zeros({1, 2}, at::kLong);
        m.BeginStep(0, {}, b);
        StepScalars s;
        s.loss = 1.0;
        report = m.EndStep(s);
        m.AttachDistributed(nullptr);
      },
      0, nullptr, nullptr, &handles);
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(report.triggered);
  EXPECT_EQ(report.status.code(), StatusCode::kUnavailable) << report.status;
  EXPECT_NE(report.summary.find("the trigger agreement at step 0 failed"), std::string::npos)
      << report.summary;
}

TEST(DistributedTest, ASumWhereTheLossNeedsAMeanIsCaught) {
  std::vector<AgreementResult> results(2);
  TwoRanks([&](int rank, Distributed& d) {
    std::vector<at::Tensor> params = Params(0, 1.0);  // same weights, same gradients
    d.OnBeginStep(0, params, {}, 0, 0, {});
    d.ReduceGradients(params, GradReduce::kSum);
    results[rank] = d.Agree(0, TriggerKind::kNone, /*loss_ranks=*/1);
  });
  for (const AgreementResult& a : results) {
    EXPECT_TRUE(a.desynced_ranks.empty());
    EXPECT_TRUE(a.reduction_not_a_mean);
    EXPECT_NEAR(a.reduction_ratio, 2.0, 1e-6);  // identical gradients: the sum is twice as long
  }
  // Declared as normalised over both ranks, the sum is what the loss needs.
  TwoRanks([&](int rank, Distributed& d) {
    std::vector<at::Tensor> params = Params(0, 1.0);
    d.OnBeginStep(0, params, {}, 0, 0, {});
    d.ReduceGradients(params, GradReduce::kSum);
    results[rank] = d.Agree(0, TriggerKind::kNone, /*loss_ranks=*/2);
  });
  for (const AgreementResult& a : results) EXPECT_FALSE(a.reduction_not_a_mean);
}

TEST(DistributedTest, AHangMakesTheWaitingRankAndTheStuckRankDump) {
  // Rank 0 waits in an all-reduce that rank 1 reaches only after 1.5 s: rank 0's watchdog (0.3 s)
  // writes a HANG capsule and sets the dump key; rank 1, not in any collective, dumps on the key.
  std::vector<std::vector<std::pair<TriggerKind, std::string>>> incidents(2);
  TwoRanks(
      [&](int rank, Distributed& d) {
        d.OnBeginStep(4, {}, {}, 0, 0, {});
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        std::vector<at::Tensor> t{at::ones({3})};
        d.AllReduce(t, "grads");
        EXPECT_EQ(t[0][0].item<float>(), 2.0f);
      },
      0.3, &incidents);
  ASSERT_EQ(incidents[0].size(), 1u);
  EXPECT_EQ(incidents[0][0].first, TriggerKind::kHang);
  EXPECT_NE(incidents[0][0].second.find("rank 0: HANG at step 4: collective allreduce grads "
                                        "(sequence 0) in flight for"),
            std::string::npos)
      << incidents[0][0].second;
  ASSERT_EQ(incidents[1].size(), 1u);
  EXPECT_EQ(incidents[1][0].first, TriggerKind::kHang);
  EXPECT_NE(incidents[1][0].second.find("dump requested through the store: rank 0: HANG"),
            std::string::npos)
      << incidents[1][0].second;
}

}  // namespace
}  // namespace capsule
