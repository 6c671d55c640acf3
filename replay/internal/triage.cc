#include "capsule/replay/internal/triage.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capsule/replay/internal/classification_stage.h"
#include "capsule/replay/internal/findings.h"

namespace capsule::internal {
namespace {

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
  if (b.loss_mask.defined() && b.loss_mask.sizes() != b.labels.sizes()) {
    return "the loss mask's shape does not match the labels'";
  }
  return "";
}

// Per-position FP64 cross-entropy with one label alignment: `shifted` means labels[i] is the
// target of position i, otherwise labels[i + 1] is.
struct Tokens {
  at::Tensor loss;      // [B, T'] FP64, 0 where there is no target
  at::Tensor unmasked;  // [B, T'] FP64, the same with the loss mask ignored
  at::Tensor valid;     // [B, T'] a target: label != -100, inside the vocabulary, loss mask set
  at::Tensor oov;       // [B, T'] a label outside [0, V) that is not -100, loss mask set
  at::Tensor any;       // [B, T'] label != -100, ignoring the loss mask
  at::Tensor padded;    // [B, T'] the predicting position is padding (attention_mask == 0)
  at::Tensor prompt;    // [B, T'] the target is a prompt token (response_mask == 0); undefined
                        // when the batch declares no response mask
  int64_t vocab = 0;
};

Tokens Align(const TriageInput& in, bool shifted) {
  const LayerBatch& b = *in.batch;
  at::Tensor scores = in.logits.to(at::kDouble);
  at::Tensor labels = b.labels;
  at::Tensor mask = b.loss_mask;
  at::Tensor attention = b.attention_mask;
  at::Tensor response = b.response_mask;
  if (!shifted) {
    const int64_t t = scores.size(1);
    scores = scores.slice(1, 0, t - 1);
    labels = labels.slice(1, 1, t);
    if (mask.defined()) mask = mask.slice(1, 1, t);
    if (response.defined()) response = response.slice(1, 1, t);
    if (attention.defined()) attention = attention.slice(1, 0, t - 1);
  }
  Tokens out;
  out.padded = attention.defined() && attention.sizes() == labels.sizes()
                   ? attention.eq(0)
                   : at::zeros(labels.sizes(), labels.options().dtype(at::kBool));
  if (response.defined() && response.sizes() == labels.sizes()) out.prompt = response.eq(0);
  out.vocab = scores.size(2);
  const at::Tensor has_target = labels.ne(-100);
  const at::Tensor outside = has_target.logical_and(labels.lt(0).logical_or(labels.ge(out.vocab)));
  out.any = has_target.logical_and(outside.logical_not());
  // A filler label the loss mask leaves out is no target, whatever its value.
  out.oov = mask.defined() ? outside.logical_and(mask.ne(0)) : outside;
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

// Per-sample counts of the data stage over its real target tokens.
struct SampleStats {
  std::vector<int64_t> n, oov;     // target tokens; labels outside the vocabulary
  std::vector<double> mean, frac;  // mean token loss; fraction of tokens at or above log V
  int64_t total = 0;
  double log_v = 0;
};

SampleStats CountSamples(const Tokens& t) {
  SampleStats s;
  s.log_v = std::log(static_cast<double>(t.vocab));
  const int64_t batch = t.loss.size(0);
  const at::Tensor high = t.valid.logical_and(t.loss.ge(s.log_v));
  s.n.resize(batch);
  s.oov.resize(batch);
  s.mean.resize(batch);
  s.frac.resize(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = t.valid[b].sum().item<int64_t>();
    s.n[b] = n;
    s.oov[b] = t.oov[b].sum().item<int64_t>();
    s.mean[b] = n > 0 ? t.loss[b].sum().item<double>() / static_cast<double>(n)
                      : std::numeric_limits<double>::quiet_NaN();
    s.frac[b] =
        n > 0 ? static_cast<double>(high[b].sum().item<int64_t>()) / static_cast<double>(n) : 0;
    s.total += n;
  }
  return s;
}

void CheckOutOfVocab(const TriageInput& in, const SampleStats& s, int64_t vocab,
                     v1::StageReport& r) {
  for (size_t b = 0; b < s.oov.size(); ++b) {
    if (s.oov[b] == 0) continue;
    v1::Finding& f =
        AddFinding(r, "data.label_out_of_vocab", true, static_cast<double>(s.oov[b]), 0);
    NameSample(in, static_cast<int64_t>(b), f);
    AddFact(f, "vocab", static_cast<double>(vocab));
  }
}

// The reduction the trainer declares (TOKEN_MEAN when it declares none).
v1::LossReduction DeclaredReduction(const TriageInput& in) {
  const v1::LossReduction d =
      in.capsule != nullptr ? in.capsule->objective().reduction() : v1::LOSS_REDUCTION_UNSPECIFIED;
  return d == v1::LOSS_REDUCTION_UNSPECIFIED ? v1::TOKEN_MEAN : d;
}

// A sample without a target token is bad data only for a per-sequence mean (0/0); a token mean
// or sum over the batch gives it no weight at all, so it is a note (all-padding filler).
void CheckEmptySamples(const TriageInput& in, const SampleStats& s, v1::StageReport& r) {
  const bool per_sequence = DeclaredReduction(in) == v1::SEQUENCE_MEAN;
  for (size_t b = 0; s.total > 0 && b < s.n.size(); ++b) {
    if (s.n[b] != 0 || s.oov[b] != 0) continue;
    v1::Finding& f = AddFinding(r, "data.empty_sample", per_sequence, 0, 1);
    NameSample(in, static_cast<int64_t>(b), f);
  }
}

// Bad and hard samples against the others' median, and the batch's largest excess (a note).
void CheckPerSampleLoss(const TriageInput& in, const SampleStats& s, v1::StageReport& r) {
  const int64_t batch = static_cast<int64_t>(s.n.size());
  double worst_excess = -std::numeric_limits<double>::infinity();
  int64_t worst = -1;
  for (int64_t b = 0; b < batch; ++b) {
    if (s.n[b] == 0) continue;
    std::vector<double> others;
    for (int64_t o = 0; o < batch; ++o) {
      if (o != b && s.n[o] > 0) others.push_back(s.mean[o]);
    }
    if (others.empty()) continue;
    const double median = Median(others);
    const double excess = s.mean[b] - median;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = b;
    }
    if (excess < kBadSampleExcessNats) continue;
    const bool uniform = s.frac[b] >= kBadSampleUniformFraction;
    const bool learned = median <= kLearnedFractionOfLogV * s.log_v;
    const bool bad = uniform && learned;
    v1::Finding& f = AddFinding(r, bad ? "data.bad_sample" : "data.hard_sample", bad, s.frac[b],
                                kBadSampleUniformFraction);
    NameSample(in, b, f);
    AddFact(f, "mean_loss", s.mean[b]);
    AddFact(f, "tokens", static_cast<double>(s.n[b]));
    AddFact(f, "median", median);
    AddFact(f, "fraction", s.frac[b]);
    AddFact(f, "log_v", s.log_v);
    AddFact(f, "learned", learned ? 1.0 : 0.0);
  }
  if (worst < 0) return;
  v1::Finding& f = AddFinding(r, "data.per_sample_loss", false, worst_excess, kBadSampleExcessNats);
  NameSample(in, worst, f);
  AddFact(f, "samples", static_cast<double>(batch));
  AddFact(f, "tokens", static_cast<double>(s.total));
  AddFact(f, "fraction", s.frac[worst]);
  AddFact(f, "log_v", s.log_v);
  AddFact(f, "fraction_needed", kBadSampleUniformFraction);
}

// The positions of `labels` [B, T] that are in the loss: a label that is not -100, with its loss
// mask set, on a real (not padded) position.
at::Tensor InLoss(const LayerBatch& b) {
  at::Tensor in = b.labels.ne(-100).logical_and(b.labels.ge(0));
  if (b.loss_mask.defined() && b.loss_mask.sizes() == b.labels.sizes()) {
    in = in.logical_and(b.loss_mask.ne(0));
  }
  if (b.attention_mask.defined() && b.attention_mask.sizes() == b.labels.sizes()) {
    in = in.logical_and(b.attention_mask.ne(0));
  }
  return in;
}

// The fraction of the positions in the loss whose label equals the input `offset` positions
// later (labels[i] == input_ids[i + offset], on a real input). Every position in the loss
// counts, those without an input at that offset as different: a far offset on a short batch
// cannot match by the chance of its few positions. NaN when no position is in the loss.
double FractionEqualAt(const LayerBatch& b, const at::Tensor& in_loss, int64_t offset) {
  const int64_t len = b.labels.size(1);
  const double n = in_loss.sum().item<double>();
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  if (std::abs(offset) >= len) return 0;
  const int64_t lo = std::max<int64_t>(0, -offset), hi = std::min(len, len - offset);
  const at::Tensor labels = b.labels.slice(1, lo, hi);
  const at::Tensor inputs = b.input_ids.slice(1, lo + offset, hi + offset);
  at::Tensor where = in_loss.slice(1, lo, hi);
  if (b.attention_mask.defined() && b.attention_mask.sizes() == b.labels.sizes()) {
    where = where.logical_and(b.attention_mask.slice(1, lo + offset, hi + offset).ne(0));
  }
  return labels.eq(inputs).logical_and(where).sum().item<double>() / n;
}

// Labels against the inputs at every offset within kMaxLabelShift of the declared one (1 when
// declared shifted: labels[i] is input i + 1; 0 when not): clean text matches the declared offset
// and a few percent elsewhere; labels shifted by the wrong amount match another offset.
void CheckLabelShift(const TriageInput& in, v1::StageReport& r) {
  const LayerBatch& b = *in.batch;
  if (!b.input_ids.defined() || b.input_ids.sizes() != b.labels.sizes()) return;
  const at::Tensor in_loss = InLoss(b);
  const int64_t declared = b.labels_shifted ? 1 : 0;
  const double at_declared = FractionEqualAt(b, in_loss, declared);
  int64_t best = declared;
  double best_fraction = -1;
  for (int64_t o = declared - kMaxLabelShift; o <= declared + kMaxLabelShift; ++o) {
    const double f = FractionEqualAt(b, in_loss, o);
    if (o == declared || !(f > best_fraction)) continue;
    best = o;
    best_fraction = f;
  }
  if (best_fraction < 0) return;  // no position in the loss
  const bool failed = best_fraction >= kLabelsEqualInputsFraction &&
                      !(at_declared >= best_fraction);  // a periodic sequence matches both
  v1::Finding& f = AddFinding(r, "objective.labels_equal_inputs", failed, best_fraction,
                              kLabelsEqualInputsFraction);
  f.set_label_offset(static_cast<int32_t>(best));
  AddFact(f, "fraction", best_fraction);
  AddFact(f, "at_declared", at_declared);
  AddFact(f, "declared_shifted", b.labels_shifted ? 1.0 : 0.0);
  AddFact(f, "max_shift", static_cast<double>(kMaxLabelShift));
}

// Targets in the loss that fall where `on` is set: a failed `check` when any does.
void CheckTargetsOn(const Tokens& t, const at::Tensor& on, const std::string& check,
                    v1::StageReport& r) {
  const double n_valid = t.valid.sum().item<double>();
  const double n = t.valid.logical_and(on).sum().item<double>();
  AddFact(AddFinding(r, check, n > 0, n, 0), "targets", n_valid);
}

// Padding that carries a target: the loss learns to predict from pad positions.
void CheckPaddingInLoss(const TriageInput& in, const Tokens& t, v1::StageReport& r) {
  if (!in.batch->attention_mask.defined()) return;
  CheckTargetsOn(t, t.padded, "objective.padding_in_loss", r);
}

// With a declared response mask, a target on a prompt token: the loss trains on the prompt.
void CheckPromptInLoss(const Tokens& t, v1::StageReport& r) {
  if (!t.prompt.defined()) return;
  CheckTargetsOn(t, t.prompt, "objective.prompt_in_loss", r);
}

double RelErr(double a, double b) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-300});
}

