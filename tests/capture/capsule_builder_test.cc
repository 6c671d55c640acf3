// The capsule builder on a snapshot and a probe result made by hand: no Monitor, no disk, no
// re-run.
#include "capsule/capture/internal/capsule_builder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/validate.h"

namespace capsule {
namespace {

using internal::BuildCapsule;
using internal::BuiltCapsule;
using internal::CaptureContext;
using internal::StepSnapshot;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Two layers, "first" (first.w) and "second" (second.w, second.b), and a parameter no layer owns.
// The builder never runs them.
class TwoLayerSequence : public LayerSequence {
 public:
  size_t size() const override { return 2; }
  std::string name(size_t i) const override { return i == 0 ? "first" : "second"; }
  TensorList Forward(size_t, const TensorList&, const LayerBatch&) override {
    throw std::logic_error("the builder must not run the model");
  }
  std::vector<NamedTensor> LayerParameters(size_t i) const override {
    if (i == 0) return {{"first.w", first_w}};
    return {{"second.w", second_w}, {"second.b", second_b}};
  }
  at::ScalarType compute_dtype() const override { return at::kFloat; }

  at::Tensor first_w = at::full({4, 4}, 0.5, at::kFloat);
  at::Tensor second_w = at::full({4, 4}, 0.25, at::kFloat);
  at::Tensor second_b = at::zeros({4}, at::kFloat);
};

class TwoLayerModel : public Model {
 public:
  LayerSequence& Path(PathKind) override { return seq; }
  std::vector<NamedTensor> NamedParameters() const override {
    std::vector<NamedTensor> all = seq.LayerParameters(0);
    for (const NamedTensor& p : seq.LayerParameters(1)) all.push_back(p);
    all.push_back({"scale", scale});
    return all;
  }
  ModelSpecInfo Spec() const override { return {"two_layer", "{\"d\":4}"}; }
  Status LoadParameters(const std::vector<NamedTensor>&) override { return Status::Ok(); }

  TwoLayerSequence seq;
  at::Tensor scale = at::ones({1}, at::kFloat);
};

HealthStats Finite(int64_t numel) {
  HealthStats s;
  s.numel = numel;
  s.min = s.max = s.absmax = s.mean = s.rms = 1.0;
  return s;
}

HealthStats AllNan(int64_t numel) {
  HealthStats s;
  s.numel = numel;
  s.nan_count = numel;
  s.first_nonfinite_index = 0;
  return s;
}

class CapsuleBuilderTest : public ::testing::Test {
 protected:
  CapsuleBuilderTest() {
    snap_.step = 7;
    snap_.cursor = DataCursor{1, 2, 3, {10, 11}, "sampler"};
    snap_.batch.tensors.input_ids = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3});
    snap_.batch.tensors.labels = at::tensor({2, 3, 0, 5, 6, 0}, at::kLong).view({2, 3});
    snap_.batch.raw_text = {"ab", "cd"};
    snap_.batch.sample_ids = {"s0", "s1"};
    snap_.batch.micro_batch = 1;
    snap_.batch.tokens_seen = 600;
    snap_.torch_rngs = {{"torch.cpu", v1::TORCH_CPU_GENERATOR, "cpu", "cpu state", 5}};
    snap_.user_rngs = {{"sampler", v1::USER, "cpu", "sampler state", 9}};
    snap_.intra_op_threads = 3;

    // The re-run: "first" is clean (and has a gradient), "second" is all NaN.
    LayerRecord first;
    first.index = 0;
    first.name = "first";
    first.inputs = {snap_.batch.tensors.input_ids};
    first.output = at::ones({2, 3, 4}, at::kFloat);
    first.forward = Finite(24);
    first.has_backward = true;
    first.grad = at::ones({2, 3, 4}, at::kFloat);
    first.backward = Finite(24);
    LayerRecord second;
    second.index = 1;
    second.name = "second";
    second.inputs = {first.output};
    second.output = at::full({2, 3, 4}, kNan, at::kFloat);
    second.forward = AllNan(24);
    rerun_.layers = {first, second};
    rerun_.loss_value = kNan;
    rerun_.first_anomalous = 1;
    rerun_.anomaly_phase = AnomalyPhase::kForward;
    rerun_.anomaly_reason = "24 NaN in forward output";

    context_.fired = {TriggerKind::kNonFiniteLoss, kNan, 0, "loss is not finite"};
    context_.now_unix_micros = 1234;
    StepScalars before, now;
    before.loss = 2.0;
    now.loss = kNan;
    context_.history = {{6, before}, {7, now}};
    context_.log_lines = {"line a", "line b"};
    context_.identity.set_code_revision("abc123");
    context_.model = &model_;
    context_.path = PathKind::kOptimized;

