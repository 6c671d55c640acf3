// One case per ValidateCapsule rule (proto/validate.cc): each breaks one "must" of capsule.proto
// in an otherwise valid full capsule and expects kInvalidArgument naming the field.
#include "capsule/format/validate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/dtype.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/format/capsule_test_util.h"

namespace capsule::test {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

TEST(ValidateTest, SampleCapsulesAreValid) {
  EXPECT_TRUE(ValidateCapsule(MakeFullCapsule()).ok()) << ValidateCapsule(MakeFullCapsule());
  EXPECT_TRUE(ValidateCapsule(MakeMinimalCapsule()).ok());
}

TEST(ValidateTest, FullCapsuleSetsEveryField) {
  // A field added to capsule.proto must be added to MakeFullCapsule, or round trips miss it.
  const std::vector<std::string> unset = UnsetFieldPaths(MakeFullCapsule());
  EXPECT_TRUE(unset.empty()) << "unset: " << ::testing::PrintToString(unset);
}

TEST(ValidateTest, UnsetFieldPathsFindsAGap) {
  v1::Capsule c = MakeFullCapsule();
  c.mutable_numerics()->mutable_layers(0)->mutable_stats()->clear_rms();
  EXPECT_TRUE(UnsetFieldPaths(c).empty()) << "other layers still set rms";
  for (auto& l : *c.mutable_numerics()->mutable_layers()) l.mutable_stats()->clear_rms();
  EXPECT_EQ(UnsetFieldPaths(c), std::vector<std::string>{"numerics.layers[].stats.rms"});
}

TEST(ValidateTest, DTypeSizesAndNames) {
  EXPECT_EQ(DTypeElementSize(v1::FLOAT64), 8);
  EXPECT_EQ(DTypeElementSize(v1::INT64), 8);
  EXPECT_EQ(DTypeElementSize(v1::FLOAT32), 4);
  EXPECT_EQ(DTypeElementSize(v1::INT32), 4);
  EXPECT_EQ(DTypeElementSize(v1::BFLOAT16), 2);
  EXPECT_EQ(DTypeElementSize(v1::FLOAT16), 2);
  EXPECT_EQ(DTypeElementSize(v1::INT16), 2);
  EXPECT_EQ(DTypeElementSize(v1::INT8), 1);
  EXPECT_EQ(DTypeElementSize(v1::UINT8), 1);
  EXPECT_EQ(DTypeElementSize(v1::BOOL), 1);
  EXPECT_EQ(DTypeElementSize(v1::DTYPE_UNSPECIFIED), 0);
  EXPECT_EQ(DTypeElementSize(999), 0);
  EXPECT_EQ(DTypeName(v1::BFLOAT16), "bfloat16");
  EXPECT_EQ(DTypeName(v1::DTYPE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(DTypeName(999), "unknown(999)");
}

TEST(ValidateTest, DTypeNamesHaveOneSpellingAndLibTorchsIsReadAsIt) {
  EXPECT_EQ(CanonicalDTypeName("float32"), "float32");
  EXPECT_EQ(CanonicalDTypeName("Float"), "float32");
  EXPECT_EQ(CanonicalDTypeName("Double"), "float64");
  EXPECT_EQ(CanonicalDTypeName("BFloat16"), "bfloat16");
  EXPECT_EQ(CanonicalDTypeName("Half"), "float16");
  EXPECT_EQ(CanonicalDTypeName("Long"), "int64");
  EXPECT_EQ(CanonicalDTypeName("Byte"), "uint8");
  EXPECT_EQ(CanonicalDTypeName("Char"), "int8");
  EXPECT_EQ(CanonicalDTypeName("Bool"), "bool");
  for (int d = v1::FLOAT64; d <= v1::BOOL; ++d) {
    EXPECT_EQ(CanonicalDTypeName(DTypeName(d)), DTypeName(d));
  }
  EXPECT_EQ(CanonicalDTypeName("float"), "");
  EXPECT_EQ(CanonicalDTypeName("ComplexFloat"), "");
  EXPECT_EQ(CanonicalDTypeName("unspecified"), "");
  EXPECT_EQ(CanonicalDTypeName(""), "");
}

struct Rule {
  const char* name;
  std::function<void(v1::Capsule*)> breaks;
  const char* message;
  bool needs_digest_check = false;
};

void PrintTo(const Rule& r, std::ostream* os) { *os << r.name; }

v1::TensorBlob* Tensor(v1::Capsule* c, int i) { return c->mutable_tensors(i); }
v1::HealthStats* Stats(v1::Capsule* c) {
  return c->mutable_numerics()->mutable_layers(2)->mutable_stats();
}
v1::Sequence* Seq(v1::Capsule* c) { return c->mutable_data()->mutable_sequences(1); }

v1::ParamStep* Param(v1::Capsule* c) { return c->mutable_optimizer()->mutable_params(0); }

const Rule kRules[] = {
    {"MicroBatchDecreases",
     [](v1::Capsule* c) { c->mutable_data()->mutable_sequences(0)->set_micro_batch(2); },
     "data.sequences[0]: micro_batch must be below data.micro_batches"},
    {"MicroBatchesNegative", [](v1::Capsule* c) { c->mutable_data()->set_micro_batches(-1); },
     "data.micro_batches: must be >= 0"},
    {"SequenceMicroBatchGoesBack",
     [](v1::Capsule* c) {
       c->mutable_data()->mutable_sequences(0)->set_micro_batch(1);
       Seq(c)->set_micro_batch(0);
     },
     "data.sequences[1]: micro_batch must be >= 0 and not decrease"},
    {"NormalizerNaN", [](v1::Capsule* c) { c->mutable_objective()->set_normalizer(std::nan("")); },
     "objective.normalizer: must be finite and >= 0"},
    {"OptimizerGroupOutOfRange", [](v1::Capsule* c) { Param(c)->set_group(2); },
     "optimizer.params[0] (blocks.0.attn.qkv.weight): group must be -1 or an index"},
    {"OptimizerTensorMissing", [](v1::Capsule* c) { Param(c)->set_grad("nope"); },
     "optimizer.params[0] (blocks.0.attn.qkv.weight): names no tensor in tensors (nope)"},
    {"OptimizerBetaOne",
     [](v1::Capsule* c) { c->mutable_optimizer()->mutable_groups(0)->set_beta2(1.0); },
     "optimizer.groups[0]: betas must be in [0, 1)"},
    {"OptimizerEpsZero",
     [](v1::Capsule* c) { c->mutable_optimizer()->mutable_groups(0)->set_eps(0); },
     "optimizer.groups[0]: eps must be > 0"},
    {"OptimizerDuplicateParam",
     [](v1::Capsule* c) { *c->mutable_optimizer()->add_params() = *Param(c); },
     "optimizer.params[1] (blocks.0.attn.qkv.weight): duplicate name"},
    {"OptimizerKindUnknown",
     [](v1::Capsule* c) { c->mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(9)); },
     "optimizer.kind: 9 is not a known OptimizerKind value"},
    {"EventsGoBack",
     [](v1::Capsule* c) {
       v1::RunEvent* e = c->add_events();
       e->set_step(5);
       e->set_kind("resume");
     },
     "events[1]: steps must not decrease"},
    {"EventWithoutKind", [](v1::Capsule* c) { c->mutable_events(0)->clear_kind(); },
     "events[0]: step must be >= 0 and kind set"},
    {"GenerationPromptNegative",
     [](v1::Capsule* c) { c->mutable_generation()->set_prompt_length(-1); },
     "generation: prompt_length and prefill_chunk must be >= 0"},
    {"GenerationTopPAboveOne",
     [](v1::Capsule* c) { c->mutable_generation()->mutable_sampling()->set_top_p(1.5); },
     "generation.sampling: temperature must be finite and >= 0, top_k >= 0 and top_p in [0, 1]"},
    {"GenerationQuantScaleNaN",
     [](v1::Capsule* c) {
       c->mutable_generation()->mutable_cache()->set_quant_scale(std::nan(""));
     },
     "generation.cache.quant_scale: must be finite and >= 0"},
    {"GenerationTokenizerHashNotHex",
     [](v1::Capsule* c) { c->mutable_generation()->set_tokenizer_sha256("XYZ"); },
     "generation.tokenizer_sha256: must be empty or 64 lowercase hex characters"},
    {"GenerationAdapterHashNotHex",
     [](v1::Capsule* c) { c->mutable_generation()->set_adapter_sha256("XYZ"); },
     "generation.adapter_sha256: must be empty or 64 lowercase hex characters"},
    {"GenerationAdapterRankNegative",
     [](v1::Capsule* c) { c->mutable_generation()->set_adapter_rank(-4); },
     "generation.adapter_rank: must be >= 0"},
    {"GenerationAdapterAlphaInfinite",
     [](v1::Capsule* c) {
       c->mutable_generation()->set_adapter_alpha(std::numeric_limits<double>::infinity());
     },
     "generation.adapter_alpha: must be finite"},
    {"WriterVersionUnset", [](v1::Capsule* c) { c->clear_writer_version(); },
     "writer_version: must be set"},
    {"CreatedTimeZero", [](v1::Capsule* c) { c->set_created_unix_micros(0); },
     "created_unix_micros: must be a time between 2000-01-01 and 2200-01-01"},
    {"CreatedTimeNegative", [](v1::Capsule* c) { c->set_created_unix_micros(-5); },
     "created_unix_micros: must be a time between 2000-01-01 and 2200-01-01"},
    {"CreatedTimeInt64Max", [](v1::Capsule* c) { c->set_created_unix_micros(kInt64Max); },
     "created_unix_micros: must be a time between"},
    {"CreatedTimeInt64Min", [](v1::Capsule* c) { c->set_created_unix_micros(kInt64Min); },
     "created_unix_micros: must be a time between"},
    {"CreatedTimeBefore2000",
     [](v1::Capsule* c) { c->set_created_unix_micros(int64_t{946684800} * 1000000 - 1); },
     "created_unix_micros: must be a time between"},
    {"CreatedTimeIn2200",
     [](v1::Capsule* c) { c->set_created_unix_micros(int64_t{7258118400} * 1000000); },
     "created_unix_micros: must be a time between"},
    {"CreatedTimeInSeconds", [](v1::Capsule* c) { c->set_created_unix_micros(1700000000); },
     "created_unix_micros: must be a time between"},
    {"TriggerWallTimeAbsurd",
     [](v1::Capsule* c) { c->mutable_trigger()->set_wall_time_unix_micros(kInt64Max); },
     "trigger.wall_time_unix_micros: must be 0 (unset) or a time between 2000-01-01"},
    {"RedactionTimeAbsurd",
     [](v1::Capsule* c) { c->mutable_redaction()->set_redacted_unix_micros(kInt64Min); },
     "redaction.redacted_unix_micros: must be 0 (unset) or a time between 2000-01-01"},
    {"TriggerKindUnknown",
     [](v1::Capsule* c) { c->mutable_trigger()->set_kind(static_cast<v1::TriggerKind>(99)); },
     "trigger.kind: 99 is not a known TriggerKind value"},
    {"RerunUnknown",
     [](v1::Capsule* c) {
       c->mutable_trigger()->set_capture_rerun(static_cast<v1::Reproduction>(-3));
     },
     "trigger.capture_rerun: -3 is not a known Reproduction value"},
    {"RngKindUnknown",
     [](v1::Capsule* c) {
       c->mutable_rng()->mutable_generators(1)->set_kind(static_cast<v1::RngKind>(4));
     },
     "rng.generators[1].kind: 4 is not a known RngKind value"},
    {"LayerPhaseUnknown",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(2)->set_phase(static_cast<v1::Phase>(3));
     },
     "numerics.layers[2].phase: 3 is not a known Phase value"},
    {"ExecutionPathUnknown",
     [](v1::Capsule* c) {
       c->mutable_model()->set_trainer_path(static_cast<v1::ExecutionPath>(9));
     },
     "model.trainer_path: 9 is not a known ExecutionPath value"},
    {"WeightPolicyUnknown",
     [](v1::Capsule* c) {
       c->mutable_model()->set_weight_policy(static_cast<v1::WeightPolicy>(7));
     },
     "model.weight_policy: 7 is not a known WeightPolicy value"},
    {"TensorRoleUnknown",
     [](v1::Capsule* c) { Tensor(c, 1)->set_role(static_cast<v1::TensorRole>(100)); },
     "tensors[1].role: 100 is not a known TensorRole value"},
    {"TensorDtypeUnknown",
     [](v1::Capsule* c) { Tensor(c, 0)->mutable_meta()->set_dtype(static_cast<v1::DType>(99)); },
     "tensors[0] (input_ids): dtype 99 is unknown"},
    {"TensorNegativeStride",
     [](v1::Capsule* c) { Tensor(c, 0)->mutable_meta()->set_strides(1, -1); },
     "tensors[0] (input_ids): negative stride"},
    {"TensorStrideBeyondAnyStorage",
     [](v1::Capsule* c) {
       // A 1-element tensor whose stride points 10^12 elements on.
       v1::TensorBlob* one = c->add_tensors();
       SetTensor(one, "one", v1::FLOAT32, {1}, std::string(4, '\0'));
       one->mutable_meta()->set_strides(0, int64_t{1000000000000});
     },
     "tensors[2] (one): stride 1000000000000 is beyond any storage"},
    {"TensorStorageOffsetBeyondAnyStorage",
     [](v1::Capsule* c) { Tensor(c, 0)->mutable_meta()->set_storage_offset(int64_t{1} << 62); },
     "tensors[0] (input_ids): storage offset 4611686018427387904 is beyond any storage"},
    {"TensorStridesAddressBeyondAnyStorage",
     [](v1::Capsule* c) {
       v1::TensorMeta* m = Tensor(c, 0)->mutable_meta();  // int64[2,4]
       m->set_strides(0, int64_t{1} << 35);
       m->set_storage_offset((int64_t{1} << 35) + 5);
     },
     "tensors[0] (input_ids): strides and storage offset address elements beyond any storage"},
    {"LayerMetaStorageOffsetBeyondAnyStorage",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(1)->mutable_meta()->set_storage_offset(kInt64Max);
     },
     "numerics.layers[1] (blocks.0).meta: storage offset 9223372036854775807 is beyond"},
    {"FirstAnomalousLayerNamesNoLayer",
     [](v1::Capsule* c) { c->mutable_numerics()->set_first_anomalous_layer("blocks.9"); },
     "numerics.first_anomalous_layer: names no layer in numerics.layers (blocks.9 at index 1)"},
    {"FirstAnomalousIndexNamesNoLayer",
     [](v1::Capsule* c) { c->mutable_numerics()->set_first_anomalous_index(2147483647); },
     "numerics.first_anomalous_layer: names no layer in numerics.layers (blocks.0 at index "
     "2147483647)"},
    {"FirstAnomalousIndexWithoutALayer",
     [](v1::Capsule* c) {
       c->mutable_numerics()->clear_first_anomalous_layer();
       c->mutable_numerics()->set_first_anomalous_index(2147483647);
     },
     "numerics.first_anomalous_index: must be -1 when first_anomalous_layer is empty"},
    {"FirstAnomalousPhaseUnset",
     [](v1::Capsule* c) {
       c->mutable_numerics()->set_first_anomalous_phase(v1::PHASE_UNSPECIFIED);
     },
     "numerics.first_anomalous_phase: must be set with first_anomalous_layer"},
    {"TriggerMissing", [](v1::Capsule* c) { c->clear_trigger(); }, "trigger.kind: must be set"},
    {"TriggerKindUnspecified",
     [](v1::Capsule* c) { c->mutable_trigger()->set_kind(v1::TRIGGER_KIND_UNSPECIFIED); },
     "trigger.kind: must be set"},
    {"StepMissing", [](v1::Capsule* c) { c->clear_step(); }, "step: must be set"},
    {"NegativeGlobalStep", [](v1::Capsule* c) { c->mutable_step()->set_global_step(-1); },
     "step: global_step, micro_batch, tokens_seen and epoch must be >= 0"},
    {"NegativeMicroBatch", [](v1::Capsule* c) { c->mutable_step()->set_micro_batch(-1); },
     "step: global_step"},
    {"NegativeTokensSeen", [](v1::Capsule* c) { c->mutable_step()->set_tokens_seen(-1); },
     "step: global_step"},
    {"NegativeEpoch", [](v1::Capsule* c) { c->mutable_step()->set_epoch(-1); },
     "step: global_step"},
    {"HistoryStepRepeated",
     [](v1::Capsule* c) { c->mutable_step()->mutable_history(2)->set_step(1233); },
     "step.history[2]: steps must increase"},
    {"HistoryStepDecreasing",
     [](v1::Capsule* c) { c->mutable_step()->mutable_history(1)->set_step(1); },
     "step.history[1]: steps must increase"},
    {"NegativeTokenCount", [](v1::Capsule* c) { Seq(c)->set_token_count(-1); },
     "data.sequences[1]: negative token_count"},
    {"TokenIdsSha256Uppercase",
     [](v1::Capsule* c) { Seq(c)->set_token_ids_sha256(std::string(64, 'A')); },
     "data.sequences[1]: token_ids_sha256 is not a lowercase hex SHA-256"},
    {"TokenIdsSha256Short",
     [](v1::Capsule* c) { Seq(c)->set_token_ids_sha256(std::string(63, 'a')); },
     "token_ids_sha256 is not a lowercase hex SHA-256"},
    {"LabelsLengthMismatch", [](v1::Capsule* c) { Seq(c)->add_labels(1); },
     "data.sequences[1]: labels and token_ids have different lengths"},
    {"AttentionMaskLengthMismatch",
     [](v1::Capsule* c) { Seq(c)->set_attention_mask(std::string(3, '\x01')); },
     "data.sequences[1]: a mask and token_ids have different lengths"},
    {"LossMaskLengthMismatch",
     [](v1::Capsule* c) { Seq(c)->set_loss_mask(std::string(5, '\x00')); },
     "a mask and token_ids have different lengths"},
    {"RawTextAndRawBytesBothSet",
     [](v1::Capsule* c) {
       Seq(c)->set_raw_text("text");
       Seq(c)->set_raw_bytes("bytes");
     },
     "data.sequences[1]: both raw_text and raw_bytes are set"},
    {"AttentionMaskNotZeroOne",
     [](v1::Capsule* c) { Seq(c)->set_attention_mask(std::string("\x01\x02\x01\x01", 4)); },
     "data.sequences[1]: a mask byte is not 0 or 1"},
    {"LossMaskAsciiOne", [](v1::Capsule* c) { Seq(c)->set_loss_mask("1111"); },
     "a mask byte is not 0 or 1"},
    {"MaskLengthAgainstTokenCount",
     [](v1::Capsule* c) {
       // After `redact --drop tokens` the length rule uses token_count.
       Seq(c)->clear_token_ids();
       Seq(c)->clear_labels();
       Seq(c)->set_token_count(5);
     },
     "a mask and token_ids have different lengths"},
    {"IdentityFileSha256Bad",
     [](v1::Capsule* c) { c->mutable_identity()->mutable_files(1)->set_sha256("abc"); },
     "identity.files[1].sha256: must be 64 lowercase hex characters"},
    {"IdentityFileSha256Missing",
     [](v1::Capsule* c) { c->mutable_identity()->mutable_files(0)->clear_sha256(); },
     "identity.files[0].sha256: must be 64 lowercase hex characters"},
    {"IdentityFileNegativeSize",
     [](v1::Capsule* c) { c->mutable_identity()->mutable_files(0)->set_size_bytes(-1); },
     "identity.files[0]: negative size"},
    {"ModelSha256Bad",
     [](v1::Capsule* c) { c->mutable_identity()->set_model_sha256(std::string(64, 'g')); },
     "identity: model_sha256/config_sha256 must be 64 lowercase hex characters"},
    {"ConfigSha256Bad", [](v1::Capsule* c) { c->mutable_identity()->set_config_sha256("x"); },
     "identity: model_sha256/config_sha256"},
    {"ConfigSha256Mismatch",
     [](v1::Capsule* c) { c->mutable_identity()->set_config_text("{\"d_model\": 65}"); },
     "identity.config_sha256: does not match config_text"},
    {"RngNameEmpty", [](v1::Capsule* c) { c->mutable_rng()->mutable_generators(1)->clear_name(); },
     "rng.generators[1] (): name must be set"},
    {"RngNameDuplicate",
     [](v1::Capsule* c) { c->mutable_rng()->mutable_generators(1)->set_name("torch.cpu"); },
     "rng.generators[1] (torch.cpu): duplicate name"},
    {"RngKindUnspecified",
     [](v1::Capsule* c) {
       c->mutable_rng()->mutable_generators(0)->set_kind(v1::RNG_KIND_UNSPECIFIED);
     },
     "rng.generators[0] (torch.cpu): kind must be set"},
    {"RngStateEmpty",
     [](v1::Capsule* c) { c->mutable_rng()->mutable_generators(1)->clear_state(); },
     "rng.generators[1] (sampler): state must not be empty"},
    {"LayerPhaseUnspecified",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(1)->set_phase(v1::PHASE_UNSPECIFIED);
     },
     "numerics.layers[1] (blocks.0): phase must be set"},
    {"LayerNegativeIndex",
     [](v1::Capsule* c) { c->mutable_numerics()->mutable_layers(3)->set_index(-1); },
     "numerics.layers[3] (loss): negative index"},
    {"LayerMetaDtypeUnspecified",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(0)->mutable_meta()->set_dtype(v1::DTYPE_UNSPECIFIED);
     },
     "numerics.layers[0] (embed).meta: dtype is unspecified"},
    {"LayerMetaDtypeUnknown",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(0)->mutable_meta()->set_dtype(
           static_cast<v1::DType>(77));
     },
     "numerics.layers[0] (embed).meta: dtype 77 is unknown"},
    {"LayerMetaStridesRank",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(0)->mutable_meta()->add_strides(1);
     },
     "numerics.layers[0] (embed).meta: strides and shape have different ranks"},
    {"LayerMetaNegativeDim",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(0)->mutable_meta()->set_shape(1, -4);
     },
     "numerics.layers[0] (embed).meta: negative dimension in shape"},
    {"LayerMetaNegativeOffset",
     [](v1::Capsule* c) {
       c->mutable_numerics()->mutable_layers(0)->mutable_meta()->set_storage_offset(-1);
     },
     "numerics.layers[0] (embed).meta: negative storage offset"},
    {"StatsNegativeNumel", [](v1::Capsule* c) { Stats(c)->set_numel(-1); },
     "numerics.layers[2] (blocks.1).stats: negative numel"},
    {"StatsNegativeCount", [](v1::Capsule* c) { Stats(c)->set_zero_count(-1); },
     "numerics.layers[2] (blocks.1).stats: a count is outside [0, numel]"},
    {"StatsCountAboveNumel", [](v1::Capsule* c) { Stats(c)->set_nan_count(65); },
     "a count is outside [0, numel]"},
    {"StatsCountsSumAboveNumel",
     [](v1::Capsule* c) {
       Stats(c)->set_nan_count(30);
       Stats(c)->set_zero_count(34);
     },
     "counts add up to more than numel"},
    {"StatsCountsSumOverflows",
     [](v1::Capsule* c) {
       // Four counts of 2^62 add up to 2^64: the sum must not wrap around to "fits".
       v1::HealthStats* s = Stats(c);
       s->set_numel(kInt64Max);
       s->set_nan_count(int64_t{1} << 62);
       s->set_pos_inf_count(int64_t{1} << 62);
       s->set_neg_inf_count(int64_t{1} << 62);
       s->set_zero_count(int64_t{1} << 62);
       s->set_first_nonfinite_index(0);
     },
     "counts add up to more than numel"},
    {"StatsFirstNonfiniteAboveNumel",
     [](v1::Capsule* c) { Stats(c)->set_first_nonfinite_index(64); },
     "first_nonfinite_index is outside [-1, numel)"},
    {"StatsFirstNonfiniteBelowMinusOne",
     [](v1::Capsule* c) { Stats(c)->set_first_nonfinite_index(-2); },
     "first_nonfinite_index is outside [-1, numel)"},
    {"StatsNonfiniteWithoutIndex", [](v1::Capsule* c) { Stats(c)->set_first_nonfinite_index(-1); },
     "first_nonfinite_index disagrees with the non-finite counts"},
    {"StatsIndexWithoutNonfinite",
     [](v1::Capsule* c) {
       Stats(c)->set_nan_count(0);
       Stats(c)->set_pos_inf_count(0);
       Stats(c)->set_neg_inf_count(0);
     },
     "first_nonfinite_index disagrees with the non-finite counts"},
    {"FirstAnomalousIndexBelowMinusOne",
     [](v1::Capsule* c) { c->mutable_numerics()->set_first_anomalous_index(-2); },
     "numerics.first_anomalous_index: must be >= -1"},
    {"TensorNameEmpty", [](v1::Capsule* c) { Tensor(c, 1)->clear_name(); },
     "tensors[1] (): name must be set"},
    {"TensorNameDuplicate", [](v1::Capsule* c) { Tensor(c, 1)->set_name("input_ids"); },
     "tensors[1] (input_ids): duplicate name"},
    {"TensorDtypeUnspecified",
     [](v1::Capsule* c) { Tensor(c, 0)->mutable_meta()->set_dtype(v1::DTYPE_UNSPECIFIED); },
     "tensors[0] (input_ids): dtype is unspecified"},
    {"TensorNegativeDim", [](v1::Capsule* c) { Tensor(c, 0)->mutable_meta()->set_shape(0, -2); },
     "tensors[0] (input_ids): negative dimension in shape"},
    {"TensorShapeTooLarge",
     [](v1::Capsule* c) {
       v1::TensorMeta* m = Tensor(c, 0)->mutable_meta();
       m->set_shape(0, int64_t{1} << 40);
       m->set_shape(1, int64_t{1} << 40);
     },
     "tensors[0] (input_ids): shape is too large"},
    {"TensorShapeOverflowsInt64",
     [](v1::Capsule* c) {
       v1::TensorMeta* m = Tensor(c, 0)->mutable_meta();
       m->set_shape(0, kInt64Max);
       m->set_shape(1, kInt64Max);
     },
     "shape is too large"},
    {"TensorDataTooShort", [](v1::Capsule* c) { Tensor(c, 1)->mutable_data()->pop_back(); },
     "tensors[1] (blocks.0.attn.qkv.weight): data is 23 bytes, expected 24 for float32[2,3]"},
    {"TensorDataTooLong", [](v1::Capsule* c) { Tensor(c, 0)->mutable_data()->append(8, '\0'); },
     "tensors[0] (input_ids): data is 72 bytes, expected 64 for int64[2,4]"},
    {"TensorDtypeChangesTheSize",
     [](v1::Capsule* c) { Tensor(c, 1)->mutable_meta()->set_dtype(v1::FLOAT64); },
     "data is 24 bytes, expected 48 for float64[2,3]"},
    {"TensorSha256NotHex", [](v1::Capsule* c) { Tensor(c, 0)->set_sha256(std::string(64, 'z')); },
     "tensors[0] (input_ids): sha256 must be 64 lowercase hex"},
    {"TensorSha256Uppercase",
     [](v1::Capsule* c) {
       std::string h = Tensor(c, 0)->sha256();
       for (char& ch : h) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
       Tensor(c, 0)->set_sha256(h);
     },
     "sha256 must be 64 lowercase hex"},
    {"TensorSha256Mismatch", [](v1::Capsule* c) { Tensor(c, 1)->set_sha256(*Sha256Hex("other")); },
     "tensors[1] (blocks.0.attn.qkv.weight): sha256 does not match data", true},
    {"BatchTensorNameUnknown",
     [](v1::Capsule* c) { c->mutable_data()->add_tensor_names("labels"); },
     "data.tensor_names[1]: names no tensor in tensors (labels)"},
    {"PlacementRankAtWorldSize", [](v1::Capsule* c) { c->mutable_placement()->set_rank(4); },
     "placement: rank must be in [0, world_size)"},
    {"PlacementNegativeRank", [](v1::Capsule* c) { c->mutable_placement()->set_rank(-1); },
     "placement: rank must be in [0, world_size)"},
    {"PlacementNegativeWorldSize",
     [](v1::Capsule* c) { c->mutable_placement()->set_world_size(-1); },
     "placement: rank must be in [0, world_size)"},
    {"PlacementWorldSizeAboveTheCap",
     [](v1::Capsule* c) { c->mutable_placement()->set_world_size(2147483647); },
     "placement.world_size: must be at most 1048576, not 2147483647"},
    {"PlacementRankAboveTheCapWithAnUnknownWorldSize",
     [](v1::Capsule* c) {
       c->mutable_placement()->set_world_size(0);
       c->mutable_placement()->set_rank(1 << 20);
     },
     "placement: rank must be in [0, world_size) (below 1048576 when world_size is 0)"},
    {"IntraOpThreadsAboveTheCap",
     [](v1::Capsule* c) { c->mutable_environment()->set_intra_op_threads(2147483647); },
     "environment.intra_op_threads: must be in [0, 1024], not 2147483647"},
    {"IntraOpThreadsJustAboveTheCap",
     [](v1::Capsule* c) { c->mutable_environment()->set_intra_op_threads(20000); },
     "environment.intra_op_threads: must be in [0, 1024], not 20000"},
    {"IntraOpThreadsNegative",
     [](v1::Capsule* c) { c->mutable_environment()->set_intra_op_threads(-3); },
     "environment.intra_op_threads: must be in [0, 1024], not -3"},
    {"InterOpThreadsAboveTheCap",
     [](v1::Capsule* c) { c->mutable_environment()->set_inter_op_threads(1025); },
     "environment.inter_op_threads: must be in [0, 1024], not 1025"},
    {"NumericsThreadsAboveTheCap",
     [](v1::Capsule* c) { c->mutable_numerics()->set_intra_op_threads(1025); },
     "numerics.intra_op_threads: must be in [0, 1024], not 1025"},
    {"ModelConfigTooLarge",
     [](v1::Capsule* c) {
       c->mutable_model()->set_config_json("{\"pad\":\"" + std::string(65536, 'x') + "\"}");
     },
     "model.config_json: is 65546 bytes; at most 65536 are read"},
    {"ModelConfigNestedTooDeep",
     [](v1::Capsule* c) {
       c->mutable_model()->set_config_json("{\"a\":" + std::string(32, '[') + std::string(32, ']') +
                                           "}");
     },
     "model.config_json: nests objects and arrays more than 32 deep"},
    {"WeightsReferenceDtypeUnknown",
     [](v1::Capsule* c) {
       c->mutable_model()->mutable_weights_reference()->mutable_tensors(0)->set_dtype("float");
     },
     "model.weights_reference.tensors[0]: dtype float is not a dtype name (float32, bfloat16, "
     "int64, ...)"},
    {"DistributedRunIdEmpty", [](v1::Capsule* c) { c->mutable_distributed()->clear_run_id(); },
     "distributed.run_id: must be 1 to 128 printable ASCII characters"},
    {"DistributedRunIdWithEscape",
     [](v1::Capsule* c) { c->mutable_distributed()->set_run_id("run\x1b[2J"); },
     "distributed.run_id: must be 1 to 128 printable ASCII characters"},
    {"DistributedSequenceNotIncreasing",
     [](v1::Capsule* c) { c->mutable_distributed()->mutable_collectives(1)->set_sequence(40); },
     "distributed.collectives[1]: sequence numbers must increase"},
    {"DistributedCollectiveStateUnset",
     [](v1::Capsule* c) {
       c->mutable_distributed()->mutable_collectives(0)->set_state(
           v1::COLLECTIVE_STATE_UNSPECIFIED);
     },
     "distributed.collectives[0]: state must be set"},
    {"DistributedCollectiveRankOutOfRange",
     [](v1::Capsule* c) { c->mutable_distributed()->mutable_collectives(0)->add_ranks(4); },
     "distributed.collectives[0]: ranks must be in [0, world_size)"},
    {"DistributedShapeNegative",
     [](v1::Capsule* c) {
       c->mutable_distributed()->mutable_collectives(0)->mutable_out_shapes(0)->add_dims(-2);
     },
     "distributed.collectives[0]: negative dimension in a shape"},
    {"DistributedReductionStepsDecrease",
     [](v1::Capsule* c) { c->mutable_distributed()->add_reductions()->set_step(6); },
     "distributed.reductions[1]: steps must not decrease"},
    {"DistributedReductionRankVectorsDiffer",
     [](v1::Capsule* c) {
       c->mutable_distributed()->mutable_reductions(0)->add_rank_local_norms(1);
     },
     "distributed.reductions[0]: rank_local_norms and rank_local_non_finite must have one entry "
     "per rank"},
    {"DistributedFingerprintNotHex",
     [](v1::Capsule* c) {
       c->mutable_distributed()->mutable_fingerprints(0)->set_params("0123456789ABCDEF");
     },
     "distributed.fingerprints[0]: checksums must be 16 lowercase hex"},
    {"DistributedAgreementRankOutOfRange",
     [](v1::Capsule* c) { c->mutable_distributed()->mutable_agreement()->add_missing_ranks(9); },
     "distributed.agreement.missing_ranks: rank out of range"},
    {"DistributedWatchdogNotFinite",
     [](v1::Capsule* c) { c->mutable_distributed()->set_watchdog_seconds(INFINITY); },
     "distributed: watchdog_seconds and timeout_seconds must be finite and >= 0"},
    {"AnnotationEmptyKey", [](v1::Capsule* c) { (*c->mutable_annotations())[""] = "v"; },
     "annotations: keys must not be empty"},
    {"RedactionUnknownItem", [](v1::Capsule* c) { c->mutable_redaction()->add_dropped("weights"); },
     "redaction.dropped: unknown item weights"},
    // Derivations (FORMAT.md §3.1): what a reader holds the capsule's trust to.
    {"DerivationToolEmpty", [](v1::Capsule* c) { c->mutable_derivations(0)->clear_tool(); },
     "derivations[0].tool: must be 1 to 32 characters of a-z, 0-9, '-' and '_'"},
    {"DerivationToolWithAControl",
     [](v1::Capsule* c) { c->mutable_derivations(0)->set_tool("redact\x1b[2K"); },
     "derivations[0].tool: must be 1 to 32 characters"},
    {"DerivationToolTooLong",
     [](v1::Capsule* c) { c->mutable_derivations(0)->set_tool(std::string(33, 'a')); },
     "derivations[0].tool: must be 1 to 32 characters"},
    {"DerivationSourceNotHex",
     [](v1::Capsule* c) { c->mutable_derivations(0)->set_source_sha256(std::string(64, 'A')); },
     "derivations[0].source_sha256: must be 64 lowercase hex characters"},
    {"DerivationTrustUnspecified",
     [](v1::Capsule* c) { c->mutable_derivations(0)->set_source_trust(v1::TRUST_UNSPECIFIED); },
     "derivations[0].source_trust: must be set"},
    {"DerivationTrustUnknown",
     [](v1::Capsule* c) { c->mutable_derivations(0)->set_source_trust(static_cast<v1::Trust>(9)); },
     "derivations"},
    {"DerivationSignedSourceWithoutKey",
     [](v1::Capsule* c) { c->mutable_derivations(0)->clear_source_signer_key_id(); },
     "derivations[0].source_signer_key_id: must be 64 lowercase hex characters"},
    {"DerivationUnsignedSourceWithAKey",
     [](v1::Capsule* c) { c->mutable_derivations(0)->set_source_trust(v1::TRUST_UNSIGNED); },
     "derivations[0].source_signer_key_id: must be 64 lowercase hex characters, and empty for an "
     "unsigned source"},
    {"DerivationTimeAbsurd",
     [](v1::Capsule* c) { c->mutable_derivations(0)->set_derived_unix_micros(kInt64Max); },
     "derivations[0].derived_unix_micros: must be 0 (unset) or a time between 2000-01-01"},
    {"DerivationsTooMany",
     [](v1::Capsule* c) {
       while (c->derivations_size() <= 64) *c->add_derivations() = c->derivations(0);
     },
     "derivations: must hold at most 64 entries, not 65"},
    {"WeightsReferenceWithEveryWeightEmbedded",
     [](v1::Capsule* c) { c->mutable_model()->set_weight_policy(v1::WEIGHTS_ALL); },
     "model.weights_reference: set although every weight is embedded"},
    {"WeightsReferenceUnknownFormat",
     [](v1::Capsule* c) { c->mutable_model()->mutable_weights_reference()->set_format("gguf"); },
     "model.weights_reference: format must be torch_pickle or torch_archive"},
    {"WeightsReferenceHashNotHex",
     [](v1::Capsule* c) {
       c->mutable_model()->mutable_weights_reference()->set_tensors_sha256("abc");
     },
     "model.weights_reference: tensors_sha256 and file_sha256 must be 64 lowercase hex"},
    {"WeightsReferenceUnsortedTensors",
     [](v1::Capsule* c) {
       auto* t = c->mutable_model()->mutable_weights_reference()->mutable_tensors();
       t->SwapElements(0, 1);
     },
     "model.weights_reference.tensors[1]: names must be sorted and unique"},
    {"WeightsReferenceTensorDigestNotHex",
     [](v1::Capsule* c) {
       c->mutable_model()->mutable_weights_reference()->mutable_tensors(0)->set_sha256("x");
     },
     "model.weights_reference.tensors[0]: sha256 must be 64 lowercase hex"},
};

