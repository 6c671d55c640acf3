// tiny_gpt: config and fault parsing, the data loader, agreement of the two execution paths on a
// clean model, the signature of every injectable fault, and training.
#include "samples/tiny_gpt/tiny_gpt.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "capsule/model/layer_sequence.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/faults.h"
#include "samples/tiny_gpt/tiny_gpt_config.h"

namespace capsule::tiny_gpt {
namespace {

// Scaled error, max |c - r| / max |r|, in FP64; +inf when the non-finite patterns differ.
double ScaledError(const at::Tensor& candidate, const at::Tensor& reference) {
  const at::Tensor c = candidate.detach().to(at::kDouble);
  const at::Tensor r = reference.detach().to(at::kDouble);
  if (!at::isfinite(c).all().item<bool>() || !at::isfinite(r).all().item<bool>()) {
    return std::numeric_limits<double>::infinity();
  }
  return (c - r).abs().max().item<double>() / std::max(r.abs().max().item<double>(), 1e-300);
}

bool AllFinite(const at::Tensor& t) { return at::isfinite(t.detach()).all().item<bool>(); }

std::unique_ptr<TinyGpt> MakeModel(const TinyGptConfig& config = {}) {
  StatusOr<std::unique_ptr<TinyGpt>> model = TinyGpt::Create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

CorpusLoader MakeLoader(uint64_t seed = 1) {
  CorpusLoaderOptions options;
  options.seed = seed;
  StatusOr<CorpusLoader> loader = CorpusLoader::Open(CorpusPath(), options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return std::move(*loader);
}

LayerBatch TestBatch() { return MakeLoader(1).Next().batch; }

// Capsule's layerwise comparison: every layer gets the REFERENCE path's input to that layer, cast
// to each path's dtype, so an error cannot propagate from one layer to the next.
struct Layerwise {
  std::vector<std::string> names;
  std::vector<at::Tensor> reference, optimized;
  size_t index(const std::string& name) const {
    return std::find(names.begin(), names.end(), name) - names.begin();
  }
};

Layerwise RunLayerwise(TinyGpt& model, const LayerBatch& batch) {
  at::NoGradGuard no_grad;
  LayerSequence& ref = model.Path(PathKind::kReference);
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  Layerwise out;
  TensorList x = {batch.input_ids};
  for (size_t i = 0; i < ref.size(); ++i) {
    TensorList x_opt = x;
    if (i > 0) x_opt = {x[0].to(opt.compute_dtype())};
    const TensorList r = ref.Forward(i, x, batch);
    const TensorList o = opt.Forward(i, x_opt, batch);
    out.names.push_back(ref.name(i));
    out.reference.push_back(r.at(0));
    out.optimized.push_back(o.at(0));
    x = r;
  }
  return out;
}

std::vector<double> LayerErrors(const Layerwise& lw) {
  std::vector<double> errors;
  for (size_t i = 0; i < lw.names.size(); ++i) {
    errors.push_back(ScaledError(lw.optimized[i], lw.reference[i]));
  }
  return errors;
}

void PrintLayerErrors(const std::string& title, const Layerwise& lw) {
  std::printf("  %s\n", title.c_str());
  const std::vector<double> e = LayerErrors(lw);
  for (size_t i = 0; i < e.size(); ++i) std::printf("    %-10s %.3e\n", lw.names[i].c_str(), e[i]);
}

// Gradients of the loss with respect to every parameter, from one full run of a path.
std::vector<at::Tensor> ParameterGrads(TinyGpt& model, PathKind path, const LayerBatch& batch) {
  const at::Tensor loss = RunSequence(model.Path(path), batch);
  return torch::autograd::grad({loss}, model.parameters());
}

// FP32 rounding as measured on the clean model (forward <= 7e-7 per layer, backward <= 7e-7 per
// parameter) with room for other thread counts and BLAS builds; every injected finite fault is
// above 1e-2.
constexpr double kForwardTol = 1e-5;
constexpr double kBackwardTol = 5e-5;

// ---------------------------------------------------------------------------------------------
// Config, fault specs, spec round trip.

TEST(TinyGptConfig, JsonRoundTrips) {
  TinyGptConfig c;
  c.n_layers = 3;
  c.layer_norm_eps = 1e-6;
  c.dropout = 0.125;
  c.seed = 18446744073709551615ull;
  c.fault = {FaultKind::kTailBlock, "blocks.2", 7};
  const std::string json = c.ToJson();
  EXPECT_NE(json.find("\"layer_norm_eps\":1e-06"), std::string::npos) << json;
  StatusOr<TinyGptConfig> back = TinyGptConfig::FromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), json);
  EXPECT_EQ(back->seed, c.seed);
  EXPECT_EQ(back->layer_norm_eps, c.layer_norm_eps);
  EXPECT_EQ(back->fault, c.fault);
}

TEST(TinyGptConfig, FromJsonKeepsDefaultsForAbsentKeys) {
  StatusOr<TinyGptConfig> c = TinyGptConfig::FromJson(R"( { "n_layers" : 2 } )");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layers, 2);
  EXPECT_EQ(c->d_model, 64);
  EXPECT_EQ(c->fault.kind, FaultKind::kNone);
}

TEST(TinyGptConfig, FromJsonRejectsBadInput) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"d_modle":64})", "unknown key \"d_modle\""},
      {R"({"d_model":"64"})", "\"d_model\": not a number"},
      {R"({"d_model":64.5})", "\"d_model\": not an integer"},
      {R"({"d_model":62})", "multiple of n_heads"},
      {R"({"seed":-1})", "\"seed\": not an unsigned integer"},
      {R"({"seed":"18446744073709551616"})", "\"seed\": not an unsigned integer"},
      {R"({"seed":"-5"})", "\"seed\": not an unsigned integer"},
      {R"({"n_layers":1,"n_layers":2})", "Repeated map key"},
      {R"({"n_layers":1} x)", "Parsing terminated before end of input"},
      {R"({"n_layers":{}})", "\"n_layers\": not a number"},
      {R"({"fault":"nan","fault_layer":"blocks.4"})", "unknown layer 'blocks.4'"},
      {R"({"fault":"tail-block","fault_layer":"ln_f"})", "needs a block layer"},
      {R"({"fault":"eps","fault_layer":"lm_head"})", "layer with a layer norm"},
      {R"({"fault":"sideways"})", "unknown fault kind 'sideways'"},
      {"", "not a JSON object"},
  };
  for (const auto& [json, message] : cases) {
    StatusOr<TinyGptConfig> c = TinyGptConfig::FromJson(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(c.status().message().find(message), std::string::npos)
        << json << " -> " << c.status().message();
  }
}