    options_.run_name = "unit";
    options_.annotations = {{"team", "numerics"}};
    options_.rank = 3;
    options_.world_size = 4;
    options_.local_rank = 1;
    options_.device = "cpu";
  }

  BuiltCapsule Build(const ProbeResult* rerun) {
    StatusOr<BuiltCapsule> built = BuildCapsule(snap_, rerun, context_, options_);
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? std::move(*built) : BuiltCapsule();
  }

  // The names of the embedded tensors with `role`.
  static std::set<std::string> Names(const v1::Capsule& c, v1::TensorRole role) {
    std::set<std::string> out;
    for (const auto& t : c.tensors()) {
      if (t.role() == role) out.insert(t.name());
    }
    return out;
  }

  TwoLayerModel model_;
  StepSnapshot snap_;
  ProbeResult rerun_;
  CaptureContext context_;
  MonitorOptions options_;
};

TEST_F(CapsuleBuilderTest, FillsEverySectionFromTheSnapshotAndTheRerun) {
  const BuiltCapsule built = Build(&rerun_);
  const v1::Capsule& c = built.capsule;
  EXPECT_FALSE(c.writer_version().empty());
  EXPECT_EQ(c.created_unix_micros(), 1234);
  EXPECT_EQ(c.run_name(), "unit");
  EXPECT_EQ(c.annotations().at("team"), "numerics");

  EXPECT_EQ(c.trigger().kind(), v1::NON_FINITE_LOSS);
  EXPECT_EQ(c.trigger().rule(), "loss is not finite");
  EXPECT_EQ(c.trigger().wall_time_unix_micros(), 1234);

  EXPECT_EQ(c.step().global_step(), 7);
  EXPECT_EQ(c.step().micro_batch(), 1);
  EXPECT_EQ(c.step().tokens_seen(), 600);
  EXPECT_EQ(c.step().epoch(), 1);
  ASSERT_EQ(c.step().history_size(), 2);
  EXPECT_EQ(c.step().history(0).step(), 6);
  EXPECT_EQ(c.step().history(0).loss(), 2.0);
  EXPECT_TRUE(std::isnan(c.step().history(1).loss()));
  EXPECT_FALSE(c.step().history(1).has_grad_norm());

  const v1::DataBatch& data = c.data();
  EXPECT_EQ(data.cursor().shard(), 2);
  EXPECT_EQ(data.cursor().offset(), 3);
  EXPECT_EQ(data.cursor().sample_indices_size(), 2);
  EXPECT_EQ(data.cursor().sampler_rng(), "sampler");
  ASSERT_EQ(data.sequences_size(), 2);
  EXPECT_EQ(std::vector<int64_t>(data.sequences(1).token_ids().begin(),
                                 data.sequences(1).token_ids().end()),
            (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(data.sequences(1).labels(1), 6);
  EXPECT_EQ(data.sequences(0).raw_text(), "ab");
  EXPECT_EQ(data.sequences(1).sample_id(), "s1");
  EXPECT_EQ(data.sequences(0).token_count(), 3);
  EXPECT_EQ(std::vector<std::string>(data.tensor_names().begin(), data.tensor_names().end()),
            (std::vector<std::string>{"input_ids", "labels"}));
  EXPECT_EQ(Names(c, v1::BATCH_INPUT), (std::set<std::string>{"input_ids", "labels"}));

  ASSERT_EQ(c.rng().generators_size(), 2);
  EXPECT_EQ(c.rng().generators(0).state(), "cpu state");
  EXPECT_EQ(c.rng().generators(1).name(), "sampler");
  EXPECT_EQ(c.rng().generators(1).seed(), 9u);
  EXPECT_FALSE(c.rng().generators(0).torch_version().empty());

  EXPECT_EQ(c.placement().rank(), 3);
  EXPECT_EQ(c.placement().world_size(), 4);
  EXPECT_EQ(c.placement().local_rank(), 1);
  EXPECT_EQ(c.placement().data_parallel_rank(), 3);
  EXPECT_EQ(c.environment().intra_op_threads(), 3);
  EXPECT_EQ(c.numerics().intra_op_threads(), 3);
  EXPECT_EQ(c.numerics().path(), v1::OPTIMIZED);

  EXPECT_EQ(c.identity().code_revision(), "abc123");
  EXPECT_EQ(c.identity().model_sha256().size(), 64u);
  EXPECT_EQ(c.identity().model_parameter_count(), 16 + 16 + 4 + 1);
  EXPECT_EQ(c.model().registry_name(), "two_layer");
  EXPECT_EQ(c.model().config_json(), "{\"d\":4}");
  EXPECT_EQ(c.model().trainer_path(), v1::OPTIMIZED);
  EXPECT_EQ(c.model().layers_size(), 2);

  // Forward stats for both layers, then the backward entry of the layer that has one.
  ASSERT_EQ(c.numerics().layers_size(), 3);
  EXPECT_EQ(c.numerics().layers(0).name(), "first");
  EXPECT_FALSE(c.numerics().layers(0).anomalous());
  EXPECT_EQ(c.numerics().layers(1).name(), "second");
  EXPECT_EQ(c.numerics().layers(1).stats().nan_count(), 24);
  EXPECT_TRUE(c.numerics().layers(1).anomalous());
  EXPECT_EQ(c.numerics().layers(2).phase(), v1::BACKWARD);
  EXPECT_EQ(c.numerics().layers(2).name(), "first");

  EXPECT_EQ(std::vector<std::string>(c.log().lines().begin(), c.log().lines().end()),
            (std::vector<std::string>{"line a", "line b"}));
  EXPECT_TRUE(c.log().error().empty());
  EXPECT_TRUE(built.notes.empty());
}

TEST_F(CapsuleBuilderTest, FirstAnomalousLayerAndItsInputsAndOutput) {
  const v1::Capsule c = Build(&rerun_).capsule;
  EXPECT_EQ(c.numerics().first_anomalous_layer(), "second");
  EXPECT_EQ(c.numerics().first_anomalous_index(), 1);
  EXPECT_EQ(c.numerics().first_anomalous_phase(), v1::FORWARD);
  EXPECT_EQ(c.numerics().anomaly_reason(), "24 NaN in forward output");
  EXPECT_EQ(Names(c, v1::LAYER_INPUT), (std::set<std::string>{"second/input.0"}));
  EXPECT_EQ(Names(c, v1::OPTIMIZED_OUTPUT), (std::set<std::string>{"second/output"}));
  for (const auto& t : c.tensors()) {
    if (t.role() == v1::LAYER_INPUT || t.role() == v1::OPTIMIZED_OUTPUT) {
      EXPECT_EQ(t.layer(), "second") << t.name();
    }
  }

  // A re-run of the reference path embeds the layer's output as a reference output.
  context_.path = PathKind::kReference;
  const v1::Capsule ref = Build(&rerun_).capsule;
  EXPECT_EQ(Names(ref, v1::REFERENCE_OUTPUT), (std::set<std::string>{"second/output"}));
  EXPECT_TRUE(Names(ref, v1::OPTIMIZED_OUTPUT).empty());

  // A clean re-run names no layer.
  rerun_.first_anomalous = -1;
  context_.path = PathKind::kOptimized;
  const v1::Capsule clean = Build(&rerun_).capsule;
  EXPECT_TRUE(clean.numerics().first_anomalous_layer().empty());
  EXPECT_EQ(clean.numerics().first_anomalous_index(), -1);
  EXPECT_TRUE(Names(clean, v1::LAYER_INPUT).empty());
}

TEST_F(CapsuleBuilderTest, WeightPolicyAllAnomalousLayerAndNone) {
  options_.weight_policy = WeightPolicy::kAll;
  const v1::Capsule all = Build(&rerun_).capsule;
  EXPECT_EQ(all.model().weight_policy(), v1::WEIGHTS_ALL);
  EXPECT_EQ(Names(all, v1::PARAMETER),
            (std::set<std::string>{"first.w", "second.w", "second.b", "scale"}));
  std::map<std::string, std::string> owner;  // parameter -> the layer it is stored under
  for (const auto& t : all.tensors()) {
    if (t.role() == v1::PARAMETER) owner[t.name()] = t.layer();
  }
  EXPECT_EQ(
      owner,
      (std::map<std::string, std::string>{
          {"first.w", "first"}, {"second.w", "second"}, {"second.b", "second"}, {"scale", ""}}));

  options_.weight_policy = WeightPolicy::kAnomalousLayer;
  const v1::Capsule layer = Build(&rerun_).capsule;
  EXPECT_EQ(layer.model().weight_policy(), v1::WEIGHTS_ANOMALOUS_LAYER);
  EXPECT_EQ(Names(layer, v1::PARAMETER), (std::set<std::string>{"second.w", "second.b"}));

  options_.weight_policy = WeightPolicy::kNone;
  const v1::Capsule none = Build(&rerun_).capsule;
  EXPECT_EQ(none.model().weight_policy(), v1::WEIGHTS_NONE);
  EXPECT_TRUE(Names(none, v1::PARAMETER).empty());
  EXPECT_FALSE(none.identity().model_sha256().empty());  // the hash is kept without the weights
}

// The parameters are embedded where they lie: the capsule holds their digests, the builder holds
// the tensors themselves (no copy of the weights), and the capsule written from them is the one
// whose message owns the bytes (OwnTensorBytes, for a capsule written after the optimizer step).
TEST_F(CapsuleBuilderTest, ParametersAreHeldNotCopied) {
  options_.weight_policy = WeightPolicy::kAll;
  context_.now_unix_micros = 1780000000000000;  // a time the validator accepts
  BuiltCapsule built = Build(&rerun_);
  const v1::Capsule& c = built.capsule;
  ASSERT_EQ(built.tensor_data.size(), static_cast<size_t>(c.tensors_size()));
  std::map<std::string, const void*> where;
  for (const NamedTensor& p : model_.NamedParameters()) where[p.first] = p.second.data_ptr();
  int params = 0;
  for (int i = 0; i < c.tensors_size(); ++i) {
    const v1::TensorBlob& t = c.tensors(i);
    if (t.role() != v1::PARAMETER) {
      EXPECT_TRUE(built.tensor_data[i].empty()) << t.name();  // copies, small
      EXPECT_FALSE(t.data().empty()) << t.name();
      continue;
    }
    ++params;
    EXPECT_TRUE(t.data().empty()) << t.name();
    EXPECT_EQ(static_cast<const void*>(built.tensor_data[i].data()), where.at(t.name()))
        << t.name() << " is not the parameter's own storage";
    EXPECT_EQ(*Sha256Hex(built.tensor_data[i]), t.sha256()) << t.name();
  }
  EXPECT_EQ(params, 4);
  EXPECT_EQ(built.held.size(), 4u);

  WriteOptions w;
  w.tensor_data = &built.tensor_data;
  StatusOr<std::string> from_views = EncodeCapsule(c, w);
  ASSERT_TRUE(from_views.ok()) << from_views.status();
  internal::OwnTensorBytes(&built);
  EXPECT_TRUE(built.tensor_data.empty());
  EXPECT_TRUE(built.held.empty());
  StatusOr<std::string> owned = EncodeCapsule(built.capsule, WriteOptions());
  ASSERT_TRUE(owned.ok()) << owned.status();
  EXPECT_EQ(*owned, *from_views);
}

TEST_F(CapsuleBuilderTest, AllFallsBackToTheAnomalousLayerOverTheCapAndSaysSo) {
  options_.weight_policy = WeightPolicy::kAll;
  options_.max_weight_bytes = 100;  // the model holds 37 floats = 148 bytes
  options_.log_lines = 2;
  const BuiltCapsule built = Build(&rerun_);
  const v1::Capsule& c = built.capsule;
  EXPECT_EQ(c.model().weight_policy(), v1::WEIGHTS_ANOMALOUS_LAYER);
  EXPECT_EQ(Names(c, v1::PARAMETER), (std::set<std::string>{"second.w", "second.b"}));
  ASSERT_EQ(built.notes.size(), 1u);
  EXPECT_NE(built.notes[0].find("weights are 148 bytes, over the cap of 100"), std::string::npos)
      << built.notes[0];
  // The capsule's log is the ring with the note appended, still at most log_lines long.
  EXPECT_EQ(std::vector<std::string>(c.log().lines().begin(), c.log().lines().end()),
            (std::vector<std::string>{"line b", built.notes[0]}));
}

TEST_F(CapsuleBuilderTest, ReproducedFlagFollowsTheTriggerRule) {
  EXPECT_EQ(Build(&rerun_).capsule.trigger().capture_rerun(), v1::RERUN_REPRODUCED);
  EXPECT_TRUE(std::isnan(Build(&rerun_).capsule.trigger().rerun_observed()));

  rerun_.loss_value = 3.25;  // the re-run's loss came out finite: transient
  const v1::Capsule transient = Build(&rerun_).capsule;
  EXPECT_EQ(transient.trigger().capture_rerun(), v1::RERUN_NOT_REPRODUCED);
  EXPECT_EQ(transient.trigger().rerun_observed(), 3.25);

  // MANUAL: the step's loss again, within the shared 1e-6 relative rule (not bit for bit).
  context_.fired = {TriggerKind::kManual, 3.25, 0, "manual capture"};
  rerun_.loss_value = 3.25 * (1 + 1e-7);
  EXPECT_EQ(Build(&rerun_).capsule.trigger().capture_rerun(), v1::RERUN_REPRODUCED);
  rerun_.loss_value = 3.25 * (1 + 1e-5);
  EXPECT_EQ(Build(&rerun_).capsule.trigger().capture_rerun(), v1::RERUN_NOT_REPRODUCED);

  // The gradient kinds record the re-run's gradient norm.
  context_.fired = {TriggerKind::kGradNormSpike, 9.0, 4.0, "grad norm spike"};
  rerun_.grad_norm = 5.0;
  rerun_.backward_done = true;
  const v1::Capsule grad = Build(&rerun_).capsule;
  EXPECT_EQ(grad.trigger().capture_rerun(), v1::RERUN_REPRODUCED);
  EXPECT_EQ(grad.trigger().rerun_observed(), 5.0);
}

TEST_F(CapsuleBuilderTest, WithoutARerunThereAreNoLayerSections) {
  const v1::Capsule c = Build(nullptr).capsule;
  EXPECT_EQ(c.trigger().capture_rerun(), v1::REPRODUCTION_UNSPECIFIED);
  EXPECT_EQ(c.numerics().layers_size(), 0);
  EXPECT_EQ(c.numerics().first_anomalous_index(), -1);
  EXPECT_TRUE(Names(c, v1::LAYER_INPUT).empty());
  EXPECT_EQ(c.model().registry_name(), "two_layer");  // the model is still described

  // Without a model: no model, weights or per-layer sections at all.
  context_.model = nullptr;
  const v1::Capsule bare = Build(&rerun_).capsule;
  EXPECT_FALSE(bare.has_model());
  EXPECT_TRUE(bare.identity().model_sha256().empty());
  EXPECT_EQ(bare.numerics().layers_size(), 0);
  EXPECT_EQ(bare.data().sequences_size(), 2);
}

TEST_F(CapsuleBuilderTest, TextThatIsNotUtf8NeverLosesTheCapsule) {
  // A byte-level tokenizer's window cut "é" (C3 A9) in two; a log line and a sample id carry
  // Latin-1 bytes.
  snap_.batch.raw_text = {"caf\xc3", "ok"};
  snap_.batch.sample_ids = {
      "s\xe9"
      "0",
      "s1"};
  context_.log_lines = {"read caf\xe9.txt"};
  context_.now_unix_micros = 1780000000000000;  // a time the validator accepts
  const BuiltCapsule built = Build(&rerun_);
  const v1::Capsule& c = built.capsule;
  ValidateOptions held;
  held.tensor_data = &built.tensor_data;
  ASSERT_TRUE(ValidateCapsule(c, held).ok()) << ValidateCapsule(c, held);
  EXPECT_EQ(c.data().sequences(0).raw_bytes(), "caf\xc3");  // losslessly, as bytes
  EXPECT_TRUE(c.data().sequences(0).raw_text().empty());
  EXPECT_EQ(c.data().sequences(1).raw_text(), "ok");
  EXPECT_EQ(c.data().sequences(0).sample_id(), "s\\xe90");  // escaped, and said so
  ASSERT_EQ(c.capture_notes_size(), 3) << c.DebugString();
  EXPECT_EQ(c.capture_notes(0),
            "data.sequences[0]: raw sample is not valid UTF-8; stored in raw_bytes");
  EXPECT_EQ(c.capture_notes(1),
            "data.sequences[0].sample_id: not valid UTF-8; 1 byte stored as \\xNN escapes");
  EXPECT_NE(c.capture_notes(2).find("log.lines[0]"), std::string::npos) << c.capture_notes(2);
  // And it encodes: the writer's validation passes.
  WriteOptions w;
  w.tensor_data = &built.tensor_data;
  EXPECT_TRUE(EncodeCapsule(c, w).ok());
}

TEST_F(CapsuleBuilderTest, ExceptionTextGoesToTheLogUnlessTheRerunSaidMore) {
  context_.fired = {TriggerKind::kException, kNan, 0, "the step threw"};
  context_.message = "CUDA error: an illegal memory access";
  EXPECT_EQ(Build(nullptr).capsule.log().error(), "CUDA error: an illegal memory access");
  EXPECT_EQ(Build(nullptr).capsule.trigger().message(), "CUDA error: an illegal memory access");

  rerun_.error = "second: index out of range";
  const v1::Capsule c = Build(&rerun_).capsule;
  EXPECT_EQ(c.log().error(), "second: index out of range");
  EXPECT_EQ(c.trigger().capture_rerun(), v1::RERUN_REPRODUCED);
}

}  // namespace
}  // namespace capsule
