#include "capsule/replay/internal/classification_stage.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace capsule::internal {
namespace {

const v1::Objective* ObjectiveOf(const TriageInput& in) {
  return in.capsule != nullptr ? &in.capsule->objective() : nullptr;
}

// The declared ignore index (0 is read as -100, as for a language model's labels).
int64_t IgnoreIndex(const TriageInput& in) {
  const v1::Objective* o = ObjectiveOf(in);
  return o == nullptr || o->ignore_index() == 0 ? -100 : o->ignore_index();
}

double Smoothing(const TriageInput& in) {
  const v1::Objective* o = ObjectiveOf(in);
  return o == nullptr ? 0 : o->label_smoothing();
}

bool DeclaresSum(const TriageInput& in) {
  const v1::Objective* o = ObjectiveOf(in);
  return o != nullptr && o->reduction() == v1::TOKEN_SUM;
}

// Why the stages cannot judge this batch as a classifier's; empty when they can.
std::string Unsupported(const TriageInput& in) {
  const at::Tensor& labels = in.batch->labels;
  if (!labels.defined() || labels.dim() != 1 ||
      !at::isIntegralType(labels.scalar_type(), /*includeBool=*/false)) {
    return "the batch has no integer class labels [batch] (declared a classifier's batch)";
  }
  if (!in.logits.defined() || in.logits.dim() != 2) {
    return "the model has no logits [batch, classes] before its loss layer";
  }
  if (in.logits.size(0) != labels.size(0)) return "the logits' batch does not match the labels'";
  if (in.logits.size(1) < 2) return "a classifier of one class";
  return "";
}

// Per-sample FP64 cross-entropy of `logits` [B, C] against the labels.
struct Samples {
  at::Tensor loss;          // [B] FP64, 0 where there is no target
  at::Tensor valid;         // [B] a target inside [0, C)
  at::Tensor out_of_range;  // [B] a target outside [0, C) that is not the ignore index
  int64_t classes = 0;
  double count = 0;  // samples with a target
  double sum = 0;    // their losses' sum
};

Samples Score(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore,
              double smoothing) {
  Samples s;
  s.classes = logits.size(1);
  const at::Tensor l = labels.to(at::kLong);
  const at::Tensor has_target = l.ne(ignore);
  s.out_of_range = has_target.logical_and(l.lt(0).logical_or(l.ge(s.classes)));
  s.valid = has_target.logical_and(s.out_of_range.logical_not());
  const at::Tensor logp = at::log_softmax(logits.to(at::kDouble), -1);
  const at::Tensor targets = l.masked_fill(s.valid.logical_not(), 0).unsqueeze(-1);
  const at::Tensor nll = -logp.gather(1, targets).squeeze(1);
  const at::Tensor uniform = -logp.mean(1);
  // Masked with where(), not a product: a row of non-finite logits must not leak into the sums of
  // the samples without a target.
  s.loss = at::where(s.valid, (1 - smoothing) * nll + smoothing * uniform, at::zeros_like(nll));
  s.count = s.valid.sum().item<double>();
  s.sum = s.loss.sum().item<double>();
  return s;
}

double RelativeError(double a, double b) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-300});
}

void NonFiniteInputs(const TriageInput& in, v1::StageReport& r) {
  const at::Tensor& x = in.batch->inputs;
  const int64_t batch = in.batch->labels.size(0);
  if (batch == 0 || !x.defined() || !x.is_floating_point() || x.dim() == 0 || x.size(0) != batch) {
    return;
  }
  const at::Tensor bad = x.isfinite().logical_not().reshape({batch, -1}).sum(1);
  const int64_t per_sample = batch > 0 ? x.numel() / batch : 0;
  int64_t samples = 0;
  for (int64_t b = 0; b < batch; ++b) samples += bad[b].item<int64_t>() > 0 ? 1 : 0;
  int named = 0;
  for (int64_t b = 0; b < batch && named < kMaxSampleFindings; ++b) {
    const int64_t n = bad[b].item<int64_t>();
    if (n == 0) continue;
    ++named;
    v1::Finding& f = AddFinding(r, "data.non_finite_input", true, static_cast<double>(n), 0);
    NameSample(in, b, f);
    AddFact(f, "per_sample", static_cast<double>(per_sample));
    if (named == kMaxSampleFindings && samples > named) {
      AddFact(f, "in_all", static_cast<double>(samples));
    }
  }
}

