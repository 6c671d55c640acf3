// The replay engine end to end in one process: the tiny_gpt sample trains under a Monitor, which
// writes capsules of faulty and clean steps; ReplayCapsule must diagnose each one and name the
// first divergent layer, ExtractLayer must cut out a layer whose own replay gives the full
// replay's verdict and errors, and the refusals must say what is wrong without naming a flag.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "capsule/base/internal/sha256.h"
#include "capsule/capture/monitor.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/redact.h"
#include "capsule/format/signing.h"
#include "capsule/format/validate.h"
#include "capsule/instrument/internal/layer_probe.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/extract.h"
#include "capsule/replay/model_registry.h"
#include "capsule/replay/replayer.h"
#include "capsule/replay/stress.h"
#include "capsule/snapshot/checkpoint.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/registration.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

namespace fs = std::filesystem;
using tiny_gpt::FaultKind;
using tiny_gpt::FaultSpec;

constexpr int kBlocks = 2;  // layers: embed, blocks.0, blocks.1, ln_f, lm_head, loss

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "capsule_replay_XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Trains tiny_gpt for `steps` steps under a Monitor, as the sample trainer does (a capture by hand
// at `capture_at`, none when negative), and returns every capsule it wrote, decoded, in file name
// order.
std::vector<v1::Capsule> Record(const FaultSpec& fault, int steps, int capture_at,
                                bool grad_norm_spike_trigger = true) {
  at::set_num_threads(1);
  TempDir dir;
  auto keys = GenerateKeyPair();
  EXPECT_TRUE(keys.ok());
  const std::string key_path = dir.path() + "/signer.key";
  EXPECT_TRUE(SavePrivateKeyFile(keys->private_key, key_path).ok());

  tiny_gpt::TinyGptConfig config;
  config.n_layers = kBlocks;
  config.fault = fault;
  std::unique_ptr<tiny_gpt::TinyGpt> model = std::move(*tiny_gpt::TinyGpt::Create(config));
  auto loader = tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {4, config.seq_len, 0});
  EXPECT_TRUE(loader.ok()) << loader.status();
  std::vector<at::Tensor> params = model->parameters();
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(3e-3));

  MonitorOptions mo;
  mo.capsule_dir = dir.path() + "/caps";
  mo.signing_key_path = key_path;
  mo.run_name = "replay-test";
  mo.log_sink = [](const std::string&) {};
  mo.trigger_grad_norm_spike = grad_norm_spike_trigger;
  Monitor monitor(mo);
  monitor.AttachModel(model.get(), PathKind::kOptimized);
  IdentityInfo identity;
  identity.config_text = config.ToJson();
  EXPECT_TRUE(monitor.SetIdentity(identity).ok());
  monitor.RegisterRng(
      "sampler", [&] { return loader->SaveRngState(); }, 0);

  for (int step = 0; step < steps; ++step) {
    model->SetStep(step);
    tiny_gpt::CorpusBatch cb = loader->Next();
    if (tiny_gpt::FaultCorruptsBatch(fault, step)) {
      tiny_gpt::CorruptBatch(cb.batch, fault.kind == FaultKind::kBadBatch);
    }
    DataCursor cursor{cb.cursor.epoch, cb.cursor.shard, cb.cursor.offset, cb.cursor.sample_indices,
                      "sampler"};
    monitor.BeginStep(step, cursor, StepBatch{cb.batch, cb.raw_text, {}, 0, step * 128, {}, {}});
    optimizer.zero_grad();
    double loss = NAN;
    StepReport failed = monitor.RunStep([&] {
      at::Tensor l = RunSequence(model->Path(PathKind::kOptimized), cb.batch);
      l.backward();
      loss = l.item<double>();
    });
    double sq = 0;
    for (const auto& p : params) {
      if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    }
    StepScalars scalars;
    scalars.loss = loss;
    scalars.grad_norm = std::sqrt(sq);
    if (!failed.triggered) monitor.EndStep(scalars);
    if (step == capture_at) monitor.CaptureNow("test capture");
    if (std::isfinite(loss) && std::isfinite(sq)) optimizer.step();
  }

  std::vector<std::string> files;
  if (fs::exists(mo.capsule_dir)) {
    for (const auto& e : fs::directory_iterator(mo.capsule_dir)) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ReadOptions ro;
  ro.trusted_keys.push_back(keys->public_key);
  std::vector<v1::Capsule> out;
  for (const std::string& f : files) {
    auto d = ReadCapsuleFile(f, ro);
    EXPECT_TRUE(d.ok()) << f << ": " << d.status();
    if (d.ok()) out.push_back(*d->capsule);
  }
  return out;
}

// The first capsule of a run, which must have written one.
v1::Capsule RecordOne(const FaultSpec& fault, int steps, int capture_at = -1) {
  std::vector<v1::Capsule> all = Record(fault, steps, capture_at);
  EXPECT_FALSE(all.empty()) << fault.ToString();
  return all.empty() ? v1::Capsule() : all.front();
}

const v1::LayerComparison* Entry(const v1::ReplayReport& r, const std::string& name,
                                 v1::Phase phase) {
  for (const auto& l : r.layers()) {
    if (l.name() == name && l.phase() == phase) return &l;
  }
  return nullptr;
}

class ReplayCapsuleTest : public ::testing::Test {
 protected:
  ReplayCapsuleTest() { tiny_gpt::RegisterTinyGpt(registry_); }

  StatusOr<v1::ReplayReport> Replay(const v1::Capsule& c, BisectMode bisect = BisectMode::kNone,
                                    bool backward = false) {
    ReplayOptions options;
    options.bisect = bisect;
    options.backward = backward;
    return ReplayCapsule(c, registry_, options);
  }

  ModelRegistry registry_;
};

