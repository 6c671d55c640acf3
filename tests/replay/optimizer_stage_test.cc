// The optimizer stage (replay/internal/triage.h, RunOptimizerStage) check by check, on a capsule
// that records one real LibTorch Adam or AdamW step as the OptimizerProbe names it: each check made
// to fire by what the trainer did wrong, and a near miss where it must not. The assertions hold
// the structured fields; the sentences are only required to be there.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/triage.h"
#include "capsule/snapshot/internal/tensor_codec.h"
#include "tests/replay/stage_test_util.h"

namespace capsule::internal {
namespace {

using stage_test::FailedChecks;
using stage_test::Find;
using stage_test::FindAll;

constexpr double kLr = 1e-2;
constexpr double kDecay = 0.1;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Param {
  const char* name;
  const char* layer;
  std::vector<int64_t> shape;
  bool exempt;  // from weight decay: in group 1, without it
};

const Param kParams[] = {
    {"blocks.0.fc.weight", "blocks.0", {3, 4}, false},
    {"blocks.0.fc.bias", "blocks.0", {4}, true},
    {"head.weight", "head", {2, 4}, false},
};

double Norm(const at::Tensor& t) { return t.to(at::kDouble).norm().item<double>(); }

void Embed(v1::Capsule& c, const std::string& name, const at::Tensor& t, v1::TensorRole role,
           const std::string& layer = "") {
  v1::TensorBlob& blob = *c.add_tensors();
  ASSERT_TRUE(TensorToBlob(name, t, &blob).ok());
  blob.set_role(role);
  blob.set_layer(layer);
}

// The moments and step count torch keeps for `p`.
template <typename State>
void Moments(torch::optim::Optimizer& opt, const at::Tensor& p, at::Tensor* m, at::Tensor* v) {
  auto found = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
  ASSERT_TRUE(found != opt.state().end());
  auto& s = static_cast<State&>(*found->second);
  *m = s.exp_avg().clone();
  *v = s.exp_avg_sq().clone();
}

// A recorded step: a trainer's second step of torch::optim::AdamW (or Adam) over kParams, decay
// exempt parameters in a group without weight decay, with everything the probe records.
struct Recorded {
  v1::Capsule capsule;
  double grad_norm = 0;    // global, over every parameter (the FP64 reference's, unclipped)
  double update_norm = 0;  // global
};

template <typename Optimizer, typename Options, typename State>
Recorded Step(v1::OptimizerKind kind) {
  at::Generator g = at::detail::createCPUGenerator(17);
  std::vector<at::Tensor> values;
  std::vector<at::Tensor> decayed, exempt;
  for (const Param& p : kParams) {
    at::Tensor t = at::randn(p.shape, g, at::kFloat);
    t.set_requires_grad(true);
    values.push_back(t);
    (p.exempt ? exempt : decayed).push_back(t);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<Options>(Options(kLr).weight_decay(kDecay)));
  groups.emplace_back(exempt, std::make_unique<Options>(Options(kLr).weight_decay(0)));
  Optimizer opt(std::move(groups), Options(kLr));
  auto set_grads = [&] {
    for (at::Tensor& t : values) t.mutable_grad() = at::randn(t.sizes(), g, at::kFloat);
  };
  set_grads();
  opt.step();  // the state the recorded step starts from
  set_grads();

  Recorded r;
  v1::OptimizerStep& step = *r.capsule.mutable_optimizer();
  step.set_kind(kind);
  for (double wd : {kDecay, 0.0}) {
    v1::ParamGroup& pg = *step.add_groups();
    pg.set_lr(kLr);
    pg.set_beta1(0.9);
    pg.set_beta2(0.999);
    pg.set_eps(1e-8);
    pg.set_weight_decay(wd);
  }
  std::vector<at::Tensor> before, m0, v0;
  for (const at::Tensor& t : values) {
    before.push_back(t.detach().clone());
    m0.emplace_back();
    v0.emplace_back();
    Moments<State>(opt, t, &m0.back(), &v0.back());
  }
  opt.step();
  double grad_sq = 0, update_sq = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const Param& p = kParams[i];
    const std::string name = p.name, prefix = "optimizer/" + name + "/";
    at::Tensor m_after, v_after;
    Moments<State>(opt, values[i], &m_after, &v_after);
    Embed(r.capsule, name, before[i], v1::PARAMETER, p.layer);
    Embed(r.capsule, prefix + "grad", values[i].grad(), v1::OTHER);
    Embed(r.capsule, prefix + "exp_avg", m0[i], v1::OTHER);
    Embed(r.capsule, prefix + "exp_avg_sq", v0[i], v1::OTHER);
    Embed(r.capsule, prefix + "param_after", values[i].detach(), v1::OTHER);
    Embed(r.capsule, prefix + "exp_avg_after", m_after, v1::OTHER);
    Embed(r.capsule, prefix + "exp_avg_sq_after", v_after, v1::OTHER);
    v1::ParamStep& ps = *step.add_params();
    ps.set_name(name);
    ps.set_group(p.exempt ? 1 : 0);
    ps.set_requires_grad(true);
    ps.set_decay_exempt(p.exempt);
    ps.set_step_before(1);
    ps.set_grad(prefix + "grad");
    ps.set_exp_avg(prefix + "exp_avg");
    ps.set_exp_avg_sq(prefix + "exp_avg_sq");
    ps.set_param_after(prefix + "param_after");
    ps.set_exp_avg_after(prefix + "exp_avg_after");
    ps.set_exp_avg_sq_after(prefix + "exp_avg_sq_after");
    ps.set_grad_norm(Norm(values[i].grad()));
    ps.set_param_norm(Norm(before[i]));
    ps.set_update_norm(Norm(values[i].detach().to(at::kDouble) - before[i].to(at::kDouble)));
    grad_sq += ps.grad_norm() * ps.grad_norm();
    update_sq += ps.update_norm() * ps.update_norm();
  }
  step.set_observed_after(true);
  r.grad_norm = std::sqrt(grad_sq);
  r.update_norm = std::sqrt(update_sq);
  return r;
}

Recorded AdamWStep() {
  return Step<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
      v1::ADAMW);
}

