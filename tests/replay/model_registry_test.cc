// ModelRegistry and LoadPlugin: registration rules, the errors a user sees, and the real tiny_gpt
// plugin loaded into this binary, building a model that runs.
#include "capsule/replay/model_registry.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "capsule/model/layer_sequence.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/replay/plugin_loader.h"
#include "capsule/snapshot/internal/tensor_codec.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/registration.h"
#include "samples/tiny_gpt/tiny_gpt.h"
#include "tests/format/temp_dir.h"

namespace capsule {
namespace {

// A model with no layers: enough to tell which factory built it.
class FakeSequence : public LayerSequence {
 public:
  size_t size() const override { return 0; }
  std::string name(size_t) const override { return ""; }
  TensorList Forward(size_t, const TensorList& inputs, const LayerBatch&) override {
    return inputs;
  }
  std::vector<NamedTensor> LayerParameters(size_t) const override { return {}; }
  at::ScalarType compute_dtype() const override { return at::kFloat; }
};

class FakeModel : public Model {
 public:
  explicit FakeModel(ModelSpecInfo spec) : spec_(std::move(spec)) {}
  LayerSequence& Path(PathKind) override { return seq_; }
  std::vector<NamedTensor> NamedParameters() const override { return {}; }
  ModelSpecInfo Spec() const override { return spec_; }
  Status LoadParameters(const std::vector<NamedTensor>&) override { return Status::Ok(); }