class ValidateRuleTest : public ::testing::TestWithParam<Rule> {};

TEST_P(ValidateRuleTest, BreakingTheRuleIsInvalidArgument) {
  v1::Capsule c = MakeFullCapsule();
  GetParam().breaks(&c);
  EXPECT_TRUE(HasError(ValidateCapsule(c), StatusCode::kInvalidArgument, GetParam().message));
}

TEST_P(ValidateRuleTest, TheWriterRefusesIt) {
  // Digests are checked by default when writing: a writer that hashed the wrong bytes is caught.
  v1::Capsule c = MakeFullCapsule();
  GetParam().breaks(&c);
  const Status s = EncodeCapsule(c, WriteOptions()).status();
  EXPECT_TRUE(HasError(s, StatusCode::kInvalidArgument, GetParam().message));
  EXPECT_EQ(s.message().rfind("refusing to write an invalid capsule: ", 0), 0u) << s;
}

TEST_P(ValidateRuleTest, TheReaderRefusesIt) {
  v1::Capsule c = MakeFullCapsule();
  GetParam().breaks(&c);
  WriteOptions w;
  w.validate = false;
  StatusOr<std::string> bytes = EncodeCapsule(c, w);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ReadOptions r;
  r.allow_unsigned = true;
  r.verify_tensor_digests = GetParam().needs_digest_check;
  const Status s = DecodeCapsule(*bytes, r).status();
  EXPECT_TRUE(HasError(s, StatusCode::kInvalidArgument, GetParam().message));
  EXPECT_EQ(s.message().rfind("invalid capsule content: ", 0), 0u) << s;
}

