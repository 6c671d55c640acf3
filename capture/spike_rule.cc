#include "capsule/capture/spike_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace capsule {
namespace {

double MedianOf(std::vector<double>& a) {
  const size_t mid = a.size() / 2;
  std::nth_element(a.begin(), a.begin() + mid, a.end());
  double m = a[mid];
  if (a.size() % 2 == 0) m = (m + *std::max_element(a.begin(), a.begin() + mid)) / 2;
  return m;
}

std::string Compact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

std::optional<double> SpikeThreshold(const std::vector<double>& recent, const SpikeRule& rule) {
  std::vector<double> logs;
  logs.reserve(static_cast<size_t>(std::max(rule.window, 0)));
  for (auto it = recent.rbegin();
       it != recent.rend() && static_cast<int>(logs.size()) < rule.window; ++it) {
    if (std::isfinite(*it) && *it > 0) logs.push_back(std::log(*it));
  }
  if (logs.empty() || static_cast<int>(logs.size()) < rule.warmup) return std::nullopt;
  const double median = MedianOf(logs);
  for (double& x : logs) x = std::fabs(x - median);
  const double mad = MedianOf(logs);
  const double margin = std::max(rule.mads * 1.4826 * mad, std::log(std::max(rule.min_ratio, 1.0)));
  return std::exp(median + margin);
}

std::string DescribeSpikeRule(const SpikeRule& rule) {
  return "> " + Compact(rule.min_ratio) + "x median(last " + std::to_string(rule.window) +
         ") and " + Compact(rule.mads) + "*1.4826*MAD of log values, after " +
         std::to_string(rule.warmup) + " steps";
}

}  // namespace capsule