TEST_F(ReplayCapsuleTest, NanFaultIsNumericsAtTheFaultyLayerAndBisectAgrees) {
  const v1::Capsule c = RecordOne({FaultKind::kNan, "blocks.1", 2}, 3);
  ASSERT_EQ(c.trigger().kind(), v1::NON_FINITE_LOSS);
  auto r = Replay(c, BisectMode::kBisect);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->fidelity(), v1::REPRODUCED_EXACT) << r->fidelity_detail();
  EXPECT_EQ(r->diagnosis(), v1::NUMERICS);
  ASSERT_TRUE(r->has_first_divergent_layer());
  EXPECT_EQ(r->first_divergent_layer(), "blocks.1");
  EXPECT_EQ(r->first_divergent_phase(), v1::FORWARD);
  EXPECT_EQ(r->first_divergent_source(), v1::LAYERWISE);
  EXPECT_FALSE(r->reference_anomalous());
  EXPECT_EQ(r->bisect().first_bad_layer(), "blocks.1");
  EXPECT_LE(r->bisect().probes(), r->bisect().probe_bound());
  // Layers before the fault agree; the faulty one has non-finite mismatches.
  for (const char* ok : {"embed", "blocks.0"}) {
    const v1::LayerComparison* l = Entry(*r, ok, v1::FORWARD);
    ASSERT_NE(l, nullptr) << ok;
    EXPECT_EQ(l->verdict(), v1::OK) << ok << ": " << l->reason();
  }
  const v1::LayerComparison* bad = Entry(*r, "blocks.1", v1::FORWARD);
  ASSERT_NE(bad, nullptr);
  EXPECT_EQ(bad->verdict(), v1::DIVERGED);
  EXPECT_GT(bad->nonfinite_mismatch(), 0);
  // The replayer returns facts; sentences are the renderers' (report/replay_text.h).
  EXPECT_EQ(r->diagnosis_text(), "");
}

TEST_F(ReplayCapsuleTest, FiniteEpsFaultIsFoundForwardAndBackward) {
  const v1::Capsule c = RecordOne({FaultKind::kEps, "blocks.0", 0}, 3, /*capture_at=*/2);
  ASSERT_EQ(c.trigger().kind(), v1::MANUAL);
  auto r = Replay(c, BisectMode::kLinear, /*backward=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->fidelity(), v1::REPRODUCED_EXACT) << r->fidelity_detail();
  EXPECT_EQ(r->diagnosis(), v1::NUMERICS);
  EXPECT_EQ(r->first_divergent_layer(), "blocks.0");
  EXPECT_EQ(r->first_divergent_phase(), v1::FORWARD);
  const v1::LayerComparison* fwd = Entry(*r, "blocks.0", v1::FORWARD);
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->verdict(), v1::DIVERGED);
  EXPECT_EQ(fwd->nonfinite_mismatch(), 0);  // finite, but far outside the tolerance
  const v1::LayerComparison* bwd = Entry(*r, "blocks.0", v1::BACKWARD);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->verdict(), v1::DIVERGED);
  EXPECT_EQ(r->bisect().strategy(), "linear");
  EXPECT_EQ(r->bisect().first_bad_layer(), "blocks.0");
  EXPECT_TRUE(r->bisect().monotonic());
}

TEST_F(ReplayCapsuleTest, CleanCaptureHasNoDivergentLayer) {
  const v1::Capsule c = RecordOne({}, 3, /*capture_at=*/2);
  auto r = Replay(c, BisectMode::kBisect, /*backward=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->fidelity(), v1::REPRODUCED_EXACT) << r->fidelity_detail();
  EXPECT_EQ(r->diagnosis(), v1::NO_DIVERGENCE);
  EXPECT_FALSE(r->has_first_divergent_layer());
  EXPECT_EQ(r->first_divergent_source(), v1::DIVERGENCE_SOURCE_UNSPECIFIED);
  EXPECT_EQ(r->bisect().first_bad_layer(), "");
  // The backward bisect compares gradients: a clean model's composites agree too.
  EXPECT_EQ(r->backward_bisect().phase(), v1::BACKWARD);
  EXPECT_EQ(r->backward_bisect().first_bad_layer(), "");
  EXPECT_GT(r->backward_bisect().probes(), 0);
  int forward = 0, backward = 0;
  for (const auto& l : r->layers()) {
    EXPECT_EQ(l.verdict(), v1::OK)
        << l.name() << " " << v1::Phase_Name(l.phase()) << ": " << l.reason();
    forward += l.phase() == v1::FORWARD;
    backward += l.phase() == v1::BACKWARD;
  }
  EXPECT_EQ(forward, kBlocks + 4);
  EXPECT_GT(backward, 0);
}

TEST_F(ReplayCapsuleTest, TransientFaultDoesNotReproduce) {
  const v1::Capsule c = RecordOne({FaultKind::kTransient, "blocks.1", 2}, 3);
  ASSERT_EQ(c.trigger().kind(), v1::NON_FINITE_LOSS);
  auto r = Replay(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->fidelity(), v1::NOT_REPRODUCED) << r->fidelity_detail();
  EXPECT_EQ(r->diagnosis(), v1::TRANSIENT);
}

TEST_F(ReplayCapsuleTest, BadBatchShowsOnTheReferencePathToo) {
  // Every sample corrupted alike: no sample stands out, so no earlier stage explains the spike.
  // The spike trigger needs 50 steps of history first; this test is about the loss.
  std::vector<v1::Capsule> all = Record({FaultKind::kBadBatch, "", 55}, 56, -1,
                                        /*grad_norm_spike_trigger=*/false);
  ASSERT_EQ(all.size(), 1u);
  const v1::Capsule& c = all.front();
  ASSERT_EQ(c.trigger().kind(), v1::LOSS_SPIKE);
  auto r = Replay(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->fidelity(), v1::NOT_REPRODUCED) << r->fidelity_detail();
  EXPECT_TRUE(r->reference_anomalous());
  EXPECT_EQ(r->diagnosis(), v1::DATA_OR_MODEL);
}

TEST_F(ReplayCapsuleTest, ExtractReplaysToTheFullReplaysVerdictAndErrors) {
  const v1::Capsule full = RecordOne({FaultKind::kNan, "blocks.1", 2}, 3);
  auto full_report = Replay(full);
  ASSERT_TRUE(full_report.ok()) << full_report.status();

  auto x = ExtractLayer(full, registry_, {"blocks.1", *Sha256Hex(full.SerializeAsString())});
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_TRUE(IsLayerExtract(*x));
  EXPECT_FALSE(IsLayerExtract(full));
  ASSERT_EQ(x->model().layers_size(), 1);
  EXPECT_EQ(x->model().layers(0), "blocks.1");
  for (const auto& t : x->tensors()) {
    EXPECT_TRUE(t.layer() == "blocks.1" || t.name() == "attention_mask" || t.name() == "loss_mask")
        << t.name() << " of layer " << t.layer();
  }

  auto r = Replay(*x);  // ReplayCapsule sees an extract and replays its one layer
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->extract_layer(), "blocks.1");
  EXPECT_EQ(r->diagnosis(), v1::NUMERICS);
  EXPECT_EQ(r->first_divergent_layer(), "blocks.1");
  EXPECT_EQ(r->fidelity(), v1::REPRODUCED_EXACT) << r->fidelity_detail();
  ASSERT_EQ(r->layers_size(), 1);
  const v1::LayerComparison* in_full = Entry(*full_report, "blocks.1", v1::FORWARD);
  ASSERT_NE(in_full, nullptr);
  EXPECT_EQ(r->layers(0).verdict(), in_full->verdict());
  EXPECT_EQ(r->layers(0).nonfinite_mismatch(), in_full->nonfinite_mismatch());
  EXPECT_EQ(r->layers(0).failed(), in_full->failed());

  // A layer before the fault replays clean on its own too, with the full replay's errors.
  auto clean = ExtractLayer(full, registry_, {"blocks.0", *Sha256Hex("source")});
  ASSERT_TRUE(clean.ok()) << clean.status();
  auto rc = Replay(*clean);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(rc->diagnosis(), v1::NO_DIVERGENCE);
  EXPECT_FALSE(rc->has_first_divergent_layer());
  const v1::LayerComparison* clean_in_full = Entry(*full_report, "blocks.0", v1::FORWARD);
  ASSERT_NE(clean_in_full, nullptr);
  ASSERT_EQ(rc->layers_size(), 1);
  EXPECT_EQ(rc->layers(0).max_abs_err(), clean_in_full->max_abs_err());
  EXPECT_EQ(rc->layers(0).max_rel_err(), clean_in_full->max_rel_err());
}

