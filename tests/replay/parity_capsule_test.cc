// Parity from a capsule: a Monitor captures a generation step with its generation section, the
// capsule carries it, and `ReplayCapsule` (and `capsule replay`) run the parity mode on it,
// naming a decode fault at its position and layer and finding nothing on a clean model.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "capsule/capture/generation.h"
#include "capsule/capture/monitor.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/model_registry.h"
#include "capsule/replay/replayer.h"
#include "samples/tiny_gpt/registration.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

namespace fs = std::filesystem;
using tiny_gpt::FaultKind;
using tiny_gpt::TinyGpt;
using tiny_gpt::TinyGptConfig;

constexpr int64_t kLength = 14;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "capsule_parity_XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A model shape other than the default: rotary positions, grouped-query attention, two blocks.
TinyGptConfig Shape(uint64_t seed) {
  TinyGptConfig c;
  c.seed = seed;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.n_layers = 2;
  c.rope = true;
  return c;
}

GenerationInfo Generation(int64_t prompt) {
  GenerationInfo g;
  g.prompt_length = prompt;
  g.sampling.temperature = 0.7;
  g.sampling.top_k = 40;
  g.sampling.top_p = 0.9;
  g.sampling.seed = 11;
  g.sampling.stop_tokens = {10};
  g.cache.layout = "batch,kv_heads,position,head_dim";
  g.cache.dtype = "float32";
  g.cache.post_rotation_keys = true;
  return g;
}

// Captures one generation step of `config` (prompt then generated tokens) and returns the file.
std::string RecordGeneration(const TinyGptConfig& config, const GenerationInfo& g,
                             const std::string& dir) {
  std::unique_ptr<TinyGpt> model = std::move(*TinyGpt::Create(config));
  MonitorOptions mo;
  mo.capsule_dir = dir;
  mo.run_name = "parity";
  mo.log_sink = [](const std::string&) {};
  Monitor monitor(mo);
  monitor.AttachModel(model.get(), PathKind::kOptimized);
  EXPECT_TRUE(monitor.SetGeneration(g).ok());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(config.seed + 5);
  LayerBatch batch;
  batch.input_ids = at::randint(config.vocab_size, {2, kLength}, gen, at::kLong);
  batch.labels = batch.input_ids.clone();
  batch.labels_shifted = false;
  batch.training = false;
  monitor.BeginStep(0, DataCursor{}, StepBatch{batch, {}, {}, 0, 0, {}, {}});
  const StepReport r = monitor.CaptureNow("parity check");
  EXPECT_FALSE(r.capsule_path.empty()) << r.summary;
  monitor.WaitForWrites();
  return r.capsule_path;
}

v1::Capsule Read(const std::string& path) {
  ReadOptions ro;
  ro.allow_unsigned = true;
  auto d = ReadCapsuleFile(path, ro);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d->capsule : v1::Capsule();
}

v1::ReplayReport Replay(const v1::Capsule& c) {
  ModelRegistry registry;
  tiny_gpt::RegisterTinyGpt(registry);
  StatusOr<v1::ReplayReport> r = ReplayCapsule(c, registry, ReplayOptions{});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : v1::ReplayReport();
}

TEST(ParityCapsule, CarriesTheGenerationSection) {
  TempDir dir;
  const v1::Capsule c = Read(RecordGeneration(Shape(1), Generation(6), dir.path()));
  ASSERT_TRUE(c.has_generation());
  EXPECT_EQ(c.generation().prompt_length(), 6);
  EXPECT_EQ(c.generation().sampling().top_k(), 40);
  EXPECT_EQ(c.generation().sampling().stop_tokens_size(), 1);
  EXPECT_EQ(c.generation().cache().layout(), "batch,kv_heads,position,head_dim");
  EXPECT_TRUE(c.generation().cache().post_rotation_keys());
}

