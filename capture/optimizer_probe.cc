#include "capsule/capture/optimizer_probe.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/string_utils.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <map>
#include <tuple>

#include "capsule/probe/tensor_codec.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {

struct OptimizerProbe::Before {
  struct Param {
    std::string name;
    at::Tensor tensor;  // the trainer's parameter
    int group = -1;
    bool requires_grad = true;
    bool exempt = false;
    int64_t step = 0;
    at::Tensor value, grad, exp_avg, exp_avg_sq;  // copies, before the step
  };
  OptimizerStepInfo info;
  v1::OptimizerKind kind = v1::OTHER_OPTIMIZER;
  std::vector<v1::ParamGroup> groups;
  std::vector<Param> params;
  bool record_tensors = false;
};

namespace {

at::Tensor Copy(const at::Tensor& t) { return t.defined() ? t.detach().clone() : t; }

double Norm(const at::Tensor& t) {
  if (!t.defined()) return 0;
  return t.detach().to(at::kDouble).pow(2).sum().sqrt().item<double>();
}

// The Adam-family state of `p`, if the optimizer holds one: step, exp_avg, exp_avg_sq.
struct AdamState {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq;
};

AdamState StateOf(torch::optim::Optimizer& opt, v1::OptimizerKind kind, const at::Tensor& p) {
  AdamState s;
  auto& states = opt.state();
  auto it = states.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
  if (it == states.end() || !it->second) return s;
  if (kind == v1::ADAMW) {
    auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
    s = {st.step(), st.exp_avg(), st.exp_avg_sq()};
  } else if (kind == v1::ADAM) {
    auto& st = static_cast<torch::optim::AdamParamState&>(*it->second);
    s = {st.step(), st.exp_avg(), st.exp_avg_sq()};
  }
  return s;
}

// AdamOptions and AdamWOptions have the same fields but no common base.
template <typename Options>
void FillAdamGroup(const Options& o, v1::ParamGroup* pg) {
  pg->set_beta1(std::get<0>(o.betas()));
  pg->set_beta2(std::get<1>(o.betas()));
  pg->set_eps(o.eps());
  pg->set_weight_decay(o.weight_decay());
  pg->set_amsgrad(o.amsgrad());
}

Status Embed(const std::string& name, const at::Tensor& t, v1::Capsule& c) {
  v1::TensorBlob blob;
  CAPSULE_RETURN_IF_ERROR(TensorToBlob(name, t.detach(), &blob));
  blob.set_role(v1::OTHER);
  *c.add_tensors() = std::move(blob);
  return Status::Ok();
}

}  // namespace

OptimizerProbe::OptimizerProbe(Monitor& monitor, torch::optim::Optimizer& optimizer,
                               std::vector<NamedTensor> named, OptimizerProbeOptions options)
    : monitor_(monitor),
      optimizer_(optimizer),
      named_(std::move(named)),
      options_(std::move(options)) {
  monitor_.SetOptimizerProbe(this);
}

OptimizerProbe::~OptimizerProbe() {
  monitor_.SetOptimizerProbe(nullptr);
  monitor_.Flush();  // a capsule still waiting is written without the step
}

void OptimizerProbe::BeforeStep(const OptimizerStepInfo& info) {
  before_.reset();
  if (monitor_.PendingCapsules().empty()) return;  // the armed cost: this branch
  try {
    auto b = std::make_unique<Before>();
    b->info = info;
    const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer_) != nullptr;
    const bool adam = dynamic_cast<torch::optim::Adam*>(&optimizer_) != nullptr;
    b->kind = adamw ? v1::ADAMW : adam ? v1::ADAM : v1::OTHER_OPTIMIZER;
    std::map<const c10::TensorImpl*, int> group_of;
    const auto& groups = optimizer_.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      v1::ParamGroup pg;
      const auto& o = groups[g].options();
      pg.set_lr(o.get_lr());
      if (adamw) {
        FillAdamGroup(static_cast<const torch::optim::AdamWOptions&>(o), &pg);
      } else if (adam) {
        FillAdamGroup(static_cast<const torch::optim::AdamOptions&>(o), &pg);
      }
      if (g < info.scheduled_lr.size() && info.scheduled_lr[g]) {
        pg.set_scheduled_lr(*info.scheduled_lr[g]);
      }
      b->groups.push_back(pg);
      for (const at::Tensor& p : groups[g].params()) {
        group_of[p.unsafeGetTensorImpl()] = static_cast<int>(g);
      }
    }
    uint64_t bytes = 0;
    for (const NamedTensor& n : named_) {
      bytes += 7 * static_cast<uint64_t>(n.second.numel()) * n.second.element_size();
    }
    b->record_tensors = bytes <= options_.max_state_bytes;
    for (const NamedTensor& n : named_) {
      Before::Param p;
      p.name = n.first;
      p.tensor = n.second;
      auto it = group_of.find(n.second.unsafeGetTensorImpl());
      p.group = it == group_of.end() ? -1 : it->second;
      p.requires_grad = n.second.requires_grad();
      p.exempt = options_.decay_exempt && options_.decay_exempt(n.first, n.second);
      const AdamState s = StateOf(optimizer_, b->kind, n.second);
      p.step = s.step;
      // Copies: step() updates these in place. Parameters are copied even when tensors are not
      // recorded, for the update norm.
      p.value = Copy(n.second);
      p.grad = Copy(n.second.grad());
      if (b->record_tensors) {
        p.exp_avg = Copy(s.exp_avg);
        p.exp_avg_sq = Copy(s.exp_avg_sq);
      }
      b->params.push_back(std::move(p));
    }
    before_ = std::move(b);
  } catch (const std::exception& e) {
    monitor_.Log(std::string("capsule: optimizer state not recorded: ") + e.what());
    before_.reset();
  }
}