TEST_F(ReplayCapsuleTest, ExtractRefusesAnExtractAndAnUnknownLayer) {
  const v1::Capsule full = RecordOne({}, 3, /*capture_at=*/1);
  auto x = ExtractLayer(full, registry_, {"blocks.0", *Sha256Hex("source")});
  ASSERT_TRUE(x.ok()) << x.status();
  auto again = ExtractLayer(*x, registry_, {"blocks.0", *Sha256Hex("x")});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.status().message().find("already an extract"), std::string::npos);
  auto none = ExtractLayer(full, registry_, {"blocks.9", *Sha256Hex("source")});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no layer \"blocks.9\""), std::string::npos);
}

// The library says what is wrong; which flag gets round it is the command line's to say.
void ExpectNoFlag(const Status& s) {
  EXPECT_EQ(s.message().find("--"), std::string::npos) << s.message();
}

TEST_F(ReplayCapsuleTest, RedactedTokensAreRefusedByReplayAndExtractAlike) {
  v1::Capsule c = RecordOne({}, 2, /*capture_at=*/1);
  RedactOptions redact;
  redact.tokens = true;
  redact.source_sha256 = *Sha256Hex("source");
  ASSERT_TRUE(RedactCapsule(&c, redact).ok());
  auto r = Replay(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("token ids were redacted"), std::string::npos) << r.status();
  ExpectNoFlag(r.status());
  auto x = ExtractLayer(c, registry_, {"blocks.0", *Sha256Hex("source")});
  ASSERT_FALSE(x.ok());
  EXPECT_EQ(x.status(), r.status());
}

TEST_F(ReplayCapsuleTest, RefusalsNameTheCauseAndNoFlag) {
  const v1::Capsule c = RecordOne({}, 2, /*capture_at=*/1);

  v1::Capsule no_weights = c;
  no_weights.mutable_model()->set_weight_policy(v1::WEIGHTS_ANOMALOUS_LAYER);
  auto r = Replay(no_weights);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("does not embed the model's weights"), std::string::npos)
      << r.status();
  ExpectNoFlag(r.status());

  v1::Capsule other_torch = c;
  other_torch.mutable_environment()->set_torch_version("0.0.1");
  r = Replay(other_torch);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("recorded with torch 0.0.1"), std::string::npos)
      << r.status();
  ExpectNoFlag(r.status());
  ReplayOptions forced;
  forced.force = true;
  auto anyway = ReplayCapsule(other_torch, registry_, forced);
  ASSERT_TRUE(anyway.ok()) << anyway.status();
  ASSERT_EQ(anyway->warnings_size(), 1);
  EXPECT_NE(anyway->warnings(0).find("recorded with torch 0.0.1"), std::string::npos);

  ModelRegistry empty;
  auto unregistered = ReplayCapsule(c, empty, {});
  ASSERT_FALSE(unregistered.ok());
  EXPECT_EQ(unregistered.status().code(), StatusCode::kNotFound);
  ExpectNoFlag(unregistered.status());

  v1::Capsule no_ids = c;
  for (auto& t : *no_ids.mutable_tensors()) {
    if (t.name() == "input_ids") t.set_name("renamed");
  }
  r = Replay(no_ids);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no input_ids"), std::string::npos) << r.status();
}

// ProbeStep, the instrumented run both capture and replay stand on: it names the first layer with
// a non-finite output and keeps every layer's input for the layerwise comparison.
TEST(ProbeStepTest, NamesTheFirstNonFiniteLayer) {
  at::set_num_threads(1);
  tiny_gpt::TinyGptConfig config;
  config.n_layers = kBlocks;
  config.fault = {FaultKind::kNan, "blocks.1", 0};
  auto model = tiny_gpt::TinyGpt::Create(config);
  ASSERT_TRUE(model.ok()) << model.status();
  auto loader = tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {2, config.seq_len, 0});
  ASSERT_TRUE(loader.ok()) << loader.status();
  const LayerBatch batch = loader->Next().batch;
  auto r = ProbeStep((*model)->Path(PathKind::kOptimized), batch, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->error, "");
  ASSERT_EQ(r->layers.size(), static_cast<size_t>(kBlocks + 4));
  ASSERT_GE(r->first_anomalous, 0);
  EXPECT_EQ(r->layers[r->first_anomalous].name, "blocks.1");
  EXPECT_EQ(r->anomaly_phase, AnomalyPhase::kForward);
  EXPECT_FALSE(std::isfinite(r->loss_value));
  EXPECT_EQ(r->layers[0].forward.nan_count, 0);

  auto clean = ProbeStep((*model)->Path(PathKind::kReference), batch, {});
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->first_anomalous, -1);
  EXPECT_TRUE(std::isfinite(clean->loss_value));
  EXPECT_TRUE(clean->backward_done);
  EXPECT_TRUE(std::isfinite(clean->grad_norm));
}

// --repeat: a deterministic capsule replays bitwise alike; a model whose optimized path draws
// from an unseeded source (a nondeterministic kernel) does not, and the spread is reported.
TEST_F(ReplayCapsuleTest, RepeatedReplaysAreBitwiseIdenticalForADeterministicCapsule) {
  const v1::Capsule c = RecordOne({FaultKind::kEps, "blocks.0", 0}, 3, /*capture_at=*/2);
  ReplayOptions options;
  options.repeat = 4;
  auto r = ReplayCapsule(c, registry_, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_repeat());
  EXPECT_EQ(r->repeat().runs(), 4);
  EXPECT_TRUE(r->repeat().bitwise_identical());
  EXPECT_EQ(r->repeat().reproduced_runs(), 4);
  EXPECT_EQ(r->repeat().spreads_size(), 0);
  EXPECT_EQ(r->diagnosis(), v1::NUMERICS);
}

