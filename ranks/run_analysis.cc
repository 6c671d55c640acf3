#include "capsule/ranks/run_analysis.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "capsule/base/internal/shell.h"
#include "capsule/ranks/internal/analysis.h"

namespace capsule {
namespace ranks {

void Analysis::Run() {
  if (!SelectRun()) return;
  BuildViews();
  Completeness();
  Gradients();
  Hang();
  Roles();  // before Exceptions: a victim's exception is the collective error, not a cause
  Exceptions();
  Desync();
  Scaling();
  LocalRngAlike();  // after scaling: seeded-alike dropout is a weaker cause than a wrong sum
  Evidence();
  Decide();
}

// Picks the run and lists every run and every capsule left out. False when no run is chosen.
bool Analysis::SelectRun() {
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

void Analysis::Skip(const RunCapsule& c, const std::string& reason) {
  v1::TriageSkipped& s = *out_.add_skipped();
  s.set_capsule(Printable(c.path));
  s.set_reason(reason);
}

void Analysis::BuildViews() {
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
    for (const auto& k : d.point_to_point()) v.p2p[{k.peer(), k.op(), k.sequence()}] = &k;
    for (const auto& f : d.finished()) {
      int64_t& last = finished_.try_emplace(f.rank(), f.last_step()).first->second;
      last = std::max(last, f.last_step());
    }
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

void Analysis::Completeness() {
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
  world_ =
      static_cast<int>(std::min<int64_t>(std::numeric_limits<int32_t>::max(),
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
        RankList(odd) + " recorded another sequence base than rank " + std::to_string(first.rank) +
            " (" + std::to_string(out_.sequence_base()) +
            "): their sequence numbers are not comparable, and the alignment may be wrong",
        odd, "");
  }
  for (int r : present_) out_.add_ranks_present(r);
  missing_ = Gaps(present_, world_);
  AddRanges(missing_, out_.mutable_missing());
  out_.set_missing_count(static_cast<int32_t>(Count(missing_)));
}

void Analysis::Evidence() {
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
    if (auto role = roles_.find(rank); role != roles_.end()) e.set_role(role->second);
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

void Analysis::Decide() {
  for (const auto& f : out_.findings()) {
    if (!f.capsule().empty()) {
      out_.set_next_command("capsule replay " + ShellQuote(f.capsule()) + " --bisect");
      break;
    }
  }
  out_.set_outcome(out_.findings_size() > 0    ? v1::TRIAGE_FINDING
                   : out_.undecided_size() > 0 ? v1::TRIAGE_UNDECIDED
                                               : v1::TRIAGE_NO_FINDING);
}

FindingRef Analysis::Add(const std::string& check, const std::string& detail,
                         const std::vector<int>& ranks, const std::string& path) {
  v1::TriageFinding& f = *out_.add_findings();
  f.set_check(check);
  f.set_detail(detail);
  for (int r : ranks) f.add_ranks(r);
  f.set_capsule(Printable(path));
  return FindingRef(&f);
}

void Analysis::Undecided(const std::string& check, const std::string& reason) {
  v1::TriageUndecided& u = *out_.add_undecided();
  u.set_check(check);
  u.set_reason(reason);
}

// The capsule of `rank` for `step`, or of the lowest rank present when `rank` wrote none.
const std::string& Analysis::PathShowing(int rank, int64_t step) const {
  auto it = views_.find(rank);
  return (it == views_.end() ? views_.begin() : it)->second.PathFor(step);
}

}  // namespace ranks

struct RunAnalysisInput::Impl {
  std::vector<std::unique_ptr<v1::Capsule>> kept;  // what `capsules` point to
  std::vector<ranks::RunCapsule> capsules;
  std::vector<std::pair<std::string, std::string>> unreadable;  // path, reason
};

RunAnalysisInput::RunAnalysisInput() : impl_(std::make_unique<Impl>()) {}
RunAnalysisInput::~RunAnalysisInput() = default;

void RunAnalysisInput::Add(const std::string& path, const v1::Capsule& capsule) {
  impl_->kept.push_back(ranks::KeptParts(capsule));
  impl_->capsules.push_back({path, impl_->kept.back().get()});
}

void RunAnalysisInput::AddUnreadable(const std::string& path, const std::string& reason) {
  impl_->unreadable.emplace_back(path, reason);
}

std::unique_ptr<v1::RunTriage> AnalyseRun(const RunAnalysisInput& input,
                                          const RunAnalysisOptions& options) {
  auto out = std::make_unique<v1::RunTriage>();
  out->set_dir(Printable(options.dir));
  for (const auto& [path, reason] : input.impl_->unreadable) {
    v1::TriageSkipped& s = *out->add_unreadable();
    s.set_capsule(Printable(path));
    s.set_reason(PrintableShort(reason));
  }
  ranks::Analysis(input.impl_->capsules, options, out.get()).Run();
  return out;
}

}  // namespace capsule