TEST(TinyGptConfig, LayerNames) {
  TinyGptConfig c;
  std::vector<std::string> names;
  for (int64_t i = 0; i < c.num_layers(); ++i) names.push_back(c.layer_name(i));
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "blocks.0", "blocks.1", "blocks.2",
                                             "blocks.3", "ln_f", "lm_head", "loss"}));
  for (int64_t i = 0; i < c.num_layers(); ++i) EXPECT_EQ(c.layer_index(names[i]), i);
  for (const char* bad : {"blocks.4", "blocks.", "blocks.01", "blocks.-1", "block.1", ""}) {
    EXPECT_EQ(c.layer_index(bad), -1) << bad;
  }
}

TEST(FaultSpec, ParsesAndFormats) {
  for (const char* text : {"none", "bad-data@7", "tail-block:blocks.2@10", "nan:embed@0",
                           "softmax-overflow:blocks.0@3", "eps:ln_f@1", "transient:lm_head@5"}) {
    StatusOr<FaultSpec> spec = ParseFaultSpec(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->ToString(), text);
  }
  StatusOr<FaultSpec> spec = ParseFaultSpec("eps:blocks.1");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(*spec, (FaultSpec{FaultKind::kEps, "blocks.1", 0}));
  for (const char* bad :
       {"nan", "nan@3", "bad-data:blocks.1@2", "nan:embed@x", "nan:embed@-1", "tailblock:blocks.1",
        "nan:embed@", "frozen-updated@3", "decay-on-norm:ln_f", "step-on-overflow"}) {
    EXPECT_FALSE(ParseFaultSpec(bad).ok()) << bad;
  }
  for (FaultKind kind :
       {FaultKind::kNone, FaultKind::kNan, FaultKind::kSoftmaxOverflow, FaultKind::kTailBlock,
        FaultKind::kEps, FaultKind::kBadData, FaultKind::kTransient, FaultKind::kLossSum,
        FaultKind::kLabelsUnshifted, FaultKind::kBadBatch, FaultKind::kDisconnected,
        FaultKind::kPadInLoss, FaultKind::kAccumScale, FaultKind::kFrozenUpdated,
        FaultKind::kDecayOnNorm, FaultKind::kStepOnOverflow, FaultKind::kClipBeforeUnscale}) {
    StatusOr<FaultKind> back = ParseFaultKind(FaultKindName(kind));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, kind);
  }
}

TEST(TinyGpt, SpecRebuildsTheSameModelAndFaultState) {
  TinyGptConfig c;
  c.seed = 42;
  c.fault = {FaultKind::kTransient, "blocks.1", 3};
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  model->SetStep(3);
  (void)RunSequence(model->Path(PathKind::kOptimized), TestBatch());  // consumes the transient
  ASSERT_FALSE(model->transient_armed());

  const ModelSpecInfo spec = model->Spec();
  EXPECT_EQ(spec.registry_name, "tiny_gpt");
  StatusOr<std::unique_ptr<TinyGpt>> rebuilt = TinyGpt::FromSpec(spec);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ((*rebuilt)->config().ToJson(), c.ToJson());
  EXPECT_EQ((*rebuilt)->step(), 3);
  EXPECT_FALSE((*rebuilt)->transient_armed());  // replay must not see the one-shot fault again
  const auto a = model->NamedParameters();
  const auto b = (*rebuilt)->NamedParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
  }
  EXPECT_FALSE(TinyGpt::FromSpec({"other_model", spec.config_json}).ok());
}

// ---------------------------------------------------------------------------------------------
// Parameters.

