#include "capsule/capture/spike_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace capsule {
namespace {

// A noisy, slowly falling loss curve: 4.0 down by 0.2% a step, times a deterministic wobble of
// up to +-15%.
std::vector<double> NoisyCurve(int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i)
    v.push_back(4.0 * std::pow(0.998, i) * (1 + 0.15 * std::sin(i * 1.7)));
  return v;
}

TEST(SpikeRuleTest, NoThresholdBeforeTheWarmup) {
  SpikeRule rule;
  EXPECT_FALSE(SpikeThreshold(NoisyCurve(rule.warmup - 1), rule).has_value());
  EXPECT_TRUE(SpikeThreshold(NoisyCurve(rule.warmup), rule).has_value());
}

TEST(SpikeRuleTest, ThresholdIsAtLeastMinRatioTimesTheMedian) {
  SpikeRule rule;
  const std::vector<double> flat(60, 3.0);  // MAD 0: only the ratio floor applies
  ASSERT_TRUE(SpikeThreshold(flat, rule).has_value());
  EXPECT_NEAR(*SpikeThreshold(flat, rule), 6.0, 1e-9);
}

TEST(SpikeRuleTest, NoiseDoesNotSpikeButAThreefoldJumpDoes) {
  SpikeRule rule;
  std::vector<double> v = NoisyCurve(120);
  const double last = v.back();
  const double t = *SpikeThreshold(v, rule);
  EXPECT_GT(t, 1.5 * last);  // the wobble never reaches it
  EXPECT_LT(t, 3.0 * last);  // a bad batch's loss (3.6x or more on tiny_gpt) does
}

TEST(SpikeRuleTest, WideNoiseRaisesTheThresholdAboveTheRatioFloor) {
  SpikeRule rule;
  std::vector<double> v;
  for (int i = 0; i < 60; ++i) v.push_back(i % 2 ? 1.0 : 1.3);  // log MAD ~0.13
  const double t = *SpikeThreshold(v, rule);
  // median of logs is between log 1 and log 1.3; 6 * 1.4826 * 0.131 = 1.17 > log 2.
  EXPECT_GT(t, 2.0 * 1.3);
}

TEST(SpikeRuleTest, NonFiniteAndNonPositiveValuesAreSkipped) {
  SpikeRule rule;
  rule.warmup = 3;
  EXPECT_FALSE(SpikeThreshold({NAN, -1.0, 0.0, INFINITY, 1.0, 1.0}, rule).has_value());
  EXPECT_NEAR(*SpikeThreshold({NAN, -1.0, 0.0, 1.0, 1.0, 1.0}, rule), 2.0, 1e-12);
}

TEST(SpikeRuleTest, OnlyTheMostRecentWindowCounts) {
  SpikeRule rule;
  rule.window = 10;
  rule.warmup = 10;
  std::vector<double> v(100, 100.0);
  v.insert(v.end(), 10, 1.0);  // the last ten values are the baseline
  EXPECT_NEAR(*SpikeThreshold(v, rule), 2.0, 1e-12);
}

TEST(SpikeRuleTest, DescriptionNamesEveryParameter) {
  EXPECT_EQ(DescribeSpikeRule(SpikeRule{}),
            "> 2x median(last 50) and 6*1.4826*MAD of log values, after 50 steps");
}

}  // namespace
}  // namespace capsule
