// The run analysis's own parts (ranks/run_analysis.h): how it keeps the ranks' capsules, the
// names and ranges its sentences use, and the Analysis whose checks live one concern to a file:
// run_analysis.cc (the run, the ranks' views, completeness, evidence, outcome), gradients.cc,
// ring.cc (collective and point-to-point alignment, hangs), roles.cc (culprit and victims),
// fingerprints.cc (replicas and RNG), scaling.cc.
// Not installed.
//
// Thread safety: an Analysis is used from one thread; the free functions are pure.
#ifndef CAPSULE_RANKS_INTERNAL_ANALYSIS_H_
#define CAPSULE_RANKS_INTERNAL_ANALYSIS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "capsule/base/internal/printable.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/triage.pb.h"
#include "capsule/ranks/run_analysis.h"

namespace capsule::ranks {

// Capsule strings in a sentence or a table cell: escaped, and short enough for one line.
constexpr size_t kFieldBytes = 64;
inline std::string Field(std::string_view s) { return PrintableShort(s, kFieldBytes); }

// "rank 3", "ranks 0, 2".
std::string RankList(const std::vector<int>& ranks);

// Ranks [first, last], both included: how missing ranks are kept, whatever world size the
// capsules claim.
struct Range {
  int first = 0;
  int last = 0;
};

// The ranks of [0, world) that are not in `known` (sorted, unique, each in [0, world)).
template <typename Sorted>
std::vector<Range> Gaps(const Sorted& known, int world) {
  std::vector<Range> out;
  int64_t next = 0;
  for (int r : known) {
    if (r > next) out.push_back({static_cast<int>(next), r - 1});
    next = int64_t{r} + 1;
  }
  if (next < world) out.push_back({static_cast<int>(next), world - 1});
  return out;
}

// The keys of `m`, in order.
template <typename Map>
std::vector<int> Keys(const Map& m) {
  std::vector<int> out;
  out.reserve(m.size());
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}

int64_t Count(const std::vector<Range>& ranges);
// "rank 3", "ranks 2..5", "ranks 0, 2..5, 7"; at most a few ranges, then how many more.
std::string RangeList(const std::vector<Range>& ranges);
void AddRanges(const std::vector<Range>& ranges,
               google::protobuf::RepeatedPtrField<v1::RankRange>* out);

// One capsule as the analysis keeps it.
struct RunCapsule {
  std::string path;
  const v1::Capsule* capsule = nullptr;
};

// What the analysis reads of a capsule: the rest (tensors, data, numerics) is dropped.
std::unique_ptr<v1::Capsule> KeptParts(const v1::Capsule& c);

// One rank's view of the run, merged over its capsules oldest first: the rings are cumulative and
// bounded, so a later capsule holds the newer entries (and the newer state of an entry both hold).
struct RankView {
  int rank = 0;
  std::vector<const RunCapsule*> capsules;  // oldest first
  std::map<uint64_t, const v1::Collective*> collectives;
  // Every reduction record, by (step, sequence): a trainer that reduces per bucket writes several
  // a step. `reductions` is their step's health as one record (CombineStep).
  std::map<std::pair<int64_t, uint64_t>, const v1::GradReduction*> records;
  std::map<int64_t, v1::GradReduction> reductions;  // by step
  std::map<int64_t, const v1::StepFingerprint*> fingerprints;
  // Point-to-point ops by (peer, "send"/"recv", count with that peer in that direction).
  std::map<std::tuple<int, std::string, uint64_t>, const v1::Collective*> p2p;
  int64_t last_step = 0;

  const v1::Capsule& latest() const { return *capsules.back()->capsule; }
  const std::string& latest_path() const { return capsules.back()->path; }
  // The capsule to replay for `step`: one written at that step, else the first written after it,
  // else the latest.
  const std::string& PathFor(int64_t step) const {
    for (const RunCapsule* c : capsules) {
      if (c->capsule->step().global_step() == step) return c->path;
    }
    for (const RunCapsule* c : capsules) {
      if (c->capsule->step().global_step() > step) return c->path;
    }
    return latest_path();
  }
};

// A step's reduction records (one per bucket) as one: norms combine as the root of the sum of
// squares, non-finite counts add, the sequence is the first record's that was non-finite before
// (else after) its reduction, else the first's; the per-rank vectors combine alike where every
// record shared them.
v1::GradReduction CombineStep(const std::vector<const v1::GradReduction*>& records);

// Every rank's gradient health at one reduced step, from the ranks' own records and from the
// per-rank vectors the trigger agreement shared (which let one capsule speak for a missing rank).
struct StepHealth {
  std::map<int, double> local_norm;
  std::map<int, bool> local_bad;
  std::map<int, const v1::GradReduction*> own;  // the records the ranks wrote themselves
};

// What must agree between the ranks' entries at one sequence for the collective to match.
// The step is part of it: every rank issues the same sequence in the same step, so a rank whose
// entry at s is the others' s+1 of the same step skipped one, whatever the op.
struct CollectiveKey {
  std::string op, tag, dtype, in_shapes, out_shapes;
  int64_t numel = 0;
  int64_t step = 0;
  auto Tied() const { return std::tie(op, tag, dtype, in_shapes, out_shapes, numel, step); }
  bool operator==(const CollectiveKey& o) const { return Tied() == o.Tied(); }
  bool operator<(const CollectiveKey& o) const { return Tied() < o.Tied(); }
  // Everything but the step: what a rank's entries of one call site share from step to step.
  bool SameCall(const CollectiveKey& o) const {
    return std::tie(op, tag, dtype, in_shapes, out_shapes, numel) ==
           std::tie(o.op, o.tag, o.dtype, o.in_shapes, o.out_shapes, o.numel);
  }
};

// "[4,3][5]"
std::string Shapes(const google::protobuf::RepeatedPtrField<v1::CollectiveShape>& shapes);
CollectiveKey KeyOf(const v1::Collective& c);
// "allreduce grads"
std::string OpTag(const v1::Collective& c);
// "allreduce grads 1024 float32 [1024]"
std::string Described(const v1::Collective& c);
// "numel differs", "op, tag differ"
std::string Differing(const CollectiveKey& a, const CollectiveKey& b);

// A finding being filled in: the setters for the optional parts.
class FindingRef {
 public:
  explicit FindingRef(v1::TriageFinding* f = nullptr) : f_(f) {}
  FindingRef& step(int64_t step) {
    f_->set_step(step);
    return *this;
  }
  FindingRef& step(int64_t step, uint64_t sequence) {
    f_->set_step(step);
    f_->set_sequence(sequence);
    return *this;
  }
  FindingRef& value(double v) {
    f_->set_value(v);
    return *this;
  }
  FindingRef& missing(const std::vector<Range>& ranks) {
    AddRanges(ranks, f_->mutable_missing());
    return *this;
  }

