#include "capsule/report/run_triage.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "capsule/base/printable.h"
#include "capsule/base/strings.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/triage.pb.h"
#include "capsule/report/internal/json.h"
#include "capsule/report/internal/text.h"

namespace capsule {
namespace {

// Capsule strings in a sentence or a table cell: escaped, and short enough for one line.
constexpr size_t kFieldBytes = 64;
std::string Field(std::string_view s) { return PrintableShort(s, kFieldBytes); }

std::string RankList(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

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

int64_t Count(const std::vector<Range>& ranges) {
  int64_t n = 0;
  for (const Range& r : ranges) n += int64_t{r.last} - r.first + 1;
  return n;
}

// "rank 3", "ranks 2..5", "ranks 0, 2..5, 7"; at most a few ranges, then how many more.
std::string RangeList(const std::vector<Range>& ranges) {
  constexpr size_t kShown = 8;
  const bool one = ranges.size() == 1 && ranges[0].first == ranges[0].last;
  std::string out = one ? "rank " : "ranks ";
  for (size_t i = 0; i < ranges.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranges[i].first);
    if (ranges[i].last != ranges[i].first) out += ".." + std::to_string(ranges[i].last);
  }
  if (ranges.size() > kShown) {
    std::vector<Range> rest(ranges.begin() + kShown, ranges.end());
    out += " and " + std::to_string(Count(rest)) + " more";
  }
  return out;
}

void AddRanges(const std::vector<Range>& ranges,
               google::protobuf::RepeatedPtrField<v1::RankRange>* out) {
  for (const Range& r : ranges) {
    v1::RankRange& x = *out->Add();
    x.set_first(r.first);
    x.set_last(r.last);
  }
}

// One capsule as the analysis keeps it.
struct RunCapsule {
  std::string path;
  const v1::Capsule* capsule = nullptr;
};

// What the analysis reads of a capsule: the rest (tensors, data, numerics) is dropped.
std::unique_ptr<v1::Capsule> KeptParts(const v1::Capsule& c) {
  auto k = std::make_unique<v1::Capsule>();
  *k->mutable_placement() = c.placement();
  k->mutable_step()->set_global_step(c.step().global_step());
  k->mutable_trigger()->set_kind(c.trigger().kind());
  k->mutable_trigger()->set_message(c.trigger().message());  // an EXCEPTION's what()
  k->set_created_unix_micros(c.created_unix_micros());
  if (c.has_objective()) *k->mutable_objective() = c.objective();
  if (c.has_distributed()) *k->mutable_distributed() = c.distributed();
  return k;
}

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
v1::GradReduction CombineStep(const std::vector<const v1::GradReduction*>& records) {
  v1::GradReduction out = *records.front();
  if (records.size() == 1) return out;
  double local = 0, global = 0;
  int64_t local_bad = 0, global_bad = 0;
  const int shared = records.front()->rank_local_norms_size();
  std::vector<double> rank_norms(static_cast<size_t>(shared), 0.0);
  std::vector<int64_t> rank_bad(static_cast<size_t>(shared), 0);
  bool all_shared = true;
  const v1::GradReduction* blamed = nullptr;
  for (const v1::GradReduction* r : records) {
    local += r->local_norm() * r->local_norm();
    global += r->global_norm() * r->global_norm();
    local_bad += r->local_non_finite();
    global_bad += r->global_non_finite();
    const bool bad_before = r->local_non_finite() > 0 || !std::isfinite(r->local_norm());
    const bool bad_after = r->global_non_finite() > 0 || !std::isfinite(r->global_norm());
    if (blamed == nullptr && (bad_before || bad_after)) blamed = r;
    if (r->rank_local_norms_size() != shared || r->rank_local_non_finite_size() != shared) {
      all_shared = false;
      continue;
    }
    for (int i = 0; i < shared; ++i) {
      rank_norms[static_cast<size_t>(i)] += r->rank_local_norms(i) * r->rank_local_norms(i);
      rank_bad[static_cast<size_t>(i)] += r->rank_local_non_finite(i);
    }
  }
  out.set_local_norm(std::sqrt(local));
  out.set_global_norm(std::sqrt(global));
  out.set_local_non_finite(local_bad);
  out.set_global_non_finite(global_bad);
  if (blamed != nullptr) out.set_sequence(blamed->sequence());
  out.clear_rank_local_norms();
  out.clear_rank_local_non_finite();
  if (all_shared) {
    for (int i = 0; i < shared; ++i) {
      out.add_rank_local_norms(std::sqrt(rank_norms[static_cast<size_t>(i)]));
      out.add_rank_local_non_finite(rank_bad[static_cast<size_t>(i)]);
    }
  }
  return out;
}

// Every rank's gradient health at one reduced step, from the ranks' own records and from the
// per-rank vectors the trigger agreement shared (which let one capsule speak for a missing rank).
struct StepHealth {
  std::map<int, double> local_norm;
  std::map<int, bool> local_bad;
  std::map<int, const v1::GradReduction*> own;  // the records the ranks wrote themselves
};

bool LocalBad(double norm, int64_t non_finite) { return non_finite > 0 || !std::isfinite(norm); }

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

std::string Shapes(const google::protobuf::RepeatedPtrField<v1::CollectiveShape>& shapes) {
  std::string out;
  for (const auto& s : shapes) {
    out += "[";
    for (int i = 0; i < s.dims_size(); ++i) out += (i ? "," : "") + std::to_string(s.dims(i));
    out += "]";
  }
  return out;
}

CollectiveKey KeyOf(const v1::Collective& c) {
  return {c.op(),    c.tag(), c.dtype(), Shapes(c.in_shapes()), Shapes(c.out_shapes()),
          c.numel(), c.step()};
}

// "allreduce grads"
std::string OpTag(const v1::Collective& c) {
  return Field(c.op()) + (c.tag().empty() ? "" : " " + Field(c.tag()));
}

// "allreduce grads 1024 float32 [1024]"
std::string Described(const v1::Collective& c) {
  std::string out = OpTag(c) + " " + std::to_string(c.numel());
  if (!c.dtype().empty()) out += " " + Field(c.dtype());
  const std::string shapes = Shapes(c.in_shapes());
  if (!shapes.empty()) out += " " + Field(shapes);
  return out;
}

std::string Differing(const CollectiveKey& a, const CollectiveKey& b) {
  std::vector<std::string> what;
  if (a.op != b.op) what.push_back("op");
  if (a.tag != b.tag) what.push_back("tag");
  if (a.numel != b.numel) what.push_back("numel");
  if (a.dtype != b.dtype) what.push_back("dtype");
  if (a.in_shapes != b.in_shapes || a.out_shapes != b.out_shapes) what.push_back("shapes");
  if (a.step != b.step) what.push_back("step");
  std::string out;
  for (size_t i = 0; i < what.size(); ++i) out += (i ? ", " : "") + what[i];
  return out + (what.size() == 1 ? " differs" : " differ");
}

class Triage {
 public:
  Triage(const std::vector<RunCapsule>& capsules, const RunTriageOptions& options,
         v1::RunTriage* out)
      : capsules_(capsules), options_(options), out_(*out) {}

