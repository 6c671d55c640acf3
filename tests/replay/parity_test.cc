// Parity replay (replay/parity.h) on tiny_gpt's incremental decoder: clean decodes of two model
// shapes give no finding, and each decode fault is named at its check, layer and first position,
// for two prefill lengths and two seeds.
#include "capsule/replay/parity.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "capsule/proto/parity.pb.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

using tiny_gpt::FaultKind;
using tiny_gpt::FaultSpec;
using tiny_gpt::TinyGpt;
using tiny_gpt::TinyGptConfig;

constexpr int64_t kLength = 16;
constexpr int64_t kLeftPad = 3;  // pad tokens before sample 0's prompt

// The default shape: learned positions, multi-head attention.
TinyGptConfig LearnedShape(uint64_t seed) {
  TinyGptConfig c;
  c.seed = seed;
  return c;
}

// A second shape: rotary positions with scaling, grouped-query attention, padding-aware.
TinyGptConfig RotaryShape(uint64_t seed) {
  TinyGptConfig c;
  c.seed = seed;
  c.d_model = 48;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.n_layers = 3;
  c.mlp_mult = 2;
  c.rope = true;
  c.rope_scale = 2.0;
  c.pad_mask = true;
  return c;
}

// Random tokens; with pad_mask, sample 0 is left-padded by kLeftPad.
LayerBatch Batch(const TinyGptConfig& c, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 100);
  LayerBatch batch;
  batch.input_ids = at::randint(c.vocab_size, {2, kLength}, gen, at::kLong);
  batch.training = false;
  if (c.pad_mask) {
    batch.attention_mask = at::ones({2, kLength}, at::kLong);
    batch.attention_mask[0].slice(0, 0, kLeftPad).zero_();
    batch.input_ids[0].slice(0, 0, kLeftPad).zero_();
  }
  return batch;
}