// The hand-written reductions of the batch's FP64 token losses.
struct Reduced {
  double numerator = 0, denominator = 0, token_mean = 0, sequence_mean = 0;
  int seq_count = 0;
  at::Tensor seq_sum, seq_n;  // per sequence
  v1::LossReduction declared = v1::LOSS_REDUCTION_UNSPECIFIED;
  double hand = 0;  // the declared one
  std::string hand_name;
};

Reduced Reduce(const TriageInput& in, const Tokens& t) {
  Reduced d;
  d.numerator = t.loss.sum().item<double>();
  d.denominator = t.valid.sum().item<double>();
  d.seq_sum = t.loss.sum(1);
  d.seq_n = t.valid.sum(1).to(at::kDouble);
  double seq_mean_sum = 0;
  for (int64_t s = 0; s < d.seq_sum.size(0); ++s) {
    const double nb = d.seq_n[s].item<double>();
    if (nb == 0) continue;
    seq_mean_sum += d.seq_sum[s].item<double>() / nb;
    ++d.seq_count;
  }
  d.token_mean = d.numerator / d.denominator;
  d.sequence_mean = d.seq_count > 0 ? seq_mean_sum / d.seq_count : d.token_mean;
  d.declared =
      in.capsule != nullptr ? in.capsule->objective().reduction() : v1::LOSS_REDUCTION_UNSPECIFIED;
  d.hand = d.declared == v1::TOKEN_SUM       ? d.numerator
           : d.declared == v1::SEQUENCE_MEAN ? d.sequence_mean
                                             : d.token_mean;
  d.hand_name = d.declared == v1::TOKEN_SUM       ? "token-sum"
                : d.declared == v1::SEQUENCE_MEAN ? "per-sequence-mean"
                                                  : "token-mean";
  return d;
}

