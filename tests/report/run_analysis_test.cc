// AnalyseRun over synthetic data-parallel runs: one signed capsule per rank, one fault per test,
// each for 2, 3 and 4 ranks. Each case is checked twice: the analysis on the decoded messages, and
// `capsule triage` on the files it wrote (exit status, and the text names the rank and the cause).
#include "capsule/ranks/run_analysis.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capsule/base/internal/file_util.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/triage.pb.h"
#include "samples/golden/golden_capsules.h"

namespace capsule {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 4;  // steps 0..3; each issues "grads" (sequence 2k) and "capsule.agree"

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

v1::Collective* AddCollective(v1::Distributed* d, uint64_t seq, const std::string& tag,
                              int64_t numel, int64_t step) {
  v1::Collective* k = d->add_collectives();
  k->set_sequence(seq);
  k->set_op("allreduce");
  k->set_tag(tag);
  k->set_dtype("float32");
  k->set_numel(numel);
  k->add_in_shapes()->add_dims(numel);
  k->add_out_shapes()->add_dims(numel);
  k->set_reduce_op("sum");
  k->set_state(v1::COMPLETED);
  k->set_enqueued_unix_micros(1780000000000000 + static_cast<int64_t>(seq) * 10);
  k->set_completed_unix_micros(1780000000000005 + static_cast<int64_t>(seq) * 10);
  k->set_step(step);
  return k;
}

// A clean run of `world` ranks: every rank's capsule at the last step (a MANUAL capture), with
// finite gradients whose reduced norm is below the mean of the local norms, divisor = world, the
// same parameters and replicated RNG on every rank and a different local RNG on each.
std::vector<v1::Capsule> CleanRun(int world, const std::string& run = "run-a") {
  std::vector<v1::Capsule> out;
  for (int rank = 0; rank < world; ++rank) {
    v1::Capsule c = golden::MakeMinimalCapsule();
    c.set_run_name("tiny");
    c.mutable_step()->set_global_step(kSteps - 1);
    c.mutable_placement()->set_rank(rank);
    c.mutable_placement()->set_world_size(world);
    v1::Distributed& d = *c.mutable_distributed();
    d.set_run_id(run);
    d.set_backend("gloo");
    d.set_group_name("default_pg");
    d.set_sequence_base(1000);
    for (int step = 0; step < kSteps; ++step) {
      AddCollective(&d, 2 * step, "grads", 1024, step);
      AddCollective(&d, 2 * step + 1, "capsule.agree", world, step);
      v1::GradReduction& r = *d.add_reductions();
      r.set_step(step);
      r.set_sequence(2 * step);
      r.set_local_norm(1.0 + 0.125 * rank);
      r.set_global_norm(0.75);
      r.set_divisor(world);
      for (int i = 0; i < world; ++i) {
        r.add_rank_local_norms(1.0 + 0.125 * i);
        r.add_rank_local_non_finite(0);
      }
      v1::StepFingerprint& f = *d.add_fingerprints();
      f.set_step(step);
      f.set_params(Hex16(0xabc000 + step));
      f.set_replicated_rng(Hex16(0x5eed00 + step));
      f.set_local_rng(Hex16(0x10ca1000 + 16 * step + rank));
      f.set_cursor_offset(step * 8);
      f.set_sample_ids(Hex16(0x5a000 + 16 * step + rank));
    }
    d.set_last_step(kSteps - 1);
    out.push_back(std::move(c));
  }
  return out;
}

// Rank `rank`'s gradients, as every rank's shared vector and its own record say, at `step`.
void SetLocal(std::vector<v1::Capsule>& run, int rank, int step, double norm, int64_t non_finite) {
  for (v1::Capsule& c : run) {
    v1::GradReduction& r = *c.mutable_distributed()->mutable_reductions(step);
    r.set_rank_local_norms(rank, norm);
    r.set_rank_local_non_finite(rank, non_finite);
    if (c.placement().rank() == rank) {
      r.set_local_norm(norm);
      r.set_local_non_finite(non_finite);
    }
  }
}

void SetGlobal(std::vector<v1::Capsule>& run, int step, double norm, int64_t non_finite) {
  for (v1::Capsule& c : run) {
    v1::GradReduction& r = *c.mutable_distributed()->mutable_reductions(step);
    r.set_global_norm(norm);
    r.set_global_non_finite(non_finite);
  }
}

std::string FileName(const v1::Capsule& c) {
  std::string kind = v1::TriggerKind_Name(c.trigger().kind());
  for (char& ch : kind) ch = ch == '_' ? '-' : static_cast<char>(std::tolower(ch));
  return c.distributed().run_id() + "-step" + std::to_string(c.step().global_step()) + "-rank" +
         std::to_string(c.placement().rank()) + "-" + kind + ".capsule";
}

struct CommandResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

// The command line under test: CAPSULE_BIN from the environment when set (to run these checks
// against another build), else this build's.
std::string CapsuleBin() {
  const char* bin = std::getenv("CAPSULE_BIN");
  return bin != nullptr && *bin != '\0' ? bin : CAPSULE_BIN;
}

CommandResult RunCli(const std::string& args) {
  CommandResult r;
  FILE* p = popen((CapsuleBin() + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class RunAnalysisTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capsule-run-triage-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto key =
        golden::LoadTestOnlyKey(std::string(CAPSULE_SOURCE_DIR) + "/samples/keys/test-only.key");
    ASSERT_TRUE(key.ok()) << key.status();
    key_ = std::move(*key);
    pubkey_ = std::string(CAPSULE_SOURCE_DIR) + "/samples/keys/test-only.pub";
  }
  void TearDown() override { fs::remove_all(dir_); }

  int world() const { return GetParam(); }
  int last() const { return world() - 1; }

  // Writes every capsule of `run` signed into the folder and returns their paths.
  std::vector<std::string> Write(const std::vector<v1::Capsule>& run) {
    std::vector<std::string> paths;
    WriteOptions options;
    options.signing_key = &key_;
    for (const v1::Capsule& c : run) {
      paths.push_back(dir_ + "/" + FileName(c));
      const Status s = WriteCapsuleFile(paths.back(), c, options);
      EXPECT_TRUE(s.ok()) << s;
    }
    return paths;
  }

  // The analysis on the messages, named as Write names the files.
  v1::RunTriage Analyse(const std::vector<v1::Capsule>& run,
                        const std::vector<std::pair<std::string, std::string>>& unreadable = {},
                        const std::string& run_id = "") {
    RunAnalysisInput input;
    for (const v1::Capsule& c : run) input.Add(dir_ + "/" + FileName(c), c);
    for (const auto& [path, reason] : unreadable) input.AddUnreadable(path, reason);
    RunAnalysisOptions options;
    options.dir = dir_;
    options.run_id = run_id;
    return *AnalyseRun(input, options);
  }

  // `capsule triage` on the folder, trusting the test key.
  CommandResult Cli(const std::string& extra = "") {
    return RunCli("triage " + dir_ + " --pubkey " + pubkey_ + extra);
  }

  static std::vector<int> Ranks(const v1::TriageFinding& f) {
    return {f.ranks().begin(), f.ranks().end()};
  }

  // The one finding of `t`, which must have check `check`.
  static const v1::TriageFinding& Only(const v1::RunTriage& t, const std::string& check) {
    EXPECT_EQ(t.findings_size(), 1) << RenderRunAnalysisText(t);
    EXPECT_EQ(t.findings(0).check(), check) << RenderRunAnalysisText(t);
    return t.findings(0);
  }

  std::string dir_;
  PrivateKey key_;
  std::string pubkey_;
};

INSTANTIATE_TEST_SUITE_P(Ranks, RunAnalysisTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST_P(RunAnalysisTest, CleanRunHasNoFindingAndExitsZero) {
  std::vector<v1::Capsule> run = CleanRun(world());
  const v1::RunTriage t = Analyse(run);
  EXPECT_EQ(t.outcome(), v1::TRIAGE_NO_FINDING) << RenderRunAnalysisText(t);
  EXPECT_EQ(t.findings_size(), 0);
  EXPECT_EQ(t.undecided_size(), 0);
  EXPECT_EQ(t.world_size(), world());
  EXPECT_EQ(t.ranks_present_size(), world());
  EXPECT_EQ(t.ranks_size(), world());
  EXPECT_EQ(t.run_id(), "run-a");
  EXPECT_EQ(t.sequence_base(), 1000u);
  EXPECT_TRUE(t.next_command().empty());

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("no finding"), std::string::npos) << r.output;
}

TEST_P(RunAnalysisTest, OneRanksNonFiniteGradientsNameThatRank) {
  std::vector<v1::Capsule> run = CleanRun(world());
  SetLocal(run, last(), 2, std::nan(""), 7);
  SetGlobal(run, 2, std::nan(""), 1024);  // the reduction spreads it to every rank
  SetGlobal(run, 3, std::nan(""), 1024);
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "gradients.first_bad_rank");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.step(), 2);
  EXPECT_EQ(f.sequence(), 4u);
  EXPECT_EQ(t.outcome(), v1::TRIAGE_FINDING);
  EXPECT_EQ(t.ranks(last()).first_non_finite_step(), 2);
  EXPECT_FALSE(t.ranks(0).has_first_non_finite_step());