Recorded AdamStep() {
  return Step<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
      v1::ADAM);
}

TEST(OptimizerStageTest, ACleanStepOfTorchsAdamWAndAdamPasses) {
  for (const Recorded& s : {AdamWStep(), AdamStep()}) {
    const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
    ASSERT_TRUE(r.ran()) << r.skipped_reason();
    EXPECT_EQ(r.stage(), v1::STAGE_OPTIMIZER);
    EXPECT_TRUE(FailedChecks(r).empty()) << r.DebugString();
    EXPECT_FALSE(r.explains());
    const v1::Finding* f = Find(r, "optimizer.update_matches");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed());
    EXPECT_GT(f->value(), 0);  // compared: the FP32 step is not bitwise the FP64 one
    EXPECT_LE(f->value(), 1);
    EXPECT_EQ(f->threshold(), 1);
    EXPECT_FALSE(f->detail().empty());
    // No fault, no finding about one; no scheduled lr or clip threshold declared.
    for (const char* check :
         {"optimizer.step_on_overflow", "optimizer.frozen_updated", "optimizer.frozen_in_optimizer",
          "optimizer.lr_schedule", "optimizer.clip_applied", "optimizer.clip_before_unscale"}) {
      EXPECT_TRUE(Find(r, check) == nullptr) << check << ": " << r.DebugString();
    }
  }
}

TEST(OptimizerStageTest, AStepWithOtherHyperParametersThanRecordedDoesNotMatch) {
  // The recorded lr 1% off the one the step used: the update is 1% off, ten times the allowance.
  Recorded s = AdamWStep();
  s.capsule.mutable_optimizer()->mutable_groups(0)->set_lr(kLr * 1.01);
  const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.update_matches");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_GT(f->value(), 1);
  EXPECT_EQ(f->threshold(), 1);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_EQ(FailedChecks(r), std::vector<std::string>{"optimizer.update_matches"});
  // 1e-5 off: within the allowance of 0.1% of the update.
  s.capsule.mutable_optimizer()->mutable_groups(0)->set_lr(kLr * (1 + 1e-5));
  EXPECT_TRUE(FailedChecks(RunOptimizerStage(s.capsule, s.grad_norm)).empty());

  // Adam's L2 decay recorded as AdamW's decoupled one.
  Recorded adam = AdamStep();
  adam.capsule.mutable_optimizer()->set_kind(v1::ADAMW);
  const v1::StageReport k = RunOptimizerStage(adam.capsule, adam.grad_norm);
  ASSERT_NE(Find(k, "optimizer.update_matches"), nullptr) << k.DebugString();
  EXPECT_TRUE(Find(k, "optimizer.update_matches")->failed());
  EXPECT_GT(Find(k, "optimizer.update_matches")->value(), 1);
  // A moment off: the first moment's beta.
  Recorded beta = AdamWStep();
  beta.capsule.mutable_optimizer()->mutable_groups(1)->set_beta1(0.8);
  const v1::StageReport b = RunOptimizerStage(beta.capsule, beta.grad_norm);
  ASSERT_NE(Find(b, "optimizer.update_matches"), nullptr) << b.DebugString();
  EXPECT_TRUE(Find(b, "optimizer.update_matches")->failed());
}