TEST(TinyGpt, ParametersAreNamedByModulePathAndOwnedByLayers) {
  std::unique_ptr<TinyGpt> model = MakeModel();
  const std::vector<NamedTensor> named = model->NamedParameters();
  EXPECT_EQ(named.size(), 2u + 4 * 12 + 2 + 1);
  std::set<std::string> names;
  for (const auto& [name, t] : named) {
    names.insert(name);
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(t.requires_grad()) << name;
  }
  for (const char* expected :
       {"embed.tok", "embed.pos", "blocks.0.ln1.weight", "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight", "blocks.3.mlp.fc1.weight", "blocks.3.mlp.fc2.bias",
        "ln_f.weight", "lm_head.weight"}) {
    EXPECT_EQ(names.count(expected), 1u) << expected;
  }
  // Every parameter belongs to exactly one layer, as the same tensor (not a copy); both paths
  // report the same ownership.
  LayerSequence& ref = model->Path(PathKind::kReference);
  LayerSequence& opt = model->Path(PathKind::kOptimized);
  size_t owned = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto lp = ref.LayerParameters(i);
    const auto lo = opt.LayerParameters(i);
    ASSERT_EQ(lp.size(), lo.size());
    for (size_t k = 0; k < lp.size(); ++k) {
      EXPECT_TRUE(lp[k].second.is_same(lo[k].second));
      EXPECT_EQ(lp[k].first.rfind(i == 0 ? "embed." : ref.name(i) + ".", 0), 0u) << lp[k].first;
    }
    owned += lp.size();
  }
  EXPECT_EQ(owned, named.size());
  EXPECT_TRUE(ref.LayerParameters(ref.size() - 1).empty());  // loss
  EXPECT_EQ(model->parameters().size(), named.size());
}

TEST(TinyGpt, InitialWeightsDependOnTheSeedOnly) {
  TinyGptConfig c;
  c.seed = 5;
  const auto a = MakeModel(c)->NamedParameters();
  const auto b = MakeModel(c)->NamedParameters();
  c.seed = 6;
  const auto d = MakeModel(c)->NamedParameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second));
  EXPECT_FALSE(at::equal(a[0].second, d[0].second));
}

TEST(TinyGpt, LoadParametersCopiesByName) {
  TinyGptConfig c;
  c.seed = 9;
  std::unique_ptr<TinyGpt> source = MakeModel(c);
  std::unique_ptr<TinyGpt> target = MakeModel();
  std::vector<NamedTensor> params = source->NamedParameters();
  std::reverse(params.begin(), params.end());
  ASSERT_TRUE(target->LoadParameters(params).ok());
  const LayerBatch batch = TestBatch();
  EXPECT_TRUE(at::equal(RunSequence(source->Path(PathKind::kOptimized), batch),
                        RunSequence(target->Path(PathKind::kOptimized), batch)));

  params.pop_back();
  EXPECT_EQ(target->LoadParameters(params).code(), StatusCode::kInvalidArgument);
  c.seed = 10;
  params = MakeModel(c)->NamedParameters();
  params[3].second = at::zeros({2, 2});
  const Status wrong_shape = target->LoadParameters(params);
  EXPECT_EQ(wrong_shape.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_shape.message().find("'blocks.0.ln1.bias' has shape [2, 2], expected [64]"),
            std::string::npos)
      << wrong_shape;
  // A refused load copies nothing, not even the parameters that were fine.
  EXPECT_TRUE(at::equal(RunSequence(source->Path(PathKind::kOptimized), batch),
                        RunSequence(target->Path(PathKind::kOptimized), batch)));
  // The default Model::LoadParameters (TinyGpt has no override): duplicates and strangers too.
  params = source->NamedParameters();
  params.push_back(params[0]);
  EXPECT_NE(target->LoadParameters(params).message().find("given twice"), std::string::npos);
  params.pop_back();
  params.emplace_back("blocks.99.w", at::zeros({1}));
  EXPECT_NE(target->LoadParameters(params).message().find("unknown parameter 'blocks.99.w'"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// A clean model: the two paths agree layer by layer, forward and backward.

TEST(CleanModel, PathsAgreeLayerByLayerForward) {
  std::unique_ptr<TinyGpt> model = MakeModel();
  const Layerwise lw = RunLayerwise(*model, TestBatch());
  PrintLayerErrors("clean forward, scaled error per layer (optimized fp32 vs reference fp64):", lw);
  ASSERT_EQ(lw.names.size(), 8u);
  for (size_t i = 0; i < lw.names.size(); ++i) {
    EXPECT_EQ(lw.reference[i].scalar_type(), at::kDouble) << lw.names[i];
    EXPECT_EQ(lw.optimized[i].scalar_type(), at::kFloat) << lw.names[i];
    EXPECT_LT(ScaledError(lw.optimized[i], lw.reference[i]), kForwardTol) << lw.names[i];
  }
  EXPECT_EQ(lw.reference.back().dim(), 0);  // the loss is a scalar
  // An untrained byte model is close to uniform over 256 bytes: loss ~ ln 256.
  EXPECT_NEAR(lw.reference.back().item<double>(), std::log(256.0), 0.1);
}

TEST(CleanModel, PathsAgreeOnParameterGradients) {
  std::unique_ptr<TinyGpt> model = MakeModel();
  const LayerBatch batch = TestBatch();
  const std::vector<at::Tensor> ref = ParameterGrads(*model, PathKind::kReference, batch);
  const std::vector<at::Tensor> opt = ParameterGrads(*model, PathKind::kOptimized, batch);
  const std::vector<NamedTensor> named = model->NamedParameters();
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(ref[i].scalar_type(), at::kFloat) << "gradients reach the FP32 masters";
    EXPECT_GT(ref[i].abs().max().item<double>(), 0) << named[i].first;
    const double e = ScaledError(opt[i], ref[i]);
    if (e > worst) {
      worst = e;
      worst_name = named[i].first;
    }
    EXPECT_LT(e, kBackwardTol) << named[i].first;
  }
  std::printf("  clean backward: worst scaled parameter-gradient error %.3e (%s)\n", worst,
              worst_name.c_str());
}

// Every layer's output of a full (chained) run of one path.
std::vector<at::Tensor> ChainedOutputs(LayerSequence& seq, const LayerBatch& batch) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> outputs;
  TensorList x = {batch.input_ids};
  for (size_t i = 0; i < seq.size(); ++i) {
    x = seq.Forward(i, x, batch);
    outputs.push_back(x.at(0));
  }
  return outputs;
}

TEST(CleanModel, DropoutMasksMatchAcrossPathsWhenTheGeneratorIsRestored) {
  TinyGptConfig c;
  c.dropout = 0.25;
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  const LayerBatch batch = TestBatch();
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor state = gen.get_state();
  const std::vector<at::Tensor> ref = ChainedOutputs(model->Path(PathKind::kReference), batch);
  gen.set_state(state);
  const std::vector<at::Tensor> opt = ChainedOutputs(model->Path(PathKind::kOptimized), batch);
  gen.set_state(state);
  const std::vector<at::Tensor> again = ChainedOutputs(model->Path(PathKind::kOptimized), batch);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LT(ScaledError(opt[i], ref[i]), kForwardTol) << i;
    EXPECT_TRUE(at::equal(opt[i], again[i])) << i;
  }
  // The embedding output really is dropped out in training and not in evaluation.
  const double dropped = opt[0].eq(0).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(dropped, 0.25, 0.02);
  LayerBatch eval = batch;
  eval.training = false;
  const at::Tensor kept = model->Path(PathKind::kOptimized).Forward(0, {batch.input_ids}, eval)[0];
  EXPECT_EQ(kept.eq(0).sum().item<int64_t>(), 0);
}