  void Run() {
    if (!SelectRun()) return;
    BuildViews();
    Completeness();
    Gradients();
    Hang();
    Exceptions();
    Desync();
    Scaling();
    LocalRngAlike();  // after scaling: seeded-alike dropout is a weaker cause than a wrong sum
    Evidence();
    Decide();
  }

 private:
  // Picks the run and lists every run and every capsule left out. False when no run is chosen.
  bool SelectRun() {
    std::map<std::string, int> runs;
    for (const RunCapsule& c : capsules_) {
      if (c.capsule->has_distributed()) ++runs[c.capsule->distributed().run_id()];
    }
    for (const auto& [id, n] : runs) {
      v1::TriageRunSummary& r = *out_.add_runs();
      r.set_run_id(Field(id));
      r.set_capsules(n);
    }
    std::string run = options_.run_id;
    if (run.empty()) {
      if (runs.size() > 1) {
        out_.set_outcome(v1::TRIAGE_SEVERAL_RUNS);
        return false;
      }
      if (runs.size() == 1) run = runs.begin()->first;
    }
    for (const RunCapsule& c : capsules_) {
      if (!c.capsule->has_distributed()) {
        Skip(c, "no distributed section (one process)");
      } else if (c.capsule->placement().rank() < 0) {
        Skip(c, "rank " + std::to_string(c.capsule->placement().rank()) + " is negative");
      } else if (c.capsule->distributed().run_id() != run) {
        Skip(c, "run " + Field(c.capsule->distributed().run_id()));
      } else {
        run_.push_back(&c);
      }
    }
    if (run_.empty()) {
      out_.set_outcome(v1::TRIAGE_NO_RUN);
      return false;
    }
    out_.set_run_id(Field(run));
    return true;
  }

  void Skip(const RunCapsule& c, const std::string& reason) {
    v1::TriageSkipped& s = *out_.add_skipped();
    s.set_capsule(Printable(c.path));
    s.set_reason(reason);
  }

  void BuildViews() {
    std::vector<const RunCapsule*> ordered = run_;
    // Oldest first, so that merging lets the newer record win.
    std::stable_sort(ordered.begin(), ordered.end(), [](const RunCapsule* a, const RunCapsule* b) {
      const v1::Capsule& x = *a->capsule;
      const v1::Capsule& y = *b->capsule;
      return std::make_tuple(x.distributed().last_step(), x.step().global_step(),
                             x.created_unix_micros(), a->path) <
             std::make_tuple(y.distributed().last_step(), y.step().global_step(),
                             y.created_unix_micros(), b->path);
    });
    for (const RunCapsule* c : ordered) {
      const int rank = c->capsule->placement().rank();
      RankView& v = views_[rank];
      v.rank = rank;
      v.capsules.push_back(c);
      const v1::Distributed& d = c->capsule->distributed();
      for (const auto& k : d.collectives()) v.collectives[k.sequence()] = &k;
      for (const auto& r : d.reductions()) v.records[{r.step(), r.sequence()}] = &r;
      for (const auto& f : d.fingerprints()) v.fingerprints[f.step()] = &f;
      v.last_step = std::max(v.last_step, d.last_step());
      if (!d.fingerprints().empty()) {
        v.last_step = std::max(v.last_step, d.fingerprints().rbegin()->step());
      }
    }
    for (auto& [rank, v] : views_) {
      present_.push_back(rank);
      std::map<int64_t, std::vector<const v1::GradReduction*>> by_step;
      for (const auto& [key, r] : v.records) by_step[key.first].push_back(r);
      for (const auto& [step, records] : by_step) v.reductions[step] = CombineStep(records);
    }
  }

  void Completeness() {
    // The world size the most capsules give; every capsule must give the same.
    std::map<int, int> worlds;
    for (const RunCapsule* c : run_) ++worlds[c->capsule->placement().world_size()];
    int votes = 0;
    for (const auto& [w, n] : worlds) {
      if (n > votes) world_ = w, votes = n;
    }
    if (worlds.size() > 1) {
      std::string detail = "the capsules disagree on the world size:";
      for (const auto& [rank, v] : views_) {
        detail += " rank " + std::to_string(rank) + " says " +
                  std::to_string(v.latest().placement().world_size()) + ";";
      }
      detail.pop_back();
      Add("completeness.world_size", detail, {}, "");
    }
    world_ = static_cast<int>(
        std::min<int64_t>(std::numeric_limits<int32_t>::max(),
                          std::max<int64_t>(world_, int64_t{present_.back()} + 1)));
    out_.set_world_size(world_);
    const RankView& first = views_.begin()->second;
    out_.set_sequence_base(first.latest().distributed().sequence_base());
    std::vector<int> odd;
    for (const auto& [rank, v] : views_) {
      if (v.latest().distributed().sequence_base() != out_.sequence_base()) odd.push_back(rank);
    }
    if (!odd.empty()) {
      Add("completeness.sequence_base",
          RankList(odd) + " recorded another sequence base than rank " +
              std::to_string(first.rank) + " (" + std::to_string(out_.sequence_base()) +
              "): their sequence numbers are not comparable, and the alignment may be wrong",
          odd, "");
    }
    for (int r : present_) out_.add_ranks_present(r);
    missing_ = Gaps(present_, world_);
    AddRanges(missing_, out_.mutable_missing());
    out_.set_missing_count(static_cast<int32_t>(Count(missing_)));
  }

