// Culprit and victims: the ranks a finding names as the cause of the run's failure (else the rank
// that failed first), and the ranks that failed or hung after it in what it left.
#include <algorithm>
#include <limits>

#include "capsule/base/internal/strings.h"
#include "capsule/ranks/internal/analysis.h"

namespace capsule::ranks {

int64_t Analysis::FirstFailure(const RankView& v) {
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const RunCapsule* c : v.capsules) {
    const v1::TriggerKind kind = c->capsule->trigger().kind();
    if (kind == v1::EXCEPTION || kind == v1::COLLECTIVE_ERROR) {
      first = std::min(first, c->capsule->created_unix_micros());
    }
  }
  for (const auto* ring : {&v.collectives}) {
    for (const auto& [seq, c] : *ring) {
      if (c->state() == v1::FAILED && c->completed_unix_micros() > 0) {
        first = std::min(first, c->completed_unix_micros());
      }
    }
  }
  for (const auto& [key, c] : v.p2p) {
    if (c->state() == v1::FAILED && c->completed_unix_micros() > 0) {
      first = std::min(first, c->completed_unix_micros());
    }
  }
  return first;
}

// Whether the rank failed or hung: a failed entry, or a capsule written for an incident.
bool Analysis::Affected(const RankView& v) {
  if (FirstFailure(v) != std::numeric_limits<int64_t>::max()) return true;
  for (const RunCapsule* c : v.capsules) {
    if (c->capsule->trigger().kind() == v1::HANG) return true;
  }
  return false;
}

void Analysis::Roles() {
  std::set<int> culprits(named_.begin(), named_.end());
  if (culprits.empty()) {
    // Nothing in the rings names a cause: the rank that failed first (clocks of one host; of
    // several, as far as they agree) is the culprit, when every rank is here to say.
    if (!missing_.empty()) return;
    int first = -1;
    int64_t at = std::numeric_limits<int64_t>::max(), next = at;
    for (const auto& [rank, v] : views_) {
      const int64_t t = FirstFailure(v);
      if (t < at) {
        next = at;
        at = t;
        first = rank;
      } else {
        next = std::min(next, t);
      }
    }
    if (first < 0) return;
    culprits.insert(first);
    std::vector<int> after;
    for (const auto& [rank, v] : views_) {
      if (rank != first && Affected(v)) after.push_back(rank);
    }
    if (after.empty()) return;
    const RankView& v = views_.at(first);
    const v1::Capsule& c = v.latest();
    std::string detail = "rank " + std::to_string(first) + " failed first (" +
                         v1::TriggerKind_Name(c.trigger().kind()) + " at step " +
                         std::to_string(c.step().global_step());
    if (next != std::numeric_limits<int64_t>::max()) {
      detail += ", " + FormatSignificant((next - at) / 1e3, 3) + " ms before any other";
    }
    detail += c.trigger().message().empty() ? ")" : ": \"" + Field(c.trigger().message()) + "\")";
    Add("rank.first_failure", detail, {first}, v.latest_path()).step(c.step().global_step());
    named_.insert(first);
    hang_found_ = true;
  }
  std::vector<int> victims;
  for (const auto& [rank, v] : views_) {
    if (culprits.count(rank)) {
      roles_[rank] = "culprit";
    } else if (Affected(v)) {
      roles_[rank] = "victim";
      victims.push_back(rank);
    }
  }
  if (victims.empty()) return;
  // The first finding that names a culprit says who suffered from it.
  for (v1::TriageFinding& f : *out_.mutable_findings()) {
    const bool names = std::any_of(f.ranks().begin(), f.ranks().end(),
                                   [&](int r) { return culprits.count(r) != 0; });
    if (!names) continue;
    f.set_detail(f.detail() + "; " + RankList(victims) +
                 (victims.size() == 1 ? " failed or hung after it in what it left: a victim"
                                      : " failed or hung after it in what it left: victims"));
    break;
  }
}

}  // namespace capsule::ranks