bool CheckLossMatches(const TriageInput& in, const Reduced& d, v1::StageReport& r) {
  const double model = in.model_loss;
  const double err = RelErr(model, d.hand);
  const bool matches = err <= kLossMatchRelTol;
  v1::Finding& f = AddFinding(r, "objective.loss_matches", !matches, err, kLossMatchRelTol);
  AddFact(f, "loss", model);
  AddFact(f, "reduction", d.hand_name);
  AddFact(f, "hand", d.hand);
  AddFact(f, "numerator", d.numerator);
  AddFact(f, "targets", d.denominator);
  AddFact(f, "declared", d.declared == v1::LOSS_REDUCTION_UNSPECIFIED ? 0.0 : 1.0);
  return matches;
}

// The normaliser the trainer declares against the step's target tokens (on this rank alone:
// a normaliser over ranks cannot be counted here).
void CheckNormalizer(const TriageInput& in, const Reduced& d, v1::StageReport& r) {
  if (in.capsule == nullptr) return;
  const v1::Objective& obj = in.capsule->objective();
  if (obj.normalizer() <= 0 || obj.ranks() > 1 ||
      (d.declared != v1::TOKEN_MEAN && d.declared != v1::LOSS_REDUCTION_UNSPECIFIED)) {
    return;
  }
  const double n = obj.normalizer();
  const bool wrong = std::abs(n - d.denominator) > 0.5;
  AddFinding(r, "objective.normalizer", wrong, n, d.denominator);
}