INSTANTIATE_TEST_SUITE_P(Rules, ValidateRuleTest, ::testing::ValuesIn(kRules),
                         [](const ::testing::TestParamInfo<Rule>& info) {
                           return std::string(info.param.name);
                         });

TEST(ValidateTest, EdgeValuesThatAreValid) {
  v1::Capsule c = MakeFullCapsule();
  c.mutable_placement()->set_world_size(0);  // unknown world size: any rank >= 0
  c.mutable_placement()->set_rank(12);
  c.mutable_numerics()->set_first_anomalous_index(-1);  // none, as the Monitor writes it
  c.mutable_numerics()->clear_first_anomalous_layer();
  c.mutable_numerics()->clear_first_anomalous_phase();
  c.mutable_trigger()->clear_wall_time_unix_micros();  // 0: unset
  c.mutable_redaction()->clear_redacted_unix_micros();
  c.set_created_unix_micros(int64_t{946684800} * 1000000);  // 2000-01-01, the first valid time
  Seq(&c)->clear_attention_mask();                          // empty mask = all ones
  Seq(&c)->clear_token_ids_sha256();
  v1::TensorBlob* empty = c.add_tensors();
  SetTensor(empty, "empty", v1::FLOAT32, {0, 5}, "");
  v1::TensorBlob* scalar = c.add_tensors();
  SetTensor(scalar, "scalar", v1::BOOL, {}, std::string(1, '\x01'));
  v1::TensorBlob* view = c.add_tensors();  // a column of a [2^17, 2^18] storage, at its end
  SetTensor(view, "view", v1::FLOAT32, {int64_t{1} << 17}, std::string(size_t{4} << 17, '\0'));
  view->mutable_meta()->set_strides(0, int64_t{1} << 18);
  view->mutable_meta()->set_storage_offset((int64_t{1} << 18) - 1);
  v1::HealthStats* s = Stats(&c);
  s->set_numel(0);
  s->set_nan_count(0);
  s->set_pos_inf_count(0);
  s->set_neg_inf_count(0);
  s->set_zero_count(0);
  s->set_first_nonfinite_index(-1);
  EXPECT_TRUE(ValidateCapsule(c).ok()) << ValidateCapsule(c);
}