// tiny_gpt whose optimized lm_head output is scaled by 1 + u * 1e-6, u from std::random_device.
class NoisyPath : public LayerSequence {
 public:
  explicit NoisyPath(LayerSequence& inner) : inner_(inner) {}
  size_t size() const override { return inner_.size(); }
  std::string name(size_t i) const override { return inner_.name(i); }
  at::ScalarType compute_dtype() const override { return inner_.compute_dtype(); }
  std::vector<NamedTensor> LayerParameters(size_t i) const override {
    return inner_.LayerParameters(i);
  }
  TensorList Forward(size_t i, const TensorList& in, const LayerBatch& batch) override {
    TensorList out = inner_.Forward(i, in, batch);
    if (inner_.name(i) != "lm_head") return out;
    std::random_device rd;
    const double u = std::uniform_real_distribution<double>(0, 1)(rd);
    return {out[0] * (1 + u * 1e-6)};
  }

 private:
  LayerSequence& inner_;
};

class NoisyModel : public Model {
 public:
  explicit NoisyModel(std::unique_ptr<Model> inner)
      : inner_(std::move(inner)), noisy_(inner_->Path(PathKind::kOptimized)) {}
  LayerSequence& Path(PathKind k) override {
    return k == PathKind::kOptimized ? noisy_ : inner_->Path(k);
  }
  std::vector<NamedTensor> NamedParameters() const override { return inner_->NamedParameters(); }
  ModelSpecInfo Spec() const override { return inner_->Spec(); }

 private:
  std::unique_ptr<Model> inner_;
  NoisyPath noisy_;
};

TEST_F(ReplayCapsuleTest, RepeatedReplaysOfANondeterministicKernelReportTheSpread) {
  v1::Capsule c = RecordOne({FaultKind::kNone, "", 0}, 3, /*capture_at=*/2);
  c.mutable_model()->set_registry_name("noisy_tiny_gpt");
  ASSERT_TRUE(registry_
                  .Register("noisy_tiny_gpt",
                            [this](const ModelSpecInfo& spec) -> StatusOr<std::unique_ptr<Model>> {
                              CAPSULE_ASSIGN_OR_RETURN(
                                  std::unique_ptr<Model> inner,
                                  registry_.Create({"tiny_gpt", spec.config_json}));
                              return std::unique_ptr<Model>(new NoisyModel(std::move(inner)));
                            })
                  .ok());
  ReplayOptions options;
  options.repeat = 3;
  auto r = ReplayCapsule(c, registry_, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->repeat().bitwise_identical());
  bool lm_head_spread = false;
  for (const v1::MetricSpread& m : r->repeat().spreads()) {
    EXPECT_LT(m.min(), m.max()) << m.metric();
    lm_head_spread |= m.metric().find("lm_head FORWARD max_abs_err") != std::string::npos;
  }
  EXPECT_TRUE(lm_head_spread);
  // Layers before the noisy one stay bitwise alike: they are not in the spreads.
  for (const v1::MetricSpread& m : r->repeat().spreads()) {
    EXPECT_EQ(m.metric().find(" embed "), std::string::npos) << m.metric();
  }
}

// A fault in a kernel's hand-written backward: the forward bisect finds nothing, the backward
// bisect (composites run forward and backward, parameter gradients compared) names the layer.
TEST_F(ReplayCapsuleTest, BackwardBisectNamesALayerWhoseBackwardAloneIsWrong) {
  const v1::Capsule c = RecordOne({FaultKind::kGeluGrad, "blocks.1", 0}, 3, /*capture_at=*/2);
  auto r = Replay(c, BisectMode::kBisect, /*backward=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->diagnosis(), v1::NUMERICS);
  EXPECT_EQ(r->first_divergent_layer(), "blocks.1");
  EXPECT_EQ(r->first_divergent_phase(), v1::BACKWARD);
  EXPECT_EQ(r->bisect().first_bad_layer(), "");  // the forward is right
  EXPECT_EQ(r->backward_bisect().first_bad_layer(), "blocks.1");
  EXPECT_LE(r->backward_bisect().probes(), r->backward_bisect().probe_bound());
  for (const auto& l : r->layers()) {
    if (l.phase() == v1::FORWARD) {
      EXPECT_EQ(l.verdict(), v1::OK) << l.name();
    }
  }
}

struct SwitchCase {
  FaultSpec fault;
  int capture_at;  // -1: the fault triggers the capture itself
  bool backward;
  const char* layer;
  const char* culprit;
};

// The features bisect turns tiny_gpt's three kernel switches on and off and names the one each
// fault lives in, within ceil(log2 3) + 1 = 3 replays.
TEST_F(ReplayCapsuleTest, FeaturesBisectNamesTheSwitchEachFaultIsTiedTo) {
  const std::vector<SwitchCase> cases = {
      {{FaultKind::kNan, "blocks.1", 2}, -1, false, "blocks.1", "fused_gelu"},
      {{FaultKind::kSoftmaxOverflow, "blocks.0", 2}, -1, false, "blocks.0", "fused_softmax"},
      {{FaultKind::kTailBlock, "blocks.1", 0}, 2, false, "blocks.1", "fused_softmax"},
      {{FaultKind::kEps, "blocks.0", 0}, 2, false, "blocks.0", "fused_layer_norm"},
      {{FaultKind::kGeluGrad, "blocks.0", 0}, 2, true, "blocks.0", "fused_gelu"},
  };
  for (const SwitchCase& k : cases) {
    SCOPED_TRACE(k.fault.ToString());
    const v1::Capsule c = RecordOne(k.fault, 3, k.capture_at);
    ReplayOptions options;
    options.backward = k.backward;
    options.bisect_features = true;
    auto r = ReplayCapsule(c, registry_, options);
    ASSERT_TRUE(r.ok()) << r.status();
    const v1::FeatureBisectReport& f = r->features();
    EXPECT_EQ(f.switches_size(), 3);
    EXPECT_EQ(f.target_layer(), k.layer);
    EXPECT_EQ(f.outcome(), v1::FeatureBisectReport::FOUND);
    ASSERT_EQ(f.culprits_size(), 1);
    EXPECT_EQ(f.culprits(0), k.culprit);
    EXPECT_EQ(f.replay_bound(), 3);
    EXPECT_LE(f.replays(), f.replay_bound());
    EXPECT_EQ(f.probes_size(), f.replays());
    // Every probe with the culprit on diverged, every one without it agreed.
    for (const v1::FeatureProbe& p : f.probes()) {
      const bool on = std::find(p.enabled().begin(), p.enabled().end(), std::string(k.culprit)) !=
                      p.enabled().end();
      EXPECT_EQ(p.bad(), on);
    }
  }
}

TEST_F(ReplayCapsuleTest, FeaturesBisectSaysWhenNoSwitchIsToBlame) {
  // A NaN written by the embedding, which has no kernel switch.
  const v1::Capsule c = RecordOne({FaultKind::kNan, "embed", 2}, 3);
  ReplayOptions options;
  options.bisect_features = true;
  auto r = ReplayCapsule(c, registry_, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->features().outcome(), v1::FeatureBisectReport::NOT_IN_SWITCHES);
  EXPECT_EQ(r->features().culprits_size(), 0);
  EXPECT_LE(r->features().replays(), r->features().replay_bound());

  const v1::Capsule clean = RecordOne({}, 3, /*capture_at=*/2);
  auto rc = ReplayCapsule(clean, registry_, options);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(rc->features().outcome(), v1::FeatureBisectReport::NO_TARGET);
  EXPECT_EQ(rc->features().replays(), 0);

  // A switch set the model does not have is refused by name.
  options.bisect_features = false;
  options.features = std::vector<std::string>{"fused_rope"};
  auto bad = ReplayCapsule(clean, registry_, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("fused_rope"), std::string::npos);
}