// How far the trainer's loss of an accumulated step may be from the FP64 declared reduction:
// kTrainerLossRelTol, or kTrainerLossPrecisionFactor times the distance the trainer's path keeps
// from the reference on the same batch, when that is larger (a lower-precision model).
double TrainerLossTolerance(const TriageInput& in) {
  const double path = RelErr(in.optimized_loss, in.model_loss);
  return std::isfinite(path) ? std::max(kTrainerLossRelTol, kTrainerLossPrecisionFactor * path)
                             : kTrainerLossRelTol;
}

// An accumulated step: the trainer's loss over every micro-batch against the declared reduction.
// A mismatch fails: the trainer optimized another objective than the one it declares. The
// variants that name it: each micro-batch's token mean averaged over the micro-batches (short
// micro-batches weigh more), and the declared loss times the number of micro-batches (the
// accumulated loss not divided by it).
void CheckTrainerLoss(const TriageInput& in, const Reduced& d, v1::StageReport& r) {
  if (in.capsule == nullptr || in.capsule->data().micro_batches() <= 1 ||
      in.capsule->data().sequences_size() != d.seq_sum.size(0)) {
    return;
  }
  std::optional<double> trainer;
  for (const auto& h : in.capsule->step().history()) {
    if (h.step() == in.capsule->step().global_step() && h.has_loss()) trainer = h.loss();
  }
  if (!trainer || !std::isfinite(*trainer)) return;
  const int k = in.capsule->data().micro_batches();
  std::vector<double> mb_sum(k), mb_n(k);
  for (int64_t s = 0; s < d.seq_sum.size(0); ++s) {
    const int m = in.capsule->data().sequences(static_cast<int>(s)).micro_batch();
    mb_sum[m] += d.seq_sum[s].item<double>();
    mb_n[m] += d.seq_n[s].item<double>();
  }
  double mean_of_means = 0;
  for (int m = 0; m < k; ++m) mean_of_means += mb_n[m] > 0 ? mb_sum[m] / mb_n[m] / k : 0;
  const double tol = TrainerLossTolerance(in);
  const double e = RelErr(*trainer, d.hand);
  const bool ok = e <= tol;
  const double e_means = RelErr(*trainer, mean_of_means);
  const double e_sum = RelErr(*trainer, k * d.hand);
  const bool means = !ok && e_means <= tol;
  const bool not_divided = !ok && !means && e_sum <= tol;
  const char* check = means         ? "objective.accumulation_mean_of_means"
                      : not_divided ? "objective.accumulation_not_divided"
                                    : "objective.trainer_loss";
  // A loss averaged over data-parallel ranks need not be this rank's batch's: a mismatch no
  // variant names is then a note.
  const int ranks = in.capsule->objective().ranks();
  v1::Finding& f = AddFinding(r, check, !ok && (means || not_divided || ranks <= 1),
                              means         ? e_means
                              : not_divided ? e_sum
                                            : e,
                              tol);
  AddFact(f, "micro_batches", k);
  AddFact(f, "trainer", *trainer);
  AddFact(f, "reduction", d.hand_name);
  AddFact(f, "hand", d.hand);
  AddFact(f, "error", e);
  AddFact(f, "matches", ok ? 1.0 : 0.0);
  if (means) AddFact(f, "mean_of_means", mean_of_means);
  AddFact(f, "ranks", ranks);
}