TEST(ValidateTest, ATensorDigestMaySpellItsDtypeAsLibTorchDid) {
  // The writer spells "float32"; capsule 0.1.0 wrote LibTorch's "Float", and those files stay
  // readable.
  v1::Capsule c = MakeFullCapsule();
  ASSERT_EQ(c.model().weights_reference().tensors(0).dtype(), "float32");
  EXPECT_TRUE(ValidateCapsule(c).ok()) << ValidateCapsule(c);
  c.mutable_model()->mutable_weights_reference()->mutable_tensors(0)->set_dtype("Float");
  EXPECT_TRUE(ValidateCapsule(c).ok()) << ValidateCapsule(c);
}

TEST(ValidateTest, TheBoundsThemselvesAreValid) {
  v1::Capsule c = MakeFullCapsule();
  c.mutable_environment()->set_intra_op_threads(1024);
  c.mutable_environment()->set_inter_op_threads(1024);
  c.mutable_numerics()->set_intra_op_threads(1024);
  c.mutable_placement()->set_world_size(1 << 20);
  c.mutable_placement()->set_rank((1 << 20) - 1);
  // 32 levels; brackets inside a string (escaped quotes included) are text, not nesting.
  c.mutable_model()->set_config_json("{\"a\":" + std::string(31, '[') + "\"[[\\\"{{\"" +
                                     std::string(31, ']') + "}");
  std::string big = "{\"pad\":\"\"}";
  big.insert(8, kMaxModelConfigBytes - big.size(), 'x');
  ASSERT_EQ(big.size(), kMaxModelConfigBytes);
  EXPECT_TRUE(ValidateCapsule(c).ok()) << ValidateCapsule(c);
  c.mutable_model()->set_config_json(big);
  EXPECT_TRUE(ValidateCapsule(c).ok()) << ValidateCapsule(c);
}

}  // namespace
}  // namespace capsule::test
