// The step fingerprints: replicas whose parameters or replicated RNG differ, rank-local RNG seeded
// alike.
#include <algorithm>

#include "capsule/ranks/internal/analysis.h"

namespace capsule::ranks {

// Whether a fingerprint checksum records anything: empty, or the checksum of no state at all
// (zero; what captures wrote for a class of RNG the trainer has none of), says nothing.
bool Analysis::Recorded(const std::string& sum) {
  return !sum.empty() && sum.find_first_not_of('0') != std::string::npos;
}

// The first step at which the ranks' `sum` differs: false when none does.
bool Analysis::FirstDisagreement(const char* check, const char* what, Checksum sum) {
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

void Analysis::Desync() {
  const bool params = FirstDisagreement("desync.params", "parameters",
                                        [](const v1::StepFingerprint& f) { return f.params(); });
  FirstDisagreement("desync.replicated_rng", "replicated RNG states",
                    [](const v1::StepFingerprint& f) { return f.replicated_rng(); });
  if (!params && !missing_.empty()) {
    Undecided("desync", "whether every replica agrees: " + NoCapsuleFrom(missing_));
  }
}

// Rank-local RNG states identical on every rank: dropout masks and sampling repeat.
void Analysis::LocalRngAlike() {
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

}  // namespace capsule::ranks