TEST(ParityCapsule, SetGenerationRefusesFieldsOutOfRange) {
  Monitor monitor(MonitorOptions{});
  GenerationInfo g = Generation(4);
  g.sampling.top_p = 1.5;
  const Status s = monitor.SetGeneration(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top_p in [0, 1]"), std::string::npos) << s;
  g = Generation(-1);
  EXPECT_EQ(monitor.SetGeneration(g).code(), StatusCode::kInvalidArgument);
}

TEST(ParityCapsule, ReplayNamesADecodeFaultAtThePromptEnd) {
  for (uint64_t seed : {1, 2}) {
    for (int64_t prompt : {5, 9}) {
      TempDir dir;
      TinyGptConfig config = Shape(seed);
      config.fault = {FaultKind::kGqaDecodeMap, "blocks.1", 0};
      const v1::ReplayReport r =
          Replay(Read(RecordGeneration(config, Generation(prompt), dir.path())));
      ASSERT_TRUE(r.has_parity()) << "seed " << seed << " prompt " << prompt;
      const v1::ParityReport& p = r.parity();
      EXPECT_TRUE(p.diverged());
      EXPECT_EQ(p.schedule().prefill(), prompt);
      EXPECT_EQ(p.first_divergent_position(), prompt);
      EXPECT_EQ(p.first_divergent_layer(), "blocks.1");
      ASSERT_GT(p.findings_size(), 0);
      EXPECT_EQ(p.findings(p.findings_size() - 1).check(), kCheckKvHeadMap);
      // The training paths are clean: the layerwise replay finds nothing.
      EXPECT_EQ(r.diagnosis(), v1::NO_DIVERGENCE);
    }
  }
}

TEST(ParityCapsule, CleanGenerationCapsulesOfTwoShapesHaveNoDivergence) {
  for (const TinyGptConfig& config : {Shape(3), TinyGptConfig{}}) {
    TempDir dir;
    const v1::ReplayReport r = Replay(Read(RecordGeneration(config, Generation(7), dir.path())));
    ASSERT_TRUE(r.has_parity());
    EXPECT_FALSE(r.parity().diverged()) << r.parity().first_divergent_layer();
    EXPECT_EQ(r.parity().findings_size(), 0);
  }
}

// A generation step of a model with a low-rank adapter, recorded as merged.
GenerationInfo MergedAdapterGeneration(int64_t prompt) {
  GenerationInfo g = Generation(prompt);
  g.adapter_merged = true;
  g.adapter_name = "proj-lora";
  g.adapter_rank = 4;
  g.adapter_alpha = 8;
  g.adapter_sha256 = std::string(64, 'a');
  return g;
}

TinyGptConfig AdapterShape(uint64_t seed) {
  TinyGptConfig c = Shape(seed);
  c.lora_rank = 4;
  c.lora_alpha = 8;
  return c;
}

TEST(ParityCapsule, ACapsuleWithAMergedAdapterReplaysInAdapterMode) {
  for (uint64_t seed : {1, 2}) {
    TempDir dir;
    TinyGptConfig config = AdapterShape(seed);
    config.fault = {FaultKind::kMergeTwice, "blocks.1", 0};
    const v1::Capsule c = Read(RecordGeneration(config, MergedAdapterGeneration(6), dir.path()));
    EXPECT_TRUE(c.generation().adapter_merged());
    EXPECT_EQ(c.generation().adapter_rank(), 4);
    EXPECT_EQ(c.generation().adapter_alpha(), 8);
    EXPECT_EQ(c.generation().adapter_sha256(), std::string(64, 'a'));
    const v1::ReplayReport r = Replay(c);
    ASSERT_TRUE(r.has_parity());
    const v1::ParityReport& p = r.parity();
    EXPECT_EQ(p.adapter_merge_dtype(), "Float");
    EXPECT_TRUE(p.diverged());
    EXPECT_EQ(p.first_divergent_position(), 0);
    EXPECT_EQ(p.first_divergent_layer(), "blocks.1");
    ASSERT_GT(p.findings_size(), 0);
    EXPECT_EQ(p.findings(p.findings_size() - 1).check(), kCheckAdapterMergedTwice);
  }
  // Not recorded as merged: the decoder applies the adapter at run time, as the fault needs not.
  TempDir dir;
  TinyGptConfig config = AdapterShape(1);
  config.fault = {FaultKind::kMergeTwice, "blocks.1", 0};
  const v1::ReplayReport r = Replay(Read(RecordGeneration(config, Generation(6), dir.path())));
  EXPECT_TRUE(r.parity().adapter_merge_dtype().empty());
  EXPECT_FALSE(r.parity().diverged());
}

TEST(ParityCapsule, SetGenerationRefusesABadAdapterRecord) {
  Monitor monitor(MonitorOptions{});
  GenerationInfo g = MergedAdapterGeneration(4);
  g.adapter_rank = -1;
  EXPECT_EQ(monitor.SetGeneration(g).code(), StatusCode::kInvalidArgument);
  g = MergedAdapterGeneration(4);
  g.adapter_sha256 = "XYZ";
  const Status s = monitor.SetGeneration(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("adapter hashes must be empty or 64"), std::string::npos) << s;
}

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult RunCli(const std::string& args) {
  CommandResult r;
  FILE* p = ::popen((std::string(CAPSULE_BIN) + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ParityCapsule, CommandLinePrintsTheVerdictAndTableAndExitsOne) {
  TempDir dir;
  TinyGptConfig config = Shape(1);
  config.fault = {FaultKind::kMaskOffset, "blocks.0", 0};
  const std::string file = RecordGeneration(config, Generation(6), dir.path());
  const std::string plugin = std::string(" --plugin ") + CAPSULE_TINY_GPT_PLUGIN_PATH;
  CommandResult r = RunCli("replay " + file + plugin + " --allow-unsigned");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("parity: decode departs from the whole-sequence forward at position 6, "
                          "layer blocks.0"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("attention.causal_mask_offset"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  6         decode   blocks.0"), std::string::npos) << r.output;
  // --prefill moves the schedule: the first decoded position follows it.
  r = RunCli("replay " + file + plugin + " --allow-unsigned --prefill 10 --json");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("\"first_divergent_position\":\"10\""), std::string::npos) << r.output;
}

// In bfloat16 the doubled delta can stay within the activations' tolerance; the weights show it,
// and the command exits 1 on it.
TEST(ParityCapsule, CommandLineAdapterMergeInBf16NamesAMergeCountedTwice) {
  TempDir dir;
  TinyGptConfig config = AdapterShape(1);
  config.fault = {FaultKind::kMergeTwice, "blocks.0", 0};
  const std::string file = RecordGeneration(config, Generation(6), dir.path());
  const std::string plugin = std::string(" --plugin ") + CAPSULE_TINY_GPT_PLUGIN_PATH;
  CommandResult r =
      RunCli("replay " + file + plugin + " --allow-unsigned --adapter-merge bfloat16");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("BFloat16 tolerance"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("adapter.merged_twice: the merged weight blocks.0.attn.proj.weight in "
                          "blocks.0 at position 0 holds 2"),
            std::string::npos)
      << r.output;
  r = RunCli("replay " + file + plugin + " --allow-unsigned --adapter-merge float16");
  EXPECT_EQ(r.status, 2) << r.output;
  // A model without an adapter is refused.
  const std::string plain = RecordGeneration(Shape(1), Generation(6), dir.path());
  r = RunCli("replay " + plain + plugin + " --allow-unsigned --adapter-merge float32");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("the model has no adapter"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace capsule
