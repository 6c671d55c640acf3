// The trigger rule shared by the Monitor's capture re-run and the replayer's fidelity run
// (instrument/trigger_rule.h): one row per rule and edge.
#include "capsule/instrument/trigger_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace capsule {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

RerunOutcome Loss(double loss) {
  RerunOutcome r;
  r.loss = loss;
  return r;
}

RerunOutcome Grad(double grad_norm, bool backward_done = true) {
  RerunOutcome r;
  r.loss = 1.0;
  r.grad_norm = grad_norm;
  r.backward_done = backward_done;
  return r;
}

RerunOutcome Threw() {
  RerunOutcome r;
  r.threw = true;
  return r;
}

struct Row {
  const char* name;
  TriggerKind kind;
  double observed;
  double threshold;
  RerunOutcome rerun;
  bool fires;
};

const TriggerKind kUnknownKind = static_cast<TriggerKind>(42);  // from a newer writer

const Row kRows[] = {
    {"non-finite loss: NaN again", TriggerKind::kNonFiniteLoss, kNan, 0, Loss(kNan), true},
    {"non-finite loss: +Inf counts", TriggerKind::kNonFiniteLoss, kNan, 0, Loss(kInf), true},
    {"non-finite loss: finite re-run", TriggerKind::kNonFiniteLoss, kNan, 0, Loss(3.0), false},
    {"non-finite grad: NaN norm", TriggerKind::kNonFiniteGrad, kNan, 0, Grad(kNan), true},
    {"non-finite grad: no backward", TriggerKind::kNonFiniteGrad, kNan, 0, Grad(kNan, false),
     false},
    {"non-finite grad: finite norm", TriggerKind::kNonFiniteGrad, kNan, 0, Grad(1.0), false},
    {"loss spike: above", TriggerKind::kLossSpike, 12.0, 10.0, Loss(11.0), true},
    {"loss spike: at the threshold", TriggerKind::kLossSpike, 12.0, 10.0, Loss(10.0), false},
    {"loss spike: NaN is not above", TriggerKind::kLossSpike, 12.0, 10.0, Loss(kNan), false},
    {"grad spike: above", TriggerKind::kGradNormSpike, 7.0, 5.0, Grad(6.0), true},
    {"grad spike: at the threshold", TriggerKind::kGradNormSpike, 7.0, 5.0, Grad(5.0), false},
    {"grad spike: no backward", TriggerKind::kGradNormSpike, 7.0, 5.0, Grad(6.0, false), false},
    {"exception: threw again", TriggerKind::kException, kNan, 0, Threw(), true},
    {"exception: ran clean", TriggerKind::kException, kNan, 0, Loss(kNan), false},
    {"manual: same bits", TriggerKind::kManual, 2.5, 0, Loss(2.5), true},
    {"manual: within 1e-6 relative", TriggerKind::kManual, 2.5, 0, Loss(2.5 * (1 + 5e-7)), true},
    {"manual: beyond 1e-6 relative", TriggerKind::kManual, 2.5, 0, Loss(2.5 * (1 + 4e-6)), false},
    {"manual: small loss, absolute floor", TriggerKind::kManual, 1e-3, 0, Loss(1e-3 + 9e-7), true},
    {"manual: small loss, beyond the floor", TriggerKind::kManual, 1e-3, 0, Loss(1e-3 + 2e-6),
     false},
    {"manual: NaN captured, NaN again", TriggerKind::kManual, kNan, 0, Loss(kNan), true},
    {"manual: NaN captured, Inf counts", TriggerKind::kManual, kNan, 0, Loss(kInf), true},
    {"manual: NaN captured, finite re-run", TriggerKind::kManual, kNan, 0, Loss(1.0), false},
    {"manual: finite captured, NaN re-run", TriggerKind::kManual, 1.0, 0, Loss(kNan), false},
    {"none: the step itself", TriggerKind::kNone, 2.5, 0, Loss(2.5), true},
    {"unknown kind: the step again", kUnknownKind, 2.5, 0, Loss(2.5), true},
    {"unknown kind: another loss", kUnknownKind, 2.5, 0, Loss(2.6), false},
};

TEST(TriggerRule, EveryRowOfTheTable) {
  for (const Row& row : kRows) {
    EXPECT_EQ(TriggerFiresAgain(row.kind, row.observed, row.threshold, row.rerun), row.fires)
        << row.name;
  }
}

TEST(TriggerRule, GradientKindsWatchTheGradientNorm) {
  RerunOutcome r;
  r.loss = 1.5;
  r.grad_norm = 8.0;
  for (TriggerKind kind : {TriggerKind::kNonFiniteGrad, TriggerKind::kGradNormSpike}) {
    EXPECT_TRUE(WatchesGradNorm(kind));
    EXPECT_EQ(WatchedValue(kind, r), 8.0);
  }
  for (TriggerKind kind :
       {TriggerKind::kNonFiniteLoss, TriggerKind::kLossSpike, TriggerKind::kManual,
        TriggerKind::kException, TriggerKind::kNone, kUnknownKind}) {
    EXPECT_FALSE(WatchesGradNorm(kind));
    EXPECT_EQ(WatchedValue(kind, r), 1.5);
  }
}

}  // namespace
}  // namespace capsule
