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

#include "capsule/proto/capsule.pb.h"
#include "capsule/snapshot/internal/tensor_codec.h"

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
  std::string optimizer_class, not_captured;
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

// AdamOptions and AdamWOptions have the same fields but no common base.
template <typename Options>
void FillAdamGroup(const Options& o, OptimizerGroupState* g) {
  g->beta1 = std::get<0>(o.betas());
  g->beta2 = std::get<1>(o.betas());
  g->eps = o.eps();
  g->weight_decay = o.weight_decay();
  g->amsgrad = o.amsgrad();
}

// A torch::optim optimizer's state for `named`, matched to its tensors by identity.
OptimizerState ReadTorchOptim(torch::optim::Optimizer& opt, const std::vector<NamedTensor>& named) {
  OptimizerState s;
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&opt) != nullptr;
  const bool adam = dynamic_cast<torch::optim::Adam*>(&opt) != nullptr;
  s.kind = adamw  ? OptimizerState::Kind::kAdamW
           : adam ? OptimizerState::Kind::kAdam
                  : OptimizerState::Kind::kOther;
  s.optimizer_class = adamw  ? "torch::optim::AdamW"
                      : adam ? "torch::optim::Adam"
                             : "torch::optim::Optimizer";
  if (!adamw && !adam) {
    s.not_captured =
        "a torch::optim::Optimizer other than AdamW and Adam is not captured: its groups' "
        "learning rates and the parameters after the step are recorded, which replay's optimizer "
        "stage does not redo";
  }
  std::map<const c10::TensorImpl*, int> group_of;
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    OptimizerGroupState pg;
    const auto& o = groups[g].options();
    pg.lr = o.get_lr();
    if (adamw) {
      FillAdamGroup(static_cast<const torch::optim::AdamWOptions&>(o), &pg);
    } else if (adam) {
      FillAdamGroup(static_cast<const torch::optim::AdamOptions&>(o), &pg);
    }
    s.groups.push_back(pg);
    for (const at::Tensor& p : groups[g].params()) {
      group_of[p.unsafeGetTensorImpl()] = static_cast<int>(g);
    }
  }
  auto& states = opt.state();
  for (const NamedTensor& n : named) {
    OptimizerParamState& ps = s.params[n.first];
    auto g = group_of.find(n.second.unsafeGetTensorImpl());
    ps.group = g == group_of.end() ? -1 : g->second;
    auto it = states.find(c10::guts::to_string(n.second.unsafeGetTensorImpl()));
    if (it == states.end() || !it->second) continue;
    if (adamw) {
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      std::tie(ps.step, ps.exp_avg, ps.exp_avg_sq) =
          std::tuple{st.step(), st.exp_avg(), st.exp_avg_sq()};
    } else if (adam) {
      auto& st = static_cast<torch::optim::AdamParamState&>(*it->second);
      std::tie(ps.step, ps.exp_avg, ps.exp_avg_sq) =
          std::tuple{st.step(), st.exp_avg(), st.exp_avg_sq()};
    }
  }
  return s;
}

v1::OptimizerKind KindOf(OptimizerState::Kind k) {
  switch (k) {
    case OptimizerState::Kind::kAdamW:
      return v1::ADAMW;
    case OptimizerState::Kind::kAdam:
      return v1::ADAM;
    case OptimizerState::Kind::kOther:
      break;
  }
  return v1::OTHER_OPTIMIZER;
}

v1::ParamGroup GroupProto(const OptimizerGroupState& g) {
  v1::ParamGroup pg;
  pg.set_lr(g.lr);
  pg.set_beta1(g.beta1);
  pg.set_beta2(g.beta2);
  pg.set_eps(g.eps);
  pg.set_weight_decay(g.weight_decay);
  pg.set_amsgrad(g.amsgrad);
  pg.set_maximize(g.maximize);
  return pg;
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
    : OptimizerProbe(
          monitor,
          [&optimizer](const std::vector<NamedTensor>& n) { return ReadTorchOptim(optimizer, n); },
          std::move(named), std::move(options)) {}

OptimizerProbe::OptimizerProbe(Monitor& monitor, OptimizerReader reader,
                               std::vector<NamedTensor> named, OptimizerProbeOptions options)
    : monitor_(monitor),
      reader_(std::move(reader)),
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
    const OptimizerState state = reader_(named_);
    b->kind = KindOf(state.kind);
    b->optimizer_class = state.optimizer_class;
    b->not_captured = state.not_captured;
    for (size_t g = 0; g < state.groups.size(); ++g) {
      v1::ParamGroup pg = GroupProto(state.groups[g]);
      if (g < info.scheduled_lr.size() && info.scheduled_lr[g]) {
        pg.set_scheduled_lr(*info.scheduled_lr[g]);
      }
      b->groups.push_back(pg);
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
      auto it = state.params.find(n.first);
      const OptimizerParamState s = it == state.params.end() ? OptimizerParamState{} : it->second;
      p.group = s.group >= 0 && s.group < static_cast<int>(b->groups.size()) ? s.group : -1;
      p.requires_grad = n.second.requires_grad();
      p.exempt = options_.decay_exempt && options_.decay_exempt(n.first, n.second);
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
    out.set_optimizer_class(b.optimizer_class);
    if (!b.not_captured.empty()) c->add_capture_notes("optimizer: " + b.not_captured);
    const OptimizerState state = reader_(named_);
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
      auto found = state.params.find(p.name);
      const OptimizerParamState s =
          found == state.params.end() ? OptimizerParamState{} : found->second;
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