// The model's loss differs from the declared one: the variants whose value it equals.
void NameLossVariant(const TriageInput& in, const Tokens& t, const Reduced& d, v1::StageReport& r) {
  const bool shifted = in.batch->labels_shifted;
  std::vector<std::pair<const char*, double>> variants;
  if (d.declared != v1::TOKEN_SUM) variants.emplace_back("objective.reduction_sum", d.numerator);
  if (d.declared != v1::SEQUENCE_MEAN && d.seq_count > 0) {
    variants.emplace_back("objective.reduction_sequence_mean", d.sequence_mean);
  }
  if (d.declared == v1::TOKEN_SUM || d.declared == v1::SEQUENCE_MEAN) {
    variants.emplace_back("objective.reduction_token_mean", d.token_mean);
  }
  const Tokens other = Align(in, !shifted);
  const double n_other = other.valid.sum().item<double>();
  if (n_other > 0) {
    variants.emplace_back("objective.labels_alignment", other.loss.sum().item<double>() / n_other);
  }
  variants.emplace_back("objective.masked_positions_counted",
                        d.numerator / static_cast<double>(t.valid.numel()));
  const double n_any = t.any.sum().item<double>();
  if (in.batch->loss_mask.defined() && n_any > 0) {
    variants.emplace_back("objective.loss_mask_ignored", t.unmasked.sum().item<double>() / n_any);
  }
  bool named = false;
  for (const auto& [check, value] : variants) {
    const double e = RelErr(in.model_loss, value);
    if (e > kLossMatchRelTol) continue;
    v1::Finding& f = AddFinding(r, check, true, e, kLossMatchRelTol);
    AddFact(f, "loss", in.model_loss);
    AddFact(f, "equals", value);
    AddFact(f, "reduction", d.hand_name);
    AddFact(f, "targets", d.denominator);
    AddFact(f, "positions", static_cast<double>(t.valid.numel()));
    AddFact(f, "shifted", shifted ? 1.0 : 0.0);
    named = true;
  }
  if (!named) AddFinding(r, "objective.unexplained", true, in.model_loss / d.hand, 1);
}