  const std::vector<std::string> paths = Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank " + std::to_string(last()) +
                          "'s gradients were non-finite before the reduction at step 2"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("data-driven / rank-local"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("next: capsule replay " + paths[last()] + " --bisect"), std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, OneCapsuleSpeaksForARankThatWroteNone) {
  // Rank `last` went bad and wrote nothing; the others' shared vectors still name it.
  std::vector<v1::Capsule> run = CleanRun(world());
  SetLocal(run, last(), 1, INFINITY, 3);
  run.pop_back();
  const v1::RunTriage t = Analyse(run);
  ASSERT_GE(t.findings_size(), 1) << RenderRunAnalysisText(t);
  EXPECT_EQ(t.findings(0).check(), "gradients.first_bad_rank");
  EXPECT_EQ(Ranks(t.findings(0)), std::vector<int>{last()});
  EXPECT_EQ(t.findings(0).step(), 1);
  ASSERT_EQ(t.missing_size(), 1);
  EXPECT_EQ(t.missing(0).first(), last());
  EXPECT_EQ(t.missing(0).last(), last());
  EXPECT_EQ(t.missing_count(), 1);
}

TEST_P(RunAnalysisTest, NonFiniteOnEveryRankIsAReplicatedBug) {
  std::vector<v1::Capsule> run = CleanRun(world());
  for (int r = 0; r < world(); ++r) SetLocal(run, r, 1, std::nan(""), 2);
  SetGlobal(run, 1, std::nan(""), 8);
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "gradients.replicated");
  EXPECT_EQ(f.ranks_size(), world());
  EXPECT_EQ(f.step(), 1);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("replicated bug"), std::string::npos) << r.output;
}