std::vector<std::string> Diverged(const v1::StressReport& r, bool diverged) {
  std::vector<std::string> names;
  for (const v1::StressCase& c : r.results()) {
    if (c.diverged() == diverged &&
        std::find(names.begin(), names.end(), c.name()) == names.end()) {
      names.push_back(c.name());
    }
  }
  return names;
}

bool Has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// stress on a tail-block layer: the lengths with causal softmax rows of more than one tile and a
// tail diverge (T >= 17), the ones within a tile or on it do not; the clean layer before it
// diverges on nothing in the whole matrix.
TEST_F(ReplayCapsuleTest, StressFindsTheTailLengthsAndNothingOnACleanLayer) {
  const v1::Capsule c = RecordOne({FaultKind::kTailBlock, "blocks.1", 0}, 3, /*capture_at=*/2);
  StressOptions options;
  options.layer = "blocks.1";
  auto bad = StressLayer(c, registry_, options);
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_TRUE(bad->declared());
  EXPECT_EQ(bad->tile(), 16);
  const std::vector<std::string> diverged = Diverged(*bad, true);
  const std::vector<std::string> agreed = Diverged(*bad, false);
  for (const char* t : {"T=17", "T=31"}) EXPECT_TRUE(Has(diverged, t)) << t;
  for (const char* t : {"T=1", "T=2", "T=15", "T=16"}) {
    EXPECT_TRUE(Has(agreed, t)) << t;
    EXPECT_FALSE(Has(diverged, t)) << t;
  }

  options.layer = "blocks.0";
  auto clean = StressLayer(c, registry_, options);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->diverged(), 0);
  for (const v1::StressCase& k : clean->results()) {
    EXPECT_FALSE(k.diverged()) << k.name() << " " << v1::Phase_Name(k.phase()) << " " << k.tensor()
                               << " rel " << k.max_rel_err() << " " << k.error();
  }
  EXPECT_GT(clean->cases(), 15);
  bool backward = false;
  for (const v1::StressCase& k : clean->results()) backward |= k.phase() == v1::BACKWARD;
  EXPECT_TRUE(backward);

  options.layer = "blocks.9";
  auto missing = StressLayer(c, registry_, options);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("blocks.0"), std::string::npos);
}

// Real model sizes: a 205 MB tiny_gpt (d_model 1024, 4 blocks) whose ln_f writes NaN. Recorded
// once embedding every weight and once naming the checkpoint the trainer loaded (the anomalous
// layer's weights and input embedded), the two capsules replay to the same verdict; the second
// is under 5% of the weights; a checkpoint with one element changed is refused, named.
struct LargeRun {
  std::vector<std::string> files;
  std::vector<v1::Capsule> capsules;
};

LargeRun RecordLarge(const std::string& dir, const std::string& checkpoint,
                     const tiny_gpt::TinyGptConfig& config, WeightPolicy policy) {
  at::set_num_threads(1);
  std::unique_ptr<tiny_gpt::TinyGpt> model = std::move(*tiny_gpt::TinyGpt::Create(config));
  // The trainer starts from the checkpoint: its weights are the checkpoint's.
  StatusOr<LoadedCheckpoint> ckpt = LoadCheckpoint(checkpoint);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(model->LoadParameters(ckpt->tensors).ok());
  auto loader = tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {2, config.seq_len, 0});
  MonitorOptions mo;
  mo.capsule_dir = dir;
  mo.run_name = "large";
  mo.log_sink = [](const std::string&) {};
  mo.weight_policy = policy;
  mo.max_weight_bytes = uint64_t{1} << 30;
  mo.weights_checkpoint = checkpoint;
  Monitor monitor(mo);
  monitor.AttachModel(model.get(), PathKind::kOptimized);
  model->SetStep(0);
  tiny_gpt::CorpusBatch cb = loader->Next();
  monitor.BeginStep(0, DataCursor{}, StepBatch{cb.batch, cb.raw_text, {}, 0, 0, {}, {}});
  double loss = 0;
  StepReport report = monitor.RunStep([&] {
    at::Tensor l = RunSequence(model->Path(PathKind::kOptimized), cb.batch);
    l.backward();
    loss = l.item<double>();
  });
  StepScalars scalars;
  scalars.loss = loss;
  if (!report.triggered) monitor.EndStep(scalars);
  LargeRun run;
  for (const auto& e : fs::directory_iterator(dir)) run.files.push_back(e.path());
  ReadOptions ro;
  ro.allow_unsigned = true;
  for (const std::string& f : run.files) {
    auto d = ReadCapsuleFile(f, ro);
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) run.capsules.push_back(*d->capsule);
  }
  return run;
}