// `name` matches a glob `pattern`: `*` any run of characters (dots included), `?` one.
bool GlobMatch(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// What the capsule recorded of one parameter's training: whether it required grad (its embedded
// tensor or the optimizer step), and the optimizer step's gradient and update norms.
struct RecordedParameter {
  std::optional<bool> requires_grad;
  double grad_norm = 0, update_norm = 0;
};

std::map<std::string, RecordedParameter> RecordedParameters(const v1::Capsule& c) {
  std::map<std::string, RecordedParameter> out;
  for (const v1::TensorBlob& t : c.tensors()) {
    if (t.role() == v1::PARAMETER) out[t.name()].requires_grad = t.meta().requires_grad();
  }
  for (const v1::ParamStep& p : c.optimizer().params()) {
    RecordedParameter& e = out[p.name()];
    e.requires_grad = e.requires_grad.value_or(false) || p.requires_grad();
    e.grad_norm = p.grad_norm();
    if (c.optimizer().observed_after()) e.update_norm = p.update_norm();
  }
  return out;
}

// The parameters the trainer declared frozen (ModelSpec.declared_frozen): one that requires grad,
// gets a gradient or is updated is trained after all; a pattern that matches no recorded
// parameter is a note. Returns whether anything was declared.
bool CheckDeclaredFrozen(const TriageInput& in, v1::StageReport& r) {
  if (in.capsule == nullptr || in.capsule->model().declared_frozen_size() == 0) return false;
  const auto& patterns = in.capsule->model().declared_frozen();
  const auto recorded = RecordedParameters(*in.capsule);
  int matched = 0, judged = 0;
  std::vector<bool> used(patterns.size());
  for (const auto& [name, p] : recorded) {
    bool declared = false;
    for (int i = 0; i < patterns.size(); ++i) {
      if (!GlobMatch(patterns[i], name)) continue;
      declared = true;
      used[i] = true;
    }
    if (!declared) continue;
    ++matched;
    if (!p.requires_grad) continue;
    ++judged;
    const bool trained = *p.requires_grad || p.grad_norm > 0 || p.update_norm > 0;
    if (!trained) continue;
    v1::Finding& f = AddFinding(r, "gradients.declared_frozen_trained", true,
                                std::max(p.grad_norm, p.update_norm), 0);
    f.set_parameter(name);
    AddFact(f, "requires_grad", *p.requires_grad ? 1.0 : 0.0);
    AddFact(f, "grad_norm", p.grad_norm);
    AddFact(f, "update_norm", p.update_norm);
  }
  for (int i = 0; i < patterns.size(); ++i) {
    if (used[i]) continue;
    AddFact(AddFinding(r, "gradients.declared_frozen_unmatched", false, 0, 0), "pattern",
            patterns[i]);
  }
  AddFact(AddFinding(r, "gradients.declared_frozen", false, static_cast<double>(matched), 0),
          "judged", judged);
  return true;
}

// Parameters that require grad and get no gradient, or an exactly-zero one, by layer in
// execution order; and the three largest per-layer gradient norms (a note).
void CheckDisconnected(const std::vector<ParameterGrad>& grads, v1::StageReport& r) {
  std::vector<std::string> layers;
  std::vector<std::vector<std::string>> cut;
  std::vector<std::vector<double>> zero;  // per cut parameter: 1 an exactly-zero gradient, 0 none
  std::vector<int> counts;
  std::vector<double> norms;
  for (const ParameterGrad& p : grads) {
    size_t i = 0;
    while (i < layers.size() && layers[i] != p.layer) ++i;
    if (i == layers.size()) {
      layers.push_back(p.layer);
      cut.emplace_back();
      zero.emplace_back();
      counts.push_back(0);
      norms.push_back(0);
    }
    ++counts[i];
    if (!p.grad.defined()) {
      cut[i].push_back(p.name);
      zero[i].push_back(0);
      continue;
    }
    const at::Tensor g = p.grad.detach().to(at::kDouble);
    const double sq = g.pow(2).sum().item<double>();
    if (sq == 0) {
      cut[i].push_back(p.name);
      zero[i].push_back(1);
    }
    norms[i] += sq;
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    if (cut[i].empty()) continue;
    v1::Finding& f =
        AddFinding(r, "gradients.disconnected", true, static_cast<double>(cut[i].size()), 0);
    AddFact(f, "layer", layers[i]);
    AddFact(f, "layer_parameters", counts[i]);
    AddFact(f, "parameters", cut[i], zero[i]);
  }
  std::vector<size_t> order(layers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return norms[a] > norms[b]; });
  std::vector<std::string> top;
  std::vector<double> top_norms;
  for (size_t k = 0; k < order.size() && k < 3; ++k) {
    top.push_back(layers[order[k]]);
    top_norms.push_back(std::sqrt(norms[order[k]]));
  }
  AddFact(AddFinding(r, "gradients.per_layer_norm", false, top_norms.empty() ? 0 : top_norms[0], 0),
          "layers", top, top_norms);
}

}  // namespace