TEST_P(RunAnalysisTest, NonFiniteOnlyAfterTheReductionBlamesTheReduction) {
  std::vector<v1::Capsule> run = CleanRun(world());
  SetGlobal(run, 2, INFINITY, 5);
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "gradients.after_reduction");
  EXPECT_EQ(f.step(), 2);
  EXPECT_EQ(f.ranks_size(), 0);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("overflow in the reduction or a scaling error"), std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, ARankThatSkippedACollectiveIsNamed) {
  // Rank 1 never issued step 2's "grads" (sequence 4): its sequence 4 is the others' 5.
  std::vector<v1::Capsule> run = CleanRun(world());
  v1::Distributed& d = *run[1].mutable_distributed();
  d.mutable_collectives()->DeleteSubrange(4, 1);
  for (int i = 4; i < d.collectives_size(); ++i) {
    d.mutable_collectives(i)->set_sequence(d.collectives(i).sequence() - 1);
  }
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.skipped_collective");
  EXPECT_EQ(Ranks(f), std::vector<int>{1});
  EXPECT_EQ(f.sequence(), 4u);
  EXPECT_EQ(f.step(), 2);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 skipped collective 4 (allreduce grads"), std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, ACountMismatchNamesTheRankAndTheAttribute) {
  std::vector<v1::Capsule> run = CleanRun(world());
  v1::Collective& k = *run[last()].mutable_distributed()->mutable_collectives(4);
  k.set_numel(1000);
  k.mutable_in_shapes(0)->set_dims(0, 1000);
  k.mutable_out_shapes(0)->set_dims(0, 1000);
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.mismatch");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.sequence(), 4u);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("mismatch at sequence 4: rank " + std::to_string(last()) +
                          " allreduce grads 1000 float32"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("vs others allreduce grads 1024 float32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(numel, shapes differ)"), std::string::npos) << r.output;
  // Two ranks are a tie: the sentence says what broke it (rank 1's grads differ from its own).
  EXPECT_EQ(f.detail().find("no majority") != std::string::npos, world() == 2) << f.detail();
  if (world() == 2) {
    EXPECT_NE(f.detail().find("no majority: rank 0 made this call as in its earlier steps and "
                              "rank 1 did not"),
              std::string::npos)
        << f.detail();
  }
}

TEST_P(RunAnalysisTest, ATieNothingBreaksSaysEitherSideMayBeTheOddOne) {
  // Half the ranks call the first collective with another count: no majority and no history.
  std::vector<v1::Capsule> run = CleanRun(world());
  for (int rank = world() / 2; rank < world(); ++rank) {
    v1::Collective& k = *run[rank].mutable_distributed()->mutable_collectives(0);
    k.set_numel(1000);
    k.mutable_in_shapes(0)->set_dims(0, 1000);
    k.mutable_out_shapes(0)->set_dims(0, 1000);
  }
  const v1::RunTriage t = Analyse(run);
  ASSERT_GE(t.findings_size(), 1) << RenderRunAnalysisText(t);
  const v1::TriageFinding& f = t.findings(0);
  EXPECT_EQ(f.check(), "hang.mismatch");
  EXPECT_EQ(f.sequence(), 0u);
  const bool tie = world() % 2 == 0;
  EXPECT_EQ(f.detail().find("either side may be the odd one") != std::string::npos, tie)
      << f.detail();
}

TEST_P(RunAnalysisTest, ParametersThatDifferNameTheOddReplica) {
  std::vector<v1::Capsule> run = CleanRun(world());
  for (auto& f : *run[last()].mutable_distributed()->mutable_fingerprints()) {
    f.set_params(Hex16(0xbad000 + f.step()));
  }
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "desync.params");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.step(), 0);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("parameters differ at the start of step 0: rank " +
                          std::to_string(last()) + " (" + Hex16(0xbad000) + ")"),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, LocalRngSeededAlikeAndReplicatedRngThatDiffersAreFindings) {
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    for (auto& f : *c.mutable_distributed()->mutable_fingerprints()) f.set_local_rng(Hex16(42));
  }
  v1::Capsule& odd = run[last()];
  odd.mutable_distributed()->mutable_fingerprints(3)->set_replicated_rng(Hex16(7));
  const v1::RunTriage t = Analyse(run);
  ASSERT_EQ(t.findings_size(), 2) << RenderRunAnalysisText(t);
  EXPECT_EQ(t.findings(0).check(), "desync.replicated_rng");
  EXPECT_EQ(Ranks(t.findings(0)), std::vector<int>{last()});
  EXPECT_EQ(t.findings(0).step(), 3);
  EXPECT_EQ(t.findings(1).check(), "desync.local_rng_alike");
  EXPECT_EQ(t.findings(1).step(), 0);
}

TEST_P(RunAnalysisTest, ARankStuckOutsideAnyCollectiveIsNamed) {
  // The others began step 3 and wait in its "grads"; rank `last` completed step 2's calls and
  // issued nothing since (stuck in its data loader).
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    v1::Distributed& d = *c.mutable_distributed();
    d.mutable_collectives()->RemoveLast();  // step 3's capsule.agree was never reached
    d.mutable_reductions()->RemoveLast();   // nor was step 3 reduced
    if (c.placement().rank() == last()) {
      d.mutable_collectives()->RemoveLast();
      d.mutable_fingerprints()->RemoveLast();
      d.set_last_step(2);
      c.mutable_step()->set_global_step(2);
    } else {
      d.mutable_collectives(6)->set_state(v1::ENQUEUED);
      d.mutable_collectives(6)->set_completed_unix_micros(0);
      c.mutable_trigger()->set_kind(v1::HANG);
      v1::ThreadPosition& p = *d.add_threads();
      p.set_thread("trainer");
      p.set_position("collective grads (sequence 6)");
      p.set_step(3);
      p.set_seconds(30);
    }
  }
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.stuck_rank");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.sequence(), 6u);
  EXPECT_EQ(t.ranks(0).last_completed(), 5u);
  EXPECT_EQ(t.ranks(0).last_enqueued(), 6u);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(
                "rank " + std::to_string(last()) +
                " is stuck outside the recorded collectives: its last one (sequence 5) completed"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("never issued sequence 6 (allreduce grads, step 3)"), std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, ARankWhoseDataRanOutOneStepEarlyIsNamed) {
  // Rank `last`'s loop ended after step 2 and it went on to the final barrier (sequence 6), which
  // the others reached as step 3's "grads": the backend times out on both sides.
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    v1::Distributed& d = *c.mutable_distributed();
    d.mutable_collectives()->RemoveLast();  // step 3's capsule.agree was never reached
    d.mutable_reductions()->RemoveLast();   // nor was step 3 reduced
    if (c.placement().rank() == last()) {
      d.mutable_fingerprints()->RemoveLast();
      v1::Collective& end = *d.mutable_collectives(6);
      end.set_op("barrier");
      end.set_tag("end");
      end.set_dtype("");
      end.set_numel(0);
      end.clear_in_shapes();
      end.clear_out_shapes();
      end.set_reduce_op("");
      end.set_step(2);
      d.set_last_step(2);
      c.mutable_step()->set_global_step(2);
    }
    v1::Collective& k = *d.mutable_collectives(6);
    k.set_state(v1::FAILED);
    k.set_error("Timed out waiting 3000ms for recv operation to complete");
    c.mutable_trigger()->set_kind(v1::COLLECTIVE_ERROR);
  }
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.uneven_data");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.sequence(), 6u);
  EXPECT_EQ(f.step(), 3);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank " + std::to_string(last()) +
                          "'s data ran out one step early (uneven data): it began step 2 last, "
                          "the others step 3; at sequence 6 it called barrier end"),
            std::string::npos)
      << r.output;
}