TEST_F(ReplayCapsuleTest, LargeModelCapsuleNamesItsCheckpointAndReplaysFromIt) {
  TempDir dir;
  tiny_gpt::TinyGptConfig config;
  config.d_model = 1024;
  config.n_heads = 16;
  config.n_layers = 4;
  config.fault = {FaultKind::kNan, "ln_f", 0};
  const std::string checkpoint = dir.path() + "/model.pt";
  uint64_t weight_bytes = 0;
  {
    std::unique_ptr<tiny_gpt::TinyGpt> init = std::move(*tiny_gpt::TinyGpt::Create(config));
    for (const auto& [name, t] : init->NamedParameters()) weight_bytes += t.numel() * 4;
    ASSERT_TRUE(SaveCheckpoint(checkpoint, init->NamedParameters()).ok());
  }
  ASSERT_GE(weight_bytes, uint64_t{200'000'000});  // 204 MB

  const LargeRun all = RecordLarge(dir.path() + "/all", checkpoint, config, WeightPolicy::kAll);
  const LargeRun ref =
      RecordLarge(dir.path() + "/ref", checkpoint, config, WeightPolicy::kAnomalousLayer);
  ASSERT_EQ(all.capsules.size(), 1u);
  ASSERT_EQ(ref.capsules.size(), 1u);
  const v1::Capsule& embedded = all.capsules[0];
  const v1::Capsule& named = ref.capsules[0];
  EXPECT_FALSE(embedded.model().has_weights_reference());
  ASSERT_TRUE(named.model().has_weights_reference());
  const v1::WeightsReference& wr = named.model().weights_reference();
  EXPECT_TRUE(wr.matches_step());
  EXPECT_EQ(wr.format(), "torch_pickle");
  EXPECT_EQ(wr.tensors_sha256(), named.identity().model_sha256());
  EXPECT_EQ(wr.tensors_size(), 2 + 12 * 4 + 3);               // embed, 4 blocks, ln_f and lm_head
  EXPECT_LE(fs::file_size(ref.files[0]), weight_bytes / 20);  // <= 5% of the weights
  EXPECT_GT(fs::file_size(all.files[0]), weight_bytes);

  auto from_embedded = Replay(embedded);
  ASSERT_TRUE(from_embedded.ok()) << from_embedded.status();
  auto from_checkpoint = Replay(named);
  ASSERT_TRUE(from_checkpoint.ok()) << from_checkpoint.status();
  EXPECT_EQ(from_checkpoint->diagnosis(), v1::NUMERICS);
  EXPECT_EQ(from_checkpoint->first_divergent_layer(), "ln_f");
  EXPECT_EQ(from_checkpoint->diagnosis(), from_embedded->diagnosis());
  EXPECT_EQ(from_checkpoint->first_divergent_layer(), from_embedded->first_divergent_layer());
  EXPECT_EQ(from_checkpoint->fidelity(), from_embedded->fidelity());
  const double a = from_checkpoint->replayed_value(), b = from_embedded->replayed_value();
  EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || a == b) << a << " vs " << b;

  // One element of one tensor changed: not the file the capsule names, refused before it is
  // parsed; and where the capsule recorded no file hash, refused naming the tensor, before
  // anything runs.
  StatusOr<LoadedCheckpoint> ckpt = LoadCheckpoint(checkpoint);
  ASSERT_TRUE(ckpt.ok());
  for (auto& [name, t] : ckpt->tensors) {
    if (name == "blocks.1.mlp.fc1.weight") t.view(-1)[7] += 1e-3;
  }
  const std::string modified = dir.path() + "/modified.pt";
  ASSERT_TRUE(SaveCheckpoint(modified, ckpt->tensors).ok());
  ReplayOptions options;
  options.checkpoint_path = modified;
  auto refused = ReplayCapsule(named, registry_, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("not the weights checkpoint the capsule names"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("refused before parsing"), std::string::npos);
  v1::Capsule no_file_hash = named;
  no_file_hash.mutable_model()->mutable_weights_reference()->clear_file_sha256();
  auto differs = ReplayCapsule(no_file_hash, registry_, options);
  ASSERT_FALSE(differs.ok());
  EXPECT_EQ(differs.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(differs.status().message().find("'blocks.1.mlp.fc1.weight' differs"), std::string::npos)
      << differs.status();
}

// A checkpoint's digests spell dtypes as the rest of the capsule does ("float32"); a capsule of
// 0.1.0, which wrote LibTorch's "Float", still replays from its checkpoint.
TEST_F(ReplayCapsuleTest, CheckpointDigestsSpellDtypesAsTheCapsuleDoesAndOldSpellingsReplay) {
  TempDir dir;
  tiny_gpt::TinyGptConfig config;
  config.n_layers = kBlocks;
  config.fault = {FaultKind::kNan, "ln_f", 0};
  const std::string checkpoint = dir.path() + "/model.pt";
  {
    std::unique_ptr<tiny_gpt::TinyGpt> init = std::move(*tiny_gpt::TinyGpt::Create(config));
    ASSERT_TRUE(SaveCheckpoint(checkpoint, init->NamedParameters()).ok());
  }
  const LargeRun run =
      RecordLarge(dir.path() + "/ref", checkpoint, config, WeightPolicy::kAnomalousLayer);
  ASSERT_EQ(run.capsules.size(), 1u);
  v1::Capsule named = run.capsules[0];
  ASSERT_TRUE(named.model().has_weights_reference());
  for (const v1::TensorDigest& t : named.model().weights_reference().tensors()) {
    EXPECT_EQ(t.dtype(), "float32") << t.name();  // as TensorMeta and the collective ring say it
  }
  auto now = Replay(named);
  ASSERT_TRUE(now.ok()) << now.status();
  // A capsule written by capsule 0.1.0 holds LibTorch's spelling: it still names these tensors.
  for (v1::TensorDigest& t :
       *named.mutable_model()->mutable_weights_reference()->mutable_tensors()) {
    t.set_dtype("Float");
  }
  ASSERT_TRUE(ValidateCapsule(named).ok()) << ValidateCapsule(named);
  auto old = Replay(named);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->diagnosis(), now->diagnosis());
  EXPECT_EQ(old->first_divergent_layer(), now->first_divergent_layer());
  // Another type than the checkpoint's is still a difference.
  named.mutable_model()->mutable_weights_reference()->mutable_tensors(0)->set_dtype("float64");
  auto other = Replay(named);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("is float32["), std::string::npos) << other.status();
}

// Restores the working directory when it goes out of scope.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const fs::path& dir) : old_(fs::current_path()) {
    fs::current_path(dir);
  }
  ~WorkingDirectory() { fs::current_path(old_); }

 private:
  fs::path old_;
};