  // ---- gradients ----------------------------------------------------------------------------

  void Gradients() {
    for (const auto& [rank, v] : views_) {
      for (const auto& [step, r] : v.reductions) {
        StepHealth& h = health_[step];
        h.own[rank] = &r;
        h.local_norm[rank] = r.local_norm();
        h.local_bad[rank] = LocalBad(r.local_norm(), r.local_non_finite());
      }
    }
    // The shared vectors fill in ranks whose own record is absent (a missing rank, a ring that
    // no longer holds the step).
    for (const auto& [rank, v] : views_) {
      for (const auto& [step, r] : v.reductions) {
        StepHealth& h = health_[step];
        for (int i = 0; i < r.rank_local_norms_size() && i < world_; ++i) {
          if (h.own.count(i)) continue;
          h.local_norm[i] = r.rank_local_norms(i);
          h.local_bad[i] = LocalBad(r.rank_local_norms(i), r.rank_local_non_finite(i));
        }
      }
    }
    for (const auto& [step, h] : health_) {
      std::vector<int> bad, good;
      for (const auto& [r, is_bad] : h.local_bad) (is_bad ? bad : good).push_back(r);
      const std::vector<Range> unknown = Gaps(Keys(h.local_bad), world_);
      for (int r : bad) {
        if (!first_bad_step_.count(r)) first_bad_step_[r] = step;
      }
      if (bad.empty() || gradients_decided_) continue;
      gradients_decided_ = true;
      const auto own_bad = h.own.find(bad.front());
      const uint64_t seq = (own_bad != h.own.end() ? own_bad : h.own.begin())->second->sequence();
      const std::string at =
          " at step " + std::to_string(step) + " (sequence " + std::to_string(seq) + ")";
      const std::string& path = PathShowing(bad.front(), step);
      FindingRef f;
      if (good.empty() && unknown.empty()) {
        f = Add("gradients.replicated",
                "every rank's gradients were non-finite before the reduction" + at +
                    ": a replicated bug (the model, the objective or a shared batch), not one "
                    "rank's data",
                bad, path);
      } else if (!good.empty()) {
        f = Add("gradients.first_bad_rank",
                RankList(bad) + (bad.size() == 1 ? "'s" : "'") +
                    " gradients were non-finite before the reduction" + at + " while " +
                    RankList(good) + (good.size() == 1 ? " was" : " were") +
                    " finite: data-driven / rank-local",
                bad, path);
      } else {
        f = Add("gradients.non_finite",
                RankList(bad) + (bad.size() == 1 ? "'s" : "'") +
                    " gradients were non-finite before the reduction" + at,
                bad, path);
        Undecided("gradients", "replicated or rank-local: " + NoCapsuleFrom(unknown));
      }
      f.step(step, seq);
    }
    if (gradients_decided_) return;
    // Finite everywhere before the reduction, non-finite after it.
    for (const auto& [step, h] : health_) {
      const v1::GradReduction* after = nullptr;
      for (const auto& [rank, r] : h.own) {
        if (r->global_non_finite() > 0 || !std::isfinite(r->global_norm())) after = r;
      }
      if (after == nullptr) continue;
      gradients_decided_ = true;
      const std::vector<Range> unknown = Gaps(Keys(h.local_bad), world_);
      if (!unknown.empty()) {
        Undecided("gradients", "the gradients were non-finite after the reduction at step " +
                                   std::to_string(step) +
                                   ", finite before it where recorded: " + NoCapsuleFrom(unknown));
        break;
      }
      Add("gradients.after_reduction",
          "every rank's gradients were finite before the reduction at step " +
              std::to_string(step) + " (sequence " + std::to_string(after->sequence()) +
              ") and non-finite after it: overflow in the reduction or a scaling error",
          {}, PathShowing(h.own.begin()->first, step))
          .step(step, after->sequence());
      break;
    }
    if (!gradients_decided_ && !missing_.empty() && !AllRanksKnownEverywhere()) {
      Undecided("gradients", "first bad rank: " + NoCapsuleFrom(missing_));
    }
  }

  bool AllRanksKnownEverywhere() const {
    if (health_.empty()) return false;
    for (const auto& [step, h] : health_) {
      if (static_cast<int>(h.local_bad.size()) < world_) return false;
    }
    return true;
  }

  // ---- hang ---------------------------------------------------------------------------------

  void Hang() {
    uint64_t lo = 0, hi = 0;
    bool any = false;
    for (const auto& [rank, v] : views_) {
      if (v.collectives.empty()) continue;
      lo = any ? std::max(lo, v.collectives.begin()->first) : v.collectives.begin()->first;
      hi = any ? std::max(hi, v.collectives.rbegin()->first) : v.collectives.rbegin()->first;
      any = true;
    }
    if (!any) {
      if (!missing_.empty()) Undecided("hang", NoCapsuleFrom(missing_));
      return;
    }
    // The sequences some rank recorded in [lo, hi]: the loops below visit these, never every
    // number in between (ranks may record sequences far apart).
    std::set<uint64_t> seqs;
    for (const auto& [rank, v] : views_) {
      for (auto it = v.collectives.lower_bound(lo); it != v.collectives.end() && it->first <= hi;
           ++it) {
        seqs.insert(it->first);
      }
    }
    std::set<int> named;
    Mismatch(seqs, &named);
    Behind(hi, named);
    named_.insert(named.begin(), named.end());
    DeadPeer(seqs);
    if (!hang_found_ && !missing_.empty()) Undecided("hang", NoCapsuleFrom(missing_));
  }