// Every rank's collective `index` failed in the backend, except `skipper`'s: it issued the
// step's capsule.agree there instead (of `numel` elements) and was still waiting in it.
void FailWhereOneRankIssuedItsAgreement(std::vector<v1::Capsule>& run, int index, int skipper,
                                        int64_t numel) {
  for (v1::Capsule& c : run) {
    v1::Collective& k = *c.mutable_distributed()->mutable_collectives(index);
    k.set_state(v1::FAILED);
    k.set_error("Connection closed by peer");
    if (c.placement().rank() == skipper) {
      k.set_tag("capsule.agree");
      k.set_carries_agreement(false);
      k.set_numel(numel);
      k.mutable_in_shapes(0)->set_dims(0, numel);
      k.mutable_out_shapes(0)->set_dims(0, numel);
      k.set_state(v1::ENQUEUED);
      k.clear_error();
    }
    c.mutable_trigger()->set_kind(v1::COLLECTIVE_ERROR);
  }
}

TEST_P(RunAnalysisTest, ASkippedCollectiveIsNamedWhenTheOthersFailedInIt) {
  // Rank 1 skipped step 3's "grads" (sequence 6) and issued step 3's capsule.agree as its
  // sequence 6; the backend failed everyone there, so nobody has a sequence 7. The order the
  // others issue their calls in within a step says which rank skipped.
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) c.mutable_distributed()->mutable_collectives()->RemoveLast();
  FailWhereOneRankIssuedItsAgreement(run, 6, 1, world());
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.skipped_collective");
  EXPECT_EQ(Ranks(f), std::vector<int>{1});
  EXPECT_EQ(f.sequence(), 6u);
  EXPECT_EQ(f.step(), 3);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 skipped collective 6 (allreduce grads, step 3): its sequence 6 "
                          "(allreduce capsule.agree) is the call the others make right after "
                          "allreduce grads in every step"),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, ARankThatSkippedTheReductionCarryingTheAgreementIsNamed) {
  // Each step's "grads" carries the agreement rows (Distributed::StepEnd), so there is no
  // capsule.agree of its own: sequence k is step k's "grads". Rank 1 skipped step 3's and, with
  // no marked reduction, issued the agreement on its own as its sequence 3; the backend failed
  // the others there.
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    v1::Distributed& d = *c.mutable_distributed();
    d.clear_collectives();
    for (int step = 0; step < kSteps; ++step) {
      v1::Collective* k = AddCollective(&d, step, "grads", 1024 + 6 * world(), step);
      k->set_carries_agreement(true);
      d.mutable_reductions(step)->set_sequence(step);
    }
  }
  FailWhereOneRankIssuedItsAgreement(run, 3, 1, 6 * world());
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.skipped_collective");
  EXPECT_EQ(Ranks(f), std::vector<int>{1});
  EXPECT_EQ(f.sequence(), 3u);
  EXPECT_EQ(f.step(), 3);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 skipped collective 3 (allreduce grads, step 3): its sequence 3 "
                          "is the step's own agreement (allreduce capsule.agree), which the "
                          "others' allreduce grads carried"),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, EveryBucketOfAStepCountsNotJustItsLastReduction) {
  // A trainer that reduces per bucket writes several records a step. Rank `last`'s first bucket
  // of step 2 was non-finite and its second finite; step 3 is non-finite everywhere (the NaN
  // reached the weights). Keeping a step's last record only called it a replicated bug at step 3.
  std::vector<v1::Capsule> run = CleanRun(world());
  SetLocal(run, last(), 2, std::nan(""), 7);
  for (int rank = 0; rank < world(); ++rank) SetLocal(run, rank, 3, std::nan(""), 5);
  SetGlobal(run, 2, std::nan(""), 1024);
  SetGlobal(run, 3, std::nan(""), 1024);
  for (v1::Capsule& c : run) {
    auto& reductions = *c.mutable_distributed()->mutable_reductions();
    std::vector<v1::GradReduction> records(reductions.begin(), reductions.end());
    v1::GradReduction second = records[2];  // step 2's second bucket: finite everywhere
    second.set_sequence(5);
    second.set_local_norm(0.5);
    second.set_local_non_finite(0);
    for (int i = 0; i < world(); ++i) {
      second.set_rank_local_norms(i, 0.5);
      second.set_rank_local_non_finite(i, 0);
    }
    records.insert(records.begin() + 3, second);
    reductions.Clear();
    for (const v1::GradReduction& r : records) *reductions.Add() = r;
  }
  const v1::RunTriage t = Analyse(run);
  ASSERT_EQ(t.findings_size(), 1) << RenderRunAnalysisText(t);
  const v1::TriageFinding& f = Only(t, "gradients.first_bad_rank");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.step(), 2);
  EXPECT_EQ(f.sequence(), 4u);
  EXPECT_EQ(t.ranks(last()).first_non_finite_step(), 2);
  EXPECT_EQ(t.ranks(0).first_non_finite_step(), 3);
}