TEST(CleanModel, LossHonoursMasksAndLabelAlignment) {
  std::unique_ptr<TinyGpt> model = MakeModel();
  LayerSequence& seq = model->Path(PathKind::kReference);
  LayerBatch batch = TestBatch();
  const at::Tensor full = RunSequence(seq, batch);
  // Ignoring half the positions through labels or through loss_mask gives the same loss.
  LayerBatch by_label = batch;
  by_label.labels = batch.labels.clone();
  by_label.labels.slice(1, 16).fill_(-100);
  LayerBatch by_mask = batch;
  by_mask.loss_mask = batch.loss_mask.clone();
  by_mask.loss_mask.slice(1, 16).fill_(0);
  const at::Tensor a = RunSequence(seq, by_label);
  EXPECT_NEAR(a.item<double>(), RunSequence(seq, by_mask).item<double>(), 1e-12);
  EXPECT_GT(std::abs(a.item<double>() - full.item<double>()), 1e-6);
  // Unshifted labels (aligned with the inputs) score the same targets as the shifted ones.
  LayerBatch unshifted = batch;
  unshifted.labels_shifted = false;
  unshifted.labels = at::cat({batch.input_ids.slice(1, 0, 1), batch.labels}, 1).slice(1, 0, 32);
  LayerBatch shifted_prefix = batch;
  shifted_prefix.labels = batch.labels.clone();
  shifted_prefix.labels.slice(1, 31).fill_(-100);
  EXPECT_NEAR(RunSequence(seq, unshifted).item<double>(),
              RunSequence(seq, shifted_prefix).item<double>(), 1e-12);
}