TEST(OptimizerStageTest, AStepThatCannotBeRedoneIsANote) {
  Recorded s = AdamWStep();
  s.capsule.mutable_optimizer()->set_kind(v1::OTHER_OPTIMIZER);
  v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.update_matches");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed());
  EXPECT_EQ(f->value(), 0);
  EXPECT_EQ(f->threshold(), 1);
  EXPECT_FALSE(f->detail().empty());
  s = AdamWStep();
  s.capsule.mutable_optimizer()->mutable_groups(0)->set_amsgrad(true);
  r = RunOptimizerStage(s.capsule, s.grad_norm);
  f = Find(r, "optimizer.update_matches");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed());
  EXPECT_EQ(f->value(), 0);
  // Without the state tensors embedded, too.
  s = AdamWStep();
  s.capsule.mutable_optimizer()->mutable_params(0)->set_param_after("");
  r = RunOptimizerStage(s.capsule, s.grad_norm);
  f = Find(r, "optimizer.update_matches");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed());
  EXPECT_EQ(f->value(), 0);
}

TEST(OptimizerStageTest, AStepOnNonFiniteGradientsFails) {
  // The trainer's finite check fired, and the step still moved every parameter.
  Recorded s = AdamWStep();
  s.capsule.mutable_optimizer()->set_found_inf(true);
  v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.step_on_overflow");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->value(), 3);  // parameters that changed
  EXPECT_EQ(f->threshold(), 0);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_TRUE(r.explains());
  // The update is not redone on non-finite gradients.
  ASSERT_NE(Find(r, "optimizer.update_matches"), nullptr);
  EXPECT_FALSE(Find(r, "optimizer.update_matches")->failed());
  EXPECT_EQ(Find(r, "optimizer.update_matches")->value(), 0);

  // A gradient with NaN, no finite check: the same.
  s = AdamWStep();
  s.capsule.mutable_optimizer()->mutable_params(2)->set_grad_norm(kNaN);
  r = RunOptimizerStage(s.capsule, s.grad_norm);
  f = Find(r, "optimizer.step_on_overflow");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->value(), 3);

  // Skipped, as it should be: no parameter changed. A note.
  s = AdamWStep();
  s.capsule.mutable_optimizer()->set_found_inf(true);
  for (v1::ParamStep& p : *s.capsule.mutable_optimizer()->mutable_params()) p.set_update_norm(0);
  r = RunOptimizerStage(s.capsule, s.grad_norm);
  f = Find(r, "optimizer.step_on_overflow");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed());
  EXPECT_EQ(f->value(), 0);
  EXPECT_FALSE(r.explains()) << r.DebugString();
}

TEST(OptimizerStageTest, AFrozenParameterThatMovedFails) {
  // head.weight does not require grad, yet its momentum moved it.
  Recorded s = AdamWStep();
  s.capsule.mutable_optimizer()->mutable_params(2)->set_requires_grad(false);
  v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.frozen_updated");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->value(), 1);
  EXPECT_EQ(f->threshold(), 0);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_TRUE(Find(r, "optimizer.frozen_in_optimizer") == nullptr);
  // In no group, and moved (a second optimizer, or a copy written over it): frozen, moved.
  s = AdamWStep();
  s.capsule.mutable_optimizer()->mutable_params(1)->set_group(-1);
  s.capsule.mutable_optimizer()->mutable_params(2)->set_group(-1);
  r = RunOptimizerStage(s.capsule, s.grad_norm);
  f = Find(r, "optimizer.frozen_updated");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->value(), 2);
}