  const v1::Collective* At(const RankView& v, uint64_t seq) const {
    auto it = v.collectives.find(seq);
    return it == v.collectives.end() ? nullptr : it->second;
  }

  // Whether rank `v`'s entries of `c`'s tag before `seq` were all like `c`: a rank whose entry
  // changed from its own history is the odd one when the count does not say.
  bool LikeItsHistory(const RankView& v, const v1::Collective& c, uint64_t seq) const {
    for (auto it = v.collectives.begin(); it != v.collectives.end() && it->first < seq; ++it) {
      if (it->second->tag() == c.tag() && it->second->op() == c.op() &&
          !KeyOf(*it->second).SameCall(KeyOf(c))) {
        return false;
      }
    }
    return true;
  }

  // Whether, in rank `w`'s entries before `seq`, a call like `first` is followed within one step
  // by a call like `then`: the order the rank's loop issues its collectives in.
  bool FollowsInStep(const RankView& w, const v1::Collective& first, const v1::Collective& then,
                     uint64_t seq) const {
    const CollectiveKey a = KeyOf(first), b = KeyOf(then);
    const v1::Collective* prev = nullptr;
    for (auto it = w.collectives.begin(); it != w.collectives.end() && it->first < seq; ++it) {
      const v1::Collective* c = it->second;
      if (prev != nullptr && prev->sequence() + 1 == c->sequence() && prev->step() == c->step() &&
          KeyOf(*prev).SameCall(a) && KeyOf(*c).SameCall(b)) {
        return true;
      }
      prev = c;
    }
    return false;
  }

  // (a) The first sequence whose entries differ between the ranks.
  void Mismatch(const std::set<uint64_t>& seqs, std::set<int>* named) {
    for (uint64_t s : seqs) {
      std::map<CollectiveKey, std::vector<int>> groups;
      for (const auto& [rank, v] : views_) {
        if (const v1::Collective* c = At(v, s)) groups[KeyOf(*c)].push_back(rank);
      }
      if (groups.size() < 2) continue;
      // A rank skipped s when its entry at s is the others' entry at s+1, issued in the same step;
      // or, when the others could not go on to s+1 (a backend that fails the mismatched call),
      // when its entry at s is the call the others always make right after theirs at s within a
      // step (and not the other way round).
      std::vector<int> skipped;
      std::map<int, bool> by_history;
      for (const auto& [rank, v] : views_) {
        const v1::Collective* mine = At(v, s);
        if (mine == nullptr) continue;
        int agree = 0, differ = 0, follows = 0, other_way = 0;
        for (const auto& [other, w] : views_) {
          if (other == rank) continue;
          const v1::Collective* here = At(w, s);
          if (here == nullptr || KeyOf(*here) == KeyOf(*mine)) continue;
          if (FollowsInStep(w, *here, *mine, s)) ++follows;
          if (FollowsInStep(v, *mine, *here, s)) ++other_way;
          const v1::Collective* next =
              s == std::numeric_limits<uint64_t>::max() ? nullptr : At(w, s + 1);
          if (next == nullptr) continue;
          (KeyOf(*next) == KeyOf(*mine) ? agree : differ)++;
        }
        if (agree > 0 && differ == 0) {
          skipped.push_back(rank);
        } else if (agree == 0 && differ == 0 && follows > 0 && other_way == 0) {
          skipped.push_back(rank);
          by_history[rank] = true;
        }
      }
      if (!skipped.empty() && skipped.size() < views_.size()) {
        for (int rank : skipped) {
          const RankView& v = views_.at(rank);
          const v1::Collective* theirs = nullptr;
          for (const auto& [other, w] : views_) {
            if (!std::count(skipped.begin(), skipped.end(), other) && At(w, s)) theirs = At(w, s);
          }
          const std::string how =
              by_history[rank] ? "its sequence " + std::to_string(s) + " (" + OpTag(*At(v, s)) +
                                     ") is the call the others make right after " + OpTag(*theirs) +
                                     " in every step"
                               : "its sequence " + std::to_string(s) + " is the others' " +
                                     std::to_string(s + 1) + " (" + OpTag(*At(v, s)) + ")";
          Add("hang.skipped_collective",
              "rank " + std::to_string(rank) + " skipped collective " + std::to_string(s) + " (" +
                  OpTag(*theirs) + ", step " + std::to_string(theirs->step()) + "): " + how,
              {rank}, v.PathFor(theirs->step()))
              .step(theirs->step(), s);
          named->insert(rank);
        }
        hang_found_ = true;
        return;
      }
      // The majority's entry is the reference; a tie goes to the group whose ranks' entries are
      // like their own history, then to the group of the lowest rank.
      auto score = [&](const std::vector<int>& ranks) {
        bool like = true;
        for (int r : ranks) like &= LikeItsHistory(views_.at(r), *At(views_.at(r), s), s);
        return std::make_tuple(ranks.size(), like, -ranks.front());
      };
      auto best = groups.begin();
      for (auto it = groups.begin(); it != groups.end(); ++it) {
        if (score(it->second) > score(best->second)) best = it;
      }
      const std::vector<int>& ref = best->second;
      const v1::Collective& theirs = *At(views_.at(ref.front()), s);
      const std::string tie = TieBreak(groups, best->first, score);
      for (const auto& [key, ranks] : groups) {
        if (&ranks == &ref) continue;
        const v1::Collective& mine = *At(views_.at(ranks.front()), s);
        if (mine.step() + 1 == theirs.step()) {
          // A step behind, and in another call: its loop ended a step early and it went on to
          // what comes after training (a final barrier, a checkpoint) while the others train.
          for (int rank : ranks) {
            const RankView& v = views_.at(rank);
            std::string detail = "rank " + std::to_string(rank) +
                                 "'s data ran out one step early (uneven data): it began step " +
                                 std::to_string(v.last_step) + " last, the others step " +
                                 std::to_string(theirs.step()) + "; at sequence " +
                                 std::to_string(s) + " it called " + Described(mine) +
                                 " where the others called " + Described(theirs);
            const std::string position = Position(v);
            if (!position.empty()) detail += "; its trainer thread: " + position;
            Add("hang.uneven_data", detail, {rank}, v.latest_path()).step(theirs.step(), s);
          }
          named->insert(ranks.begin(), ranks.end());
          continue;
        }
        Add("hang.mismatch",
            "mismatch at sequence " + std::to_string(s) + ": " + RankList(ranks) + " " +
                Described(mine) + " vs " +
                (ref.size() + ranks.size() == views_.size() ? std::string("others")
                                                            : RankList(ref)) +
                " " + Described(theirs) + " (" + Differing(key, best->first) + ")" + tie,
            ranks, views_.at(ranks.front()).PathFor(mine.step()))
            .step(mine.step(), s);
        named->insert(ranks.begin(), ranks.end());
      }
      hang_found_ = true;
      return;
    }
  }