TEST(CleanModel, RejectsBadInputs) {
  std::unique_ptr<TinyGpt> model = MakeModel();
  LayerSequence& seq = model->Path(PathKind::kOptimized);
  LayerBatch batch = TestBatch();
  EXPECT_THROW(seq.Forward(0, {at::zeros({2, 33}, at::kLong)}, batch), c10::Error);
  EXPECT_THROW(seq.Forward(0, {at::zeros({2, 8}, at::kFloat)}, batch), c10::Error);
  EXPECT_THROW(seq.Forward(1, {}, batch), c10::Error);
  EXPECT_THROW(seq.Forward(8, {batch.input_ids}, batch), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// Faults: each one shows up at the named layer, the way its bug class does, and nowhere before.

struct FaultCase {
  FaultSpec fault;
  int64_t step;
};

Layerwise RunWithFault(const FaultSpec& fault, int64_t step) {
  TinyGptConfig c;
  c.fault = fault;
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  model->SetStep(step);
  return RunLayerwise(*model, TestBatch());
}

void ExpectCleanBefore(const Layerwise& lw, size_t layer) {
  for (size_t i = 0; i < layer; ++i) {
    EXPECT_LT(ScaledError(lw.optimized[i], lw.reference[i]), kForwardTol) << lw.names[i];
  }
}

TEST(Faults, NanPoisonsTheNamedLayerFromItsStep) {
  for (const char* layer : {"embed", "blocks.0", "blocks.2", "ln_f", "lm_head", "loss"}) {
    const FaultSpec fault{FaultKind::kNan, layer, 4};
    const Layerwise before = RunWithFault(fault, 3);
    for (size_t i = 0; i < before.names.size(); ++i) {
      EXPECT_TRUE(AllFinite(before.optimized[i]))
          << layer << " before its step: " << before.names[i];
    }
    for (const int64_t step : {4, 9}) {
      const Layerwise lw = RunWithFault(fault, step);
      const size_t at = lw.index(layer);
      ExpectCleanBefore(lw, at);
      EXPECT_TRUE(at::isnan(lw.optimized[at]).any().item<bool>()) << layer;
      for (size_t i = 0; i < lw.names.size(); ++i) {
        EXPECT_TRUE(AllFinite(lw.reference[i])) << layer << ": reference " << lw.names[i];
      }
      // Layers after it get the reference input in layerwise mode and are clean again.
      for (size_t i = at + 1; i < lw.names.size(); ++i) {
        EXPECT_LT(ScaledError(lw.optimized[i], lw.reference[i]), kForwardTol) << lw.names[i];
      }
    }
  }
}

TEST(Faults, SoftmaxOverflowIsNonFiniteOnlyInTheOptimizedBlock) {
  const FaultSpec fault{FaultKind::kSoftmaxOverflow, "blocks.2", 3};
  const Layerwise early = RunWithFault(fault, 2);
  for (size_t i = 0; i < early.names.size(); ++i) {
    EXPECT_LT(ScaledError(early.optimized[i], early.reference[i]), kForwardTol) << early.names[i];
  }
  const Layerwise lw = RunWithFault(fault, 3);
  PrintLayerErrors("softmax-overflow at blocks.2:", lw);
  const size_t at = lw.index("blocks.2");
  ExpectCleanBefore(lw, at);
  EXPECT_FALSE(AllFinite(lw.optimized[at]));
  for (size_t i = 0; i < lw.names.size(); ++i) {
    EXPECT_TRUE(AllFinite(lw.reference[i])) << lw.names[i];
  }
  for (size_t i = at + 1; i < lw.names.size(); ++i) {
    EXPECT_LT(ScaledError(lw.optimized[i], lw.reference[i]), kForwardTol) << lw.names[i];
  }
}

// Finite faults: the named layer's error is far above FP32 rounding, the layers before it are not.
void ExpectFiniteDivergenceAt(const FaultSpec& fault, double min_error) {
  const Layerwise lw = RunWithFault(fault, fault.from_step);
  PrintLayerErrors(fault.ToString() + ":", lw);
  const size_t at = lw.index(fault.layer);
  ExpectCleanBefore(lw, at);
  EXPECT_TRUE(AllFinite(lw.optimized[at])) << fault.ToString();
  EXPECT_GT(ScaledError(lw.optimized[at], lw.reference[at]), min_error) << fault.ToString();
  for (size_t i = at + 1; i < lw.names.size(); ++i) {
    EXPECT_LT(ScaledError(lw.optimized[i], lw.reference[i]), kForwardTol) << lw.names[i];
  }
  // One step before the fault switches on, the model is clean.
  if (fault.from_step > 0) {
    const Layerwise early = RunWithFault(fault, fault.from_step - 1);
    EXPECT_LT(ScaledError(early.optimized[at], early.reference[at]), kForwardTol);
  }
}

TEST(Faults, TailBlockIsFiniteButWrongAtTheNamedBlock) {
  ExpectFiniteDivergenceAt({FaultKind::kTailBlock, "blocks.1", 2}, 1e-2);
  ExpectFiniteDivergenceAt({FaultKind::kTailBlock, "blocks.3", 0}, 1e-2);
}

// Each kernel fault lives behind one switch: with that switch off the layer agrees with the
// reference again, with the others off it does not. The switches travel in the spec.
TEST(Faults, EachKernelFaultIsGoneWithItsSwitchOff) {
  const std::vector<std::pair<FaultSpec, std::string>> cases = {
      {{FaultKind::kEps, "blocks.1", 0}, "fused_layer_norm"},
      {{FaultKind::kTailBlock, "blocks.1", 0}, "fused_softmax"},
      {{FaultKind::kNan, "blocks.1", 0}, "fused_gelu"},
  };
  const std::vector<std::string> all = {"fused_layer_norm", "fused_softmax", "fused_gelu"};
  for (const auto& [fault, culprit] : cases) {
    TinyGptConfig c;
    c.fault = fault;
    for (const std::string& off : all) {
      std::unique_ptr<TinyGpt> model = MakeModel(c);
      std::vector<std::string> on;
      for (const std::string& name : all) {
        if (name != off) on.push_back(name);
      }
      ASSERT_TRUE(model->SetEnabledFeatures(on).ok());
      EXPECT_EQ(model->EnabledFeatures(), on);
      const Layerwise lw = RunLayerwise(*model, TestBatch());
      const size_t at = lw.index(fault.layer);
      const bool agrees = AllFinite(lw.optimized[at]) &&
                          ScaledError(lw.optimized[at], lw.reference[at]) < kForwardTol;
      EXPECT_EQ(agrees, off == culprit) << fault.ToString() << " with " << off << " off";

      StatusOr<std::unique_ptr<TinyGpt>> rebuilt = TinyGpt::FromSpec(model->Spec());
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
      EXPECT_EQ((*rebuilt)->EnabledFeatures(), on);
    }
  }
  // All on is the default, and then the spec says nothing about switches (earlier capsules'
  // specs are unchanged).
  std::unique_ptr<TinyGpt> model = MakeModel();
  EXPECT_EQ(model->EnabledFeatures(), all);
  EXPECT_EQ(model->Spec().config_json.find("disabled_features"), std::string::npos);
  const Status unknown = model->SetEnabledFeatures({"fused_gelu", "fused_rope"});
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("fused_rope"), std::string::npos);
  EXPECT_EQ(model->EnabledFeatures(), all);  // a refused set changes nothing
  EXPECT_FALSE(TinyGpt::FromSpec({"tiny_gpt", R"({"disabled_features":"fused_rope"})"}).ok());
}

TEST(Faults, GeluGradBreaksOnlyTheNamedBlocksGradients) {
  TinyGptConfig c;
  c.fault = {FaultKind::kGeluGrad, "blocks.1", 0};
  const Layerwise lw = RunWithFault(c.fault, 0);
  for (size_t i = 0; i < lw.names.size(); ++i) {
    EXPECT_LT(ScaledError(lw.optimized[i], lw.reference[i]), kForwardTol) << lw.names[i];
  }
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  const LayerBatch batch = TestBatch();
  auto grads = [&](PathKind path) {
    for (const at::Tensor& p : model->parameters()) p.mutable_grad() = at::Tensor();
    RunSequence(model->Path(path), batch).backward();
    std::map<std::string, at::Tensor> g;
    for (const auto& [name, p] : model->NamedParameters()) g[name] = p.grad().clone();
    return g;
  };
  auto ref = grads(PathKind::kReference);
  auto opt = grads(PathKind::kOptimized);
  EXPECT_GT(ScaledError(opt["blocks.1.mlp.fc1.weight"], ref["blocks.1.mlp.fc1.weight"]), 1e-2);
  EXPECT_LT(ScaledError(opt["blocks.1.mlp.fc2.weight"], ref["blocks.1.mlp.fc2.weight"]), 1e-4);
}

TEST(Faults, EpsIsFiniteButWrongAtTheNamedLayer) {
  ExpectFiniteDivergenceAt({FaultKind::kEps, "blocks.0", 1}, 1e-2);
  ExpectFiniteDivergenceAt({FaultKind::kEps, "ln_f", 0}, 1e-2);
}

TEST(Faults, TransientFiresOnceAndReRunsClean) {
  TinyGptConfig c;
  c.fault = {FaultKind::kTransient, "blocks.1", 5};
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  const LayerBatch batch = TestBatch();
  LayerSequence& opt = model->Path(PathKind::kOptimized);
  LayerSequence& ref = model->Path(PathKind::kReference);

  model->SetStep(4);
  EXPECT_TRUE(AllFinite(RunSequence(opt, batch)));
  EXPECT_TRUE(model->transient_armed());
  model->SetStep(5);
  EXPECT_TRUE(AllFinite(RunSequence(ref, batch)));  // the reference path never fires it
  EXPECT_TRUE(model->transient_armed());
  EXPECT_TRUE(std::isnan(RunSequence(opt, batch).item<float>()));
  EXPECT_FALSE(model->transient_armed());
  const at::Tensor rerun = RunSequence(opt, batch);  // the same step again: clean
  EXPECT_TRUE(AllFinite(rerun));
  EXPECT_LT(ScaledError(rerun, RunSequence(ref, batch)), kForwardTol);
  model->SetStep(6);
  EXPECT_TRUE(AllFinite(RunSequence(opt, batch)));

  model->RearmTransient();
  EXPECT_TRUE(AllFinite(RunSequence(opt, batch)));  // armed, but not its step
  model->SetStep(5);
  const Layerwise lw = RunLayerwise(*model, batch);
  const size_t at = lw.index("blocks.1");
  ExpectCleanBefore(lw, at);
  EXPECT_TRUE(at::isnan(lw.optimized[at]).any().item<bool>());
  EXPECT_TRUE(AllFinite(lw.optimized.back()));  // fired once, in blocks.1 only
}

TEST(Faults, SetFaultValidatesTheLayer) {
  std::unique_ptr<TinyGpt> model = MakeModel();
  EXPECT_EQ(model->SetFault({FaultKind::kTailBlock, "lm_head", 0}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(model->SetFault({FaultKind::kNan, "blocks.9", 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model->fault().kind, FaultKind::kNone);
  ASSERT_TRUE(model->SetFault({FaultKind::kEps, "ln_f", 2}).ok());
  EXPECT_NE(model->Spec().config_json.find("\"fault\":\"eps\""), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Training, and bad data on a trained model.

constexpr int kTrainSteps = 50;

struct Trained {
  std::unique_ptr<TinyGpt> model;
  std::vector<double> losses;
  double ms_per_step = 0;
};

// Trains once per process with Adam on the corpus; shared by the tests below.
const Trained& TrainedModel() {
  static const Trained* trained = [] {
    auto* t = new Trained;
    t->model = MakeModel();
    CorpusLoader loader = MakeLoader(3);
    torch::optim::Adam opt(t->model->parameters(), torch::optim::AdamOptions(3e-3));
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < kTrainSteps; ++step) {
      t->model->SetStep(step);
      const LayerBatch batch = loader.Next().batch;
      opt.zero_grad();
      const at::Tensor loss = RunSequence(t->model->Path(PathKind::kOptimized), batch);
      loss.backward();
      opt.step();
      t->losses.push_back(loss.item<double>());
    }
    const std::chrono::duration<double, std::milli> elapsed =
        std::chrono::steady_clock::now() - start;
    t->ms_per_step = elapsed.count() / kTrainSteps;
    return t;
  }();
  return *trained;
}

double MeanOfLast(const std::vector<double>& v, size_t n) {
  double sum = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) sum += v[i];
  return sum / static_cast<double>(n);
}

TEST(Training, AdamLowersTheLoss) {
  const Trained& t = TrainedModel();
  std::printf(
      "  loss: step 0 %.3f, step %d %.3f (mean of last 5 %.3f); %.1f ms/step "
      "(batch 8, seq 32, forward+backward+Adam, %d intra-op threads)\n",
      t.losses.front(), kTrainSteps - 1, t.losses.back(), MeanOfLast(t.losses, 5), t.ms_per_step,
      at::get_num_threads());
  EXPECT_NEAR(t.losses.front(), std::log(256.0), 0.1);
  EXPECT_LT(MeanOfLast(t.losses, 5), t.losses.front() - 1.5);
  for (double loss : t.losses) EXPECT_TRUE(std::isfinite(loss));
}

TEST(Training, TrainedPathsStillAgree) {
  const Trained& t = TrainedModel();
  const Layerwise lw = RunLayerwise(*t.model, TestBatch());
  PrintLayerErrors("after training:", lw);
  for (size_t i = 0; i < lw.names.size(); ++i) {
    EXPECT_LT(ScaledError(lw.optimized[i], lw.reference[i]), kForwardTol) << lw.names[i];
  }
}

TEST(Faults, BadDataSpikesTheLossOnBothPaths) {
  const Trained& t = TrainedModel();
  const FaultSpec fault{FaultKind::kBadData, "", 60};
  EXPECT_FALSE(FaultCorruptsBatch(fault, 59));
  EXPECT_TRUE(FaultCorruptsBatch(fault, 60));
  EXPECT_FALSE(FaultCorruptsBatch(fault, 61));

  const LayerBatch clean = MakeLoader(11).Next().batch;
  LayerBatch bad = clean;
  bad.labels = clean.labels.clone();
  bad.labels[0][0] = -100;  // ignored positions stay ignored
  LayerBatch bad_copy = bad;
  bad_copy.labels = bad.labels.clone();
  // bad-data corrupts one sample, the first; the rest of the batch is untouched.
  LayerBatch one = bad;
  CorruptBatch(one);
  EXPECT_FALSE(at::equal(one.labels[kCorruptSample], bad.labels[kCorruptSample]));
  EXPECT_TRUE(at::equal(one.labels.slice(0, 1), bad.labels.slice(0, 1)));
  // bad-batch corrupts every sample: the whole batch's loss spikes.
  CorruptBatch(bad, /*every_sample=*/true);
  CorruptBatch(bad_copy, /*every_sample=*/true);
  EXPECT_TRUE(at::equal(bad.labels, bad_copy.labels));  // deterministic
  EXPECT_EQ(bad.labels[0][0].item<int64_t>(), -100);
  EXPECT_TRUE(at::equal(bad.input_ids, clean.input_ids));

  const double running = MeanOfLast(t.losses, 10);
  for (PathKind path : {PathKind::kReference, PathKind::kOptimized}) {
    const double good = RunSequence(t.model->Path(path), clean).item<double>();
    const double spiked = RunSequence(t.model->Path(path), bad).item<double>();
    std::printf("  bad-data on %s: running loss %.3f, clean batch %.3f, corrupted batch %.3f\n",
                PathKindName(path), running, good, spiked);
    EXPECT_TRUE(std::isfinite(spiked));
    EXPECT_GT(spiked, 3 * running);
    EXPECT_GT(spiked, 3 * good);
  }
}

// ---------------------------------------------------------------------------------------------
// Data.

TEST(CorpusLoader, BatchesAreShiftedWindowsOfTheCorpus) {
  CorpusLoader loader = MakeLoader(1);
  const CorpusBatch b = loader.Next();
  ASSERT_EQ(b.batch.input_ids.sizes(), (at::IntArrayRef{8, 32}));
  ASSERT_EQ(b.batch.labels.sizes(), (at::IntArrayRef{8, 32}));
  EXPECT_TRUE(b.batch.labels_shifted);
  ASSERT_EQ(b.cursor.sample_indices.size(), 8u);
  ASSERT_EQ(b.raw_text.size(), 8u);
  for (int64_t s = 0; s < 8; ++s) {
    const int64_t start = b.cursor.sample_indices[s];
    const std::string expected = loader.text().substr(start, 33);
    EXPECT_EQ(b.raw_text[s], expected);
    for (int64_t j = 0; j < 32; ++j) {
      EXPECT_EQ(b.batch.input_ids[s][j].item<int64_t>(), static_cast<unsigned char>(expected[j]));
      EXPECT_EQ(b.batch.labels[s][j].item<int64_t>(), static_cast<unsigned char>(expected[j + 1]));
    }
  }
  EXPECT_EQ(b.batch.loss_mask.sum().item<int64_t>(), 8 * 32);
}

TEST(CorpusLoader, IsDeterministicPerSeed) {
  CorpusLoader a = MakeLoader(1);
  CorpusLoader b = MakeLoader(1);
  CorpusLoader c = MakeLoader(2);
  for (int i = 0; i < 5; ++i) {
    const CorpusBatch x = a.Next();
    const CorpusBatch y = b.Next();
    EXPECT_EQ(x.cursor.sample_indices, y.cursor.sample_indices);
    EXPECT_TRUE(at::equal(x.batch.input_ids, y.batch.input_ids));
    EXPECT_NE(x.cursor.sample_indices, c.Next().cursor.sample_indices);
  }
}

TEST(CorpusLoader, RestoringTheRngStateRepeatsTheBatch) {
  CorpusLoader loader = MakeLoader(1);
  loader.Next();
  const std::string state = loader.SaveRngState();
  const DataCursor cursor = loader.cursor();
  const CorpusBatch first = loader.Next();
  const CorpusBatch second = loader.Next();
  EXPECT_NE(first.cursor.sample_indices, second.cursor.sample_indices);

  CorpusLoader fresh = MakeLoader(99);  // another seed: only the restored state matters
  ASSERT_TRUE(fresh.RestoreRngState(state).ok());
  fresh.set_cursor(cursor);
  const CorpusBatch again = fresh.Next();
  EXPECT_EQ(again.cursor.sample_indices, first.cursor.sample_indices);
  EXPECT_EQ(again.cursor.offset, first.cursor.offset);
  EXPECT_TRUE(at::equal(again.batch.input_ids, first.batch.input_ids));
  EXPECT_TRUE(at::equal(again.batch.labels, first.batch.labels));
  EXPECT_EQ(fresh.Next().cursor.sample_indices, second.cursor.sample_indices);
  EXPECT_TRUE(fresh.SaveRngState() == loader.SaveRngState());

  const std::string before = fresh.SaveRngState();
  EXPECT_EQ(fresh.RestoreRngState("not a state").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.RestoreRngState(state + " 17").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fresh.SaveRngState() == before);  // unchanged by a failed restore
}

TEST(CorpusLoader, CursorCountsEpochs) {
  CorpusLoaderOptions options;
  options.batch_size = 3;
  options.seq_len = 4;
  StatusOr<CorpusLoader> loader = CorpusLoader::FromText("abcdefghijklmnopqrstuvwxyz", options);
  ASSERT_TRUE(loader.ok());
  EXPECT_EQ(loader->sequences_per_epoch(), 6);
  EXPECT_EQ(loader->num_start_offsets(), 22);
  loader->Next();
  EXPECT_EQ(loader->cursor().epoch, 0);
  EXPECT_EQ(loader->cursor().offset, 3);
  loader->Next();
  loader->Next();
  EXPECT_EQ(loader->cursor().epoch, 1);
  EXPECT_EQ(loader->cursor().offset, 3);
  for (int i = 0; i < 100; ++i) {
    for (int64_t start : loader->Next().cursor.sample_indices) {
      EXPECT_GE(start, 0);
      EXPECT_LE(start + options.seq_len, 25);
    }
  }
  EXPECT_FALSE(CorpusLoader::FromText("abcd", options).ok());
  EXPECT_EQ(CorpusLoader::Open("/nonexistent/corpus.txt", options).status().code(),
            StatusCode::kNotFound);
}

TEST(DataFiles, ArePresentAndAscii) {
  for (const std::string& path : {CorpusPath(), TokenizerPath(), ChatTemplatePath()}) {
    CorpusLoaderOptions options;
    options.seq_len = 1;
    StatusOr<CorpusLoader> file = CorpusLoader::Open(path, options);
    ASSERT_TRUE(file.ok()) << path << ": " << file.status();
    for (const char ch : file->text()) {
      ASSERT_LT(static_cast<unsigned char>(ch), 0x80) << path;
    }
  }
  StatusOr<CorpusLoader> corpus = CorpusLoader::Open(CorpusPath(), {});
  ASSERT_TRUE(corpus.ok());
  EXPECT_GT(corpus->text().size(), 20000u);
}

}  // namespace
}  // namespace capsule::tiny_gpt