TEST(OptimizerStageTest, AFrozenParameterLeftInAGroupThatDidNotMoveIsANote) {
  Recorded s = AdamWStep();
  v1::ParamStep& head = *s.capsule.mutable_optimizer()->mutable_params(2);
  head.set_requires_grad(false);
  head.set_update_norm(0);
  head.set_grad("");  // torch's step skips a parameter without a gradient
  const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.frozen_in_optimizer");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed());
  EXPECT_EQ(f->value(), 1);
  EXPECT_EQ(f->threshold(), 0);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_TRUE(Find(r, "optimizer.frozen_updated") == nullptr);
  EXPECT_TRUE(FailedChecks(r).empty()) << r.DebugString();
  // Frozen and in no group: where it belongs, no note.
  head.set_group(-1);
  EXPECT_TRUE(Find(RunOptimizerStage(s.capsule, s.grad_norm), "optimizer.frozen_in_optimizer") ==
              nullptr);
}

TEST(OptimizerStageTest, DecayOnAnExemptParameterFails) {
  Recorded s = AdamWStep();
  {
    const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
    const v1::Finding* f = Find(r, "optimizer.decay_on_excluded");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed());
    EXPECT_EQ(f->value(), 0);
    EXPECT_EQ(f->threshold(), 0);
    EXPECT_FALSE(f->detail().empty());
  }
  // The bias, exempt by the configuration, sits in the group with weight decay.
  s.capsule.mutable_optimizer()->mutable_params(1)->set_group(0);
  const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.decay_on_excluded");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->value(), 1);
  EXPECT_EQ(f->threshold(), 0);
  EXPECT_TRUE(r.explains());
  // Nothing exempt: nothing to judge.
  s.capsule.mutable_optimizer()->mutable_params(1)->set_decay_exempt(false);
  EXPECT_TRUE(Find(RunOptimizerStage(s.capsule, s.grad_norm), "optimizer.decay_on_excluded") ==
              nullptr);
}

TEST(OptimizerStageTest, AnLrOffTheScheduleFails) {
  Recorded s = AdamWStep();
  v1::ParamGroup& g = *s.capsule.mutable_optimizer()->mutable_groups(1);
  g.set_scheduled_lr(kLr * (1 + 1e-12));
  {
    const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
    const auto found = FindAll(r, "optimizer.lr_schedule");
    ASSERT_EQ(found.size(), 1u) << r.DebugString();  // group 0 declares no schedule
    EXPECT_FALSE(found[0]->failed());
    EXPECT_EQ(found[0]->value(), kLr);
    EXPECT_EQ(found[0]->threshold(), kLr * (1 + 1e-12));
    EXPECT_FALSE(found[0]->detail().empty());
  }
  // The warmup's lr, not the one the step used.
  g.set_scheduled_lr(kLr / 2);
  const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.lr_schedule");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->value(), kLr);
  EXPECT_EQ(f->threshold(), kLr / 2);
  EXPECT_EQ(FailedChecks(r), std::vector<std::string>{"optimizer.lr_schedule"});
}

TEST(OptimizerStageTest, GradientsAboveTheClipThresholdFail) {
  Recorded s = AdamWStep();
  // The gradients are unclipped: a threshold below their norm did not apply.
  s.capsule.mutable_optimizer()->set_clip_max_norm(s.grad_norm / 1.01);
  v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.clip_applied");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_NEAR(f->value(), s.grad_norm, 1e-12 * s.grad_norm);
  EXPECT_EQ(f->threshold(), s.grad_norm / 1.01);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_TRUE(r.explains());
  // Within the 0.1% slack, and well within: passed.
  for (double clip : {s.grad_norm / (1 + 5e-4), 2 * s.grad_norm}) {
    s.capsule.mutable_optimizer()->set_clip_max_norm(clip);
    r = RunOptimizerStage(s.capsule, s.grad_norm);
    f = Find(r, "optimizer.clip_applied");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed()) << "clip " << clip;
    EXPECT_EQ(f->threshold(), clip);
  }
}