v1::ParityReport RunCase(const TinyGptConfig& config, uint64_t seed, int64_t prefill,
                         int64_t chunk = 0) {
  StatusOr<std::unique_ptr<TinyGpt>> model = TinyGpt::Create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  ParityOptions options;
  options.prefill = prefill;
  options.chunk = chunk;
  StatusOr<v1::ParityReport> report = RunParity(**model, Batch(config, seed), options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *report : v1::ParityReport();
}

std::string Failed(const v1::ParityReport& r) {
  for (const v1::ParityFinding& f : r.findings()) {
    if (f.failed()) return f.check();
  }
  return "";
}

TEST(Parity, CleanDecodesOfTwoShapesHaveNoFinding) {
  for (auto shape : {LearnedShape, RotaryShape}) {
    for (uint64_t seed : {1, 2}) {
      for (const auto& [prefill, chunk] : std::vector<std::pair<int64_t, int64_t>>{
               {5, 0}, {11, 0}, {1, 0}, {kLength, 4}, {9, 3}}) {
        const TinyGptConfig c = shape(seed);
        const v1::ParityReport r = RunCase(c, seed, prefill, chunk);
        SCOPED_TRACE(c.ToJson() + " prefill " + std::to_string(prefill) + " chunk " +
                     std::to_string(chunk));
        EXPECT_FALSE(r.diverged()) << r.first_divergent_layer() << " at "
                                   << r.first_divergent_position() << " ratio " << r.worst_ratio();
        EXPECT_EQ(r.findings_size(), 0);
        EXPECT_FALSE(r.nondeterministic());
        EXPECT_EQ(r.positions_size(), kLength);
        // The tolerance comes from the decoder's dtype, and clean runs keep well inside it.
        EXPECT_EQ(r.tolerance().dtype(), "Float");
        EXPECT_EQ(r.tolerance().atol(), DefaultTolerance(at::kFloat).atol);
        for (const v1::ParityLayer& layer : r.layers()) EXPECT_LT(layer.worst_ratio(), 0.5);
      }
    }
  }
}

struct FaultCase {
  std::string name;
  TinyGptConfig (*shape)(uint64_t);
  FaultSpec fault;
  double dropout;
  const char* check;
  std::string layer;      // the first divergent layer
  std::string cached;     // the cached tensor that departs first ("" for none)
  bool cached_at_prefix;  // it departs before the first decoded position (not at it)
};

class ParityFault : public ::testing::TestWithParam<FaultCase> {};

TEST_P(ParityFault, IsNamedAtItsCheckLayerAndFirstPosition) {
  const FaultCase& fc = GetParam();
  for (uint64_t seed : {1, 2}) {
    for (int64_t prefill : {5, 11}) {
      TinyGptConfig c = fc.shape(seed);
      c.dropout = fc.dropout;
      c.fault = fc.fault;
      SCOPED_TRACE(fc.name + " seed " + std::to_string(seed) + " prefill " +
                   std::to_string(prefill));
      const v1::ParityReport r = RunCase(c, seed, prefill);
      ASSERT_TRUE(r.diverged());
      EXPECT_EQ(r.first_divergent_position(), prefill);
      EXPECT_EQ(r.first_divergent_layer(), fc.layer);
      EXPECT_EQ(Failed(r), fc.check);
      EXPECT_EQ(r.first_cached_tensor(), fc.cached);
      if (fc.cached_at_prefix) {
        // A key already in the cache before the first decode step changed (position 0 turns by
        // angle 0, so the first one that can is 1).
        EXPECT_LT(r.first_cached_position(), prefill);
      } else if (!fc.cached.empty()) {
        EXPECT_EQ(r.first_cached_position(), prefill);
      }
      EXPECT_GT(r.worst_ratio(), 1.0);
      // Every position before the first divergence agrees.
      for (int64_t p = 0; p < prefill; ++p) EXPECT_FALSE(r.positions(p).diverged()) << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DecodeFaults, ParityFault,
                         ::testing::Values(FaultCase{"mask_offset",
                                                     LearnedShape,
                                                     {FaultKind::kMaskOffset, "blocks.1", 0},
                                                     0,
                                                     kCheckMaskOffset,
                                                     "blocks.1",
                                                     "",
                                                     false},
                                           FaultCase{"mask_offset_rotary",
                                                     RotaryShape,
                                                     {FaultKind::kMaskOffset, "blocks.2", 0},
                                                     0,
                                                     kCheckMaskOffset,
                                                     "blocks.2",
                                                     "",
                                                     false},
                                           FaultCase{"rope_position",
                                                     RotaryShape,
                                                     {FaultKind::kRopeDecode, "blocks.1", 0},
                                                     0,
                                                     kCheckRopePosition,
                                                     "blocks.1",
                                                     "k",
                                                     false},
                                           FaultCase{"rerotated_key",
                                                     RotaryShape,
                                                     {FaultKind::kRerotatedKey, "blocks.0", 0},
                                                     0,
                                                     kCheckRerotatedKey,
                                                     "blocks.0",
                                                     "k",
                                                     true},
                                           FaultCase{"gqa_map",
                                                     RotaryShape,
                                                     {FaultKind::kGqaDecodeMap, "blocks.1", 0},
                                                     0,
                                                     kCheckKvHeadMap,
                                                     "blocks.1",
                                                     "",
                                                     false},
                                           FaultCase{"left_pad_learned",
                                                     [](uint64_t seed) {
                                                       TinyGptConfig c = LearnedShape(seed);
                                                       c.pad_mask = true;
                                                       return c;
                                                     },
                                                     {FaultKind::kLeftPadPositions, "", 0},
                                                     0,
                                                     kCheckPositionIds,
                                                     "embed",
                                                     "pos",
                                                     false},
                                           FaultCase{"left_pad_rotary",
                                                     RotaryShape,
                                                     {FaultKind::kLeftPadPositions, "", 0},
                                                     0,
                                                     kCheckPositionIds,
                                                     "blocks.0",
                                                     "pos",
                                                     false},
                                           FaultCase{"dropout_in_eval",
                                                     LearnedShape,
                                                     {FaultKind::kDropoutInEval, "blocks.2", 0},
                                                     0.1,
                                                     kCheckEvalDropout,
                                                     "blocks.2",
                                                     "",
                                                     false}),
                         [](const ::testing::TestParamInfo<FaultCase>& info) {
                           return info.param.name;
                         });

TEST(Parity, ChunkedPrefillNamesTheMaskOffsetAtTheSecondChunk) {
  for (uint64_t seed : {1, 2}) {
    for (int64_t chunk : {4, 6}) {
      TinyGptConfig c = LearnedShape(seed);
      c.fault = {FaultKind::kMaskOffset, "blocks.3", 0};
      const v1::ParityReport r = RunCase(c, seed, kLength, chunk);
      ASSERT_TRUE(r.diverged());
      EXPECT_EQ(r.schedule().prefill(), kLength);
      EXPECT_EQ(r.first_divergent_position(), chunk);
      EXPECT_EQ(r.first_divergent_layer(), "blocks.3");
      EXPECT_EQ(Failed(r), kCheckMaskOffset);
    }
  }
}

TEST(Parity, RefusesBadOptions) {
  StatusOr<std::unique_ptr<TinyGpt>> model = TinyGpt::Create(TinyGptConfig{});
  ASSERT_TRUE(model.ok());
  ParityOptions options;
  options.prefill = kLength + 1;
  StatusOr<v1::ParityReport> r = RunParity(**model, Batch(TinyGptConfig{}, 1), options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("prefill must be in 0..16"), std::string::npos);
  r = RunParity(**model, LayerBatch{}, ParityOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("input_ids"), std::string::npos);
}

}  // namespace
}  // namespace capsule