void OutOfRange(const TriageInput& in, const Samples& s, v1::StageReport& r) {
  const at::Tensor& labels = in.batch->labels;
  const int64_t total = s.out_of_range.sum().item<int64_t>();
  int named = 0;
  for (int64_t b = 0; b < labels.size(0) && named < kMaxSampleFindings; ++b) {
    if (!s.out_of_range[b].item<bool>()) continue;
    ++named;
    const int64_t target = labels[b].item<int64_t>();
    v1::Finding& f = AddFinding(r, "data.label_out_of_range", true, static_cast<double>(target), 0);
    NameSample(in, b, f);
    AddFact(f, "classes", static_cast<double>(s.classes));
    AddFact(f, "ignore_index", static_cast<double>(IgnoreIndex(in)));
    if (named == kMaxSampleFindings && total > named) {
      AddFact(f, "in_all", static_cast<double>(total));
    }
  }
}

void ConstantTargets(const TriageInput& in, const Samples& s, v1::StageReport& r) {
  if (s.count < 2) return;
  const at::Tensor targets = in.batch->labels.to(at::kLong).masked_select(s.valid);
  const int64_t first = targets[0].item<int64_t>();
  if (!targets.eq(first).all().item<bool>()) return;
  const double chance = std::pow(1.0 / static_cast<double>(s.classes), s.count - 1);
  v1::Finding& f = AddFinding(r, "data.constant_targets", false, s.count, 2);
  AddFact(f, "class", static_cast<double>(first));
  AddFact(f, "classes", static_cast<double>(s.classes));
  AddFact(f, "chance", chance);
}

// What the loss may have computed instead of the declared cross-entropy, on the same logits: the
// checks and the values they would give, and the label smoothing of the other one.
struct Variants {
  std::vector<std::pair<const char*, double>> values;
  double other_smoothing = 0;
};

Variants VariantsOf(const TriageInput& in, const at::Tensor& logits, const Samples& s) {
  Variants out;
  const bool sum = DeclaresSum(in);
  const double batch = static_cast<double>(in.batch->labels.size(0));
  if (!sum) {
    out.values.emplace_back("objective.reduction_sum", s.sum);
  } else {
    out.values.emplace_back("objective.reduction_token_mean", s.sum / s.count);
  }
  out.other_smoothing = Smoothing(in) > 0 ? 0 : 0.1;
  const Samples o = Score(logits, in.batch->labels, IgnoreIndex(in), out.other_smoothing);
  out.values.emplace_back("objective.label_smoothing", sum ? o.sum : o.sum / o.count);
  if (s.count < batch && !sum) {
    out.values.emplace_back("objective.masked_positions_counted", s.sum / batch);
  }
  return out;
}

// The facts every loss finding of a classifier states: whose loss, what it was held to.
void LossFacts(const TriageInput& in, const std::string& who, double loss, const Samples& s,
               v1::Finding& f) {
  AddFact(f, "who", who);
  AddFact(f, "loss", loss);
  AddFact(f, "sum", DeclaresSum(in) ? 1.0 : 0.0);
  AddFact(f, "samples", s.count);
  AddFact(f, "batch", static_cast<double>(in.batch->labels.size(0)));
  AddFact(f, "classes", static_cast<double>(s.classes));
  AddFact(f, "smoothing", Smoothing(in));
  AddFact(f, "ignore_index", static_cast<double>(IgnoreIndex(in)));
}

// `who`'s loss against the declared FP64 cross-entropy of `logits`, as `check`; on a mismatch,
// the variant it equals.
void JudgeLoss(const TriageInput& in, const char* check, const std::string& who, double loss,
               const at::Tensor& logits, double tol, v1::StageReport& r) {
  const Samples s = Score(logits, in.batch->labels, IgnoreIndex(in), Smoothing(in));
  if (s.count == 0) return;
  const double hand = DeclaresSum(in) ? s.sum : s.sum / s.count;
  const double err = RelativeError(loss, hand);
  const bool matches = err <= tol;
  v1::Finding& judged = AddFinding(r, check, !matches, err, tol);
  LossFacts(in, who, loss, s, judged);
  AddFact(judged, "hand", hand);
  if (matches) return;
  bool named = false;
  const Variants variants = VariantsOf(in, logits, s);
  for (const auto& [variant, value] : variants.values) {
    const double e = RelativeError(loss, value);
    if (e > tol) continue;
    v1::Finding& f = AddFinding(r, variant, true, e, tol);
    LossFacts(in, who, loss, s, f);
    AddFact(f, "equals", value);
    AddFact(f, "smoothing_used", variants.other_smoothing);
    named = true;
  }
  if (!named)
    LossFacts(in, who, loss, s, AddFinding(r, "objective.unexplained", true, loss / hand, 1));
}

