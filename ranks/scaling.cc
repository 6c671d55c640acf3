// The reduction's scaling: a reduced norm above the mean of the local norms is a sum where a mean
// was meant; the declared objective and divisor where the norms cannot tell.
#include <cmath>

#include "capsule/base/internal/strings.h"
#include "capsule/ranks/internal/analysis.h"

namespace capsule::ranks {

void Analysis::Scaling() {
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
              std::to_string(objective.ranks()) + "): the gradients are " + std::to_string(world_) +
              "x their mean",
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

}  // namespace capsule::ranks