bool StartStage(v1::Stage stage, const std::string& unsupported, v1::StageReport* r) {
  r->set_stage(stage);
  r->set_skipped_reason(unsupported);
  r->set_ran(unsupported.empty());
  return unsupported.empty();
}

void NameSample(const TriageInput& in, int64_t b, v1::Finding& f) {
  f.set_sample_index(static_cast<int32_t>(b));
  if (in.capsule == nullptr) return;
  const v1::DataBatch& d = in.capsule->data();
  if (b < d.sequences_size() && !d.sequences(b).sample_id().empty()) {
    f.set_sample_id(d.sequences(b).sample_id());
  }
  if (b < d.cursor().sample_indices_size()) f.set_dataset_index(d.cursor().sample_indices(b));
}

namespace {

void JudgeData(const TriageInput& in, v1::StageReport& r) {
  Tokens t = Align(in, in.batch->labels_shifted);
  // The data stage judges the real tokens: targets predicted from padding are the objective's
  // business (objective.padding_in_loss).
  t.valid = t.valid.logical_and(t.padded.logical_not());
  t.oov = t.oov.logical_and(t.padded.logical_not());
  t.loss = t.loss * t.valid.to(at::kDouble);
  const SampleStats s = CountSamples(t);
  CheckOutOfVocab(in, s, t.vocab, r);
  CheckEmptySamples(in, s, r);
  CheckPerSampleLoss(in, s, r);
}

void JudgeObjective(const TriageInput& in, v1::StageReport& r) {
  const Tokens t = Align(in, in.batch->labels_shifted);
  const at::Tensor valid_loss = t.loss.masked_select(t.valid);
  if (!valid_loss.isfinite().all().item<bool>()) {
    r.set_skipped_reason(
        "the reference path's logits are not finite at the targets: the loss cannot be judged");
    r.set_ran(false);
    return;
  }
  CheckLabelShift(in, r);
  CheckPaddingInLoss(in, t, r);
  CheckPromptInLoss(t, r);
  const bool labels_explain = r.explains();
  if (t.valid.sum().item<double>() == 0) {
    r.set_skipped_reason("the batch has no target token");
    r.set_ran(false);
    return;
  }
  const Reduced d = Reduce(in, t);
  const bool matches = CheckLossMatches(in, d, r);
  CheckNormalizer(in, d, r);
  CheckTrainerLoss(in, d, r);
  if (!matches && !labels_explain) NameLossVariant(in, t, d, r);
}

}  // namespace

v1::StageReport RunDataStage(const TriageInput& in) {
  if (IsClassificationBatch(in)) return RunClassificationDataStage(in);
  v1::StageReport r;
  if (StartStage(v1::STAGE_DATA, Unsupported(in), &r)) JudgeData(in, r);
  RenderDetails(&r);
  return r;
}

v1::StageReport RunObjectiveStage(const TriageInput& in) {
  if (IsClassificationBatch(in)) return RunClassificationObjectiveStage(in);
  v1::StageReport r;
  if (StartStage(v1::STAGE_OBJECTIVE, Unsupported(in), &r)) JudgeObjective(in, r);
  RenderDetails(&r);
  return r;
}

v1::StageReport RunGradientsStage(const TriageInput& in) {
  v1::StageReport r;
  r.set_stage(v1::STAGE_GRADIENTS);
  const bool declared = CheckDeclaredFrozen(in, r);
  const bool backward = in.parameter_grads != nullptr && !in.parameter_grads->empty();
  if (backward) CheckDisconnected(*in.parameter_grads, r);
  if (!backward && !declared) {
    r.set_skipped_reason("no backward ran on the reference path, or no parameter requires grad");
  }
  r.set_ran(backward || declared);
  RenderDetails(&r);
  return r;
}

}  // namespace capsule::internal