StepReport OptimizerProbe::AfterStep() {
  const std::vector<v1::Capsule*> pending = monitor_.PendingCapsules();
  if (pending.empty()) return {};
  for (v1::Capsule* c : pending) RecordStep(c);
  before_.reset();
  return monitor_.Flush();
}

void OptimizerProbe::RecordStep(v1::Capsule* c) {
  if (!before_) {
    c->add_capture_notes(
        "optimizer: BeforeStep was not called (or failed) before the step; the step is not "
        "recorded");
    return;
  }
  try {
    v1::OptimizerStep& out = *c->mutable_optimizer();
    const Before& b = *before_;
    out.set_kind(b.kind);
    for (const v1::ParamGroup& g : b.groups) *out.add_groups() = g;
    for (const std::string& s : b.info.order) out.add_order(s);
    out.set_clip_max_norm(b.info.clip_max_norm);
    out.set_grad_norm_before_clip(b.info.grad_norm_before_clip ? *b.info.grad_norm_before_clip
                                                               : std::nan(""));
    out.set_loss_scale(b.info.loss_scale);
    out.set_found_inf(b.info.found_inf);
    if (!b.record_tensors) {
      c->add_capture_notes("optimizer: state tensors are over max_state_bytes (" +
                           std::to_string(options_.max_state_bytes) +
                           " bytes); only scalars and norms are recorded");
    }
    for (const Before::Param& p : b.params) {
      v1::ParamStep& ps = *out.add_params();
      ps.set_name(p.name);
      ps.set_group(p.group);
      ps.set_requires_grad(p.requires_grad);
      ps.set_decay_exempt(p.exempt);
      ps.set_step_before(p.step);
      ps.set_grad_norm(p.grad.defined() ? Norm(p.grad) : 0.0);
      ps.set_param_norm(Norm(p.value));
      const at::Tensor after = p.tensor.detach();
      ps.set_update_norm(Norm(after.to(at::kDouble) - p.value.to(at::kDouble)));
      if (!b.record_tensors) continue;
      const std::string prefix = "optimizer/" + p.name + "/";
      auto record = [&](const char* what, const at::Tensor& t, std::string* field) -> Status {
        if (!t.defined()) return Status::Ok();
        CAPSULE_RETURN_IF_ERROR(Embed(prefix + what, t, *c));
        *field = prefix + what;
        return Status::Ok();
      };
      const AdamState s = StateOf(optimizer_, b.kind, p.tensor);
      Status st = record("grad", p.grad, ps.mutable_grad());
      if (st.ok()) st = record("exp_avg", p.exp_avg, ps.mutable_exp_avg());
      if (st.ok()) st = record("exp_avg_sq", p.exp_avg_sq, ps.mutable_exp_avg_sq());
      if (st.ok()) st = record("param_after", after, ps.mutable_param_after());
      if (st.ok()) st = record("exp_avg_after", s.exp_avg, ps.mutable_exp_avg_after());
      if (st.ok()) st = record("exp_avg_sq_after", s.exp_avg_sq, ps.mutable_exp_avg_sq_after());
      if (!st.ok()) c->add_capture_notes("optimizer: " + p.name + ": " + st.message());
    }
    out.set_observed_after(true);
  } catch (const c10::Error& e) {
    c->add_capture_notes(std::string("optimizer: step not recorded: ") +
                         e.what_without_backtrace());
  } catch (const std::exception& e) {
    c->add_capture_notes(std::string("optimizer: step not recorded: ") + e.what());
  }
}

}  // namespace capsule