std::optional<double> TrainerLoss(const TriageInput& in) {
  if (in.capsule == nullptr) return std::nullopt;
  std::optional<double> out;
  for (const auto& h : in.capsule->step().history()) {
    if (h.step() == in.capsule->step().global_step() && h.has_loss()) out = h.loss();
  }
  return out;
}

}  // namespace

bool IsClassificationBatch(const TriageInput& in) {
  if (in.batch == nullptr) return false;
  const v1::Objective* o = ObjectiveOf(in);
  const v1::ObjectiveKind kind = o != nullptr ? o->kind() : v1::OBJECTIVE_KIND_UNSPECIFIED;
  if (kind != v1::OBJECTIVE_KIND_UNSPECIFIED) return kind == v1::CLASSIFICATION;
  const at::Tensor& labels = in.batch->labels;
  return labels.defined() && labels.dim() == 1 && in.logits.defined() && in.logits.dim() == 2;
}

namespace {

void JudgeData(const TriageInput& in, v1::StageReport& r) {
  NonFiniteInputs(in, r);
  const Samples s = Score(in.logits, in.batch->labels, IgnoreIndex(in), Smoothing(in));
  OutOfRange(in, s, r);
  const int64_t batch = in.batch->labels.size(0);
  if (s.count == 0 && s.out_of_range.sum().item<int64_t>() == 0) {
    v1::Finding& f = AddFinding(r, "data.empty_batch", true, 0, 1);
    AddFact(f, "batch", static_cast<double>(batch));
    AddFact(f, "ignore_index", static_cast<double>(IgnoreIndex(in)));
  }
  ConstantTargets(in, s, r);
  if (s.count > 0) {
    const int64_t worst =
        at::where(s.valid, s.loss, at::full_like(s.loss, -INFINITY)).argmax().item<int64_t>();
    v1::Finding& f = AddFinding(r, "data.per_sample_loss", false, s.loss[worst].item<double>(),
                                std::log(static_cast<double>(s.classes)));
    NameSample(in, worst, f);
    AddFact(f, "samples", static_cast<double>(batch));
    AddFact(f, "with_target", s.count);
    AddFact(f, "classes", static_cast<double>(s.classes));
    AddFact(f, "mean", s.sum / s.count);
  }
}

void JudgeObjective(const TriageInput& in, v1::StageReport& r) {
  const Samples s = Score(in.logits, in.batch->labels, IgnoreIndex(in), Smoothing(in));
  if (s.count == 0) {
    r.set_skipped_reason("the batch has no sample with a target");
    r.set_ran(false);
    return;
  }
  if (!std::isfinite(s.sum)) {
    r.set_skipped_reason(
        "the reference path's logits are not finite at the targets: the loss cannot be judged");
    r.set_ran(false);
    return;
  }
  JudgeLoss(in, "objective.loss_matches", "the model's loss", in.model_loss, in.logits,
            kLossMatchRelTol, r);
  // The trainer's loss was computed on the step in its own mode (BatchNorm's batch statistics in
  // training), so it is held to the reference path's logits in that mode.
  const std::optional<double> trainer = TrainerLoss(in);
  if (trainer && std::isfinite(*trainer)) {
    const bool same_shape = in.step_logits.defined() && in.step_logits.sizes() == in.logits.sizes();
    JudgeLoss(in, "objective.trainer_loss_matches", "the trainer's loss for the step", *trainer,
              same_shape ? in.step_logits : in.logits, kClassificationTrainerLossRelTol, r);
  }
}

}  // namespace

v1::StageReport RunClassificationDataStage(const TriageInput& in) {
  v1::StageReport r;
  if (StartStage(v1::STAGE_DATA, Unsupported(in), &r)) JudgeData(in, r);
  RenderDetails(&r);
  return r;
}

v1::StageReport RunClassificationObjectiveStage(const TriageInput& in) {
  v1::StageReport r;
  if (StartStage(v1::STAGE_OBJECTIVE, Unsupported(in), &r)) JudgeObjective(in, r);
  RenderDetails(&r);
  return r;
}

}  // namespace capsule::internal
