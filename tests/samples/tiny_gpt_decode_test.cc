// tiny_gpt's inference options (rotary positions, grouped-query attention, padding) and its
// incremental decoder: options off leave the config and the paths as they were, options on keep
// the two training paths in agreement, and a cached decode reproduces the whole-sequence logits.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "capsule/model/decoder.h"
#include "samples/tiny_gpt/faults.h"
#include "samples/tiny_gpt/tiny_gpt.h"
#include "samples/tiny_gpt/tiny_gpt_config.h"

namespace capsule::tiny_gpt {
namespace {

std::unique_ptr<TinyGpt> MakeModel(const TinyGptConfig& config) {
  StatusOr<std::unique_ptr<TinyGpt>> model = TinyGpt::Create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

TinyGptConfig RotaryGrouped() {
  TinyGptConfig c;
  c.d_model = 48;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.n_layers = 2;
  c.rope = true;
  c.rope_base = 500;
  c.rope_scale = 4;
  c.pad_mask = true;
  return c;
}

LayerBatch PaddedBatch(const TinyGptConfig& c, int64_t t) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  LayerBatch batch;
  batch.input_ids = at::randint(c.vocab_size, {2, t}, gen, at::kLong);
  batch.labels = batch.input_ids;
  batch.labels_shifted = false;
  batch.training = false;
  batch.attention_mask = at::ones({2, t}, at::kLong);
  batch.attention_mask[1].slice(0, 0, 2).zero_();
  return batch;
}

double MaxScaledError(const at::Tensor& c, const at::Tensor& r) {
  const at::Tensor cd = c.detach().to(at::kDouble);
  const at::Tensor rd = r.detach().to(at::kDouble);
  return ((cd - rd).abs().max() / rd.abs().max()).item<double>();
}

// The logits of prefill [0, prefill) and then one token per step, through the whole decoder.
at::Tensor DecodeLogits(TinyGpt& model, const LayerBatch& batch, int64_t prefill) {
  at::NoGradGuard no_grad;
  IncrementalDecoder& dec = model.Decoder();
  dec.ResetCache();
  TensorList steps;
  const int64_t t = batch.input_ids.size(1);
  for (int64_t start = 0; start < t; start += start == 0 ? prefill : 1) {
    const int64_t len = start == 0 ? prefill : 1;
    DecodeStep step{batch.input_ids.slice(1, start, start + len), {}, start};
    if (batch.attention_mask.defined()) {
      step.attention_mask = batch.attention_mask.slice(1, 0, start + len);
    }
    TensorList x = {step.input_ids};
    for (size_t i = 0; i < dec.size(); ++i) x = dec.ForwardStep(i, x, step);
    steps.push_back(x[0]);
  }
  return at::cat(steps, 1);
}

at::Tensor FullLogits(TinyGpt& model, PathKind path, const LayerBatch& batch) {
  at::NoGradGuard no_grad;
  LayerSequence& seq = model.Path(path);
  TensorList x = {batch.input_ids};
  for (size_t i = 0; i + 1 < seq.size(); ++i) x = seq.Forward(i, x, batch);
  return x[0];
}

TEST(InferenceOptions, OffLeaveTheConfigJsonAsItWas) {
  // With the inference options off, their keys are not written.
  EXPECT_EQ(TinyGptConfig{}.ToJson(),
            "{\"d_model\":64,\"dropout\":0,\"fault\":\"none\",\"fault_from_step\":0,"
            "\"fault_layer\":\"\",\"layer_norm_eps\":1e-05,\"mlp_mult\":4,\"n_heads\":4,"
            "\"n_layers\":4,\"seed\":0,\"seq_len\":32,\"vocab_size\":256}");
  // The JSON every earlier capsule's model spec holds (keys in declaration order) still loads as
  // the same config.
  StatusOr<TinyGptConfig> earlier = TinyGptConfig::FromJson(
      "{\"vocab_size\":256,\"d_model\":64,\"n_heads\":4,\"n_layers\":4,\"seq_len\":32,"
      "\"mlp_mult\":4,\"dropout\":0,\"layer_norm_eps\":1e-05,\"seed\":0,\"fault\":\"none\","
      "\"fault_layer\":\"\",\"fault_from_step\":0}");
  ASSERT_TRUE(earlier.ok()) << earlier.status();
  EXPECT_EQ(earlier->ToJson(), TinyGptConfig{}.ToJson());
}

TEST(InferenceOptions, RoundTripThroughJson) {
  TinyGptConfig c = RotaryGrouped();
  c.fault = {FaultKind::kGqaDecodeMap, "blocks.1", 3};
  const std::string json = c.ToJson();
  StatusOr<TinyGptConfig> back = TinyGptConfig::FromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), json);
  EXPECT_TRUE(back->rope);
  EXPECT_EQ(back->rope_base, 500);
  EXPECT_EQ(back->rope_scale, 4);
  EXPECT_EQ(back->kv_heads(), 2);
  EXPECT_TRUE(back->pad_mask);
  EXPECT_EQ(back->fault, c.fault);
}