  // How the reference side of a mismatch was chosen when no side is a majority: by the ranks'
  // own history of that call, or (nothing telling the sides apart) by the lowest rank. Empty when
  // the reference side is a majority.
  template <typename Groups, typename Score>
  static std::string TieBreak(const Groups& groups, const CollectiveKey& best, const Score& score) {
    const auto& ref = groups.at(best);
    std::vector<int> tied;
    bool history = false;
    for (const auto& [key, ranks] : groups) {
      if (key == best || ranks.size() != ref.size()) continue;
      tied.insert(tied.end(), ranks.begin(), ranks.end());
      history |= std::get<1>(score(ref)) && !std::get<1>(score(ranks));
    }
    if (tied.empty()) return "";
    std::sort(tied.begin(), tied.end());
    if (history) {
      return "; no majority: " + RankList(ref) + " made this call as in its earlier steps and " +
             RankList(tied) + " did not";
    }
    return "; no majority, and nothing tells the sides apart: " + RankList(ref) +
           " is taken as the reference as the lowest rank; either side may be the odd one";
  }

  // (b) Ranks whose last collective is behind a sequence the others issued and could not finish.
  void Behind(uint64_t hi, const std::set<int>& named) {
    int64_t last_step = 0;
    for (const auto& [rank, v] : views_) last_step = std::max(last_step, v.last_step);
    for (const auto& [rank, v] : views_) {
      if (named.count(rank) || v.collectives.empty()) continue;
      if (v.collectives.rbegin()->first >= hi) continue;
      const uint64_t s = v.collectives.rbegin()->first + 1;
      // Others that completed s had this rank with them (its capsule is only older); ranks
      // waiting in s are waiting for it.
      std::vector<int> waiting;
      const v1::Collective* theirs = nullptr;
      bool completed = false;
      for (const auto& [other, w] : views_) {
        const v1::Collective* c = At(w, s);
        if (other == rank || c == nullptr) continue;
        completed |= c->state() == v1::COMPLETED;
        waiting.push_back(other);
        theirs = c;
      }
      if (completed || theirs == nullptr) continue;
      hang_found_ = true;
      const std::string issued = "never issued sequence " + std::to_string(s) + " (" +
                                 OpTag(*theirs) + ", step " + std::to_string(theirs->step()) +
                                 ") that " + RankList(waiting) +
                                 (waiting.size() == 1 ? " waits" : " wait") + " in";
      const int64_t behind = last_step - v.last_step;
      std::string detail;
      std::string check = "hang.never_issued";
      if (v.latest().trigger().kind() == v1::EXCEPTION) {
        // Its step threw and the trainer left the loop: the others wait for a rank that is gone.
        check = "hang.exception";
        detail = "rank " + std::to_string(rank) + " raised an exception in step " +
                 std::to_string(v.latest().step().global_step()) + " and left the run (" +
                 ExceptionText(v) + "); it " + issued;
      } else if (v.collectives.rbegin()->second->state() == v1::COMPLETED) {
        // Its last call completed and it issued nothing since: it is not waiting in a
        // collective but stuck elsewhere (data loading, I/O, a deadlock in its own code).
        check = "hang.stuck_rank";
        detail = "rank " + std::to_string(rank) +
                 " is stuck outside any collective: its last one (sequence " +
                 std::to_string(s - 1) + ") completed, and it " + issued;
      } else if (behind == 1) {
        check = "hang.uneven_data";
        detail = "rank " + std::to_string(rank) +
                 "'s data ran out one step early (uneven data): it began step " +
                 std::to_string(v.last_step) + " last, the others step " +
                 std::to_string(last_step) + ", and " + issued;
      } else {
        detail = "rank " + std::to_string(rank) + " " + issued;
        if (behind > 1) detail += "; it is " + std::to_string(behind) + " steps behind";
      }
      const std::string position = Position(v);
      if (!position.empty()) detail += "; its trainer thread: " + position;
      Add(check, detail, {rank}, v.latest_path()).step(theirs->step(), s);
      named_.insert(rank);
    }
  }

  static std::string ExceptionText(const RankView& v) {
    const std::string& what = v.latest().trigger().message();
    return what.empty() ? std::string("no text recorded") : "\"" + Field(what) + "\"";
  }

  // A rank whose step threw, when no other finding named it: the exception is evidence in itself.
  void Exceptions() {
    for (const auto& [rank, v] : views_) {
      if (named_.count(rank) || v.latest().trigger().kind() != v1::EXCEPTION) continue;
      const int64_t step = v.latest().step().global_step();
      Add("rank.exception",
          "rank " + std::to_string(rank) + "'s step " + std::to_string(step) +
              " raised an exception (" + ExceptionText(v) + ")",
          {rank}, v.latest_path())
          .step(step);
    }
  }

