// Gradients: the first step whose gradients were non-finite on some rank, before or after the
// reduction.
#include <cmath>

#include "capsule/ranks/internal/analysis.h"

namespace capsule::ranks {
namespace {

bool LocalBad(double norm, int64_t non_finite) { return non_finite > 0 || !std::isfinite(norm); }

}  // namespace

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

void Analysis::Gradients() {
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
        "every rank's gradients were finite before the reduction at step " + std::to_string(step) +
            " (sequence " + std::to_string(after->sequence()) +
            ") and non-finite after it: overflow in the reduction or a scaling error",
        {}, PathShowing(h.own.begin()->first, step))
        .step(step, after->sequence());
    break;
  }
  if (!gradients_decided_ && !missing_.empty() && !AllRanksKnownEverywhere()) {
    Undecided("gradients", "first bad rank: " + NoCapsuleFrom(missing_));
  }
}

bool Analysis::AllRanksKnownEverywhere() const {
  if (health_.empty()) return false;
  for (const auto& [step, h] : health_) {
    if (static_cast<int>(h.local_bad.size()) < world_) return false;
  }
  return true;
}

}  // namespace capsule::ranks
