#include "capsule/replay/internal/findings.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/strings.h"

namespace capsule::internal {
namespace {

// Read access to one finding's fields and facts, formatted for a sentence.
class View {
 public:
  explicit View(const v1::Finding& f) : f_(f) {}

  bool failed() const { return f_.failed(); }
  const std::string& parameter() const { return f_.parameter(); }
  bool Has(const char* name) const { return Get(name) != nullptr; }
  double Number(const char* name) const {
    const v1::Fact* fact = Get(name);
    return fact != nullptr ? fact->number() : std::numeric_limits<double>::quiet_NaN();
  }
  bool Flag(const char* name) const { return Number(name) != 0 && Has(name); }
  std::string Text(const char* name) const {
    const v1::Fact* fact = Get(name);
    return fact != nullptr ? fact->text() : std::string();
  }
  // Four significant digits (or `digits`), as the stages measured them.
  std::string Num(const char* name, int digits = 4) const {
    return FormatSignificant(Number(name), digits);
  }
  std::string Int(const char* name) const { return IntOf(Number(name)); }
  std::string Value(int digits = 4) const { return FormatSignificant(f_.value(), digits); }
  std::string IntValue() const { return IntOf(f_.value()); }
  std::string IntThreshold() const { return IntOf(f_.threshold()); }
  std::string Threshold(int digits = 4) const { return FormatSignificant(f_.threshold(), digits); }

  // The list fact `name`: its names, each with `with(number)` after it when it has numbers, then
  // "..." and the count when the fact kept fewer than it counts.
  std::string List(const char* name,
                   const std::function<std::string(const std::string&, int)>& each = {}) const {
    const v1::Fact* fact = Get(name);
    if (fact == nullptr) return "";
    std::string out;
    for (int k = 0; k < fact->items_size(); ++k) {
      out += (k ? ", " : "") + (each ? each(fact->items(k), k) : fact->items(k));
    }
    const double all = fact->number();
    if (all > fact->items_size()) out += ", ... (" + IntOf(all) + " in all)";
    return out;
  }
  double ItemNumber(const char* name, int k) const {
    const v1::Fact* fact = Get(name);
    return fact != nullptr && k < fact->numbers_size() ? fact->numbers(k)
                                                       : std::numeric_limits<double>::quiet_NaN();
  }

  // "sample 3 (id "a", dataset index 17)": the sample the finding names.
  std::string Sample() const {
    std::string name = "sample " + std::to_string(f_.sample_index());
    std::vector<std::string> parts;
    if (!f_.sample_id().empty()) {
      parts.push_back("id \"" + PrintableShort(f_.sample_id(), 64) + "\"");
    }
    if (f_.has_dataset_index()) {
      parts.push_back("dataset index " + std::to_string(f_.dataset_index()));
    }
    for (size_t i = 0; i < parts.size(); ++i) name += (i == 0 ? " (" : ", ") + parts[i];
    return parts.empty() ? name : name + ")";
  }
  int32_t label_offset() const { return f_.label_offset(); }

