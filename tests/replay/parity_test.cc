// Parity replay (replay/parity.h) on tiny_gpt's incremental decoder: clean decodes of two model
// shapes give no finding, and each decode fault is named at its check, layer and first position,
// for two prefill lengths and two seeds. In adapter mode, clean float32 and bfloat16 merges give
// no finding and each merge fault is named at its adapter check and layer, on tiny_gpt and on a
// second model built here.
#include "capsule/replay/parity.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capsule/model/decoder.h"
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

// Adapter mode: the decoder runs with each block's low-rank adapter merged into attn.proj, the
// reference applies it at run time in FP64.
TinyGptConfig WithAdapter(TinyGptConfig c) {
  c.lora_rank = 4;
  c.lora_alpha = 8;
  c.lora_seed = c.seed + 10;
  return c;
}

v1::ParityReport RunAdapterCase(const TinyGptConfig& config, uint64_t seed, int64_t prefill,
                                at::ScalarType merge) {
  StatusOr<std::unique_ptr<TinyGpt>> model = TinyGpt::Create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  ParityOptions options;
  options.prefill = prefill;
  options.adapter_merge = merge;
  StatusOr<v1::ParityReport> report = RunParity(**model, Batch(config, seed), options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *report : v1::ParityReport();
}

const v1::ParityFinding* FirstFailure(const v1::ParityReport& r) {
  for (const v1::ParityFinding& f : r.findings()) {
    if (f.failed()) return &f;
  }
  return nullptr;
}

TEST(ParityAdapter, CleanMergesOfTwoShapesHaveNoFindingInFp32AndBf16) {
  for (auto shape : {LearnedShape, RotaryShape}) {
    for (uint64_t seed : {1, 2}) {
      for (at::ScalarType merge : {at::kFloat, at::kBFloat16}) {
        const TinyGptConfig c = WithAdapter(shape(seed));
        SCOPED_TRACE(c.ToJson() + " merged in " + c10::toString(merge));
        const v1::ParityReport r = RunAdapterCase(c, seed, 5, merge);
        EXPECT_FALSE(r.diverged()) << r.first_divergent_layer() << " ratio " << r.worst_ratio();
        EXPECT_EQ(r.findings_size(), 0);
        // Judged with the merge dtype's tolerance, and well inside it.
        EXPECT_EQ(r.tolerance().dtype(), c10::toString(merge));
        EXPECT_EQ(r.tolerance().atol(), DefaultTolerance(merge).atol);
        EXPECT_EQ(r.adapter_merge_dtype(), c10::toString(merge));
        for (const v1::ParityLayer& layer : r.layers()) EXPECT_LT(layer.worst_ratio(), 0.5);
        ASSERT_EQ(r.adapters_size(), c.n_layers);
        for (const v1::ParityAdapter& a : r.adapters()) {
          EXPECT_NEAR(a.delta_ratio(), 1.0, merge == at::kFloat ? 1e-6 : 1e-2) << a.weight();
          EXPECT_LE(a.rounding_eps(), a.rounding_bound()) << a.weight();
          EXPECT_EQ(a.rank(), 4);
          EXPECT_EQ(a.scale(), 2.0);
        }
      }
    }
  }
}

// The adapter applied at run time by both sides is no divergence either, and the training paths
// are unchanged by an adapter's presence in the decoder.
TEST(ParityAdapter, AdapterAppliedAtRunTimeByTheDecoderAgrees) {
  for (auto shape : {LearnedShape, RotaryShape}) {
    const v1::ParityReport r = RunCase(WithAdapter(shape(1)), 1, 5);
    EXPECT_FALSE(r.diverged()) << r.first_divergent_layer();
    EXPECT_EQ(r.findings_size(), 0);
    EXPECT_EQ(r.adapters_size(), 0);
  }
}

struct AdapterFaultCase {
  std::string name;
  TinyGptConfig (*shape)(uint64_t);
  FaultSpec fault;
  at::ScalarType merge;
  const char* check;
  bool diverges;  // surely, at the merge dtype's tolerance
};

class ParityAdapterFault : public ::testing::TestWithParam<AdapterFaultCase> {};

TEST_P(ParityAdapterFault, IsNamedAtItsCheckLayerAndFirstPosition) {
  const AdapterFaultCase& fc = GetParam();
  for (uint64_t seed : {1, 2}) {
    for (int64_t prefill : {5, 11}) {
      TinyGptConfig c = WithAdapter(fc.shape(seed));
      c.fault = fc.fault;
      SCOPED_TRACE(fc.name + " seed " + std::to_string(seed) + " prefill " +
                   std::to_string(prefill));
      const v1::ParityReport r = RunAdapterCase(c, seed, prefill, fc.merge);
      EXPECT_TRUE(r.diverged() || !fc.diverges);
      if (r.diverged()) {
        // A merged weight acts from the first position on, prefill or decode alike.
        EXPECT_EQ(r.first_divergent_position(), 0);
        EXPECT_EQ(r.first_divergent_layer(), fc.fault.layer);
      }
      const v1::ParityFinding* f = FirstFailure(r);
      ASSERT_NE(f, nullptr);
      EXPECT_EQ(f->check(), fc.check);
      EXPECT_EQ(f->layer(), fc.fault.layer);
      EXPECT_EQ(f->position(), 0);
      EXPECT_EQ(f->tensor(), fc.fault.layer + ".attn.proj.weight");
      EXPECT_GT(f->value(), f->threshold());
      // The numbers that tell the two apart: the faulty layer's delta ratio and rounding error.
      for (const v1::ParityAdapter& a : r.adapters()) {
        if (a.layer() != fc.fault.layer) {
          EXPECT_LE(a.rounding_eps(), a.rounding_bound()) << a.layer();
          continue;
        }
        if (std::string(fc.check) == kCheckAdapterMergedTwice) {
          EXPECT_NEAR(a.delta_ratio(), 2.0, 1e-2);
        } else {
          // Rounded in bfloat16, judged in float32: within bfloat16's half-ulp, far beyond
          // float32's.
          EXPECT_NEAR(a.delta_ratio(), 1.0, 1e-2);
          EXPECT_GT(a.rounding_eps(), 1000 * a.rounding_bound());
          EXPECT_LE(a.rounding_eps() * a.eps(), 0.0078125);
        }
      }
      // Only the merge checks ran for the faulty layer's weight: no cache or attention finding.
      for (const v1::ParityFinding& g : r.findings()) {
        EXPECT_EQ(g.check().rfind("adapter.", 0), 0u) << g.check();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MergeFaults, ParityAdapterFault,
                         ::testing::Values(AdapterFaultCase{"bf16_merge",
                                                            LearnedShape,
                                                            {FaultKind::kBf16Merge, "blocks.1", 0},
                                                            at::kFloat,
                                                            kCheckAdapterRounding,
                                                            true},
                                           AdapterFaultCase{"bf16_merge_rotary",
                                                            RotaryShape,
                                                            {FaultKind::kBf16Merge, "blocks.2", 0},
                                                            at::kFloat,
                                                            kCheckAdapterRounding,
                                                            true},
                                           AdapterFaultCase{"merged_twice",
                                                            LearnedShape,
                                                            {FaultKind::kMergeTwice, "blocks.2", 0},
                                                            at::kFloat,
                                                            kCheckAdapterMergedTwice,
                                                            true},
                                           AdapterFaultCase{"merged_twice_rotary",
                                                            RotaryShape,
                                                            {FaultKind::kMergeTwice, "blocks.0", 0},
                                                            at::kFloat,
                                                            kCheckAdapterMergedTwice,
                                                            true},
                                           // In bfloat16 the doubled delta can hide within the
                                           // activations' tolerance; the weights still show it.
                                           AdapterFaultCase{"merged_twice_bf16",
                                                            LearnedShape,
                                                            {FaultKind::kMergeTwice, "blocks.3", 0},
                                                            at::kBFloat16,
                                                            kCheckAdapterMergedTwice,
                                                            false}),
                         [](const ::testing::TestParamInfo<AdapterFaultCase>& info) {
                           return info.param.name;
                         });

// A bf16-merge fault merged in bfloat16 anyway is what a bfloat16 merge is: no finding.
TEST(ParityAdapter, ABf16MergeJudgedInBf16IsClean) {
  TinyGptConfig c = WithAdapter(LearnedShape(1));
  c.fault = {FaultKind::kBf16Merge, "blocks.1", 0};
  const v1::ParityReport r = RunAdapterCase(c, 1, 5, at::kBFloat16);
  EXPECT_FALSE(r.diverged());
  EXPECT_EQ(FirstFailure(r), nullptr);
}

// A second model, not tiny_gpt: token embedding, one residual linear layer with a LoRA adapter,
// and a tied head, position by position (no cache). Its decoder merges the adapter with the
// merge a test hands it, so the parity mode's adapter checks run on a model of another shape.
class LoraLinearModel : public Model, public Decodable {
 public:
  using MergeFn = std::function<at::Tensor(const LowRankAdapter&, at::ScalarType)>;

  LoraLinearModel(uint64_t seed, MergeFn merge) : decoder_(*this), merge_(std::move(merge)) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    emb_ = at::empty({kVocab, kWidth}, at::kFloat).normal_(0.0, 0.5, gen);
    w_ = at::empty({kWidth, kWidth}, at::kFloat).normal_(0.0, 0.2, gen);
    a_ = at::empty({2, kWidth}, at::kFloat).normal_(0.0, 0.25, gen);
    b_ = at::empty({kWidth, 2}, at::kFloat).normal_(0.0, 0.2, gen);
  }
  LayerSequence& Path(PathKind kind) override {
    return kind == PathKind::kReference ? reference_ : optimized_;
  }
  std::vector<NamedTensor> NamedParameters() const override {
    return {{"embed.weight", emb_}, {"proj.weight", w_}};
  }
  ModelSpecInfo Spec() const override { return {"lora_linear", "{}"}; }
  IncrementalDecoder& Decoder() override { return decoder_; }

 private:
  static constexpr int64_t kVocab = 32, kWidth = 16;
  static constexpr double kScale = 4.0;

  // Layer i in `dtype` over the whole input, the adapter applied at run time unless `merged`.
  at::Tensor Layer(size_t i, const at::Tensor& x, at::ScalarType dtype,
                   const at::Tensor& merged) const {
    if (i == 0) return at::embedding(emb_.to(dtype), x);
    if (i == 2) return at::matmul(x.to(dtype), emb_.to(dtype).t());
    const at::Tensor h = x.to(dtype);
    if (merged.defined()) return h + at::linear(h, merged.to(dtype));
    return h + at::linear(h, w_.to(dtype)) +
           kScale * at::linear(at::linear(h, a_.to(dtype)), b_.to(dtype));
  }

  class LinearPath : public LayerSequence {
   public:
    LinearPath(const LoraLinearModel& m, at::ScalarType dtype) : m_(m), dtype_(dtype) {}
    size_t size() const override { return 3; }
    std::string name(size_t i) const override {
      return std::vector<std::string>{"embed", "proj", "head"}.at(i);
    }
    TensorList Forward(size_t i, const TensorList& x, const LayerBatch&) override {
      return {m_.Layer(i, x.at(0), dtype_, {})};
    }
    std::vector<NamedTensor> LayerParameters(size_t) const override { return {}; }
    at::ScalarType compute_dtype() const override { return dtype_; }

   private:
    const LoraLinearModel& m_;
    at::ScalarType dtype_;
  };

  class LinearDecoder : public IncrementalDecoder {
   public:
    explicit LinearDecoder(LoraLinearModel& m) : m_(m) {}
    size_t size() const override { return 3; }
    std::string name(size_t i) const override { return m_.reference_.name(i); }
    at::ScalarType compute_dtype() const override { return at::kFloat; }
    void ResetCache() override {}
    TensorList ForwardStep(size_t i, const TensorList& x, const DecodeStep&) override {
      return {m_.Layer(i, x.at(0), at::kFloat, merged_)};
    }
    std::vector<NamedTensor> Cache(size_t) const override { return {}; }
    std::vector<NamedTensor> Probe(size_t) const override { return {}; }
    std::vector<NamedTensor> ReferenceTrace(size_t, const TensorList&, const LayerBatch&) override {
      return {};
    }
    std::vector<LowRankAdapter> Adapters(size_t i) const override {
      if (i != 1) return {};
      return {{"proj.weight", m_.w_, m_.a_, m_.b_, kScale, merged_}};
    }
    void MergeAdapters(std::optional<at::ScalarType> dtype) override {
      merged_ = dtype ? m_.merge_(Adapters(1)[0], *dtype) : at::Tensor();
    }

   private:
    LoraLinearModel& m_;
    at::Tensor merged_;
  };

  at::Tensor emb_, w_, a_, b_;
  LinearPath reference_{*this, at::kDouble};
  LinearPath optimized_{*this, at::kFloat};
  LinearDecoder decoder_;
  MergeFn merge_;
};

// W + scale * B @ A computed in `in`, stored in `dtype`; `times` deltas.
LoraLinearModel::MergeFn MergeIn(std::optional<at::ScalarType> in, int times) {
  return [in, times](const LowRankAdapter& a, at::ScalarType dtype) {
    const at::ScalarType t = in.value_or(dtype);
    const at::Tensor delta = (a.scale * at::matmul(a.b, a.a)).to(t);
    at::Tensor w = a.base.to(t);
    for (int k = 0; k < times; ++k) w = w + delta;
    return w.to(dtype);
  };
}

TEST(ParityAdapter, ASecondModelsMergeFaultsAreNamedAtTheirLayer) {
  for (uint64_t seed : {1, 2}) {
    for (int64_t prefill : {3, 9}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " prefill " + std::to_string(prefill));
      LayerBatch batch;
      batch.input_ids =
          at::randint(32, {2, 12}, at::make_generator<at::CPUGeneratorImpl>(seed), at::kLong);
      ParityOptions options;
      options.prefill = prefill;
      options.adapter_merge = at::kFloat;
      struct Case {
        LoraLinearModel::MergeFn merge;
        const char* check;  // "" for none
      };
      for (const Case& c : {Case{MergeIn(std::nullopt, 1), ""},
                            Case{MergeIn(at::kBFloat16, 1), kCheckAdapterRounding},
                            Case{MergeIn(std::nullopt, 2), kCheckAdapterMergedTwice}}) {
        LoraLinearModel model(seed, c.merge);
        StatusOr<v1::ParityReport> r = RunParity(model, batch, options);
        ASSERT_TRUE(r.ok()) << r.status();
        const v1::ParityFinding* f = FirstFailure(*r);
        if (std::string(c.check).empty()) {
          EXPECT_FALSE(r->diverged()) << r->first_divergent_layer();
          EXPECT_EQ(f, nullptr);
          continue;
        }
        EXPECT_TRUE(r->diverged());
        EXPECT_EQ(r->first_divergent_layer(), "proj");
        EXPECT_EQ(r->first_divergent_position(), 0);
        ASSERT_NE(f, nullptr);
        EXPECT_EQ(f->check(), c.check);
        EXPECT_EQ(f->layer(), "proj");
        EXPECT_EQ(f->tensor(), "proj.weight");
      }
    }
  }
}

// A second model: a plain linear layer with a LoRA adapter, merged three ways by hand.
TEST(ParityAdapter, MeasureAdapterMergeTellsRoundingFromADeltaCountedTwice) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  LowRankAdapter adapter;
  adapter.weight = "linear.weight";
  adapter.base = at::empty({24, 40}, at::kFloat).normal_(0.0, 0.1, gen);
  adapter.a = at::empty({2, 40}, at::kFloat).normal_(0.0, 0.15, gen);
  adapter.b = at::empty({24, 2}, at::kFloat).normal_(0.0, 0.1, gen);
  adapter.scale = 8.0;
  const at::Tensor delta = adapter.scale * at::matmul(adapter.b, adapter.a);

  adapter.merged = adapter.base + delta;
  StatusOr<AdapterMergeError> e = MeasureAdapterMerge(adapter, at::kFloat);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->delta_ratio, 1.0, 1e-6);
  EXPECT_LE(e->rounding_eps, e->bound);
  EXPECT_EQ(e->bound, 4);
  EXPECT_EQ(e->eps, std::numeric_limits<float>::epsilon());

  adapter.merged = (adapter.base.to(at::kBFloat16) + delta.to(at::kBFloat16)).to(at::kFloat);
  e = MeasureAdapterMerge(adapter, at::kFloat);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->delta_ratio, 1.0, 1e-2);
  EXPECT_GT(e->rounding_eps, 1000 * e->bound);
  e = MeasureAdapterMerge(adapter, at::kBFloat16);  // the same merge, in its own dtype: clean
  ASSERT_TRUE(e.ok());
  EXPECT_LE(e->rounding_eps, e->bound);

  adapter.merged = adapter.base + delta + delta;
  e = MeasureAdapterMerge(adapter, at::kFloat);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->delta_ratio, 2.0, 1e-6);
  EXPECT_NEAR(e->max_abs_err, delta.abs().max().item<double>(), 1e-6);

  adapter.merged = at::Tensor();
  e = MeasureAdapterMerge(adapter, at::kFloat);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("linear.weight"), std::string::npos);
}

TEST(ParityAdapter, RefusesAMergeWithoutAdapterOrInAnIntegerDtype) {
  StatusOr<std::unique_ptr<TinyGpt>> model = TinyGpt::Create(TinyGptConfig{});
  ASSERT_TRUE(model.ok());
  ParityOptions options;
  options.adapter_merge = at::kFloat;
  StatusOr<v1::ParityReport> r = RunParity(**model, Batch(TinyGptConfig{}, 1), options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no adapter"), std::string::npos);
  options.adapter_merge = at::kInt;
  r = RunParity(**model, Batch(TinyGptConfig{}, 1), options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("must be floating"), std::string::npos);
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
