#include "capsule/replay/internal/classification_stage.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "capsule/base/printable.h"
#include "capsule/base/strings.h"

namespace capsule::internal {
namespace {

std::string Num(double v) { return FormatSignificant(v, 4); }

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
    v1::Finding& f = AddFinding(r, "data.non_finite_input", true, static_cast<double>(n), 0, "");
    f.set_detail(NameSample(in, b, f) + " has " + std::to_string(n) +
                 " non-finite input values (of " + std::to_string(per_sample) +
                 "): a corrupt sample or a broken transform (a division by a zero standard "
                 "deviation, a decode that failed)" +
                 (named == kMaxSampleFindings && samples > named
                      ? "; " + std::to_string(samples) + " samples have them in all"
                      : ""));
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
    v1::Finding& f =
        AddFinding(r, "data.label_out_of_range", true, static_cast<double>(target), 0, "");
    f.set_detail(NameSample(in, b, f) + " has target class " + std::to_string(target) +
                 ", outside the model's " + std::to_string(s.classes) + " classes [0, " +
                 std::to_string(s.classes) + ") and not the ignore index " +
                 std::to_string(IgnoreIndex(in)) +
                 ": a label map or class count that does not match the model's head" +
                 (named == kMaxSampleFindings && total > named
                      ? "; " + std::to_string(total) + " samples have one in all"
                      : ""));
  }
}

void ConstantTargets(const TriageInput& in, const Samples& s, v1::StageReport& r) {
  if (s.count < 2) return;
  const at::Tensor targets = in.batch->labels.to(at::kLong).masked_select(s.valid);
  const int64_t first = targets[0].item<int64_t>();
  if (!targets.eq(first).all().item<bool>()) return;
  const double chance = std::pow(1.0 / static_cast<double>(s.classes), s.count - 1);
  AddFinding(r, "data.constant_targets", false, s.count, 2,
             "every one of the " + Num(s.count) + " samples with a target is class " +
                 std::to_string(first) + " of " + std::to_string(s.classes) +
                 " (with uniform classes, a chance of " + Num(chance) +
                 "): a sampler that does not shuffle, or a label column read wrong");
}

// What the loss may have computed instead of the declared cross-entropy, on the same logits.
struct Variant {
  const char* check;
  double value;
  std::string why;
};

std::vector<Variant> VariantsOf(const TriageInput& in, const at::Tensor& logits, const Samples& s) {
  std::vector<Variant> out;
  const bool sum = DeclaresSum(in);
  const double batch = static_cast<double>(in.batch->labels.size(0));
  if (!sum) {
    out.push_back({"objective.reduction_sum", s.sum,
                   "the loss is the sum over the samples, not their mean (not divided by the " +
                       Num(s.count) + " samples)"});
  } else {
    out.push_back({"objective.reduction_token_mean", s.sum / s.count,
                   "the loss is the mean over the samples, not the declared sum"});
  }
  const double declared = Smoothing(in);
  const double other = declared > 0 ? 0 : 0.1;
  const Samples o = Score(logits, in.batch->labels, IgnoreIndex(in), other);
  out.push_back(
      {"objective.label_smoothing", sum ? o.sum : o.sum / o.count,
       "the loss has label smoothing " + Num(other) + ", not the declared " + Num(declared)});
  if (s.count < batch && !sum) {
    out.push_back({"objective.masked_positions_counted", s.sum / batch,
                   "the mean divides by every sample (" + Num(batch) +
                       "), ignored ones included, "
                       "not by the " +
                       Num(s.count) + " samples with a target"});
  }
  return out;
}