 private:
  static std::string IntOf(double v) {
    return std::isfinite(v) ? std::to_string(static_cast<int64_t>(v)) : FormatSignificant(v, 4);
  }
  const v1::Fact* Get(const char* name) const {
    for (const v1::Fact& fact : f_.facts()) {
      if (fact.name() == name) return &fact;
    }
    return nullptr;
  }
  const v1::Finding& f_;
};

using Sentence = std::function<std::string(const View&)>;

// --- data ---

std::string SampleLossNumbers(const View& v, double fraction) {
  return "mean token loss " + v.Num("mean_loss") + " over " + v.Int("tokens") +
         " tokens against a median of " + v.Num("median") + " for the other samples; " +
         FormatSignificant(100 * fraction, 4) +
         "% of its tokens at or above log V = " + v.Num("log_v");
}

std::string PerSampleLoss(const View& v) {
  if (v.Has("classes")) {
    return v.Int("samples") + " samples, " + v.Num("with_target") + " with a target, " +
           v.Int("classes") + " classes; mean cross-entropy " + v.Num("mean") + ", the largest " +
           v.Value() + " (" + v.Sample() + "); log C = " + v.Threshold();
  }
  return v.Int("samples") + " samples, " + v.Int("tokens") +
         " target tokens; the largest excess over the other samples' median is " + v.Value() +
         " nats (" + v.Sample() + ", " + FormatSignificant(100 * v.Number("fraction"), 4) +
         "% of its tokens at or above log V = " + v.Num("log_v") + "); a bad sample needs " +
         v.Threshold() + " nats and " + FormatSignificant(100 * v.Number("fraction_needed"), 4) +
         "%";
}

std::string InAll(const View& v, const std::string& what) {
  return v.Has("in_all") ? "; " + v.Int("in_all") + " samples " + what + " in all" : "";
}

void DataSentences(std::map<std::string, Sentence>& c) {
  c["data.label_out_of_vocab"] = [](const View& v) {
    return v.Sample() + " has " + v.IntValue() + " labels outside the vocabulary of " +
           v.Int("vocab") + " (not -100): a tokenizer or vocabulary mismatch";
  };
  c["data.empty_sample"] = [](const View& v) {
    return v.Sample() +
           " has no target token: every label is -100 or masked (an empty or all-padding "
           "sample; " +
           (v.failed() ? "the declared per-sequence mean of it is 0/0)"
                       : "the declared token reduction gives it no weight, so it does not change "
                         "the loss)");
  };
  c["data.bad_sample"] = [](const View& v) {
    return v.Sample() + " is bad data: " + SampleLossNumbers(v, v.Number("fraction")) +
           " (the model finds them no better than random, while it has learned the rest: "
           "labels that look random, a corrupt or mismatched sample)";
  };
  c["data.hard_sample"] = [](const View& v) {
    return v.Sample() + " is a hard sample: " + SampleLossNumbers(v, v.Number("fraction")) +
           (v.Flag("learned") ? " (high but consistent: most tokens are predicted better than "
                                "random; a genuinely hard sample, not corrupt)"
                              : " (the model has not learned the batch yet: cannot tell bad from "
                                "hard)");
  };
  c["data.per_sample_loss"] = PerSampleLoss;
  c["data.non_finite_input"] = [](const View& v) {
    return v.Sample() + " has " + v.IntValue() + " non-finite input values (of " +
           v.Int("per_sample") +
           "): a corrupt sample or a broken transform (a division by a zero standard deviation, "
           "a decode that failed)" +
           InAll(v, "have them");
  };
  c["data.label_out_of_range"] = [](const View& v) {
    return v.Sample() + " has target class " + v.IntValue() + ", outside the model's " +
           v.Int("classes") + " classes [0, " + v.Int("classes") + ") and not the ignore index " +
           v.Int("ignore_index") +
           ": a label map or class count that does not match the model's head" +
           InAll(v, "have one");
  };
  c["data.constant_targets"] = [](const View& v) {
    return "every one of the " + v.Value() + " samples with a target is class " + v.Int("class") +
           " of " + v.Int("classes") + " (with uniform classes, a chance of " + v.Num("chance") +
           "): a sampler that does not shuffle, or a label column read wrong";
  };
  c["data.empty_batch"] = [](const View& v) {
    return v.Number("batch") == 0 ? std::string("the batch has no sample")
                                  : "none of the " + v.Int("batch") +
                                        " samples has a target: every label is the ignore index " +
                                        v.Int("ignore_index") + " (a mean over them is 0/0)";
  };
}

// --- objective ---

std::string LabelsEqualInputs(const View& v) {
  const int64_t best = v.label_offset();
  const bool shifted = v.Flag("declared_shifted");
  const int64_t declared = shifted ? 1 : 0;
  const int64_t span = static_cast<int64_t>(v.Number("max_shift"));
  const std::string offset = "labels[i] = input[i" + std::string(best < 0 ? " - " : " + ") +
                             std::to_string(std::abs(best)) + "]";
  const std::string declared_text =
      std::string("the batch declares labels_shifted = ") +
      (shifted ? "true (labels[i] = input[i + 1])" : "false (labels[i] = input[i])");
  const double pct = 100 * v.Number("fraction");
  if (v.failed()) {
    return FormatSignificant(pct, 4) + "% of the targets in the loss satisfy " + offset +
           ", against " + FormatSignificant(100 * v.Number("at_declared"), 4) +
           "% at the declared offset: the labels are shifted by " + std::to_string(best) +
           ", but " + declared_text;
  }
  return "at most " + FormatSignificant(pct, 4) +
         "% of the targets in the loss equal the input at an offset other than the declared one "
         "(" +
         offset + "; offsets " + std::to_string(declared - span) + " to " +
         std::to_string(declared + span) + " tried); " + declared_text;
}

// The model's (or the trainer's: `who`) loss against the hand-written cross-entropy.
std::string LossMatches(const View& v) {
  const std::string verb = v.failed() ? " differs from" : " equals";
  if (v.Has("who")) {
    return v.Text("who") + " " + v.Num("loss", 9) + verb + " a hand-written FP64 cross-entropy " +
           (v.Flag("sum") ? "sum " : "mean ") + v.Num("hand", 9) + " over " + v.Num("samples") +
           " samples of " + v.Int("classes") + " classes (label smoothing " + v.Num("smoothing") +
           ", ignore index " + v.Int("ignore_index") + "; relative error " + v.Value(3) + ")";
  }
  return "the model's loss " + v.Num("loss", 9) + verb + " a hand-written FP64 " +
         v.Text("reduction") + " cross-entropy " + v.Num("hand", 9) + " (" + v.Num("numerator", 9) +
         " over " + v.Int("targets") + " target tokens; relative error " + v.Value(3) +
         (v.Flag("declared") ? ")" : "; the trainer declared no reduction, read as a token mean)");
}

// What a loss variant is, in a language model's (LM) and a classifier's words.
std::string VariantWhy(const std::string& check, const View& v) {
  const bool lm = !v.Has("who");
  if (check == "objective.reduction_sum") {
    return lm ? "the loss is the token sum, not the declared " + v.Text("reduction") +
                    " (it was not divided by the " + v.Int("targets") + " target tokens)"
              : "the loss is the sum over the samples, not their mean (not divided by the " +
                    v.Num("samples") + " samples)";
  }
  if (check == "objective.reduction_token_mean") {
    return lm ? "the loss is the token mean, not the declared " + v.Text("reduction")
              : std::string("the loss is the mean over the samples, not the declared sum");
  }
  if (check == "objective.reduction_sequence_mean") {
    return "the loss is a mean of per-sequence means, not a token mean: long and short samples "
           "weigh the same";
  }
  if (check == "objective.labels_alignment") {
    return std::string("the labels are aligned as if ") +
           (v.Flag("shifted") ? "the model shifted them (labels[i+1] the target of position i)"
                              : "already shifted (labels[i] the target of position i)") +
           ", not as the batch declares: the model predicts the token it is given";
  }
  if (check == "objective.masked_positions_counted") {
    return lm ? "the denominator counts every position (" + v.Int("positions") +
                    "), padding and ignored ones included, not the " + v.Int("targets") +
                    " target tokens"
              : "the mean divides by every sample (" + v.Num("batch") +
                    "), ignored ones included, not by the " + v.Num("samples") +
                    " samples with a target";
  }
  if (check == "objective.loss_mask_ignored") {
    return "the loss mask is ignored: masked positions (padding, prompt) are in the loss";
  }
  return "the loss has label smoothing " + v.Num("smoothing_used") + ", not the declared " +
         v.Num("smoothing");  // objective.label_smoothing
}

Sentence Variant(const std::string& check) {
  return [check](const View& v) {
    const std::string who = v.Has("who") ? v.Text("who") : "the model's loss";
    return VariantWhy(check, v) + ": " + who + " " + v.Num("loss", 9) + " equals it (" +
           v.Num("equals", 9) + ")";
  };
}

// An accumulated step's trainer loss against the declared reduction, and the variants.
std::string TrainerLoss(const std::string& check, const View& v) {
  const std::string head = "the trainer's loss over " + v.Int("micro_batches") +
                           " micro-batches is " + v.Num("trainer", 9);
  const std::string hand = v.Num("hand", 9);
  const std::string declared = v.Text("reduction");
  if (check == "objective.accumulation_mean_of_means") {
    return head + ", the mean of the micro-batches' token means (" + v.Num("mean_of_means", 9) +
           "), not the step's token mean " + hand +
           ": each micro-batch was divided by the number of micro-batches instead of the step's "
           "target tokens, so tokens in short micro-batches weigh more";
  }
  if (check == "objective.accumulation_not_divided") {
    return head + ", " + v.Int("micro_batches") + " times the declared " + declared + " " + hand +
           ": the accumulated micro-batch losses were not divided by the number of "
           "micro-batches, so the step's gradient is " +
           v.Int("micro_batches") + " times too large";
  }
  const std::string errors = "relative error " + v.Num("error", 3) + ", allowed " + v.Threshold(3);
  if (v.Flag("matches"))
    return head + ", the declared " + declared + " " + hand + " (" + errors + ")";
  std::string out = head + ", not the declared " + declared + " " + hand + " (" + errors + "; " +
                    FormatSignificant(v.Number("trainer") / v.Number("hand"), 6) +
                    " times it), nor the mean of micro-batch means, nor the declared loss times "
                    "the micro-batches: the trainer optimizes another objective than it declares";
  if (v.Number("ranks") > 1) {
    out += " (the loss spans " + v.Int("ranks") + " ranks: not judged on this rank's batch)";
  }
  return out;
}

std::string TargetsOn(const View& v, const std::string& what, const std::string& none) {
  return v.failed() ? v.Value() + " of the " + v.Num("targets") + " target tokens " + what : none;
}

void ObjectiveSentences(std::map<std::string, Sentence>& c) {
  c["objective.labels_equal_inputs"] = LabelsEqualInputs;
  c["objective.padding_in_loss"] = [](const View& v) {
    return TargetsOn(v,
                     "are predicted from padding (attention_mask 0): padding is counted in the "
                     "loss; its labels should be -100 or its loss mask 0",
                     "no target token is predicted from padding");
  };
  c["objective.prompt_in_loss"] = [](const View& v) {
    return TargetsOn(v,
                     "are prompt tokens (response_mask 0): the loss covers the prompt; their "
                     "labels should be -100 or their loss mask 0",
                     "no target token is a prompt token (response_mask 0)");
  };
  c["objective.loss_matches"] = LossMatches;
  c["objective.trainer_loss_matches"] = LossMatches;
  c["objective.normalizer"] = [](const View& v) {
    return "the trainer divides by " + v.Value() + (v.failed() ? ", but" : ", and") +
           " the step has " + v.IntThreshold() + " target tokens" +
           (v.failed() ? ": the normaliser counts something else (padding, a stale or nominal "
                         "batch size)"
                       : "");
  };
  for (const char* check : {"objective.trainer_loss", "objective.accumulation_mean_of_means",
                            "objective.accumulation_not_divided"}) {
    c[check] = [check = std::string(check)](const View& v) { return TrainerLoss(check, v); };
  }
  for (const char* check : {"objective.reduction_sum", "objective.reduction_token_mean",
                            "objective.reduction_sequence_mean", "objective.labels_alignment",
                            "objective.masked_positions_counted", "objective.loss_mask_ignored",
                            "objective.label_smoothing"}) {
    c[check] = Variant(check);
  }
  c["objective.unexplained"] = [](const View& v) {
    if (v.Has("who")) {
      return v.Text("who") + " is " + v.Value(6) +
             " times the declared cross-entropy and matches none of: the other reduction, the "
             "other label smoothing, ignored samples counted";
    }
    return "the model's loss is " + v.Value(6) +
           " times the token-mean cross-entropy and matches none of: token sum, per-sequence "
           "mean, the other label alignment, every position counted, the loss mask ignored";
  };
}

// --- gradients and numerics ---

void GradientSentences(std::map<std::string, Sentence>& c) {
  c["gradients.declared_frozen_trained"] = [](const View& v) {
    return "parameter " + v.parameter() + " is declared frozen but " +
           (v.Flag("requires_grad") ? "requires grad" : "does not require grad") +
           ", with a gradient norm of " + v.Num("grad_norm") + " and an update norm of " +
           v.Num("update_norm") + " in the step: it is trained";
  };
  c["gradients.declared_frozen_unmatched"] = [](const View& v) {
    return "the declared-frozen pattern \"" + PrintableShort(v.Text("pattern"), 64) +
           "\" matches no parameter the capsule records";
  };
  c["gradients.declared_frozen"] = [](const View& v) {
    return v.IntValue() + " recorded parameters are declared frozen (" + v.Int("judged") +
           " with what the capsule records of their training)";
  };
  c["gradients.disconnected"] = [](const View& v) {
    const std::string names = v.List("parameters", [&v](const std::string& name, int k) {
      return name + (v.ItemNumber("parameters", k) != 0 ? " (exactly zero)" : " (none)");
    });
    return "layer " + v.Text("layer") + ": " + v.IntValue() + " of " + v.Int("layer_parameters") +
           " parameters that require grad get no gradient from the loss (" + names +
           "): a stray detach() or a branch left out of the graph; the optimizer never updates "
           "them";
  };
  c["gradients.per_layer_norm"] = [](const View& v) {
    const std::string ranked = v.List("layers", [&v](const std::string& layer, int k) {
      return layer + " " + FormatSignificant(v.ItemNumber("layers", k), 4);
    });
    return "largest per-layer gradient norms (FP64 reference): " + ranked;
  };
  c["numerics.first_divergent_layer"] = [](const View& v) {
    const std::string source = v.Text("source");
    if (source == "layerwise") {
      return "the optimized path diverges from the FP64 reference at " + v.Text("layer") + " (" +
             v.Text("phase") + ")";
    }
    if (!source.empty()) {
      return "composite runs diverge from layer " + v.Text("layer") + " on (" +
             (source == "backward_bisect" ? "backward " : "") + "bisect)";
    }
    return std::string(
        "the optimized path agrees with the FP64 reference on every compared "
        "layer");
  };
}

// --- optimizer ---

std::string FrozenMoved(const View& v) {
  return v.List("parameters", [&v](const std::string& name, int k) {
    const double group = v.ItemNumber("groups", k);
    return name + " (" + (v.ItemNumber("requires_grad", k) != 0 ? "" : "requires_grad false, ") +
           (group >= 0 ? "in group " + std::to_string(static_cast<int64_t>(group))
                       : std::string("in no group")) +
           ") moved by " + FormatSignificant(v.ItemNumber("parameters", k), 4);
  });
}

std::string ClipBeforeUnscale(const View& v) {
  const std::string scale = v.Threshold();
  return "the clip saw a gradient norm of " + v.Num("seen") + ", " + v.Value() +
         " times the FP64 reference's " + v.Num("reference") +
         (v.failed() ? ": the loss scale " + scale +
                           " times it; the gradients were clipped before they were unscaled, so "
                           "the step got gradients " +
                           scale + " times smaller than the threshold allows"
          : v.Flag("unscaled")
              ? " (the unscaled norm, as it should be)"
              : " (neither the unscaled norm nor the loss scale " + scale + " times it)");
}

void OptimizerSentences(std::map<std::string, Sentence>& c) {
  c["optimizer.step_on_overflow"] = [](const View& v) {
    const std::string which = v.Number("nonfinite_grads") > 0 ? v.List("nonfinite_grads")
                                                              : "the trainer's finite check fired";
    return "the step's gradients were not finite (" + which +
           (v.failed() ? ") and the optimizer still stepped: " + v.IntValue() +
                             " parameters changed, " + v.Int("moved_nonfinite") +
                             " of them to non-finite values; a step on an overflow must be "
                             "skipped (and the loss scale lowered)"
                       : ") and no parameter changed: the step was skipped, as it should be");
  };
  c["optimizer.frozen_updated"] = [](const View& v) {
    return v.IntValue() + " frozen parameters changed in the step: " + FrozenMoved(v) +
           "; a frozen parameter left in the optimizer still moves by its momentum and weight "
           "decay: remove it from the optimizer's groups";
  };
  c["optimizer.frozen_in_optimizer"] = [](const View& v) {
    return v.IntValue() + " frozen parameters are in the optimizer's groups but did not change (" +
           v.List("parameters") + ")";
  };
  c["optimizer.decay_on_excluded"] = [](const View& v) {
    if (!v.failed())
      return std::string("no parameter the configuration exempts from weight decay is decayed");
    return v.IntValue() +
           " parameters the configuration exempts from weight decay sit in a group with weight "
           "decay " +
           v.Num("weight_decay") + ": " + v.List("parameters") +
           " (norm weights and biases decayed toward zero); put them in the group without decay";
  };
  c["optimizer.lr_schedule"] = [](const View& v) {
    return "group " + v.Int("group") + " stepped with lr " + v.Value(9) +
           (v.failed() ? ", not the schedule's " : ", the schedule's ") + v.Threshold(9);
  };
  c["optimizer.clip_applied"] = [](const View& v) {
    return "the optimizer got gradients of global norm " + v.Value() +
           (v.failed() ? ", above the clip threshold " : " within the clip threshold ") +
           v.Threshold() +
           (v.failed() ? ": clipping did not apply (or ran before the gradients were unscaled)"
                       : "");
  };
  c["optimizer.clip_before_unscale"] = ClipBeforeUnscale;
  c["optimizer.update_matches"] = [](const View& v) {
    if (v.Has("not_redone")) return "not redone: " + v.Text("not_redone");
    return std::string(v.failed() ? "the trainer's step is not " : "the trainer's step equals ") +
           "a hand-written FP64 " + v.Text("optimizer") + " step from the recorded state on " +
           v.Int("compared") + " parameters (worst: " + v.Text("worst") + " of " + v.parameter() +
           " at " + v.Value() + " times the allowed error)" +
           (v.failed() ? ": the optimizer did not apply the recorded hyper-parameters (lr, betas, "
                         "eps, weight decay, bias correction or step count)"
                       : "");
  };
  c["optimizer.step_norms"] = [](const View& v) {
    return "gradient norm " + v.Num("grad_norm") + ", update norm " + v.Value() +
           ", parameter norm " + v.Num("param_norm") + "; largest update/parameter ratio " +
           v.Num("top_ratio") + " at " + v.Text("top_layer");
  };
}

const std::map<std::string, Sentence>& Catalogue() {
  static const auto* const catalogue = [] {
    auto* c = new std::map<std::string, Sentence>();
    DataSentences(*c);
    ObjectiveSentences(*c);
    GradientSentences(*c);
    OptimizerSentences(*c);
    return c;
  }();
  return *catalogue;
}

}  // namespace

v1::Finding& AddFinding(v1::StageReport& r, const std::string& check, bool failed, double value,
                        double threshold) {
  v1::Finding& f = *r.add_findings();
  f.set_check(check);
  f.set_failed(failed);
  f.set_value(value);
  f.set_threshold(threshold);
  if (failed) r.set_explains(true);
  return f;
}

void AddFact(v1::Finding& f, const std::string& name, double number) {
  v1::Fact& fact = *f.add_facts();
  fact.set_name(name);
  fact.set_number(number);
}

void AddFact(v1::Finding& f, const std::string& name, const std::string& text) {
  v1::Fact& fact = *f.add_facts();
  fact.set_name(name);
  fact.set_text(text);
}

void AddFact(v1::Finding& f, const std::string& name, const std::vector<std::string>& items,
             const std::vector<double>& numbers) {
  v1::Fact& fact = *f.add_facts();
  fact.set_name(name);
  fact.set_number(static_cast<double>(items.size()));
  for (size_t k = 0; k < items.size() && k < static_cast<size_t>(kFactItems); ++k) {
    fact.add_items(items[k]);
    if (k < numbers.size()) fact.add_numbers(numbers[k]);
  }
}

std::string RenderFinding(const v1::Finding& f) {
  const auto& catalogue = Catalogue();
  const auto it = catalogue.find(f.check());
  if (it == catalogue.end()) {
    return PrintableShort(f.check(), 64) + ": " + FormatSignificant(f.value(), 4) + " (bound " +
           FormatSignificant(f.threshold(), 4) + ")";
  }
  return it->second(View(f));
}

void RenderDetails(v1::StageReport* r) {
  for (v1::Finding& f : *r->mutable_findings()) f.set_detail(RenderFinding(f));
}

std::vector<std::string> RenderedChecks() {
  std::vector<std::string> out;
  for (const auto& [check, sentence] : Catalogue()) out.push_back(check);
  return out;
}

}  // namespace capsule::internal