// A trainer that names its checkpoint by a relative path: the capsule records it relative to the
// capsule's own directory, and replay finds it there whatever its working directory; a
// checkpoint that is not the recorded file is refused before it is parsed, or with --force
// compared tensor by tensor, the difference named in a warning.
TEST_F(ReplayCapsuleTest, ACheckpointNamedByARelativePathIsFoundBesideTheCapsule) {
  TempDir dir;
  const fs::path run = fs::path(dir.path()) / "run";
  fs::create_directories(run);
  tiny_gpt::TinyGptConfig config;
  config.n_layers = kBlocks;
  config.fault = {FaultKind::kNan, "ln_f", 0};
  {
    std::unique_ptr<tiny_gpt::TinyGpt> init = std::move(*tiny_gpt::TinyGpt::Create(config));
    ASSERT_TRUE(SaveCheckpoint((run / "model.pt").string(), init->NamedParameters()).ok());
  }
  LargeRun recorded;
  {
    WorkingDirectory in(run);
    recorded = RecordLarge("caps", "model.pt", config, WeightPolicy::kAnomalousLayer);
  }
  ASSERT_EQ(recorded.capsules.size(), 1u);
  const v1::Capsule& c = recorded.capsules[0];
  ASSERT_TRUE(c.model().has_weights_reference());
  EXPECT_EQ(c.model().weights_reference().path(), "../model.pt");

  ReplayOptions options;
  options.capsule_path = (run / recorded.files[0]).string();
  auto found = ReplayCapsule(c, registry_, options);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->diagnosis(), v1::NUMERICS);
  EXPECT_EQ(found->first_divergent_layer(), "ln_f");
  EXPECT_EQ(found->warnings_size(), 0);

  auto unknown = Replay(c);  // no capsule path: the directory is not known
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unknown.status().message().find("relative to its own directory"), std::string::npos)
      << unknown.status();

  StatusOr<LoadedCheckpoint> ckpt = LoadCheckpoint((run / "model.pt").string());
  ASSERT_TRUE(ckpt.ok());
  ckpt->tensors[3].second.view(-1)[0] += 1;
  const std::string changed_name = ckpt->tensors[3].first;
  options.checkpoint_path = (run / "changed.pt").string();
  ASSERT_TRUE(SaveCheckpoint(options.checkpoint_path, ckpt->tensors).ok());
  auto refused = ReplayCapsule(c, registry_, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("refused before parsing"), std::string::npos)
      << refused.status();
  options.force = true;
  auto forced = ReplayCapsule(c, registry_, options);
  ASSERT_TRUE(forced.ok()) << forced.status();
  std::string warnings;
  for (const std::string& w : forced->warnings()) warnings += w + "\n";
  EXPECT_NE(warnings.find("is not the file the capsule names"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("tensor '" + changed_name + "' differs"), std::string::npos) << warnings;
}