TEST_P(RunAnalysisTest, TheChecksumOfNoRankLocalRngIsNotSeededAlike) {
  // A trainer with no rank-local RNG: captures wrote the checksum of nothing, zero, on every rank.
  // That said "seeded alike", ahead of the wrong sum that was the real cause.
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    c.mutable_objective()->set_reduction(v1::TOKEN_MEAN);
    c.mutable_objective()->set_ranks(1);
    for (auto& f : *c.mutable_distributed()->mutable_fingerprints()) {
      f.set_local_rng("0000000000000000");
    }
    for (auto& r : *c.mutable_distributed()->mutable_reductions()) {
      r.set_local_norm(1.0);
      for (int i = 0; i < world(); ++i) r.set_rank_local_norms(i, 1.0);
      r.set_global_norm(world());
      r.set_divisor(1);
    }
  }
  v1::RunTriage t = Analyse(run);
  ASSERT_EQ(t.findings_size(), 1) << RenderRunAnalysisText(t);
  Only(t, "scaling.sum_not_mean");

  // Seeded alike for real, and the sum: the sum comes first.
  for (v1::Capsule& c : run) {
    for (auto& f : *c.mutable_distributed()->mutable_fingerprints()) f.set_local_rng(Hex16(42));
  }
  t = Analyse(run);
  ASSERT_EQ(t.findings_size(), 2) << RenderRunAnalysisText(t);
  EXPECT_EQ(t.findings(0).check(), "scaling.sum_not_mean");
  EXPECT_EQ(t.findings(1).check(), "desync.local_rng_alike");
}

// Rank `last` left the run after step 2; the others wait in step 3's "grads" (sequence 6). Its
// capsule is `last_kind`, with `message`.
std::vector<v1::Capsule> RankLeftAfterStep2(int world, v1::TriggerKind last_kind,
                                            const std::string& message) {
  std::vector<v1::Capsule> run = CleanRun(world);
  for (v1::Capsule& c : run) {
    v1::Distributed& d = *c.mutable_distributed();
    d.mutable_collectives()->RemoveLast();
    d.mutable_reductions()->RemoveLast();
    if (c.placement().rank() == world - 1) {
      d.mutable_collectives()->RemoveLast();
      d.mutable_fingerprints()->RemoveLast();
      d.set_last_step(2);
      c.mutable_step()->set_global_step(2);
      c.mutable_trigger()->set_kind(last_kind);
      c.mutable_trigger()->set_message(message);
    } else {
      d.mutable_collectives(6)->set_state(v1::ENQUEUED);
      d.mutable_collectives(6)->set_completed_unix_micros(0);
      c.mutable_trigger()->set_kind(v1::HANG);
    }
  }
  return run;
}

TEST_P(RunAnalysisTest, ARankThatRaisedIsNamedWithItsExceptionNotAsStuck) {
  const std::string what = "RuntimeError: shape '[4, 16]' is invalid for input of size 60";
  std::vector<v1::Capsule> run = RankLeftAfterStep2(world(), v1::EXCEPTION, what);
  const v1::RunTriage t = Analyse(run);
  ASSERT_EQ(t.findings_size(), 1) << RenderRunAnalysisText(t);
  const v1::TriageFinding& f = Only(t, "hang.exception");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.sequence(), 6u);
  EXPECT_NE(f.detail().find(what), std::string::npos) << f.detail();
  EXPECT_EQ(t.ranks(last()).error(), what);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank " + std::to_string(last()) +
                          " raised an exception in step 2 and left the run (\"" + what + "\")"),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, AnExceptionNoOtherFindingExplainsIsAFinding) {
  std::vector<v1::Capsule> run = CleanRun(world());
  run[last()].mutable_trigger()->set_kind(v1::EXCEPTION);
  run[last()].mutable_trigger()->set_message("ValueError: bad batch");
  const v1::RunTriage t = Analyse(run);
  ASSERT_EQ(t.findings_size(), 1) << RenderRunAnalysisText(t);
  const v1::TriageFinding& f = Only(t, "rank.exception");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.step(), kSteps - 1);
  EXPECT_EQ(t.outcome(), v1::TRIAGE_FINDING);
}

TEST_P(RunAnalysisTest, AReductionThatSummedIsNamedWithItsRatio) {
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    c.mutable_objective()->set_reduction(v1::TOKEN_MEAN);
    c.mutable_objective()->set_ranks(1);
    for (auto& r : *c.mutable_distributed()->mutable_reductions()) {
      r.set_local_norm(1.0);
      for (int i = 0; i < world(); ++i) r.set_rank_local_norms(i, 1.0);
      r.set_global_norm(world());  // aligned gradients, summed
      r.set_divisor(1);
    }
  }
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "scaling.sum_not_mean");
  EXPECT_DOUBLE_EQ(f.value(), world());
  EXPECT_EQ(f.step(), 0);
  EXPECT_NE(f.detail().find("the reduction's divisor was 1"), std::string::npos) << f.detail();
  EXPECT_NE(f.detail().find("objective ranks 1"), std::string::npos) << f.detail();

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("the reduction summed where a mean was meant (post/mean-of-local = " +
                          std::to_string(world()) + ")"),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, AveragingALossNormalisedOverAllRanksIsAFinding) {
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    c.mutable_objective()->set_reduction(v1::TOKEN_MEAN);
    c.mutable_objective()->set_ranks(world());
  }
  const v1::RunTriage t = Analyse(run);
  Only(t, "scaling.double_average");
}