  // (c) Every present rank enqueued s and none completed it, while a rank wrote no capsule.
  void DeadPeer(const std::set<uint64_t>& seqs) {
    if (missing_.empty() || hang_found_) return;
    for (uint64_t s : seqs) {
      bool all = true, none_completed = true;
      const v1::Collective* c = nullptr;
      for (const auto& [rank, v] : views_) {
        const v1::Collective* mine = At(v, s);
        all &= mine != nullptr;
        if (mine == nullptr) break;
        none_completed &= mine->state() != v1::COMPLETED;
        c = mine;
      }
      if (!all || !none_completed) continue;
      std::string detail = "every present rank (" + RankList(present_) + ") enqueued sequence " +
                           std::to_string(s) + " (" + OpTag(*c) + ", step " +
                           std::to_string(c->step()) + ") and none completed it; " +
                           RangeList(missing_) + " wrote no capsule: a dead or hung peer";
      std::set<int> reported;
      for (const auto& [rank, v] : views_) {
        for (int m : v.latest().distributed().agreement().missing_ranks()) reported.insert(m);
      }
      if (!reported.empty()) {
        detail += "; the trigger agreement also missed " +
                  RankList(std::vector<int>(reported.begin(), reported.end()));
      }
      for (const auto& [rank, v] : views_) {
        const v1::Collective* mine = At(v, s);
        if (mine->state() == v1::FAILED && !mine->error().empty()) {
          detail += "; rank " + std::to_string(rank) + ": " + Field(mine->error());
          break;
        }
      }
      Add("hang.dead_peer", detail, {}, views_.begin()->second.latest_path())
          .step(c->step(), s)
          .missing(missing_);
      hang_found_ = true;
      return;
    }
  }

  static std::string Position(const RankView& v) {
    for (const auto& t : v.latest().distributed().threads()) {
      if (t.thread() == "trainer") {
        return Field(t.position()) + " for " + FormatSignificant(t.seconds(), 3) + " s";
      }
    }
    return "";
  }

  // ---- desync -------------------------------------------------------------------------------

  using Checksum = std::string (*)(const v1::StepFingerprint&);

  // Whether a fingerprint checksum records anything: empty, or the checksum of no state at all
  // (zero; what captures wrote for a class of RNG the trainer has none of), says nothing.
  static bool Recorded(const std::string& sum) {
    return !sum.empty() && sum.find_first_not_of('0') != std::string::npos;
  }

  // The first step at which the ranks' `sum` differs: false when none does.
  bool FirstDisagreement(const char* check, const char* what, Checksum sum) {
    std::set<int64_t> steps;
    for (const auto& [rank, v] : views_) {
      for (const auto& [step, f] : v.fingerprints) steps.insert(step);
    }
    for (int64_t step : steps) {
      std::map<std::string, std::vector<int>> groups;
      for (const auto& [rank, v] : views_) {
        auto it = v.fingerprints.find(step);
        if (it != v.fingerprints.end() && Recorded(sum(*it->second))) {
          groups[sum(*it->second)].push_back(rank);
        }
      }
      if (groups.size() < 2) continue;
      auto best = groups.begin();
      for (auto it = groups.begin(); it != groups.end(); ++it) {
        const auto score = [](const std::vector<int>& r) {
          return std::make_pair(r.size(), -r.front());
        };
        if (score(it->second) > score(best->second)) best = it;
      }
      size_t second = 0;
      for (const auto& [value, ranks] : groups) {
        if (&ranks != &best->second) second = std::max(second, ranks.size());
      }
      const bool tie = second == best->second.size();
      std::string detail = std::string("the replicas' ") + what + " differ at the start of step " +
                           std::to_string(step) + ":";
      std::vector<int> odd;
      for (const auto& [value, ranks] : groups) {
        if (&ranks == &best->second) continue;
        detail += " " + RankList(ranks) + " (" + Field(value) + ")";
        odd.insert(odd.end(), ranks.begin(), ranks.end());
      }
      detail += " vs " + RankList(best->second) + " (" + Field(best->first) + ")";
      if (tie) detail += "; no majority: either side may be the odd one";
      std::sort(odd.begin(), odd.end());
      Add(check, detail, odd, views_.at(odd.front()).PathFor(step)).step(step);
      return true;
    }
    return false;
  }

  void Desync() {
    const bool params = FirstDisagreement("desync.params", "parameters",
                                          [](const v1::StepFingerprint& f) { return f.params(); });
    FirstDisagreement("desync.replicated_rng", "replicated RNG states",
                      [](const v1::StepFingerprint& f) { return f.replicated_rng(); });
    if (!params && !missing_.empty()) {
      Undecided("desync", "whether every replica agrees: " + NoCapsuleFrom(missing_));
    }
  }

  // Rank-local RNG states identical on every rank: dropout masks and sampling repeat.
  void LocalRngAlike() {
    if (world_ <= 1 || present_.size() <= 1) return;
    std::set<int64_t> steps;
    for (const auto& [rank, v] : views_) {
      for (const auto& [step, f] : v.fingerprints) steps.insert(step);
    }
    for (int64_t step : steps) {
      std::set<std::string> values;
      size_t have = 0;
      for (const auto& [rank, v] : views_) {
        auto it = v.fingerprints.find(step);
        if (it == v.fingerprints.end() || !Recorded(it->second->local_rng())) break;
        values.insert(it->second->local_rng());
        ++have;
      }
      if (have != views_.size() || values.size() != 1) continue;
      Add("desync.local_rng_alike",
          "the rank-local RNG states are identical on " +
              (missing_.empty() ? "every rank" : RankList(present_)) + " at step " +
              std::to_string(step) + " (" + Field(*values.begin()) +
              "): rank-local RNG seeded alike, so dropout masks and sampling repeat across ranks",
          present_, views_.begin()->second.PathFor(step))
          .step(step);
      return;
    }
  }

