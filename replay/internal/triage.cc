#include "capsule/replay/internal/triage.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "capsule/base/printable.h"
#include "capsule/base/strings.h"
#include "capsule/replay/internal/classification_stage.h"

namespace capsule::internal {
namespace {

std::string Num(double v) { return FormatSignificant(v, 4); }

// Why the stages cannot judge this batch; empty when they can.
std::string Unsupported(const TriageInput& in) {
  const LayerBatch& b = *in.batch;
  if (!b.labels.defined() || b.labels.dim() != 2 || b.labels.scalar_type() != at::kLong) {
    return "the batch has no token labels [batch, seq] (not a language model's batch)";
  }
  if (!in.logits.defined() || in.logits.dim() != 3) {
    return "the model has no logits [batch, seq, vocab] before its loss layer";
  }
  if (in.logits.size(0) != b.labels.size(0) || in.logits.size(1) != b.labels.size(1)) {
    return "the logits' shape does not match the labels'";
  }
  if (in.logits.size(2) < 2 || b.labels.size(1) < 2) return "a vocabulary or sequence of one";
  return "";
}

// Per-position FP64 cross-entropy with one label alignment: `shifted` means labels[i] is the
// target of position i, otherwise labels[i + 1] is.
struct Tokens {
  at::Tensor loss;      // [B, T'] FP64, 0 where there is no target
  at::Tensor unmasked;  // [B, T'] FP64, the same with the loss mask ignored
  at::Tensor valid;     // [B, T'] a target: label != -100, inside the vocabulary, loss mask set
  at::Tensor oov;       // [B, T'] a label outside [0, V) that is not -100
  at::Tensor any;       // [B, T'] label != -100, ignoring the loss mask
  at::Tensor padded;    // [B, T'] the predicting position is padding (attention_mask == 0)
  int64_t vocab = 0;
};

Tokens Align(const TriageInput& in, bool shifted) {
  const LayerBatch& b = *in.batch;
  at::Tensor scores = in.logits.to(at::kDouble);
  at::Tensor labels = b.labels;
  at::Tensor mask = b.loss_mask;
  at::Tensor attention = b.attention_mask;
  if (!shifted) {
    const int64_t t = scores.size(1);
    scores = scores.slice(1, 0, t - 1);
    labels = labels.slice(1, 1, t);
    if (mask.defined()) mask = mask.slice(1, 1, t);
    if (attention.defined()) attention = attention.slice(1, 0, t - 1);
  }
  Tokens out;
  out.padded = attention.defined() && attention.sizes() == labels.sizes()
                   ? attention.eq(0)
                   : at::zeros(labels.sizes(), labels.options().dtype(at::kBool));
  out.vocab = scores.size(2);
  const at::Tensor has_target = labels.ne(-100);
  out.oov = has_target.logical_and(labels.lt(0).logical_or(labels.ge(out.vocab)));
  out.any = has_target.logical_and(out.oov.logical_not());
  out.valid = mask.defined() ? out.any.logical_and(mask.ne(0)) : out.any;
  const at::Tensor targets = labels.masked_fill(out.any.logical_not(), 0).unsqueeze(-1);
  const at::Tensor all = -at::log_softmax(scores, -1).gather(-1, targets).squeeze(-1);
  out.loss = all * out.valid.to(at::kDouble);
  out.unmasked = all * out.any.to(at::kDouble);
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

v1::Finding& AddFinding(v1::StageReport& r, const std::string& check, bool failed, double value,
                        double threshold, std::string detail) {
  v1::Finding& f = *r.add_findings();
  f.set_check(check);
  f.set_failed(failed);
  f.set_value(value);
  f.set_threshold(threshold);
  f.set_detail(std::move(detail));
  if (failed) r.set_explains(true);
  return f;
}

// Names sample `b` in `f` and returns its name for a sentence.
std::string NameSample(const TriageInput& in, int64_t b, v1::Finding& f) {
  f.set_sample_index(static_cast<int32_t>(b));
  std::string name = "sample " + std::to_string(b);
  std::vector<std::string> parts;
  if (in.capsule != nullptr) {
    const v1::DataBatch& d = in.capsule->data();
    if (b < d.sequences_size() && !d.sequences(b).sample_id().empty()) {
      f.set_sample_id(d.sequences(b).sample_id());
      parts.push_back("id \"" + PrintableShort(d.sequences(b).sample_id(), 64) + "\"");
    }
    if (b < d.cursor().sample_indices_size()) {
      f.set_dataset_index(d.cursor().sample_indices(b));
      parts.push_back("dataset index " + std::to_string(d.cursor().sample_indices(b)));
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) name += (i == 0 ? " (" : ", ") + parts[i];
  return parts.empty() ? name : name + ")";
}

// A report for `stage`; false (and the reason recorded) when the batch cannot be judged.
bool StartStage(v1::Stage stage, const TriageInput& in, v1::StageReport* r) {
  r->set_stage(stage);
  const std::string why = Unsupported(in);
  r->set_skipped_reason(why);
  r->set_ran(why.empty());
  return why.empty();
}

}  // namespace

v1::StageReport RunDataStage(const TriageInput& in) {
  if (IsClassificationBatch(in)) return RunClassificationDataStage(in);
  v1::StageReport r;
  if (!StartStage(v1::STAGE_DATA, in, &r)) return r;
  Tokens t = Align(in, in.batch->labels_shifted);
  // The data stage judges the real tokens: targets predicted from padding are the objective's
  // business (objective.padding_in_loss).
  t.valid = t.valid.logical_and(t.padded.logical_not());
  t.loss = t.loss * t.valid.to(at::kDouble);
  const double log_v = std::log(static_cast<double>(t.vocab));
  const int64_t batch = t.loss.size(0);
  const at::Tensor high = t.valid.logical_and(t.loss.ge(log_v));
  std::vector<int64_t> n(batch), oov(batch);
  std::vector<double> mean(batch), frac(batch);
  int64_t total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    n[b] = t.valid[b].sum().item<int64_t>();
    oov[b] = t.oov[b].sum().item<int64_t>();
    mean[b] = n[b] > 0 ? t.loss[b].sum().item<double>() / static_cast<double>(n[b])
                       : std::numeric_limits<double>::quiet_NaN();
    frac[b] = n[b] > 0
                  ? static_cast<double>(high[b].sum().item<int64_t>()) / static_cast<double>(n[b])
                  : 0;
    total += n[b];
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (oov[b] == 0) continue;
    v1::Finding& f =
        AddFinding(r, "data.label_out_of_vocab", true, static_cast<double>(oov[b]), 0, "");
    f.set_detail(NameSample(in, b, f) + " has " + std::to_string(oov[b]) +
                 " labels outside the vocabulary of " + std::to_string(t.vocab) +
                 " (not -100): a tokenizer or vocabulary mismatch");
  }
  for (int64_t b = 0; total > 0 && b < batch; ++b) {
    if (n[b] != 0 || oov[b] != 0) continue;
    v1::Finding& f = AddFinding(r, "data.empty_sample", true, 0, 1, "");
    f.set_detail(NameSample(in, b, f) +
                 " has no target token: every label is -100 or masked (an empty or all-padding "
                 "sample; a per-sequence mean of it is 0/0)");
  }
  double worst_excess = -std::numeric_limits<double>::infinity();
  int64_t worst = -1;
  for (int64_t b = 0; b < batch; ++b) {
    if (n[b] == 0) continue;
    std::vector<double> others;
    for (int64_t o = 0; o < batch; ++o) {
      if (o != b && n[o] > 0) others.push_back(mean[o]);
    }
    if (others.empty()) continue;
    const double median = Median(others);
    const double excess = mean[b] - median;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = b;
    }
    if (excess < kBadSampleExcessNats) continue;
    const bool uniform = frac[b] >= kBadSampleUniformFraction;
    const bool learned = median <= kLearnedFractionOfLogV * log_v;
    const bool bad = uniform && learned;
    v1::Finding& f = AddFinding(r, bad ? "data.bad_sample" : "data.hard_sample", bad, frac[b],
                                kBadSampleUniformFraction, "");
    const std::string numbers = "mean token loss " + Num(mean[b]) + " over " +
                                std::to_string(n[b]) + " tokens against a median of " +
                                Num(median) + " for the other samples; " + Num(100 * frac[b]) +
                                "% of its tokens at or above log V = " + Num(log_v);
    f.set_detail(NameSample(in, b, f) + (bad ? " is bad data: " : " is a hard sample: ") + numbers +
                 (bad ? " (the model finds them no better than random, while it has learned the "
                        "rest: labels that look random, a corrupt or mismatched sample)"
                      : (learned ? " (high but consistent: most tokens are predicted better "
                                   "than random; a genuinely hard sample, not corrupt)"
                                 : " (the model has not learned the batch yet: "
                                   "cannot tell bad from hard)")));
  }
  if (worst >= 0) {
    v1::Finding& f =
        AddFinding(r, "data.per_sample_loss", false, worst_excess, kBadSampleExcessNats, "");
    f.set_detail(std::to_string(batch) + " samples, " + std::to_string(total) +
                 " target tokens; the largest excess over the other samples' median is " +
                 Num(worst_excess) + " nats (" + NameSample(in, worst, f) + ", " +
                 Num(100 * frac[worst]) + "% of its tokens at or above log V = " + Num(log_v) +
                 "); a bad sample needs " + Num(kBadSampleExcessNats) + " nats and " +
                 Num(100 * kBadSampleUniformFraction) + "%");
  }
  return r;
}

v1::StageReport RunObjectiveStage(const TriageInput& in) {
  if (IsClassificationBatch(in)) return RunClassificationObjectiveStage(in);
  v1::StageReport r;
  if (!StartStage(v1::STAGE_OBJECTIVE, in, &r)) return r;
  const bool shifted = in.batch->labels_shifted;
  const Tokens t = Align(in, shifted);
  const at::Tensor valid_loss = t.loss.masked_select(t.valid);
  if (!valid_loss.isfinite().all().item<bool>()) {
    r.set_skipped_reason(
        "the reference path's logits are not finite at the targets: the loss cannot be judged");
    r.set_ran(false);
    return r;
  }
  // Labels against the inputs: declared shifted, labels[i] is the token after input i, so it
  // rarely equals input i; declared unshifted, labels[i] is input i, so the token after it rarely
  // equals labels[i].
  const LayerBatch& b = *in.batch;
  if (b.input_ids.defined() && b.input_ids.sizes() == b.labels.sizes()) {
    const int64_t len = b.labels.size(1);
    const at::Tensor same = shifted ? b.labels.eq(b.input_ids)
                                    : b.labels.slice(1, 1, len).eq(b.input_ids.slice(1, 1, len));
    const at::Tensor with_target = shifted ? b.labels.ne(-100) : t.valid;
    const double n = with_target.sum().item<double>();
    if (n > 0) {
      const double fraction = same.logical_and(with_target).sum().item<double>() / n;
      const bool failed = fraction >= kLabelsEqualInputsFraction;
      AddFinding(r, "objective.labels_equal_inputs", failed, fraction, kLabelsEqualInputsFraction,
                 Num(100 * fraction) + "% of the targets equal " +
                     (shifted ? "the input at their own position" : "the input after them") +
                     (failed ? std::string(": the labels were not shifted by one (the model "
                                           "learns to copy its input), though the batch "
                                           "declares labels_shifted = ") +
                                   (shifted ? "true" : "false")
                             : std::string(" (a shifted copy would make it about 100%)")));
    }
  }
  // Padding that carries a target: the loss learns to predict from pad positions.
  if (b.attention_mask.defined()) {
    const double n_valid = t.valid.sum().item<double>();
    const double n_pad = t.valid.logical_and(t.padded).sum().item<double>();
    AddFinding(r, "objective.padding_in_loss", n_pad > 0, n_pad, 0,
               n_pad > 0 ? Num(n_pad) + " of the " + Num(n_valid) +
                               " target tokens are predicted from padding (attention_mask 0): "
                               "padding is counted in the loss; its labels should be -100 or "
                               "its loss mask 0"
                         : "no target token is predicted from padding");
  }
  const bool labels_explain = r.explains();
  const double numerator = t.loss.sum().item<double>();
  const double denominator = t.valid.sum().item<double>();
  if (denominator == 0) {
    r.set_skipped_reason("the batch has no target token");
    r.set_ran(false);
    return r;
  }
  // Per-sequence and per-micro-batch sums and counts.
  const at::Tensor seq_sum = t.loss.sum(1);
  const at::Tensor seq_n = t.valid.sum(1).to(at::kDouble);
  double seq_mean_sum = 0;
  int seq_count = 0;
  for (int64_t s = 0; s < seq_sum.size(0); ++s) {
    const double nb = seq_n[s].item<double>();
    if (nb == 0) continue;
    seq_mean_sum += seq_sum[s].item<double>() / nb;
    ++seq_count;
  }
  const double token_mean = numerator / denominator;
  const double sequence_mean = seq_count > 0 ? seq_mean_sum / seq_count : token_mean;
  const v1::Objective* declared_obj = in.capsule != nullptr ? &in.capsule->objective() : nullptr;
  const v1::LossReduction declared =
      declared_obj != nullptr ? declared_obj->reduction() : v1::LOSS_REDUCTION_UNSPECIFIED;
  const double hand = declared == v1::TOKEN_SUM       ? numerator
                      : declared == v1::SEQUENCE_MEAN ? sequence_mean
                                                      : token_mean;
  const std::string hand_name = declared == v1::TOKEN_SUM       ? "token-sum"
                                : declared == v1::SEQUENCE_MEAN ? "per-sequence-mean"
                                                                : "token-mean";
  const double model = in.model_loss;
  auto rel = [](double a, double b) {
    return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-300});
  };
  const double err = rel(model, hand);
  const bool matches = err <= kLossMatchRelTol;
  AddFinding(r, "objective.loss_matches", !matches, err, kLossMatchRelTol,
             "the model's loss " + FormatSignificant(model, 9) +
                 (matches ? " equals" : " differs from") + " a hand-written FP64 " + hand_name +
                 " cross-entropy " + FormatSignificant(hand, 9) + " (" +
                 FormatSignificant(numerator, 9) + " over " +
                 std::to_string(static_cast<int64_t>(denominator)) +
                 " target tokens; relative error " + FormatSignificant(err, 3) +
                 (declared == v1::LOSS_REDUCTION_UNSPECIFIED
                      ? "; the trainer declared no reduction, read as a token mean)"
                      : ")"));
  // The normaliser the trainer declares against the step's target tokens (on this rank alone:
  // a normaliser over ranks cannot be counted here).
  if (declared_obj != nullptr && declared_obj->normalizer() > 0 && declared_obj->ranks() <= 1 &&
      (declared == v1::TOKEN_MEAN || declared == v1::LOSS_REDUCTION_UNSPECIFIED)) {
    const double n = declared_obj->normalizer();
    const bool wrong = std::abs(n - denominator) > 0.5;
    AddFinding(r, "objective.normalizer", wrong, n, denominator,
               "the trainer divides by " + Num(n) + (wrong ? ", but" : ", and") + " the step has " +
                   std::to_string(static_cast<int64_t>(denominator)) + " target tokens" +
                   (wrong ? ": the normaliser counts something else (padding, a stale or "
                            "nominal batch size)"
                          : ""));
  }
  // An accumulated step: the trainer's loss over every micro-batch against the declared
  // reduction. It is computed in the trainer's precision, so the tolerance is FP32's; a mismatch
  // counts only when a known normalisation explains it (the numerics stage may explain the rest).
  if (in.capsule != nullptr && in.capsule->data().micro_batches() > 1 &&
      in.capsule->data().sequences_size() == seq_sum.size(0)) {
    std::optional<double> trainer;
    for (const auto& h : in.capsule->step().history()) {
      if (h.step() == in.capsule->step().global_step() && h.has_loss()) trainer = h.loss();
    }
    const int k = in.capsule->data().micro_batches();
    std::vector<double> mb_sum(k), mb_n(k);
    for (int64_t s = 0; s < seq_sum.size(0); ++s) {
      const int m = in.capsule->data().sequences(static_cast<int>(s)).micro_batch();
      mb_sum[m] += seq_sum[s].item<double>();
      mb_n[m] += seq_n[s].item<double>();
    }
    double mean_of_means = 0;
    for (int m = 0; m < k; ++m) mean_of_means += mb_n[m] > 0 ? mb_sum[m] / mb_n[m] / k : 0;
    if (trainer && std::isfinite(*trainer)) {
      const double e = rel(*trainer, hand);
      const bool ok = e <= kTrainerLossRelTol;
      const double e_means = rel(*trainer, mean_of_means);
      const bool means = !ok && e_means <= kTrainerLossRelTol;
      AddFinding(
          r, means ? "objective.accumulation_mean_of_means" : "objective.trainer_loss", means,
          means ? e_means : e, kTrainerLossRelTol,
          "the trainer's loss over " + std::to_string(k) + " micro-batches is " +
              FormatSignificant(*trainer, 9) +
              (ok      ? ", the declared " + hand_name + " " + FormatSignificant(hand, 9)
               : means ? ", the mean of the micro-batches' token means (" +
                             FormatSignificant(mean_of_means, 9) + "), not the step's token mean " +
                             FormatSignificant(hand, 9) +
                             ": each micro-batch was divided by the number of "
                             "micro-batches instead of the step's target tokens, so "
                             "tokens in short micro-batches weigh more"
                       : ", not the declared " + hand_name + " " + FormatSignificant(hand, 9) +
                             " (relative error " + FormatSignificant(e, 3) +
                             ") nor the mean of micro-batch means"));
    }
  }
  if (matches || labels_explain) return r;

  // What the model computed instead: the variants whose value it equals.
  struct Variant {
    const char* check;
    double value;
    std::string why;
  };
  std::vector<Variant> variants;
  if (declared != v1::TOKEN_SUM) {
    variants.push_back({"objective.reduction_sum", numerator,
                        "the loss is the token sum, not the declared " + hand_name +
                            " (it was not divided by the " +
                            std::to_string(static_cast<int64_t>(denominator)) + " target tokens)"});
  }
  if (declared != v1::SEQUENCE_MEAN && seq_count > 0) {
    variants.push_back({"objective.reduction_sequence_mean", sequence_mean,
                        "the loss is a mean of per-sequence means, not a token mean: long and "
                        "short samples weigh the same"});
  }
  if (declared == v1::TOKEN_SUM || declared == v1::SEQUENCE_MEAN) {
    variants.push_back({"objective.reduction_token_mean", token_mean,
                        "the loss is the token mean, not the declared " + hand_name});
  }
  {
    const Tokens other = Align(in, !shifted);
    const double d = other.valid.sum().item<double>();
    if (d > 0) {
      variants.push_back(
          {"objective.labels_alignment", other.loss.sum().item<double>() / d,
           std::string("the labels are aligned as if ") +
               (shifted ? "the model shifted them (labels[i+1] the target of position i)"
                        : "already shifted (labels[i] the target of position i)") +
               ", not as the batch declares: the model predicts the token it is given"});
    }
  }
  variants.push_back({"objective.masked_positions_counted",
                      numerator / static_cast<double>(t.valid.numel()),
                      "the denominator counts every position (" + std::to_string(t.valid.numel()) +
                          "), padding and ignored ones " + "included, not the " +
                          std::to_string(static_cast<int64_t>(denominator)) + " target tokens"});
  if (in.batch->loss_mask.defined()) {
    const double d = t.any.sum().item<double>();
    if (d > 0) {
      variants.push_back({"objective.loss_mask_ignored", t.unmasked.sum().item<double>() / d,
                          "the loss mask is ignored: masked positions (padding, prompt) are in "
                          "the loss"});
    }
  }
  bool named = false;
  for (const Variant& v : variants) {
    const double e = rel(model, v.value);
    if (e > kLossMatchRelTol) continue;
    AddFinding(r, v.check, true, e, kLossMatchRelTol,
               v.why + ": the model's loss " + FormatSignificant(model, 9) + " equals it (" +
                   FormatSignificant(v.value, 9) + ")");
    named = true;
  }
  if (!named) {
    AddFinding(r, "objective.unexplained", true, model / hand, 1,
               "the model's loss is " + FormatSignificant(model / hand, 6) +
                   " times the token-mean cross-entropy and matches none of: token sum, "
                   "per-sequence mean, the other label alignment, every position counted, the "
                   "loss mask ignored");
  }
  return r;
}