 private:
  ModelSpecInfo spec_;
  FakeSequence seq_;
};

ModelFactory FakeFactory(const std::string& tag) {
  return [tag](const ModelSpecInfo& spec) -> StatusOr<std::unique_ptr<Model>> {
    return std::unique_ptr<Model>(new FakeModel({spec.registry_name, tag}));
  };
}

TEST(ModelRegistry, RegisterAndCreate) {
  ModelRegistry registry;
  ASSERT_TRUE(registry.Register("b_model", FakeFactory("b")).ok());
  ASSERT_TRUE(registry.Register("a_model", FakeFactory("a")).ok());
  EXPECT_TRUE(registry.Has("a_model"));
  EXPECT_FALSE(registry.Has("c_model"));
  EXPECT_EQ(registry.names(), (std::vector<std::string>{"a_model", "b_model"}));

  StatusOr<std::unique_ptr<Model>> model = registry.Create({"b_model", "{}"});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->Spec().registry_name, "b_model");
  EXPECT_EQ((*model)->Spec().config_json, "b");
}

TEST(ModelRegistry, NotRegisteredSaysWhatIsAndWhatToDo) {
  ModelRegistry registry;
  StatusOr<std::unique_ptr<Model>> none = registry.Create({"gpt", "{}"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none.status().message(), "model 'gpt' is not registered; registered: none");

  ASSERT_TRUE(registry.Register("b", FakeFactory("b")).ok());
  ASSERT_TRUE(registry.Register("a", FakeFactory("a")).ok());
  StatusOr<std::unique_ptr<Model>> missing = registry.Create({"x", "{}"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "model 'x' is not registered; registered: a, b");
}

TEST(ModelRegistry, DuplicateRegistrationKeepsTheFirst) {
  ModelRegistry registry;
  ASSERT_TRUE(registry.Register("m", FakeFactory("first")).ok());
  const Status again = registry.Register("m", FakeFactory("second"));
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(again.message(), "model registry: model 'm' is already registered");
  EXPECT_EQ((*registry.Create({"m", ""}))->Spec().config_json, "first");
}

TEST(ModelRegistry, RefusesEmptyNamesAndFactories) {
  ModelRegistry registry;
  EXPECT_EQ(registry.Register("", FakeFactory("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register("m", ModelFactory()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.names().empty());
}

TEST(ModelRegistry, FactoryErrorsReachTheCallerAndExceptionsDoNot) {
  ModelRegistry registry;
  ASSERT_TRUE(registry
                  .Register("bad_config",
                            [](const ModelSpecInfo&) -> StatusOr<std::unique_ptr<Model>> {
                              return InvalidArgumentError("bad_config: d_model must be > 0");
                            })
                  .ok());
  ASSERT_TRUE(registry
                  .Register("throws",
                            [](const ModelSpecInfo&) -> StatusOr<std::unique_ptr<Model>> {
                              TORCH_CHECK(false, "tensor went missing");
                              return InternalError("unreachable");
                            })
                  .ok());
  ASSERT_TRUE(registry
                  .Register("null",
                            [](const ModelSpecInfo&) -> StatusOr<std::unique_ptr<Model>> {
                              return std::unique_ptr<Model>();
                            })
                  .ok());
  const Status bad = registry.Create({"bad_config", "{}"}).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "bad_config: d_model must be > 0");
  const Status thrown = registry.Create({"throws", "{}"}).status();
  EXPECT_EQ(thrown.code(), StatusCode::kInternal);
  EXPECT_NE(thrown.message().find("model 'throws': factory failed: tensor went missing"),
            std::string::npos)
      << thrown;
  EXPECT_EQ(thrown.message().find("Exception raised from"), std::string::npos) << thrown;
  EXPECT_EQ(registry.Create({"null", "{}"}).status().code(), StatusCode::kInternal);
}

// ---------------------------------------------------------------------------------------------
// tiny_gpt, registered statically and through its plugin.

tiny_gpt::TinyGptConfig SmallConfig() {
  tiny_gpt::TinyGptConfig config;
  config.n_layers = 2;
  config.seed = 11;
  return config;
}

ModelSpecInfo SmallSpec() {
  StatusOr<std::unique_ptr<tiny_gpt::TinyGpt>> model = tiny_gpt::TinyGpt::Create(SmallConfig());
  EXPECT_TRUE(model.ok()) << model.status();
  return (*model)->Spec();
}

LayerBatch SmallBatch() {
  tiny_gpt::CorpusLoaderOptions options;
  options.batch_size = 2;
  options.seq_len = 16;
  StatusOr<tiny_gpt::CorpusLoader> loader =
      tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return loader->Next().batch;
}

// Runs both paths of `model` forward and the reference path backward; returns the reference loss.
double RunBothPaths(Model& model) {
  const LayerBatch batch = SmallBatch();
  const at::Tensor ref = RunSequence(model.Path(PathKind::kReference), batch);
  const at::Tensor opt = RunSequence(model.Path(PathKind::kOptimized), batch);
  EXPECT_EQ(ref.scalar_type(), at::kDouble);
  EXPECT_NEAR(ref.item<double>(), opt.item<double>(), 1e-5);
  std::vector<at::Tensor> params;
  for (const NamedTensor& p : model.NamedParameters()) params.push_back(p.second);
  const std::vector<at::Tensor> grads = torch::autograd::grad({ref}, params);
  EXPECT_EQ(grads.size(), params.size());
  EXPECT_TRUE(at::isfinite(grads.back()).all().item<bool>());
  return ref.item<double>();
}

TEST(TinyGptRegistration, CreatesTheModelASpecDescribes) {
  ModelRegistry registry;
  tiny_gpt::RegisterTinyGpt(registry);
  EXPECT_EQ(registry.names(), std::vector<std::string>{"tiny_gpt"});
  tiny_gpt::RegisterTinyGpt(registry);  // a second registration is ignored
  EXPECT_EQ(registry.names(), std::vector<std::string>{"tiny_gpt"});

  StatusOr<std::unique_ptr<Model>> model = registry.Create(SmallSpec());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->Spec().config_json, SmallSpec().config_json);
  EXPECT_EQ((*model)->Path(PathKind::kReference).size(), 6u);
  RunBothPaths(**model);

  const Status bad = registry.Create({"tiny_gpt", R"({"n_layers":-1})"}).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad;
}

// ---------------------------------------------------------------------------------------------
// LoadPlugin.

class LoadPluginTest : public ::testing::Test {
 protected:
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  test::TempDir dir_;
  ModelRegistry registry_;
};

TEST_F(LoadPluginTest, EmptyPath) {
  EXPECT_EQ(LoadPlugin("", registry_).code(), StatusCode::kInvalidArgument);
}

TEST_F(LoadPluginTest, MissingFile) {
  const std::string path = dir_.path() + "/libnothing.so";
  const Status s = LoadPlugin(path, registry_);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "plugin " + path + " does not exist");
}

TEST_F(LoadPluginTest, BareNamesAreNotLookedUpInTheLibraryPath) {
  // libz.so.1 is loadable by name through the system's library path; a plugin name is a file name
  // relative to the current directory, so it must not be found.
  const Status s = LoadPlugin("libz.so.1", registry_);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(), "plugin libz.so.1 does not exist");
}

TEST_F(LoadPluginTest, TextFileIsNotLoadable) {
  const std::string path = WriteFile("libfake.so", "this is not an ELF file\n");
  const Status s = LoadPlugin(path, registry_);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("plugin " + path + " cannot be loaded: "), std::string::npos) << s;
  EXPECT_TRUE(registry_.names().empty());
}

TEST_F(LoadPluginTest, DirectoryIsNotLoadable) {
  const Status s = LoadPlugin(dir_.path(), registry_);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "plugin " + dir_.path() + " is not a regular file");
}