// `who`'s loss against the declared FP64 cross-entropy of `logits`, as `check`; on a mismatch,
// the variant it equals.
void JudgeLoss(const TriageInput& in, const char* check, const std::string& who, double loss,
               const at::Tensor& logits, double tol, v1::StageReport& r) {
  const Samples s = Score(logits, in.batch->labels, IgnoreIndex(in), Smoothing(in));
  if (s.count == 0) return;
  const bool sum = DeclaresSum(in);
  const double hand = sum ? s.sum : s.sum / s.count;
  const double err = RelativeError(loss, hand);
  const bool matches = err <= tol;
  AddFinding(r, check, !matches, err, tol,
             who + " " + FormatSignificant(loss, 9) + (matches ? " equals" : " differs from") +
                 " a hand-written FP64 cross-entropy " + (sum ? "sum " : "mean ") +
                 FormatSignificant(hand, 9) + " over " + Num(s.count) + " samples of " +
                 std::to_string(s.classes) + " classes (label smoothing " + Num(Smoothing(in)) +
                 ", ignore index " + std::to_string(IgnoreIndex(in)) + "; relative error " +
                 FormatSignificant(err, 3) + ")");
  if (matches) return;
  bool named = false;
  for (const Variant& v : VariantsOf(in, logits, s)) {
    const double e = RelativeError(loss, v.value);
    if (e > tol) continue;
    AddFinding(r, v.check, true, e, tol,
               v.why + ": " + who + " " + FormatSignificant(loss, 9) + " equals it (" +
                   FormatSignificant(v.value, 9) + ")");
    named = true;
  }
  if (!named) {
    AddFinding(r, "objective.unexplained", true, loss / hand, 1,
               who + " is " + FormatSignificant(loss / hand, 6) +
                   " times the declared cross-entropy and matches none of: the other reduction, "
                   "the other label smoothing, ignored samples counted");
  }
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

v1::StageReport RunClassificationDataStage(const TriageInput& in) {
  v1::StageReport r;
  if (!StartStage(v1::STAGE_DATA, Unsupported(in), &r)) return r;
  NonFiniteInputs(in, r);
  const Samples s = Score(in.logits, in.batch->labels, IgnoreIndex(in), Smoothing(in));
  OutOfRange(in, s, r);
  const int64_t batch = in.batch->labels.size(0);
  if (s.count == 0 && s.out_of_range.sum().item<int64_t>() == 0) {
    AddFinding(r, "data.empty_batch", true, 0, 1,
               batch == 0 ? std::string("the batch has no sample")
                          : "none of the " + std::to_string(batch) +
                                " samples has a target: every label is the ignore index " +
                                std::to_string(IgnoreIndex(in)) + " (a mean over them is 0/0)");
  }
  ConstantTargets(in, s, r);
  if (s.count > 0) {
    const int64_t worst =
        at::where(s.valid, s.loss, at::full_like(s.loss, -INFINITY)).argmax().item<int64_t>();
    v1::Finding& f = AddFinding(r, "data.per_sample_loss", false, s.loss[worst].item<double>(),
                                std::log(static_cast<double>(s.classes)), "");
    f.set_detail(std::to_string(batch) + " samples, " + Num(s.count) + " with a target, " +
                 std::to_string(s.classes) + " classes; mean cross-entropy " +
                 Num(s.sum / s.count) + ", the largest " + Num(s.loss[worst].item<double>()) +
                 " (" + NameSample(in, worst, f) +
                 "); log C = " + Num(std::log(static_cast<double>(s.classes))));
  }
  return r;
}

v1::StageReport RunClassificationObjectiveStage(const TriageInput& in) {
  v1::StageReport r;
  if (!StartStage(v1::STAGE_OBJECTIVE, Unsupported(in), &r)) return r;
  const Samples s = Score(in.logits, in.batch->labels, IgnoreIndex(in), Smoothing(in));
  if (s.count == 0) {
    r.set_skipped_reason("the batch has no sample with a target");
    r.set_ran(false);
    return r;
  }
  if (!std::isfinite(s.sum)) {
    r.set_skipped_reason(
        "the reference path's logits are not finite at the targets: the loss cannot be judged");
    r.set_ran(false);
    return r;
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
  return r;
}

}  // namespace capsule::internal
