// The optimizer stage of the triage (triage.h): the recorded step redone in FP64.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "capsule/base/strings.h"
#include "capsule/probe/tensor_codec.h"
#include "capsule/replay/internal/capsule_inputs.h"
#include "capsule/replay/internal/triage.h"

namespace capsule::internal {
namespace {

std::string Num(double v) { return FormatSignificant(v, 4); }

// A recorded tensor as FP64, undefined when the name is empty, absent or undecodable.
at::Tensor Load(const v1::Capsule& c, const std::string& name) {
  if (name.empty()) return {};
  const v1::TensorBlob* blob = FindTensor(c, name);
  if (blob == nullptr) return {};
  auto t = TensorFromBlob(*blob);
  return t.ok() ? t->to(at::kDouble) : at::Tensor();
}

// Names, at most four, for a sentence.
std::string List(const std::vector<std::string>& names) {
  std::string out;
  for (size_t k = 0; k < names.size() && k < 4; ++k) out += (k ? ", " : "") + names[k];
  if (names.size() > 4) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

v1::Finding& Add(v1::StageReport& r, const std::string& check, bool failed, double value,
                 double threshold, const std::string& detail) {
  v1::Finding& f = *r.add_findings();
  f.set_check(check);
  f.set_failed(failed);
  f.set_value(value);
  f.set_threshold(threshold);
  f.set_detail(detail);
  if (failed) r.set_explains(true);
  return f;
}

// max over elements of |actual - expected| / bound; 0 for empty tensors.
double WorstRatio(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& bound) {
  if (actual.numel() == 0) return 0;
  return ((actual - expected).abs() / bound).max().item<double>();
}

}  // namespace

v1::StageReport RunOptimizerStage(const v1::Capsule& c, double reference_grad_norm) {
  v1::StageReport r;
  r.set_stage(v1::STAGE_OPTIMIZER);
  const v1::OptimizerStep& opt = c.optimizer();
  if (opt.params_size() == 0) {
    r.set_skipped_reason("the capsule has no optimizer step (no OptimizerProbe was attached)");
    return r;
  }
  if (!opt.observed_after()) {
    r.set_skipped_reason("the optimizer step after the capture was not observed");
    return r;
  }
  r.set_ran(true);
  std::map<std::string, std::string> layer_of;
  for (const v1::TensorBlob& t : c.tensors()) {
    if (t.role() == v1::PARAMETER) layer_of[t.name()] = t.layer();
  }

  // Which parameters moved, and which had non-finite gradients.
  std::vector<std::string> nonfinite_grads, moved, moved_nonfinite, frozen_moved, frozen_idle;
  std::vector<std::string> frozen_why;  // the first few frozen_moved, with how and how much
  for (const v1::ParamStep& p : opt.params()) {
    const bool changed = p.update_norm() != 0;  // NaN (a non-finite update) counts as a change
    if (changed) moved.push_back(p.name());
    if (changed && !std::isfinite(p.update_norm())) moved_nonfinite.push_back(p.name());
    if (!std::isfinite(p.grad_norm())) nonfinite_grads.push_back(p.name());
    const bool frozen = !p.requires_grad() || p.group() < 0;
    if (frozen && changed) {
      frozen_moved.push_back(p.name());
      if (frozen_why.size() < 4) {
        frozen_why.push_back(p.name() + " (" + (p.requires_grad() ? "" : "requires_grad false, ") +
                             (p.group() >= 0 ? "in group " + std::to_string(p.group())
                                             : std::string("in no group")) +
                             ") moved by " + Num(p.update_norm()));
      }
    }
    if (frozen && !changed && p.group() >= 0) frozen_idle.push_back(p.name());
  }
  const bool overflow = opt.found_inf() || !nonfinite_grads.empty();
  if (overflow) {
    const bool stepped = !moved.empty();
    Add(r, "optimizer.step_on_overflow", stepped, static_cast<double>(moved.size()), 0,
        std::string("the step's gradients were not finite (") +
            (nonfinite_grads.empty() ? "the trainer's finite check fired" : List(nonfinite_grads)) +
            (stepped ? ") and the optimizer still stepped: " + std::to_string(moved.size()) +
                           " parameters changed, " + std::to_string(moved_nonfinite.size()) +
                           " of them to non-finite values; a step on an overflow must be skipped "
                           "(and the loss scale lowered)"
                     : ") and no parameter changed: the step was skipped, as it should be"));
  }
  if (!frozen_moved.empty()) {
    Add(r, "optimizer.frozen_updated", true, static_cast<double>(frozen_moved.size()), 0,
        std::to_string(frozen_moved.size()) +
            " frozen parameters changed in the step: " + List(frozen_why) +
            "; a frozen parameter left in the optimizer still moves by its momentum and weight "
            "decay: remove it from the optimizer's groups");
  } else if (!frozen_idle.empty()) {
    Add(r, "optimizer.frozen_in_optimizer", false, static_cast<double>(frozen_idle.size()), 0,
        std::to_string(frozen_idle.size()) +
            " frozen parameters are in the optimizer's groups but did not change (" +
            List(frozen_idle) + ")");
  }
  // Weight decay on parameters the configuration exempts.
  std::vector<std::string> decayed;
  double decay = 0;
  for (const v1::ParamStep& p : opt.params()) {
    if (!p.decay_exempt() || p.group() < 0) continue;
    const double wd = opt.groups(p.group()).weight_decay();
    if (wd > 0) {
      decayed.push_back(p.name());
      decay = std::max(decay, wd);
    }
  }
  bool any_exempt = false;
  for (const v1::ParamStep& p : opt.params()) any_exempt |= p.decay_exempt();
  if (any_exempt) {
    Add(r, "optimizer.decay_on_excluded", !decayed.empty(), static_cast<double>(decayed.size()), 0,
        decayed.empty()
            ? "no parameter the configuration exempts from weight decay is decayed"
            : std::to_string(decayed.size()) +
                  " parameters the configuration exempts from weight decay sit in a group with "
                  "weight decay " +
                  Num(decay) + ": " + List(decayed) +
                  " (norm weights and biases decayed toward zero); put them in the group "
                  "without decay");
  }
  // The learning rate the schedule gives.
  for (int g = 0; g < opt.groups_size(); ++g) {
    const v1::ParamGroup& pg = opt.groups(g);
    if (!pg.has_scheduled_lr()) continue;
    const double e =
        std::abs(pg.lr() - pg.scheduled_lr()) / std::max(std::abs(pg.scheduled_lr()), 1e-300);
    Add(r, "optimizer.lr_schedule", e > 1e-9, pg.lr(), pg.scheduled_lr(),
        "group " + std::to_string(g) + " stepped with lr " + FormatSignificant(pg.lr(), 9) +
            (e > 1e-9 ? ", not the schedule's " : ", the schedule's ") +
            FormatSignificant(pg.scheduled_lr(), 9));
  }
  // Clipping: the gradients the optimizer got must be within the threshold.
  double global_sq = 0;
  for (const v1::ParamStep& p : opt.params()) global_sq += p.grad_norm() * p.grad_norm();
  const double global = std::sqrt(global_sq);
  if (opt.clip_max_norm() > 0 && std::isfinite(global)) {
    const bool over = global > opt.clip_max_norm() * (1 + 1e-3);
    Add(r, "optimizer.clip_applied", over, global, opt.clip_max_norm(),
        "the optimizer got gradients of global norm " + Num(global) +
            (over ? ", above the clip threshold " : " within the clip threshold ") +
            Num(opt.clip_max_norm()) +
            (over ? ": clipping did not apply (or ran before the gradients were unscaled)" : ""));
  }

  // The clip against the loss scale: the norm it saw, against the FP64 reference's unscaled
  // gradient norm. Scale times it means the clip ran on scaled gradients.
  const double scale = opt.loss_scale();
  const double seen = opt.grad_norm_before_clip();
  if (opt.clip_max_norm() > 0 && scale > 1 && std::isfinite(seen) &&
      std::isfinite(reference_grad_norm) && reference_grad_norm > 0) {
    const double ratio = seen / reference_grad_norm;
    const bool scaled = std::abs(ratio / scale - 1) <= kClipNormRelTol;
    const bool unscaled = std::abs(ratio - 1) <= kClipNormRelTol;
    Add(r, "optimizer.clip_before_unscale", scaled, ratio, scale,
        "the clip saw a gradient norm of " + Num(seen) + ", " + Num(ratio) +
            " times the FP64 reference's " + Num(reference_grad_norm) +
            (scaled ? ": the loss scale " + Num(scale) +
                          " times it; the gradients were clipped before they were unscaled, so the "
                          "step got gradients " +
                          Num(scale) + " times smaller than the threshold allows"
             : unscaled
                 ? " (the unscaled norm, as it should be)"
                 : " (neither the unscaled norm nor the loss scale " + Num(scale) + " times it)"));
  }

  // The update itself, redone in FP64 from the recorded state.
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
    const v1::ParamGroup& g = opt.groups(p.group());
    if (g.amsgrad()) {
      why_not = "amsgrad's maximum is not recorded";
      break;
    }
    const at::Tensor before = Load(c, p.name());
    const at::Tensor grad = Load(c, p.grad());
    const at::Tensor after = Load(c, p.param_after());
    if (!before.defined() || !grad.defined() || !after.defined()) {
      why_not = "the parameters before the step or the state tensors are not embedded";
      break;
    }
    at::Tensor m0 = Load(c, p.exp_avg());
    at::Tensor v0 = Load(c, p.exp_avg_sq());
    if (!m0.defined()) m0 = at::zeros_like(before);
    if (!v0.defined()) v0 = at::zeros_like(before);
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
    const at::Tensor m_after = Load(c, p.exp_avg_after());
    const at::Tensor v_after = Load(c, p.exp_avg_sq_after());
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
  const char* kind = opt.kind() == v1::ADAMW ? "AdamW" : "Adam";
  if (why_not.empty() && compared > 0) {
    const bool bad = worst > 1;
    Add(r, "optimizer.update_matches", bad, worst, 1,
        std::string(bad ? "the trainer's step is not " : "the trainer's step equals ") +
            "a hand-written FP64 " + kind + " step from the recorded state on " +
            std::to_string(compared) + " parameters (worst: " + worst_what + " of " + worst_name +
            " at " + Num(worst) + " times the allowed error)" +
            (bad ? ": the optimizer did not apply the recorded hyper-parameters (lr, betas, eps, "
                   "weight decay, bias correction or step count)"
                 : ""));
  } else if (!why_not.empty()) {
    Add(r, "optimizer.update_matches", false, 0, 1, "not redone: " + why_not);
  }
  // Norms of the step, for people: global, and the layer that moved most relative to its size.
  double update_sq = 0, param_sq = 0;
  std::map<std::string, std::pair<double, double>> by_layer;  // layer -> (update^2, param^2)
  for (const v1::ParamStep& p : opt.params()) {
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
  Add(r, "optimizer.step_norms", false, std::sqrt(update_sq), 0,
      "gradient norm " + Num(global) + ", update norm " + Num(std::sqrt(update_sq)) +
          ", parameter norm " + Num(std::sqrt(param_sq)) + "; largest update/parameter ratio " +
          Num(top_ratio) + " at " + top);
  return r;
}

}  // namespace capsule::internal