v1::StageReport RunGradientsStage(const TriageInput& in) {
  v1::StageReport r;
  r.set_stage(v1::STAGE_GRADIENTS);
  if (in.parameter_grads == nullptr || in.parameter_grads->empty()) {
    r.set_skipped_reason("no backward ran on the reference path, or no parameter requires grad");
    return r;
  }
  r.set_ran(true);
  // By layer, in execution order: the parameters without a gradient, and the gradient norm.
  std::vector<std::string> layers;
  std::vector<std::vector<std::string>> cut;
  std::vector<int> counts;
  std::vector<double> norms;
  for (const ParameterGrad& p : *in.parameter_grads) {
    size_t i = 0;
    while (i < layers.size() && layers[i] != p.layer) ++i;
    if (i == layers.size()) {
      layers.push_back(p.layer);
      cut.emplace_back();
      counts.push_back(0);
      norms.push_back(0);
    }
    ++counts[i];
    if (!p.grad.defined()) {
      cut[i].push_back(p.name + " (none)");
      continue;
    }
    const at::Tensor g = p.grad.detach().to(at::kDouble);
    const double sq = g.pow(2).sum().item<double>();
    if (sq == 0) cut[i].push_back(p.name + " (exactly zero)");
    norms[i] += sq;
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    if (cut[i].empty()) continue;
    std::string names;
    for (size_t k = 0; k < cut[i].size() && k < 4; ++k) names += (k ? ", " : "") + cut[i][k];
    if (cut[i].size() > 4) names += ", ...";
    AddFinding(r, "gradients.disconnected", true, static_cast<double>(cut[i].size()), 0,
               "layer " + layers[i] + ": " + std::to_string(cut[i].size()) + " of " +
                   std::to_string(counts[i]) +
                   " parameters that require grad get no gradient from the loss (" + names +
                   "): a stray detach() or a branch left out of the graph; the optimizer never "
                   "updates them");
  }
  std::vector<size_t> order(layers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return norms[a] > norms[b]; });
  std::string ranked;
  for (size_t k = 0; k < order.size() && k < 3; ++k) {
    ranked += (k ? ", " : "") + layers[order[k]] + " " + Num(std::sqrt(norms[order[k]]));
  }
  AddFinding(r, "gradients.per_layer_norm", false, order.empty() ? 0 : std::sqrt(norms[order[0]]),
             0, "largest per-layer gradient norms (FP64 reference): " + ranked);
  return r;
}

}  // namespace capsule::internal