TEST(InferenceOptions, DecodeFaultsNeedTheOptionTheyBreak) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"fault":"rope-decode-position","fault_layer":"blocks.0"})", "needs rope"},
      {R"({"fault":"rerotated-key","fault_layer":"blocks.0"})", "needs rope"},
      {R"({"fault":"gqa-decode-map","fault_layer":"blocks.0"})", "needs n_kv_heads < n_heads"},
      {R"({"fault":"left-pad-positions"})", "needs pad_mask"},
      {R"({"fault":"dropout-in-eval","fault_layer":"blocks.0"})", "needs dropout > 0"},
      {R"({"fault":"mask-offset","fault_layer":"ln_f"})", "needs a block layer"},
      {R"({"n_kv_heads":3})", "must divide n_heads"},
      {R"({"rope":true,"d_model":60,"n_heads":4,"n_kv_heads":0})", "even head width"},
      {R"({"rope_scale":0})", "rope_scale must be > 0"},
  };
  for (const auto& [json, message] : cases) {
    StatusOr<TinyGptConfig> c = TinyGptConfig::FromJson(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(c.status().message().find(message), std::string::npos)
        << json << " -> " << c.status().message();
  }
  for (const char* text :
       {"mask-offset:blocks.1@0", "rope-decode-position:blocks.0@2", "rerotated-key:blocks.3@0",
        "gqa-decode-map:blocks.0@1", "left-pad-positions@4", "dropout-in-eval:blocks.2@0"}) {
    StatusOr<FaultSpec> spec = ParseFaultSpec(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->ToString(), text);
  }
}

TEST(InferenceOptions, TrainingPathsStillAgreeWithThemOn) {
  const TinyGptConfig c = RotaryGrouped();
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  const LayerBatch batch = PaddedBatch(c, 20);
  const at::Tensor ref = FullLogits(*model, PathKind::kReference, batch);
  const at::Tensor opt = FullLogits(*model, PathKind::kOptimized, batch);
  EXPECT_LT(MaxScaledError(opt, ref), 1e-5);
  // The padding is read: the padded sample's logits are not what it gets unpadded.
  LayerBatch unmasked = batch;
  unmasked.attention_mask = at::Tensor();
  EXPECT_GT(MaxScaledError(FullLogits(*model, PathKind::kReference, unmasked)[1], ref[1]), 1e-3);
}

// A learned position table under rope would be a parameter the loss never reaches (replay's
// gradients stage names such a parameter): with rope the model has none, and every parameter
// gets a gradient.
TEST(InferenceOptions, RopeModelsHaveNoPositionTableAndEveryParameterLearns) {
  const TinyGptConfig c = RotaryGrouped();
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  for (const auto& [name, tensor] : model->NamedParameters()) EXPECT_NE(name, "embed.pos");
  LayerBatch batch = PaddedBatch(c, 10);
  batch.training = true;
  const at::Tensor loss = RunSequence(model->Path(PathKind::kReference), batch);
  loss.backward();
  for (const auto& [name, tensor] : model->NamedParameters()) {
    ASSERT_TRUE(tensor.grad().defined()) << name;
    EXPECT_GT(tensor.grad().abs().sum().item<double>(), 0) << name;
  }
}

TEST(Decoder, CachedDecodeReproducesTheWholeSequenceLogits) {
  for (const TinyGptConfig& c : {TinyGptConfig{}, RotaryGrouped()}) {
    std::unique_ptr<TinyGpt> model = MakeModel(c);
    const LayerBatch batch = PaddedBatch(c, 18);
    const at::Tensor full = FullLogits(*model, PathKind::kOptimized, batch);
    for (int64_t prefill : {1, 6, 17}) {
      EXPECT_LT(MaxScaledError(DecodeLogits(*model, batch, prefill), full), 1e-5)
          << c.ToJson() << " prefill " << prefill;
    }
  }
}