TEST_P(RunAnalysisTest, AMissingRankIsUndecidedNotGuessed) {
  std::vector<v1::Capsule> run = CleanRun(world());
  run.pop_back();
  const v1::RunTriage t = Analyse(run);
  EXPECT_EQ(t.outcome(), v1::TRIAGE_UNDECIDED) << RenderRunAnalysisText(t);
  EXPECT_EQ(t.findings_size(), 0) << RenderRunAnalysisText(t);
  ASSERT_EQ(t.missing_size(), 1);
  EXPECT_EQ(t.missing(0).first(), last());
  EXPECT_EQ(t.missing(0).last(), last());
  EXPECT_EQ(t.missing_count(), 1);
  ASSERT_GE(t.undecided_size(), 1);
  bool hang = false;
  for (const auto& u : t.undecided()) {
    EXPECT_NE(u.reason().find("cannot decide: no capsule from rank " + std::to_string(last())),
              std::string::npos)
        << u.reason();
    hang |= u.check() == "hang";
  }
  EXPECT_TRUE(hang);

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cannot decide: no capsule from rank " + std::to_string(last())),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, EveryPresentRankWaitingOnAMissingRankIsADeadPeer) {
  std::vector<v1::Capsule> run = CleanRun(world());
  run.pop_back();
  for (v1::Capsule& c : run) {
    v1::Distributed& d = *c.mutable_distributed();
    d.mutable_collectives(7)->set_state(v1::FAILED);
    d.mutable_collectives(7)->set_error("Connection closed by peer");
    d.mutable_agreement()->set_step(3);
    d.mutable_agreement()->add_missing_ranks(last());
    c.mutable_trigger()->set_kind(v1::COLLECTIVE_ERROR);
  }
  const v1::RunTriage t = Analyse(run);
  ASSERT_GE(t.findings_size(), 1) << RenderRunAnalysisText(t);
  EXPECT_EQ(t.findings(0).check(), "hang.dead_peer");
  EXPECT_TRUE(Ranks(t.findings(0)).empty());
  ASSERT_EQ(t.findings(0).missing_size(), 1);
  EXPECT_EQ(t.findings(0).missing(0).first(), last());
  EXPECT_EQ(t.findings(0).missing(0).last(), last());
  EXPECT_EQ(t.findings(0).sequence(), 7u);
  EXPECT_NE(t.findings(0).detail().find("Connection closed by peer"), std::string::npos);
}

TEST_P(RunAnalysisTest, CapsulesOfSeveralRunsNeedRun) {
  std::vector<v1::Capsule> a = CleanRun(world(), "run-a");
  std::vector<v1::Capsule> b = CleanRun(world(), "run-b");
  SetLocal(b, 0, 1, std::nan(""), 1);
  std::vector<v1::Capsule> both = a;
  both.insert(both.end(), b.begin(), b.end());
  const v1::RunTriage t = Analyse(both);
  EXPECT_EQ(t.outcome(), v1::TRIAGE_SEVERAL_RUNS);
  ASSERT_EQ(t.runs_size(), 2);
  EXPECT_EQ(t.runs(0).run_id(), "run-a");
  EXPECT_EQ(t.runs(1).capsules(), world());
  const v1::RunTriage picked = Analyse(both, {}, "run-b");
  EXPECT_EQ(picked.outcome(), v1::TRIAGE_FINDING);
  EXPECT_EQ(picked.skipped_size(), world());
  EXPECT_EQ(picked.findings(0).check(), "gradients.first_bad_rank");

  Write(both);
  CommandResult r = Cli();
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("run run-a: " + std::to_string(world()) + " capsules"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--run ID picks one"), std::string::npos) << r.output;
  EXPECT_EQ(Cli(" --run run-a").status, 0);
  EXPECT_EQ(Cli(" --run run-b").status, 1);
  EXPECT_EQ(Cli(" --run run-c").status, 2);
}

TEST_P(RunAnalysisTest, ATamperedCapsuleIsListedAndNeverUsed) {
  std::vector<v1::Capsule> run = CleanRun(world());
  // A copy of rank `last`'s capsule that claims non-finite gradients, with one byte changed after
  // signing: were it used, the triage would name rank `last`.
  std::vector<v1::Capsule> forged = {run[last()]};
  SetLocal(forged, last(), 0, std::nan(""), 9);
  forged[0].mutable_step()->set_global_step(9);
  const std::vector<std::string> paths = Write(run);
  const std::string forged_path = Write(forged)[0];
  auto bytes = ReadFileBytes(forged_path, 1 << 20);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= 0x01;
  {
    std::FILE* f = std::fopen(forged_path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes->data(), 1, bytes->size(), f);
    std::fclose(f);
  }
  CommandResult r = Cli();
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("unreadable (not used): " + forged_path + ": "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("digest mismatch"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("non-finite before"), std::string::npos) << r.output;
  r = Cli(" --json");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"unreadable\":[{\"capsule\":\"" + forged_path), std::string::npos)
      << r.output;

  // When the tampered file is the rank's only capsule, the rank is missing.
  fs::remove(paths[last()]);
  r = Cli();
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cannot decide: no capsule from rank " + std::to_string(last())),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, CapsuleTextIsEscaped) {
  std::vector<v1::Capsule> run = CleanRun(world());
  v1::Collective& k = *run[last()].mutable_distributed()->mutable_collectives(4);
  k.set_tag("grads\x1b[2K\nrank 0: OK");
  const v1::RunTriage t = Analyse(run);
  const std::string text = RenderRunAnalysisText(t);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("grads\\x1b[2K\\nrank 0: OK"), std::string::npos) << text;
  Only(t, "hang.mismatch");
}

