// The optimizer stage of the triage (triage.h): the recorded step redone in FP64.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "capsule/base/internal/strings.h"
#include "capsule/replay/internal/capsule_inputs.h"
#include "capsule/replay/internal/triage.h"
#include "capsule/snapshot/internal/tensor_codec.h"

namespace capsule::internal {
namespace {

// A recorded tensor as FP64, undefined when the name is empty, absent or undecodable.
at::Tensor Load(const v1::Capsule& c, const std::string& name) {
  if (name.empty()) return {};
  const v1::TensorBlob* blob = FindTensor(c, name);
  if (blob == nullptr) return {};
  auto t = TensorFromBlob(*blob);
  return t.ok() ? t->to(at::kDouble) : at::Tensor();
}

// max over elements of |actual - expected| / bound; 0 for empty tensors.
double WorstRatio(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& bound) {
  if (actual.numel() == 0) return 0;
  return ((actual - expected).abs() / bound).max().item<double>();
}

// Which parameters moved, and which had non-finite gradients.
struct Movement {
  std::vector<std::string> nonfinite_grads, moved, moved_nonfinite, frozen_idle;
  std::vector<std::string> frozen_moved;  // with their update norm, group and requires_grad
  std::vector<double> frozen_norms, frozen_groups, frozen_requires_grad;
  bool overflow = false;
};

Movement MovementOf(const v1::OptimizerStep& opt) {
  Movement m;
  for (const v1::ParamStep& p : opt.params()) {
    const bool changed = p.update_norm() != 0;  // NaN (a non-finite update) counts as a change
    if (changed) m.moved.push_back(p.name());
    if (changed && !std::isfinite(p.update_norm())) m.moved_nonfinite.push_back(p.name());
    if (!std::isfinite(p.grad_norm())) m.nonfinite_grads.push_back(p.name());
    const bool frozen = !p.requires_grad() || p.group() < 0;
    if (frozen && changed) {
      m.frozen_moved.push_back(p.name());
      m.frozen_norms.push_back(p.update_norm());
      m.frozen_groups.push_back(p.group());
      m.frozen_requires_grad.push_back(p.requires_grad() ? 1 : 0);
    }
    if (frozen && !changed && p.group() >= 0) m.frozen_idle.push_back(p.name());
  }
  m.overflow = opt.found_inf() || !m.nonfinite_grads.empty();
  return m;
}

void CheckOverflowAndFrozen(const Movement& m, v1::StageReport& r) {
  if (m.overflow) {
    v1::Finding& f = AddFinding(r, "optimizer.step_on_overflow", !m.moved.empty(),
                                static_cast<double>(m.moved.size()), 0);
    AddFact(f, "nonfinite_grads", m.nonfinite_grads);
    AddFact(f, "moved_nonfinite", static_cast<double>(m.moved_nonfinite.size()));
  }
  if (!m.frozen_moved.empty()) {
    v1::Finding& f = AddFinding(r, "optimizer.frozen_updated", true,
                                static_cast<double>(m.frozen_moved.size()), 0);
    AddFact(f, "parameters", m.frozen_moved, m.frozen_norms);
    AddFact(f, "groups", m.frozen_moved, m.frozen_groups);
    AddFact(f, "requires_grad", m.frozen_moved, m.frozen_requires_grad);
  } else if (!m.frozen_idle.empty()) {
    AddFact(AddFinding(r, "optimizer.frozen_in_optimizer", false,
                       static_cast<double>(m.frozen_idle.size()), 0),
            "parameters", m.frozen_idle);
  }
}

// Weight decay on parameters the configuration exempts.
void CheckDecayOnExcluded(const v1::OptimizerStep& opt, v1::StageReport& r) {
  std::vector<std::string> decayed;
  double decay = 0;
  bool any_exempt = false;
  for (const v1::ParamStep& p : opt.params()) {
    any_exempt |= p.decay_exempt();
    if (!p.decay_exempt() || p.group() < 0) continue;
    const double wd = opt.groups(p.group()).weight_decay();
    if (wd > 0) {
      decayed.push_back(p.name());
      decay = std::max(decay, wd);
    }
  }
  if (!any_exempt) return;
  v1::Finding& f = AddFinding(r, "optimizer.decay_on_excluded", !decayed.empty(),
                              static_cast<double>(decayed.size()), 0);
  AddFact(f, "parameters", decayed);
  AddFact(f, "weight_decay", decay);
}

// The learning rate the schedule gives.
void CheckLrSchedule(const v1::OptimizerStep& opt, v1::StageReport& r) {
  for (int g = 0; g < opt.groups_size(); ++g) {
    const v1::ParamGroup& pg = opt.groups(g);
    if (!pg.has_scheduled_lr()) continue;
    const double e =
        std::abs(pg.lr() - pg.scheduled_lr()) / std::max(std::abs(pg.scheduled_lr()), 1e-300);
    AddFact(AddFinding(r, "optimizer.lr_schedule", e > 1e-9, pg.lr(), pg.scheduled_lr()), "group",
            g);
  }
}

// Clipping: the gradients the optimizer got must be within the threshold; and the norm the clip
// saw against the FP64 reference's unscaled gradient norm (scale times it: the clip ran on
// scaled gradients).
void CheckClip(const v1::OptimizerStep& opt, double global, double reference_grad_norm,
               v1::StageReport& r) {
  if (opt.clip_max_norm() <= 0) return;
  if (std::isfinite(global)) {
    AddFinding(r, "optimizer.clip_applied", global > opt.clip_max_norm() * (1 + 1e-3), global,
               opt.clip_max_norm());
  }
  const double scale = opt.loss_scale();
  const double seen = opt.grad_norm_before_clip();
  if (scale <= 1 || !std::isfinite(seen) || !std::isfinite(reference_grad_norm) ||
      reference_grad_norm <= 0) {
    return;
  }
  const double ratio = seen / reference_grad_norm;
  const bool scaled = std::abs(ratio / scale - 1) <= kClipNormRelTol;
  v1::Finding& f = AddFinding(r, "optimizer.clip_before_unscale", scaled, ratio, scale);
  AddFact(f, "seen", seen);
  AddFact(f, "reference", reference_grad_norm);
  AddFact(f, "unscaled", std::abs(ratio - 1) <= kClipNormRelTol ? 1.0 : 0.0);
}

// The worst element ratio of one parameter's step against a hand-written FP64 Adam/AdamW step
// from the recorded state, by tensor ("parameter", "exp_avg", "exp_avg_sq"); empty with `why_not`
// set when it cannot be redone.
std::vector<std::pair<const char*, double>> RedoAdam(const v1::Capsule& c, const v1::ParamStep& p,
                                                     std::string* why_not) {
  const v1::OptimizerStep& opt = c.optimizer();
  const v1::ParamGroup& g = opt.groups(p.group());
  if (g.amsgrad()) {
    *why_not = "amsgrad's maximum is not recorded";
    return {};
  }
  const at::Tensor before = Load(c, p.name());
  const at::Tensor grad = Load(c, p.grad());
  const at::Tensor after = Load(c, p.param_after());
  if (!before.defined() || !grad.defined() || !after.defined()) {
    *why_not = "the parameters before the step or the state tensors are not embedded";
    return {};
  }
  at::Tensor m0 = Load(c, p.exp_avg());
  at::Tensor v0 = Load(c, p.exp_avg_sq());
  if (!m0.defined()) m0 = at::zeros_like(before);
  if (!v0.defined()) v0 = at::zeros_like(before);
  const at::Tensor m_after = Load(c, p.exp_avg_after());
  const at::Tensor v_after = Load(c, p.exp_avg_sq_after());
  const std::vector<const at::Tensor*> recorded = {&grad, &after, &m0, &v0, &m_after, &v_after};
  for (const at::Tensor* t : recorded) {
    if (t->defined() && t->sizes() != before.sizes()) {
      *why_not = "a recorded gradient or state tensor of " + p.name() +
                 " does not have the parameter's shape";
      return {};
    }
  }
  const double lr = g.lr(), b1 = g.beta1(), b2 = g.beta2(), eps = g.eps(), wd = g.weight_decay();
  const int64_t t = p.step_before() + 1;
  at::Tensor gr = g.maximize() ? -grad : grad;  // torch's maximize ascends
  at::Tensor expected = before;
  if (opt.kind() == v1::ADAMW) {
    expected = before * (1 - lr * wd);
  } else if (wd != 0) {
    gr = gr + wd * before;
  }
  const at::Tensor m = b1 * m0 + (1 - b1) * gr;
  const at::Tensor v = b2 * v0 + (1 - b2) * gr * gr;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(t));
  expected = expected - (lr / bc1) * m / (v.sqrt() / std::sqrt(bc2) + eps);
  const double ulp = std::ldexp(1.0, -23);
  const at::Tensor p_bound = kOptimizerParamUlps * ulp * (before.abs() + expected.abs()) +
                             kOptimizerUpdateRelTol * (expected - before).abs() + 1e-30;
  std::vector<std::pair<const char*, double>> ratios = {
      {"parameter", WorstRatio(after, expected, p_bound)}};
  if (m_after.defined()) {
    const at::Tensor bound =
        kOptimizerMomentRelTol * ((b1 * m0).abs() + ((1 - b1) * gr).abs()) + 1e-30;
    ratios.push_back({"exp_avg", WorstRatio(m_after, m, bound)});
  }
  if (v_after.defined()) {
    const at::Tensor bound =
        kOptimizerMomentRelTol * ((b2 * v0).abs() + ((1 - b2) * gr * gr).abs()) + 1e-40;
    ratios.push_back({"exp_avg_sq", WorstRatio(v_after, v, bound)});
  }
  return ratios;
}

// The update itself, redone in FP64 from the recorded state.
void CheckUpdate(const v1::Capsule& c, bool overflow, v1::StageReport& r) {
  const v1::OptimizerStep& opt = c.optimizer();
  std::string why_not;
  if (opt.kind() != v1::ADAMW && opt.kind() != v1::ADAM) {
    why_not = "the optimizer is not Adam or AdamW";
  } else if (overflow) {
    why_not = "the gradients are not finite";
  }
  double worst = 0;
  std::string worst_name, worst_what;
  int compared = 0;
  for (const v1::ParamStep& p : opt.params()) {
    if (!why_not.empty()) break;
    if (p.group() < 0 || p.grad().empty()) continue;
    const auto ratios = RedoAdam(c, p, &why_not);
    if (!why_not.empty()) break;
    ++compared;
    for (const auto& [what, ratio] : ratios) {
      const double q = std::isnan(ratio) ? INFINITY : ratio;
      if (q > worst || worst_name.empty()) {
        worst = q;
        worst_name = p.name();
        worst_what = what;
      }
    }
  }
  if (!why_not.empty()) {
    AddFact(AddFinding(r, "optimizer.update_matches", false, 0, 1), "not_redone", why_not);
    return;
  }
  if (compared == 0) return;
  v1::Finding& f = AddFinding(r, "optimizer.update_matches", worst > 1, worst, 1);
  f.set_parameter(worst_name);
  AddFact(f, "optimizer", opt.kind() == v1::ADAMW ? "AdamW" : "Adam");
  AddFact(f, "compared", compared);
  AddFact(f, "worst", worst_what);
}

// Norms of the step, for people: global, and the layer that moved most relative to its size.
void NoteStepNorms(const v1::Capsule& c, double global, v1::StageReport& r) {
  std::map<std::string, std::string> layer_of;
  for (const v1::TensorBlob& t : c.tensors()) {
    if (t.role() == v1::PARAMETER) layer_of[t.name()] = t.layer();
  }
  double update_sq = 0, param_sq = 0;
  std::map<std::string, std::pair<double, double>> by_layer;  // layer -> (update^2, param^2)
  for (const v1::ParamStep& p : c.optimizer().params()) {
    update_sq += p.update_norm() * p.update_norm();
    param_sq += p.param_norm() * p.param_norm();
    auto& l = by_layer[layer_of.count(p.name()) ? layer_of[p.name()] : p.name()];
    l.first += p.update_norm() * p.update_norm();
    l.second += p.param_norm() * p.param_norm();
  }
  std::string top;
  double top_ratio = -1;
  for (const auto& [layer, sq] : by_layer) {
    const double ratio = sq.second > 0 ? std::sqrt(sq.first / sq.second) : 0;
    if (ratio > top_ratio) {
      top_ratio = ratio;
      top = layer;
    }
  }
  v1::Finding& f = AddFinding(r, "optimizer.step_norms", false, std::sqrt(update_sq), 0);
  AddFact(f, "grad_norm", global);
  AddFact(f, "param_norm", std::sqrt(param_sq));
  AddFact(f, "top_ratio", top_ratio);
  AddFact(f, "top_layer", top);
}

void JudgeStep(const v1::Capsule& c, double reference_grad_norm, v1::StageReport& r) {
  const v1::OptimizerStep& opt = c.optimizer();
  const Movement m = MovementOf(opt);
  CheckOverflowAndFrozen(m, r);
  CheckDecayOnExcluded(opt, r);
  CheckLrSchedule(opt, r);
  double global_sq = 0;
  for (const v1::ParamStep& p : opt.params()) global_sq += p.grad_norm() * p.grad_norm();
  const double global = std::sqrt(global_sq);
  CheckClip(opt, global, reference_grad_norm, r);
  CheckUpdate(c, m.overflow, r);
  NoteStepNorms(c, global, r);
}

// Why the recorded step cannot be judged; empty when it can.
std::string Unsupported(const v1::OptimizerStep& opt) {
  if (opt.params_size() == 0) {
    return "the capsule has no optimizer step (no OptimizerProbe was attached)";
  }
  if (!opt.observed_after()) return "the optimizer step after the capture was not observed";
  return "";
}

}  // namespace

v1::StageReport RunOptimizerStage(const v1::Capsule& c, double reference_grad_norm) {
  v1::StageReport r;
  if (StartStage(v1::STAGE_OPTIMIZER, Unsupported(c.optimizer()), &r)) {
    JudgeStep(c, reference_grad_norm, r);
  }
  RenderDetails(&r);
  return r;
}

}  // namespace capsule::internal
