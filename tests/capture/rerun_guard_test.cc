// The capture re-run's scope guard: the trainer's RNG position and intra-op thread count come back
// however the re-run ends.
#include "capsule/capture/internal/rerun_guard.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "capsule/snapshot/rng_state.h"

namespace capsule {
namespace {

class RerunGuardTest : public ::testing::Test {
 protected:
  RerunGuardTest() {
    at::set_num_threads(1);
    at::manual_seed(3);
    step_rngs_ = SnapshotTorchRngs();
    step_draw_ = at::randn({16});  // what the step saw
    at::manual_seed(11);           // where the trainer is after its own step
    trainer_rngs_ = SnapshotTorchRngs();
    trainer_next_ = at::randn({16});
    EXPECT_TRUE(RestoreTorchRngs(trainer_rngs_).ok());
  }
  ~RerunGuardTest() override { at::set_num_threads(1); }

  // The trainer's next draw is the one it would have made without a re-run in between.
  bool TrainerStreamIntact() { return at::equal(at::randn({16}), trainer_next_); }

  std::vector<RngBlobData> step_rngs_, trainer_rngs_;
  at::Tensor step_draw_, trainer_next_;
};

TEST_F(RerunGuardTest, RestoresRngAndThreadsAfterAnException) {
  bool entered = false;
  try {
    internal::RerunGuard guard;
    entered = guard.Enter(step_rngs_, 2).ok();
    EXPECT_EQ(at::get_num_threads(), 2);
    EXPECT_TRUE(at::equal(at::randn({16}), step_draw_));  // the step's stream
    throw std::runtime_error("a layer threw during the re-run");
  } catch (const std::runtime_error&) {
  }
  ASSERT_TRUE(entered);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_TRUE(TrainerStreamIntact());
}

TEST_F(RerunGuardTest, RestoresOnAnEarlyReturn) {
  auto rerun = [&]() -> Status {
    internal::RerunGuard guard;
    CAPSULE_RETURN_IF_ERROR(guard.Enter(step_rngs_, 2));
    (void)at::randn({1000});
    return InternalError("statistics failed");
  };
  EXPECT_EQ(rerun().code(), StatusCode::kInternal);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_TRUE(TrainerStreamIntact());
}

TEST_F(RerunGuardTest, RestoreRunsOnceAndTheDestructorDoesNotUndoLaterDraws) {
  {
    internal::RerunGuard guard;
    ASSERT_TRUE(guard.Enter(step_rngs_, 2).ok());
    EXPECT_TRUE(guard.Restore().ok());
    EXPECT_EQ(at::get_num_threads(), 1);
    EXPECT_TRUE(TrainerStreamIntact());  // the trainer draws on
    EXPECT_TRUE(guard.Restore().ok());   // a no-op now
  }  // and so is the destructor: the trainer's later draw is not rewound
  EXPECT_FALSE(at::equal(at::randn({16}), trainer_next_));
}

TEST_F(RerunGuardTest, EnterRefusesABrokenStateAndAZeroThreadCount) {
  {
    internal::RerunGuard guard;
    std::vector<RngBlobData> broken = step_rngs_;
    broken[0].state.resize(10);
    EXPECT_EQ(guard.Enter(broken, 2).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(guard.Enter(step_rngs_, 0).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_TRUE(TrainerStreamIntact());
}

}  // namespace
}  // namespace capsule