 private:
  v1::TriageFinding* f_;
};

// One analysis of one run: Run() fills `out` with the findings, in the order completeness,
// gradients, hang, first failure, exceptions, desync, scaling.
class Analysis {
 public:
  Analysis(const std::vector<RunCapsule>& capsules, const RunAnalysisOptions& options,
           v1::RunTriage* out)
      : capsules_(capsules), options_(options), out_(*out) {}
  void Run();

 private:
  // run_analysis.cc
  bool SelectRun();  // false when no run is chosen
  void Skip(const RunCapsule& c, const std::string& reason);
  void BuildViews();
  void Completeness();
  void Evidence();
  void Decide();
  FindingRef Add(const std::string& check, const std::string& detail, const std::vector<int>& ranks,
                 const std::string& path);
  void Undecided(const std::string& check, const std::string& reason);
  static std::string NoCapsuleFrom(const std::vector<Range>& ranks) {
    return "cannot decide: no capsule from " + RangeList(ranks);
  }
  // The capsule of `rank` for `step`, or of the lowest rank present when `rank` wrote none.
  const std::string& PathShowing(int rank, int64_t step) const;

  // gradients.cc
  void Gradients();
  bool AllRanksKnownEverywhere() const;

  // ring.cc
  void Hang();
  const v1::Collective* At(const RankView& v, uint64_t seq) const;
  bool LikeItsHistory(const RankView& v, const v1::Collective& c, uint64_t seq) const;
  bool FollowsInStep(const RankView& w, const v1::Collective& first, const v1::Collective& then,
                     uint64_t seq) const;
  void Mismatch(const std::set<uint64_t>& seqs, std::set<int>* named);
  void Behind(uint64_t hi, const std::set<int>& named);
  // The check and the sentence for rank `v`, whose ring stops before sequence `s` the others wait
  // in; `issued` is "never issued sequence s (...) that ranks ... wait in".
  std::pair<std::string, std::string> WhyBehind(const RankView& v, uint64_t s, int64_t last_step,
                                                const std::string& issued) const;
  std::string UnevenData(int rank, int64_t its_last, int64_t others_last) const;
  bool FinishedPeers(const std::set<uint64_t>& seqs);
  // The rank's newest point-to-point op that did not complete; null when none.
  const v1::Collective* PendingP2p(const RankView& v) const;
  static std::string P2pText(const v1::Collective& c);
  std::string P2pPeerSays(int rank, const v1::Collective& c) const;
  void PointToPoint();
  static std::string ExceptionText(const RankView& v);
  void Exceptions();
  void DeadPeer(const std::set<uint64_t>& seqs);
  static std::string Position(const RankView& v);

  // roles.cc
  // When the rank first failed (unix micros): an EXCEPTION or COLLECTIVE_ERROR capsule, a failed
  // entry; int64 max when never.
  static int64_t FirstFailure(const RankView& v);
  static bool Affected(const RankView& v);
  void Roles();

  // fingerprints.cc
  using Checksum = std::string (*)(const v1::StepFingerprint&);
  static bool Recorded(const std::string& sum);
  bool FirstDisagreement(const char* check, const char* what, Checksum sum);
  void Desync();
  void LocalRngAlike();

  // scaling.cc
  void Scaling();

  const std::vector<RunCapsule>& capsules_;
  const RunAnalysisOptions& options_;
  v1::RunTriage& out_;
  std::vector<const RunCapsule*> run_;
  std::map<int, RankView> views_;
  std::vector<int> present_;
  std::vector<Range> missing_;  // the ranks of [0, world_) without a capsule
  int world_ = 0;
  std::map<int64_t, StepHealth> health_;
  std::map<int, int64_t> first_bad_step_;
  bool gradients_decided_ = false;
  bool hang_found_ = false;
  std::set<int> named_;               // ranks a hang finding named
  std::map<int, int64_t> finished_;   // rank -> last step, as any capsule recorded it
  std::map<int, std::string> roles_;  // "culprit", "victim"
};

}  // namespace capsule::ranks

#endif  // CAPSULE_RANKS_INTERNAL_ANALYSIS_H_