TEST_F(LoadPluginTest, LibraryWithoutTheEntryPoint) {
  const std::string path = CAPSULE_NO_ENTRY_POINT_PLUGIN_PATH;
  const Status s = LoadPlugin(path, registry_);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("plugin " + path + " does not export capsule_register_models"),
            std::string::npos)
      << s;
}

TEST_F(LoadPluginTest, TinyGptPluginBuildsAWorkingModel) {
  // Use the capsule format first, so that this process has capsule.proto in protobuf's generated
  // pool: a plugin carrying a second copy of it would abort on load.
  v1::TensorBlob blob;
  ASSERT_TRUE(TensorToBlob("probe", at::ones({2}), &blob).ok());

  const Status s = LoadPlugin(CAPSULE_TINY_GPT_PLUGIN_PATH, registry_);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(registry_.names(), std::vector<std::string>{"tiny_gpt"});
  StatusOr<std::unique_ptr<Model>> model = registry_.Create(SmallSpec());
  ASSERT_TRUE(model.ok()) << model.status();
  const double plugin_loss = RunBothPaths(**model);

  // The plugin's copy of tiny_gpt computes exactly what this binary's copy does.
  ModelRegistry local;
  tiny_gpt::RegisterTinyGpt(local);
  StatusOr<std::unique_ptr<Model>> same = local.Create(SmallSpec());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(plugin_loss, RunBothPaths(**same));

  // The plugin's errors and exceptions come back as statuses.
  EXPECT_EQ(registry_.Create({"tiny_gpt", "not json"}).status().code(),
            StatusCode::kInvalidArgument);
  LayerBatch bad = SmallBatch();
  bad.input_ids = at::zeros({1, 64}, at::kLong);  // longer than seq_len
  EXPECT_THROW(RunSequence((*model)->Path(PathKind::kOptimized), bad), c10::Error);

  // Loading it again is harmless.
  EXPECT_TRUE(LoadPlugin(CAPSULE_TINY_GPT_PLUGIN_PATH, registry_).ok());
  EXPECT_EQ(registry_.names(), std::vector<std::string>{"tiny_gpt"});
}

TEST_F(LoadPluginTest, RelativePathsAreResolvedFromTheCurrentDirectory) {
  const std::filesystem::path plugin(CAPSULE_TINY_GPT_PLUGIN_PATH);
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(plugin.parent_path());
  const Status bare = LoadPlugin(plugin.filename().string(), registry_);
  const Status dotted = LoadPlugin("./" + plugin.filename().string(), registry_);
  std::filesystem::current_path(cwd);
  EXPECT_TRUE(bare.ok()) << bare;
  EXPECT_TRUE(dotted.ok()) << dotted;
  EXPECT_TRUE(registry_.Has("tiny_gpt"));
}

}  // namespace
}  // namespace capsule