TEST_P(RunAnalysisTest, AClaimedWorldSizeCostsWhatTheCapsulesPresentCost) {
  // Every capsule claims a million ranks; only world() wrote one. The missing ones are one range,
  // in the result and in the text, not a million numbers.
  constexpr int kClaimed = 1000000;
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) c.mutable_placement()->set_world_size(kClaimed);
  const v1::RunTriage t = Analyse(run);
  EXPECT_EQ(t.world_size(), kClaimed);
  EXPECT_EQ(t.ranks_present_size(), world());
  ASSERT_EQ(t.missing_size(), 1);
  EXPECT_EQ(t.missing(0).first(), world());
  EXPECT_EQ(t.missing(0).last(), kClaimed - 1);
  EXPECT_EQ(t.missing_count(), kClaimed - world());
  const std::string text = RenderRunAnalysisText(t);
  EXPECT_LT(text.size(), 8192u) << text.substr(0, 2000);
  EXPECT_NE(
      text.find("cannot decide: no capsule from ranks " + std::to_string(world()) + "..999999"),
      std::string::npos)
      << text;
  EXPECT_LT(RenderRunAnalysisJson(t).size(), 8192u);

  Write(run);
  CommandResult r = Cli();
  EXPECT_EQ(r.status, 2) << r.output.substr(0, 2000);
  EXPECT_LT(r.output.size(), 8192u) << r.output.substr(0, 2000);
  EXPECT_NE(r.output.find("missing: ranks " + std::to_string(world()) + "..999999 (" +
                          std::to_string(kClaimed - world()) + " ranks)"),
            std::string::npos)
      << r.output.substr(0, 2000);
  r = Cli(" --json");
  EXPECT_LT(r.output.size(), 8192u) << r.output.substr(0, 2000);
  EXPECT_NE(r.output.find("\"missing_count\":" + std::to_string(kClaimed - world())),
            std::string::npos)
      << r.output.substr(0, 2000);
}