  // ---- scaling ------------------------------------------------------------------------------

  void Scaling() {
    const v1::Capsule& lead = views_.begin()->second.latest();
    const v1::Objective& objective = lead.objective();
    bool decided = false;
    for (const auto& [step, h] : health_) {
      if (static_cast<int>(h.local_norm.size()) < world_ || h.own.empty()) continue;
      bool finite = true;
      double sum = 0;
      for (const auto& [r, norm] : h.local_norm) {
        finite &= !h.local_bad.at(r);
        sum += norm;
      }
      const v1::GradReduction& red = *h.own.begin()->second;
      if (!finite || !std::isfinite(red.global_norm())) continue;
      decided = true;
      const double m = sum / world_;
      const double g = red.global_norm();
      if (m > 0 && g > m * (1 + kReductionNormSlack)) {
        std::string detail = "at step " + std::to_string(step) + " the reduced gradient's norm " +
                             FormatSignificant(g, 6) +
                             " exceeds the mean of the ranks' local norms " +
                             FormatSignificant(m, 6) +
                             ", which a mean of gradients cannot: the reduction summed where a "
                             "mean was meant (post/mean-of-local = " +
                             FormatSignificant(g / m, 4) + ")";
        if (red.divisor() == 1) detail += "; the reduction's divisor was 1";
        if (objective.ranks() <= 1 && world_ > 1) {
          detail += "; the loss is normalised on each rank alone (objective ranks " +
                    std::to_string(objective.ranks()) + ")";
        }
        Add("scaling.sum_not_mean", detail, {}, PathShowing(h.own.begin()->first, step))
            .step(step, red.sequence())
            .value(g / m);
        return;
      }
    }
    // The declared facts alone, where the norms cannot tell (they may cancel).
    const v1::GradReduction* red = nullptr;
    int64_t red_step = 0;
    for (const auto& [step, h] : health_) {
      if (!h.own.empty()) red = h.own.begin()->second, red_step = step;
    }
    const bool declared =
        objective.reduction() != v1::LOSS_REDUCTION_UNSPECIFIED || objective.normalizer() > 0;
    if (red != nullptr && world_ > 1) {
      const std::string& path = views_.begin()->second.PathFor(red_step);
      if (declared && red->divisor() == 1 && objective.ranks() <= 1) {
        Add("scaling.sum_not_mean",
            "the reduction's divisor is 1 (a sum over " + std::to_string(world_) +
                " ranks) while the loss is normalised on each rank alone (objective ranks " +
                std::to_string(objective.ranks()) + "): the gradients are " +
                std::to_string(world_) + "x their mean",
            {}, path)
            .step(red_step, red->sequence());
        return;
      }
      if (red->divisor() > 1 && objective.ranks() == world_) {
        Add("scaling.double_average",
            "the reduction divided by " + FormatSignificant(red->divisor(), 6) +
                " a loss already normalised over all " + std::to_string(world_) +
                " ranks (objective ranks " + std::to_string(objective.ranks()) +
                "): averaged a loss already normalised over all ranks; the gradients are 1/" +
                FormatSignificant(red->divisor(), 6) + " of what they should be",
            {}, path)
            .step(red_step, red->sequence());
        return;
      }
    }
    if (!decided && !missing_.empty()) Undecided("scaling", NoCapsuleFrom(missing_));
  }

  // ---- evidence and outcome -----------------------------------------------------------------

  void Evidence() {
    for (const auto& [rank, v] : views_) {
      v1::RankEvidence& e = *out_.add_ranks();
      e.set_rank(rank);
      for (const RunCapsule* c : v.capsules) e.add_capsules(Printable(c->path));
      e.set_trigger(v1::TriggerKind_Name(v.latest().trigger().kind()));
      e.set_last_step(v.last_step);
      if (!v.collectives.empty()) {
        const v1::Collective& last = *v.collectives.rbegin()->second;
        e.set_last_enqueued(last.sequence());
        e.set_last_collective(OpTag(last) + " (" + v1::CollectiveState_Name(last.state()) + ")");
      }
      for (auto it = v.collectives.rbegin(); it != v.collectives.rend(); ++it) {
        if (it->second->state() == v1::COMPLETED) {
          e.set_last_completed(it->first);
          break;
        }
      }
      if (first_bad_step_.count(rank)) e.set_first_non_finite_step(first_bad_step_.at(rank));
      if (!v.fingerprints.empty()) e.set_params(Field(v.fingerprints.rbegin()->second->params()));
      e.set_position(Position(v));
      for (const auto& [seq, c] : v.collectives) {
        if (c->state() == v1::FAILED && !c->error().empty()) {
          e.set_error(Field(c->error()));
          break;
        }
      }
      if (e.error().empty()) e.set_error(Field(v.latest().distributed().agreement().error()));
      if (e.error().empty() && v.latest().trigger().kind() == v1::EXCEPTION) {
        e.set_error(Field(v.latest().trigger().message()));
      }
    }
  }

  void Decide() {
    for (const auto& f : out_.findings()) {
      if (!f.capsule().empty()) {
        out_.set_next_command("capsule replay " + internal::ShellQuote(f.capsule()) + " --bisect");
        break;
      }
    }
    out_.set_outcome(out_.findings_size() > 0    ? v1::TRIAGE_FINDING
                     : out_.undecided_size() > 0 ? v1::TRIAGE_UNDECIDED
                                                 : v1::TRIAGE_NO_FINDING);
  }

  // ---- helpers ------------------------------------------------------------------------------

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

  FindingRef Add(const std::string& check, const std::string& detail, const std::vector<int>& ranks,
                 const std::string& path) {
    v1::TriageFinding& f = *out_.add_findings();
    f.set_check(check);
    f.set_detail(detail);
    for (int r : ranks) f.add_ranks(r);
    f.set_capsule(Printable(path));
    return FindingRef(&f);
  }