// Weights from another capsule whose model hash is not the recorded one: the message names the
// first tensor that differs, from the digests the capsule holds.
TEST_F(ReplayCapsuleTest, AWeightsMismatchNamesTheTensorThatDiffers) {
  const v1::Capsule c = RecordOne({}, 2, /*capture_at=*/1);
  v1::Capsule other = c;
  v1::TensorBlob* changed = nullptr;
  for (v1::TensorBlob& t : *other.mutable_tensors()) {
    if (t.role() == v1::PARAMETER && (changed == nullptr || t.name() > changed->name())) {
      changed = &t;
    }
  }
  ASSERT_NE(changed, nullptr);
  std::string data = changed->data();
  data[1] ^= 0x40;
  changed->set_data(data);
  changed->set_sha256(*Sha256Hex(data));
  TempDir dir;
  const std::string weights = dir.path() + "/other.capsule";
  ASSERT_TRUE(WriteCapsuleFile(weights, other, WriteOptions()).ok());
  ReplayOptions options;
  options.weights_path = weights;
  auto r = ReplayCapsule(c, registry_, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("tensor '" + changed->name() + "' differs"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("another model's weights"), std::string::npos);
}

// ---- what a capsule's content can make replay, gate and stress do -------------------------------

struct CommandResult {
  int status = -1;
  std::string output;  // standard output and error
};

// `capsule ARGS` through the shell, standard error with standard output (or dropped). CAPSULE_BIN
// from the environment when set (to run these checks against another build), else this build's.
CommandResult RunCli(const std::string& args, bool with_stderr = true) {
  const char* env = std::getenv("CAPSULE_BIN");
  const std::string bin = env != nullptr && *env != '\0' ? env : CAPSULE_BIN;
  CommandResult r;
  FILE* p = ::popen((bin + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `s` in single quotes for the shell (a file name with a line break in it included).
std::string Quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

void WriteUnsigned(const std::string& path, const v1::Capsule& c) {
  const Status s = WriteCapsuleFile(path, c, WriteOptions());
  ASSERT_TRUE(s.ok()) << path << ": " << s;
}

// Every injected string starts its would-be line with "FORGED": no line of `r` may.
void ExpectNoForgedLine(const std::string& what, const CommandResult& r) {
  std::istringstream lines(r.output);
  std::string line;
  while (std::getline(lines, line)) {
    EXPECT_NE(line.rfind("FORGED", 0), 0u)
        << what << ": a capsule's text made a line of its own: " << line << "\n"
        << r.output;
  }
}

void ExpectShown(const std::string& what, const CommandResult& r, const std::string& escaped) {
  EXPECT_NE(r.output.find(escaped), std::string::npos)
      << what << ": " << escaped << " is not shown escaped:\n"
      << r.output;
}

TEST_F(ReplayCapsuleTest, LineBreaksInACapsulesTextOrFileNameNeverForgeALine) {
  const v1::Capsule c = RecordOne({FaultKind::kNan, "blocks.1", 2}, 3);
  ASSERT_EQ(c.numerics().first_anomalous_layer(), "blocks.1");
  TempDir dir;
  const std::string plugin = std::string(" --plugin ") + CAPSULE_TINY_GPT_PLUGIN_PATH;
  // A: its layer names, trigger message and file name carry a line break each.
  const std::string layer = "blocks.1\nFORGED layer";
  v1::Capsule a = c;
  for (auto& l : *a.mutable_numerics()->mutable_layers()) {
    if (l.name() == "blocks.1") l.set_name(layer);
  }
  a.mutable_numerics()->set_first_anomalous_layer(layer);
  for (std::string& name : *a.mutable_model()->mutable_layers()) {
    if (name == "blocks.1") name = layer;
  }
  a.mutable_trigger()->set_message("loss is nan\nFORGED trigger");
  const std::string a_path = dir.path() + "/a\nFORGED file.capsule";
  WriteUnsigned(a_path, a);
  // B: its torch version (quoted by the version check, and by its warning under --force).
  v1::Capsule b = c;
  b.mutable_environment()->set_torch_version(c.environment().torch_version() + "\nFORGED torch");
  const std::string b_path = dir.path() + "/b.capsule";
  WriteUnsigned(b_path, b);
  // C: its model's registry name (quoted by the "not registered" error).
  v1::Capsule m = c;
  m.mutable_model()->set_registry_name("tiny_gpt\nFORGED model");
  WriteUnsigned(dir.path() + "/c.capsule", m);

  CommandResult r = RunCli("gate " + Quoted(dir.path()) + plugin + " --allow-unsigned");
  EXPECT_EQ(r.status, 2) << r.output;  // B and C cannot be judged
  ExpectNoForgedLine("gate", r);
  ExpectShown("gate", r, "a\\nFORGED file.capsule");
  ExpectShown("gate", r, "blocks.1\\nFORGED layer");
  ExpectShown("gate", r, "\\nFORGED torch");
  ExpectShown("gate", r, "tiny_gpt\\nFORGED model");
  EXPECT_NE(r.output.find("\ngate: 0 of 3 capsules no longer fail; 1 still fail, 2 could not be "
                          "judged\n"),
            std::string::npos)
      << r.output;

  r = RunCli("replay " + Quoted(a_path) + plugin + " --allow-unsigned");
  EXPECT_EQ(r.status, 1) << r.output;  // NUMERICS at blocks.1
  ExpectNoForgedLine("replay", r);
  ExpectShown("replay", r, "replay: capsule replay " + dir.path() + "/a\\nFORGED file.capsule");

  r = RunCli("replay " + Quoted(b_path) + plugin + " --allow-unsigned --force");
  EXPECT_EQ(r.status, 1) << r.output;
  ExpectNoForgedLine("replay --force", r);
  ExpectShown("replay --force", r, "warning: capsule was recorded with torch ");
  ExpectShown("replay --force", r, "\\nFORGED torch");

  r = RunCli("replay " + Quoted(dir.path() + "/c.capsule") + plugin + " --allow-unsigned");
  EXPECT_EQ(r.status, 2) << r.output;
  ExpectNoForgedLine("replay of an unknown model", r);
  ExpectShown("replay of an unknown model", r, "tiny_gpt\\nFORGED model");

  // The report path: replay --json, then the Markdown report that includes it.
  const std::string json = dir.path() + "/replay.json";
  r = RunCli("replay " + Quoted(a_path) + plugin + " --allow-unsigned --json",
             /*with_stderr=*/false);
  EXPECT_EQ(r.status, 1) << r.output;
  {
    std::ofstream out(json);
    out << r.output;
  }
  r = RunCli("report " + Quoted(a_path) + " --allow-unsigned --replay-json " + Quoted(json));
  EXPECT_EQ(r.status, 0) << r.output;
  ExpectNoForgedLine("report --replay-json", r);
  EXPECT_NE(r.output.find("FORGED layer"), std::string::npos) << r.output;

  r = RunCli("stress " + Quoted(b_path) + " --layer blocks.0" + plugin +
             " --allow-unsigned --force");
  EXPECT_TRUE(r.status == 0 || r.status == 1) << r.output;
  ExpectNoForgedLine("stress", r);
  ExpectShown("stress", r, "note: capsule was recorded with torch ");
  ExpectShown("stress", r, "\\nFORGED torch");
}

TEST_F(ReplayCapsuleTest, ALibraryThatEndsTheProcessIsAnErrorNotAFinding) {
  // The model's factory calls exit(1), as OpenMP does when it cannot start its threads: replay
  // and gate judged nothing, and say so with exit status 2.
  v1::Capsule c = RecordOne({}, 2, /*capture_at=*/1);
  c.mutable_model()->set_registry_name("exits_on_build");
  TempDir dir;
  WriteUnsigned(dir.path() + "/exits.capsule", c);
  const std::string plugin = std::string(" --plugin ") + CAPSULE_EXITING_PLUGIN_PATH;
  for (const std::string& command :
       {"replay " + Quoted(dir.path() + "/exits.capsule"), "gate " + Quoted(dir.path())}) {
    const CommandResult r = RunCli(command + plugin + " --allow-unsigned");
    EXPECT_EQ(r.status, 2) << command << ":\n" << r.output;
    EXPECT_NE(r.output.find("capsule: a library ended the process before the command finished"),
              std::string::npos)
        << command << ":\n"
        << r.output;
  }
}

// The CPUs this process may run on, as sched_getaffinity says.
int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

TEST_F(ReplayCapsuleTest, ThreadsBeyondTheUsableCpusAreNotStartedAndTheReportSaysSo) {
  v1::Capsule c = RecordOne({}, 2, /*capture_at=*/1);
  c.mutable_environment()->set_intra_op_threads(kMaxThreads);
  c.mutable_numerics()->set_intra_op_threads(kMaxThreads);
  ASSERT_TRUE(ValidateCapsule(c).ok());  // the largest count a capsule may hold
  auto r = Replay(c);
  at::set_num_threads(1);
  ASSERT_TRUE(r.ok()) << r.status();
  const int usable = std::min(AffinityCpus(), kMaxThreads);
  EXPECT_EQ(r->intra_op_threads(), usable);
  ASSERT_GE(r->warnings_size(), 1);
  EXPECT_NE(r->warnings(0).find("recorded with 1024 intra-op threads; this process may use " +
                                std::to_string(usable) + " CPUs and replays with " +
                                std::to_string(usable) + " threads"),
            std::string::npos)
      << r->warnings(0);
}

TEST_F(ReplayCapsuleTest, WeightsThatAreNotTheRecordedOnesAreRefusedBeforeTheModelIsBuilt) {
  v1::Capsule c = RecordOne({}, 2, /*capture_at=*/1);
  // One weight changed (its blob digest kept consistent, so the capsule is valid), and a config
  // that asks for a model larger than the one recorded.
  for (v1::TensorBlob& t : *c.mutable_tensors()) {
    if (t.role() != v1::PARAMETER) continue;
    (*t.mutable_data())[0] ^= 0x01;
    t.set_sha256(*Sha256Hex(t.data()));
    break;
  }
  tiny_gpt::TinyGptConfig bigger;
  bigger.n_layers = 8;
  bigger.d_model = 256;
  c.mutable_model()->set_config_json(bigger.ToJson());
  ASSERT_TRUE(ValidateCapsule(c).ok()) << ValidateCapsule(c);
  ModelRegistry tiny;
  tiny_gpt::RegisterTinyGpt(tiny);
  int built = 0;
  ModelRegistry counting;
  ASSERT_TRUE(counting
                  .Register("tiny_gpt",
                            [&](const ModelSpecInfo& spec) {
                              ++built;
                              return tiny.Create(spec);
                            })
                  .ok());
  auto r = ReplayCapsule(c, counting, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("weights from the capsule have model sha256"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(built, 0) << "the model was built before its weights were checked";
}

}  // namespace
}  // namespace capsule
