#include "capsule/capture/spike_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace capsule {
namespace {

constexpr double kMadToSigma = 1.4826;

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

// Where the log values put the next value, and how far they stray from it (1.4826 * MAD).
struct Baseline {
  double level = 0;
  double spread = 0;
};

// 1.4826 * the median absolute deviation of `residuals` from `center`.
double Spread(std::vector<double> residuals, double center) {
  for (double& r : residuals) r = std::fabs(r - center);
  return kMadToSigma * MedianOf(residuals);
}

Baseline MedianBaseline(const std::vector<double>& logs) {
  std::vector<double> copy = logs;
  const double median = MedianOf(copy);
  return {median, Spread(logs, median)};
}

// The Theil-Sen line through (i, logs[i]), evaluated at i = logs.size(): the step being judged.
Baseline TrendBaseline(const std::vector<double>& logs) {
  const size_t n = logs.size();
  if (n < 2) return MedianBaseline(logs);
  std::vector<double> slopes;
  slopes.reserve(n * (n - 1) / 2);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) slopes.push_back((logs[j] - logs[i]) / double(j - i));
  }
  const double slope = MedianOf(slopes);
  std::vector<double> residuals(n);
  for (size_t i = 0; i < n; ++i) residuals[i] = logs[i] - slope * double(i);
  std::vector<double> copy = residuals;
  const double intercept = MedianOf(copy);
  return {intercept + slope * double(n), Spread(residuals, intercept)};
}

}  // namespace

std::optional<double> SpikeThreshold(const std::vector<double>& recent, const SpikeRule& rule) {
  std::vector<double> logs;  // newest first while collecting
  logs.reserve(static_cast<size_t>(std::max(rule.window, 0)));
  for (auto it = recent.rbegin();
       it != recent.rend() && static_cast<int>(logs.size()) < rule.window; ++it) {
    if (std::isfinite(*it) && *it > 0) logs.push_back(std::log(*it));
  }
  if (logs.empty() || static_cast<int>(logs.size()) < rule.warmup) return std::nullopt;
  std::reverse(logs.begin(), logs.end());
  const Baseline b = rule.detrend ? TrendBaseline(logs) : MedianBaseline(logs);
  const double level = std::exp(b.level);
  const double ratio_floor = level * std::max(rule.min_ratio, 1.0);
  double t = std::max(std::exp(b.level + rule.mads * b.spread), ratio_floor);
  if (rule.max_rise > 0) t = std::max(std::min(t, level + rule.max_rise), ratio_floor);
  return std::max(t, level + std::max(rule.min_rise, 0.0));
}

std::string DescribeSpikeRule(const SpikeRule& rule) {
  const std::string window = "(last " + std::to_string(rule.window) + ")";
  std::string s = "> " + Compact(rule.min_ratio) + "x ";
  s += rule.detrend
           ? "and " + Compact(rule.mads) + "*1.4826*MAD above the trend of log values " + window
           : "median" + window + " and " + Compact(rule.mads) + "*1.4826*MAD of log values";
  if (rule.max_rise > 0) s += " or " + Compact(rule.max_rise) + " above it";
  if (rule.min_rise > 0) s += ", and " + Compact(rule.min_rise) + " above it";
  return s + ", after " + std::to_string(rule.warmup) + " steps";
}

}  // namespace capsule