  void Undecided(const std::string& check, const std::string& reason) {
    v1::TriageUndecided& u = *out_.add_undecided();
    u.set_check(check);
    u.set_reason(reason);
  }

  static std::string NoCapsuleFrom(const std::vector<Range>& ranks) {
    return "cannot decide: no capsule from " + RangeList(ranks);
  }

  // The capsule of `rank` for `step`, or of the lowest rank present when `rank` wrote none.
  const std::string& PathShowing(int rank, int64_t step) const {
    auto it = views_.find(rank);
    return (it == views_.end() ? views_.begin() : it)->second.PathFor(step);
  }

  const std::vector<RunCapsule>& capsules_;
  const RunTriageOptions& options_;
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
  std::set<int> named_;  // ranks a hang finding named
};

std::string Optional(bool has, uint64_t v) { return has ? std::to_string(v) : "-"; }

std::string Column(const std::string& s, size_t width) {
  return s.size() >= width ? s + "  " : s + std::string(width - s.size() + 2, ' ');
}

}  // namespace

struct RunTriageInput::Impl {
  std::vector<std::unique_ptr<v1::Capsule>> kept;  // what `capsules` point to
  std::vector<RunCapsule> capsules;
  std::vector<std::pair<std::string, std::string>> unreadable;  // path, reason
};

RunTriageInput::RunTriageInput() : impl_(std::make_unique<Impl>()) {}
RunTriageInput::~RunTriageInput() = default;

void RunTriageInput::Add(const std::string& path, const v1::Capsule& capsule) {
  impl_->kept.push_back(KeptParts(capsule));
  impl_->capsules.push_back({path, impl_->kept.back().get()});
}

void RunTriageInput::AddUnreadable(const std::string& path, const std::string& reason) {
  impl_->unreadable.emplace_back(path, reason);
}

std::unique_ptr<v1::RunTriage> TriageRun(const RunTriageInput& input,
                                         const RunTriageOptions& options) {
  auto out = std::make_unique<v1::RunTriage>();
  out->set_dir(Printable(options.dir));
  for (const auto& [path, reason] : input.impl_->unreadable) {
    v1::TriageSkipped& s = *out->add_unreadable();
    s.set_capsule(Printable(path));
    s.set_reason(PrintableShort(reason));
  }
  Triage(input.impl_->capsules, options, out.get()).Run();
  return out;
}

std::string RenderRunTriageText(const v1::RunTriage& t) {
  // Every string in `t` was escaped when it was made; Printable again costs nothing and keeps
  // this renderer safe for a message that came from elsewhere (a JSON file).
  std::ostringstream out;
  const auto runs = [&] {
    for (const auto& r : t.runs()) {
      out << "  run " << Printable(r.run_id()) << ": " << r.capsules() << " capsules\n";
    }
  };
  switch (t.outcome()) {
    case v1::TRIAGE_SEVERAL_RUNS:
      out << "capsules of " << t.runs_size() << " runs in " << Printable(t.dir())
          << "; pick one with --run ID:\n";
      runs();
      break;
    case v1::TRIAGE_NO_RUN:
      out << "no capsule of " << (t.run_id().empty() ? "a distributed run" : "that run") << " in "
          << Printable(t.dir()) << "\n";
      runs();
      break;
    default: {
      out << "run " << Printable(t.run_id()) << " in " << Printable(t.dir()) << ": world size "
          << t.world_size() << ", " << t.ranks_present_size() << " of " << t.world_size()
          << " ranks present, sequence base " << t.sequence_base() << "\n";
      if (t.missing_size() > 0) {
        std::vector<Range> missing;
        for (const v1::RankRange& r : t.missing()) missing.push_back({r.first(), r.last()});
        out << "  missing: " << RangeList(missing)
            << (t.missing_count() > 1 ? " (" + std::to_string(t.missing_count()) + " ranks)" : "")
            << "\n";
      }
      out << "\n"
          << Column("rank", 4) << Column("trigger", 16) << Column("step", 4) << Column("enq", 5)
          << Column("done", 5) << Column("last collective", 36) << Column("non-finite", 10)
          << Column("params", 16) << "position / error\n";
      for (const auto& e : t.ranks()) {
        std::string where = Printable(e.position());
        if (!e.error().empty()) where += (where.empty() ? "" : "; ") + Printable(e.error());
        out << Column(std::to_string(e.rank()), 4) << Column(Printable(e.trigger()), 16)
            << Column(std::to_string(e.last_step()), 4)
            << Column(Optional(e.has_last_enqueued(), e.last_enqueued()), 5)
            << Column(Optional(e.has_last_completed(), e.last_completed()), 5)
            << Column(Printable(e.last_collective()), 36)
            << Column(e.has_first_non_finite_step()
                          ? "step " + std::to_string(e.first_non_finite_step())
                          : "-",
                      10)
            << Column(e.params().empty() ? "-" : Printable(e.params()), 16)
            << (where.empty() ? "-" : where) << "\n";
      }
      out << "\n";
      if (t.findings_size() == 0) {
        out << (t.undecided_size() == 0 ? "no finding\n" : "no finding in the capsules present\n");
      }
      for (const auto& f : t.findings()) {
        out << Printable(f.check()) << ": " << Printable(f.detail()) << "\n";
      }
      for (const auto& u : t.undecided()) {
        out << Printable(u.check()) << ": " << Printable(u.reason()) << "\n";
      }
      if (!t.next_command().empty()) out << "next: " << Printable(t.next_command()) << "\n";
    }
  }
  for (const auto& u : t.unreadable()) {
    out << "unreadable (not used): " << Printable(u.capsule()) << ": " << Printable(u.reason())
        << "\n";
  }
  for (const auto& s : t.skipped()) {
    out << "skipped: " << Printable(s.capsule()) << ": " << Printable(s.reason()) << "\n";
  }
  return out.str();
}

std::string RenderRunTriageJson(const v1::RunTriage& triage) { return internal::PrintJson(triage); }

}  // namespace capsule