TEST_P(RunAnalysisTest, TheLargestWorldSizeAndSequenceNumbersAreTriagedInTheirEntriesTime) {
  // 2^31 - 1 ranks claimed (no reader lets such a capsule through; the analysis must not depend
  // on that), and one rank whose ring ends at the last sequence number there is: the ranks
  // present and the entries they hold are what the triage visits.
  std::vector<v1::Capsule> run = CleanRun(world());
  for (v1::Capsule& c : run) {
    c.mutable_placement()->set_world_size(std::numeric_limits<int32_t>::max());
  }
  v1::Collective* far = AddCollective(run[last()].mutable_distributed(),
                                      std::numeric_limits<uint64_t>::max(), "grads", 1024, kSteps);
  far->set_state(v1::ENQUEUED);
  const v1::RunTriage t = Analyse(run);
  EXPECT_EQ(t.world_size(), std::numeric_limits<int32_t>::max());
  ASSERT_EQ(t.missing_size(), 1);
  EXPECT_EQ(t.missing(0).first(), world());
  EXPECT_EQ(t.missing(0).last(), std::numeric_limits<int32_t>::max() - 1);
  EXPECT_EQ(t.ranks(last()).last_enqueued(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(t.findings_size(), 0) << RenderRunAnalysisText(t);
  EXPECT_EQ(t.outcome(), v1::TRIAGE_UNDECIDED) << RenderRunAnalysisText(t);
  EXPECT_LT(RenderRunAnalysisText(t).size(), 8192u);
}

TEST_P(RunAnalysisTest, TheInputKeepsWhatItNeedsAndNotTheCapsule) {
  // Each capsule is dropped once added: the analysis must not read it afterwards, and what it
  // keeps of it is the small part it reads, not the tensors.
  std::vector<v1::Capsule> run = CleanRun(world());
  SetLocal(run, last(), 2, std::nan(""), 7);
  RunAnalysisInput input;
  for (const v1::Capsule& c : run) {
    auto copy = std::make_unique<v1::Capsule>(c);
    v1::TensorBlob& big = *copy->add_tensors();
    big.set_name("weights");
    big.mutable_data()->assign(1 << 20, '\x7f');
    input.Add(dir_ + "/" + FileName(c), *copy);
    copy.reset();
  }
  RunAnalysisOptions options;
  options.dir = dir_;
  const v1::RunTriage t = *AnalyseRun(input, options);
  const v1::TriageFinding& f = Only(t, "gradients.first_bad_rank");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_EQ(f.capsule(), dir_ + "/" + FileName(run[last()]));
}

// Sends "act" from rank 0 to rank `to`, #0 .. #count-1, one per step, completed.
void AddSends(v1::Capsule& from, v1::Capsule& to, int count) {
  for (int n = 0; n < count; ++n) {
    for (auto [c, op, peer] : {std::make_tuple(&from, "send", to.placement().rank()),
                               std::make_tuple(&to, "recv", from.placement().rank())}) {
      v1::Collective& k = *c->mutable_distributed()->add_point_to_point();
      k.set_sequence(n);
      k.set_op(op);
      k.set_tag("act");
      k.set_peer(peer);
      k.set_dtype("float32");
      k.set_numel(16);
      k.set_state(v1::COMPLETED);
      k.set_enqueued_unix_micros(1780000000000000 + n * 20);
      k.set_completed_unix_micros(1780000000000001 + n * 20);
      k.set_step(n);
    }
  }
}

TEST_P(RunAnalysisTest, ARankWaitingInAReceiveIsNamedWithThePeerThatNeverSent) {
  // Rank `last` receives step 3's activations from rank 0 (#3) before its "grads"; rank 0 went
  // straight to "grads" (sequence 6) without sending.
  std::vector<v1::Capsule> run = RankLeftAfterStep2(world(), v1::HANG, "dump requested");
  AddSends(run[0], run[last()], 3);
  v1::Collective& wait = *run[last()].mutable_distributed()->add_point_to_point();
  wait.set_sequence(3);
  wait.set_op("recv");
  wait.set_tag("act");
  wait.set_peer(0);
  wait.set_numel(16);
  wait.set_state(v1::ENQUEUED);
  wait.set_enqueued_unix_micros(1780000000009000);
  wait.set_step(3);
  run[last()].mutable_distributed()->set_last_step(3);
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.point_to_point");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_NE(f.detail().find("waits in recv act from rank 0 (#3, step 3)"), std::string::npos)
      << f.detail();
  EXPECT_NE(f.detail().find("rank 0 never issued the matching send #3 (its last send to rank " +
                            std::to_string(last()) + ": #2)"),
            std::string::npos)
      << f.detail();

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("hang.point_to_point: rank " + std::to_string(last()) + " waits in"),
            std::string::npos)
      << r.output;
}

TEST_P(RunAnalysisTest, TheRankThatFailedFirstIsTheCulpritAndTheOthersVictims) {
  // Rank 1 died in the backend at step 3's "grads" (sequence 6, still enqueued on its side);
  // the others' "grads" then failed (the connection closed), and rank `last`'s trainer rethrew
  // the error as an EXCEPTION capsule too. The rings agree: only the times tell.
  const int64_t t0 = 1780000000100000;
  std::vector<v1::Capsule> run = CleanRun(world());
  std::vector<v1::Capsule> extra;
  for (v1::Capsule& c : run) {
    v1::Distributed& d = *c.mutable_distributed();
    d.mutable_collectives()->RemoveLast();
    d.mutable_reductions()->RemoveLast();
    v1::Collective& k = *d.mutable_collectives(6);
    const int rank = c.placement().rank();
    c.mutable_trigger()->set_kind(v1::COLLECTIVE_ERROR);
    if (rank == 1) {
      k.set_state(v1::ENQUEUED);
      k.set_completed_unix_micros(0);
      c.set_created_unix_micros(t0);
      c.mutable_trigger()->set_message(
          "rank 1: the process is terminating in the collective backend: out of memory");
      continue;
    }
    k.set_state(v1::FAILED);
    k.set_error("Connection closed by peer");
    k.set_completed_unix_micros(t0 + 2000 + rank);
    c.set_created_unix_micros(t0 + 3000 + rank);
    c.mutable_trigger()->set_message("collective allreduce grads (sequence 6) failed");
    if (rank == last()) {
      v1::Capsule e = c;
      e.mutable_trigger()->set_kind(v1::EXCEPTION);
      e.mutable_trigger()->set_message("Connection closed by peer");
      e.set_created_unix_micros(t0 + 9000);
      extra.push_back(std::move(e));
    }
  }
  run.insert(run.end(), extra.begin(), extra.end());
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "rank.first_failure");
  EXPECT_EQ(Ranks(f), std::vector<int>{1});
  EXPECT_NE(f.detail().find("rank 1 failed first (COLLECTIVE_ERROR at step 3, 2 ms before any "
                            "other: \"rank 1: the process is terminating"),
            std::string::npos)
      << f.detail();
  for (const v1::RankEvidence& e : t.ranks()) {
    EXPECT_EQ(e.role(), e.rank() == 1 ? "culprit" : "victim") << e.rank();
  }

  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank.first_failure: rank 1 failed first"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("rank.exception"), std::string::npos) << r.output;
}

TEST_P(RunAnalysisTest, ARankThatRaisedIsTheCulpritAndTheWaitingRanksVictims) {
  std::vector<v1::Capsule> run = RankLeftAfterStep2(world(), v1::EXCEPTION, "ValueError: bad");
  const v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.exception");
  std::vector<int> others;
  for (int r = 0; r < last(); ++r) others.push_back(r);
  std::string victims = others.size() == 1 ? "rank 0" : "ranks 0";
  for (size_t i = 1; i < others.size(); ++i) victims += ", " + std::to_string(others[i]);
  EXPECT_NE(f.detail().find("; " + victims + " failed or hung after it in what it left"),
            std::string::npos)
      << f.detail();
  for (const v1::RankEvidence& e : t.ranks()) {
    EXPECT_EQ(e.role(), e.rank() == last() ? "culprit" : "victim") << e.rank();
  }
}

TEST_P(RunAnalysisTest, ARankThatFinishedItsLoopEarlyIsUnevenDataNotStuck) {
  // Rank `last` finished its loop after step 2 (it said so through the store); the others went
  // on to step 3 and wait in its "grads". Its own capsule (written when the others asked) shows
  // it idle after a completed collective, as a stuck rank would be: the step numbers tell.
  std::vector<v1::Capsule> run = RankLeftAfterStep2(world(), v1::HANG, "dump requested");
  for (int r = 0; r < last(); ++r) {
    v1::FinishedRank& done = *run[r].mutable_distributed()->add_finished();
    done.set_rank(last());
    done.set_last_step(2);
  }
  v1::RunTriage t = Analyse(run);
  const v1::TriageFinding& f = Only(t, "hang.uneven_data");
  EXPECT_EQ(Ranks(f), std::vector<int>{last()});
  EXPECT_NE(f.detail().find("rank " + std::to_string(last()) +
                            " finished its training loop after step 2 while the others went on "
                            "to step 3"),
            std::string::npos)
      << f.detail();

  // Without its capsule (its process ended): the same, not a dead peer.
  run.pop_back();
  t = Analyse(run);
  const v1::TriageFinding& g = Only(t, "hang.uneven_data");
  EXPECT_EQ(Ranks(g), std::vector<int>{last()});
  EXPECT_EQ(g.sequence(), 6u);
  ASSERT_EQ(g.missing_size(), 1);
  EXPECT_EQ(g.missing(0).first(), last());
  Write(run);
  const CommandResult r = Cli();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("it wrote no capsule"), std::string::npos) << r.output;
}

TEST(RunTriageCliTest, AFolderWithoutCapsulesOrThatDoesNotExistExitsTwo) {
  char tmpl[] = "/tmp/capsule-run-triage-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  CommandResult r = RunCli(std::string("triage ") + tmpl);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("no *.capsule file in"), std::string::npos) << r.output;
  fs::remove_all(tmpl);
  r = RunCli(std::string("triage ") + tmpl);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cannot read the folder"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace capsule