TEST(OptimizerStageTest, AClipOnScaledGradientsIsFound) {
  Recorded s = AdamWStep();
  v1::OptimizerStep& opt = *s.capsule.mutable_optimizer();
  opt.set_clip_max_norm(100);
  opt.set_loss_scale(1024);
  // The clip saw the scaled norm.
  opt.set_grad_norm_before_clip(1024 * s.grad_norm);
  v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const v1::Finding* f = Find(r, "optimizer.clip_before_unscale");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_TRUE(f->failed());
  EXPECT_NEAR(f->value(), 1024, 1e-9);
  EXPECT_EQ(f->threshold(), 1024);
  EXPECT_FALSE(f->detail().empty());
  EXPECT_EQ(FailedChecks(r), std::vector<std::string>{"optimizer.clip_before_unscale"});
  // The unscaled norm; one 2% off the scaled one; neither: passed, the ratio given.
  for (double ratio : {1.0, 1024 * 1.02, 3.0}) {
    opt.set_grad_norm_before_clip(ratio * s.grad_norm);
    r = RunOptimizerStage(s.capsule, s.grad_norm);
    f = Find(r, "optimizer.clip_before_unscale");
    ASSERT_NE(f, nullptr) << r.DebugString();
    EXPECT_FALSE(f->failed()) << "ratio " << ratio;
    EXPECT_NEAR(f->value(), ratio, 1e-9 * ratio);
  }
  // No loss scale, or no FP64 reference norm: not judged.
  opt.set_grad_norm_before_clip(1024 * s.grad_norm);
  EXPECT_TRUE(Find(RunOptimizerStage(s.capsule, kNaN), "optimizer.clip_before_unscale") == nullptr);
  opt.set_loss_scale(1);
  EXPECT_TRUE(Find(RunOptimizerStage(s.capsule, s.grad_norm), "optimizer.clip_before_unscale") ==
              nullptr);
}

TEST(OptimizerStageTest, TheStepNormsNoteGivesTheUpdateNorm) {
  Recorded s = AdamWStep();
  const v1::StageReport r = RunOptimizerStage(s.capsule, s.grad_norm);
  const auto found = FindAll(r, "optimizer.step_norms");
  ASSERT_EQ(found.size(), 1u) << r.DebugString();
  EXPECT_FALSE(found[0]->failed());
  EXPECT_NEAR(found[0]->value(), s.update_norm, 1e-12 * s.update_norm);
  EXPECT_GT(found[0]->value(), 0);
  EXPECT_EQ(found[0]->threshold(), 0);
  EXPECT_FALSE(found[0]->detail().empty());
  // The step after it not observed, or no step recorded: the stage is skipped, no note.
  s.capsule.mutable_optimizer()->set_observed_after(false);
  v1::StageReport skipped = RunOptimizerStage(s.capsule, s.grad_norm);
  EXPECT_FALSE(skipped.ran());
  EXPECT_FALSE(skipped.skipped_reason().empty());
  EXPECT_EQ(skipped.findings_size(), 0);
  s.capsule.mutable_optimizer()->clear_params();
  skipped = RunOptimizerStage(s.capsule, s.grad_norm);
  EXPECT_FALSE(skipped.ran());
  EXPECT_EQ(skipped.findings_size(), 0);
}

// A recorded state tensor of another shape than its parameter's: the format's validator accepts
// it (it checks that the names resolve, not the shapes), so the stage must judge the rest and say
// the update was not redone, not throw out of replay (nothing up the stack catches LibTorch's
// error there: the command would end on an uncaught exception).
TEST(OptimizerStageTest, AStateTensorOfAnotherShapeIsNotRedone) {
  Recorded s = AdamWStep();
  // blocks.0.fc.weight [3, 4] given head.weight's gradient [2, 4].
  s.capsule.mutable_optimizer()->mutable_params(0)->set_grad("optimizer/head.weight/grad");
  v1::StageReport r;
  ASSERT_NO_THROW(r = RunOptimizerStage(s.capsule, s.grad_norm));
  ASSERT_TRUE(r.ran()) << r.skipped_reason();
  const v1::Finding* f = Find(r, "optimizer.update_matches");
  ASSERT_NE(f, nullptr) << r.DebugString();
  EXPECT_FALSE(f->failed());
  EXPECT_EQ(f->value(), 0);
  EXPECT_FALSE(f->detail().empty());
  ASSERT_NE(Find(r, "optimizer.step_norms"), nullptr);
}

}  // namespace
}  // namespace capsule::internal