TEST(Decoder, MaskOffsetFaultChangesOnlyDecodedPositions) {
  TinyGptConfig c;
  c.fault = {FaultKind::kMaskOffset, "blocks.2", 0};
  std::unique_ptr<TinyGpt> model = MakeModel(c);
  const LayerBatch batch = PaddedBatch(c, 12);
  const at::Tensor full = FullLogits(*model, PathKind::kOptimized, batch);
  const at::Tensor decoded = DecodeLogits(*model, batch, 7);
  EXPECT_LT(MaxScaledError(decoded.slice(1, 0, 7), full.slice(1, 0, 7)), 1e-5);
  EXPECT_GT(MaxScaledError(decoded.slice(1, 7, 8), full.slice(1, 7, 8)), 1e-2);
}

TinyGptConfig WithAdapter(TinyGptConfig c) {
  c.lora_rank = 4;
  c.lora_alpha = 16;
  c.lora_seed = 9;
  return c;
}

TEST(Adapter, RoundTripsThroughJsonAndItsFaultsNeedIt) {
  TinyGptConfig c = WithAdapter(RotaryGrouped());
  c.fault = {FaultKind::kMergeTwice, "blocks.1", 0};
  const std::string json = c.ToJson();
  for (const char* key : {"\"lora_rank\":4", "\"lora_alpha\":16", "\"lora_seed\":9"}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
  StatusOr<TinyGptConfig> back = TinyGptConfig::FromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), json);
  EXPECT_EQ(back->lora_scale(), 4.0);
  for (const char* json : {R"({"fault":"bf16-merge","fault_layer":"blocks.0"})",
                           R"({"fault":"merge-twice","fault_layer":"blocks.0"})"}) {
    StatusOr<TinyGptConfig> bad = TinyGptConfig::FromJson(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find("needs lora_rank > 0"), std::string::npos)
        << bad.status();
  }
  EXPECT_FALSE(TinyGptConfig::FromJson(R"({"lora_rank":-1})").ok());
  for (const char* text : {"bf16-merge:blocks.1@0", "merge-twice:blocks.0@3"}) {
    StatusOr<FaultSpec> spec = ParseFaultSpec(text);
    ASSERT_TRUE(spec.ok()) << text;
    EXPECT_EQ(spec->ToString(), text);
  }
}

// The adapter is applied at run time by both training paths and by the decoder, which then
// reproduces the whole-sequence logits, as it does with the adapter merged in float32.
TEST(Adapter, ChangesTheLogitsAndEveryPathAgrees) {
  for (const TinyGptConfig& base : {TinyGptConfig{}, RotaryGrouped()}) {
    const TinyGptConfig c = WithAdapter(base);
    std::unique_ptr<TinyGpt> plain = MakeModel(base);
    std::unique_ptr<TinyGpt> model = MakeModel(c);
    const LayerBatch batch = PaddedBatch(c, 12);
    const at::Tensor ref = FullLogits(*model, PathKind::kReference, batch);
    const at::Tensor opt = FullLogits(*model, PathKind::kOptimized, batch);
    EXPECT_LT(MaxScaledError(opt, ref), 1e-5);
    EXPECT_GT(MaxScaledError(FullLogits(*plain, PathKind::kReference, batch), ref), 1e-2);
    // Not a parameter: the base weights are those of the model without it.
    EXPECT_EQ(model->NamedParameters().size(), plain->NamedParameters().size());
    EXPECT_LT(MaxScaledError(DecodeLogits(*model, batch, 5), opt), 1e-5);
    model->Decoder().MergeAdapters(at::kFloat);
    EXPECT_LT(MaxScaledError(DecodeLogits(*model, batch, 5), opt), 1e-5);
    ASSERT_EQ(model->Decoder().Adapters(1).size(), 1u);
    EXPECT_TRUE(model->Decoder().Adapters(1)[0].merged.defined());
    EXPECT_TRUE(model->Decoder().Adapters(0).empty());
    model->Decoder().MergeAdapters(std::nullopt);
    EXPECT_FALSE(model->Decoder().Adapters(1)[0].merged.defined());
  }
}

TEST(Decoder, RefusesAStepThatDoesNotContinueTheCache) {
  std::unique_ptr<TinyGpt> model = MakeModel(TinyGptConfig{});
  IncrementalDecoder& dec = model->Decoder();
  dec.ResetCache();
  const DecodeStep step{at::zeros({1, 2}, at::kLong), {}, 3};
  try {
    dec.ForwardStep(0, {step.input_ids}, step);
    FAIL() << "a step at past 3 on an empty cache ran";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("cache holds 0 positions"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace capsule::tiny_gpt
