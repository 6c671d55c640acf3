#include "capsule/capture/spike_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
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
  rule.min_rise = 0;  // the ratio floor alone
  EXPECT_FALSE(SpikeThreshold({NAN, -1.0, 0.0, INFINITY, 1.0, 1.0}, rule).has_value());
  EXPECT_NEAR(*SpikeThreshold({NAN, -1.0, 0.0, 1.0, 1.0, 1.0}, rule), 2.0, 1e-12);
}

TEST(SpikeRuleTest, OnlyTheMostRecentWindowCounts) {
  SpikeRule rule;
  rule.window = 10;
  rule.warmup = 10;
  rule.min_rise = 0;
  std::vector<double> v(100, 100.0);
  v.insert(v.end(), 10, 1.0);  // the last ten values are the baseline
  EXPECT_NEAR(*SpikeThreshold(v, rule), 2.0, 1e-12);
}

// The rule before the line fit and the floor: the window's median and MAD alone.
SpikeRule MedianRule() {
  SpikeRule rule;
  rule.detrend = false;
  rule.min_rise = 0;
  rule.max_rise = 0;
  return rule;
}

double MedianOfLast(const std::vector<double>& v, size_t n) {
  std::vector<double> tail(v.end() - static_cast<std::ptrdiff_t>(n), v.end());
  std::sort(tail.begin(), tail.end());
  return (tail[n / 2] + tail[(n - 1) / 2]) / 2;
}

// The loss still falls fast through the window (5.0 to 1.6, a +-8% wobble): the window's MAD is
// wide, and a median/MAD threshold sits 14x above the median. A bad-data batch at 5.5x the median
// is far above the line the descent follows.
TEST(SpikeRuleTest, BadBatchDuringTheEarlyDescentFires) {
  std::vector<double> v;
  for (int i = 0; i < 60; ++i)
    v.push_back(1.0 + 6.0 * std::exp(-i / 25.0) * (1 + 0.08 * std::sin(i * 1.7)));
  const double bad = 5.5 * MedianOfLast(v, 50);
  ASSERT_TRUE(SpikeThreshold(v, SpikeRule{}).has_value());
  EXPECT_LT(*SpikeThreshold(v, SpikeRule{}), bad);
  EXPECT_GT(*SpikeThreshold(v, MedianRule()), bad);  // what the median rule missed
  // the descent itself stays under it: the next value of the curve does not fire
  EXPECT_GT(*SpikeThreshold(v, SpikeRule{}), 1.0 + 6.0 * std::exp(-60 / 25.0) * 1.08);
}

// A loss settled near 0.005 (a +-25% wobble, and now and then a batch at 0.02-0.03): an ordinary
// batch at 0.09 is 18x the median but 0.085 nats above it, under the 2-nat floor.
TEST(SpikeRuleTest, OrdinaryBatchOfASettledLossDoesNotFire) {
  std::vector<double> v;
  for (int i = 0; i < 60; ++i) v.push_back(0.005 * std::exp(0.25 * std::sin(i * 1.3)));
  for (int i : {7, 33, 52}) v[i] = 0.02 + 0.01 * (i % 3);
  ASSERT_TRUE(SpikeThreshold(v, SpikeRule{}).has_value());
  EXPECT_GT(*SpikeThreshold(v, SpikeRule{}), 0.09);
  EXPECT_LT(*SpikeThreshold(v, MedianRule()), 0.09);        // the median rule fired on it
  EXPECT_LT(*SpikeThreshold(v, SpikeRule{}), 0.005 + 2.1);  // the floor is the level + 2 nats
}

// The loss descends toward 0.005 (60x over the window, a +-30% wobble); a label-noise batch 4.3
// nats above the last loss spikes, though the descent widens the window's MAD so much that the
// median rule wants 39 nats.
TEST(SpikeRuleTest, LabelNoiseBatchFourNatsAboveFires) {
  std::vector<double> v;
  for (int i = 0; i < 60; ++i) {
    v.push_back(0.3 * std::exp(-i * std::log(60.0) / 59) * std::exp(0.3 * std::sin(i * 1.7)));
  }
  const double noisy = v.back() + 4.3;
  ASSERT_TRUE(SpikeThreshold(v, SpikeRule{}).has_value());
  EXPECT_LT(*SpikeThreshold(v, SpikeRule{}), noisy);
  EXPECT_GT(*SpikeThreshold(v, MedianRule()), noisy);
}

TEST(SpikeRuleTest, TheLineFollowsARisingCurveToo) {
  // A loss rising 1% a step (a learning-rate warm-up gone wrong is a trend, not a spike): the
  // level is the line's, not the median's, so the next step of the trend stays quiet.
  SpikeRule rule;
  rule.min_rise = 0;
  std::vector<double> v;
  for (int i = 0; i < 60; ++i) v.push_back(std::exp(0.01 * i) * (1 + 0.05 * std::sin(i * 1.7)));
  EXPECT_NEAR(*SpikeThreshold(v, rule), 2.0 * std::exp(0.01 * 60), 0.2);
}

// A loss settled near zero that bounces 0.01-0.5 (a ViT's clean run at step 230-280): the log
// spread is so wide that 6 robust standard deviations reach 25 nats. A garbage batch 4.2 nats
// above fires by `max_rise`; the bounces themselves (at most 1.6 nats above) stay quiet.
TEST(SpikeRuleTest, MaxRiseBoundsTheSpreadOfABouncingSettledLoss) {
  std::vector<double> v;
  for (int i = 0; i < 50; ++i) v.push_back(0.04 * std::exp(1.2 * std::sin(i * 2.3)));
  v[6] = 1.6;
  SpikeRule unbounded;
  unbounded.max_rise = 0;
  EXPECT_GT(*SpikeThreshold(v, unbounded), 4.2);
  EXPECT_LT(*SpikeThreshold(v, SpikeRule{}), 4.2);
  EXPECT_GT(*SpikeThreshold(v, SpikeRule{}), 2.0);  // and never under the 2-nat floor
  // max_rise never lowers the threshold under min_ratio times the level
  std::vector<double> high(50, 10.0);
  EXPECT_NEAR(*SpikeThreshold(high, SpikeRule{}), 20.0, 1e-9);
}

TEST(SpikeRuleTest, DescriptionNamesEveryParameter) {
  EXPECT_EQ(DescribeSpikeRule(SpikeRule{}),
            "> 2x and 6*1.4826*MAD above the trend of log values (last 50) or 4 above it, and 2 "
            "above it, after 50 steps");
  EXPECT_EQ(DescribeSpikeRule(MedianRule()),
            "> 2x median(last 50) and 6*1.4826*MAD of log values, after 50 steps");
}

}  // namespace
}  // namespace capsule
