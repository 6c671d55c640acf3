// Checkpoints as users have them (snapshot/checkpoint.h): files written by Debian's python3-torch
// at test time (tests/replay/make_checkpoints.py), by LibTorch's OutputArchive and by
// SaveCheckpoint, and hostile ones. Nothing in a checkpoint may run: a TorchScript archive whose
// __setstate__ writes a file is refused and the file never appears (torch.jit.load of the same
// archive writes it, which the test checks too); one whose __setstate__ never returns is read as
// data.
#include "capsule/snapshot/checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"
#include "tests/format/temp_dir.h"

namespace capsule {
namespace {

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::map<std::string, at::Tensor> ByName(const LoadedCheckpoint& ckpt) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : ckpt.tensors) out[name] = t;
  return out;
}

at::Tensor Arange(int64_t n, at::ScalarType type = at::kFloat) {
  return at::arange(n, at::kDouble).to(type);
}

class CheckpointTest : public ::testing::Test {
 protected:
  // The Python-written files, made once for the suite.
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string cmd = "/usr/bin/python3 " CAPSULE_SOURCE_DIR
                            "/tests/replay/make_checkpoints.py " +
                            dir_->path() + " " + Canary();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Path(const std::string& name) { return dir_->path() + "/" + name + ".pt"; }
  // The file writes_a_file.pt's code creates.
  static std::string Canary() { return dir_->path() + "/canary"; }

  static StatusOr<LoadedCheckpoint> Load(const std::string& name) {
    return LoadCheckpoint(Path(name));
  }

  static test::TempDir* dir_;
};

test::TempDir* CheckpointTest::dir_ = nullptr;

// torch.save(model.state_dict(), path): an OrderedDict with _metadata, which LibTorch's unpickler
// read as None.
TEST_F(CheckpointTest, ModelStateDictItselfLoads) {
  StatusOr<LoadedCheckpoint> ckpt = Load("state_dict");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->format, "torch_pickle");
  std::vector<std::string> names;
  for (const auto& [name, t] : ckpt->tensors) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  auto t = ByName(*ckpt);
  EXPECT_TRUE(at::equal(t["0.weight"], Arange(6).reshape({2, 3})));
  EXPECT_TRUE(at::equal(t["0.bias"], Arange(2)));
  EXPECT_TRUE(at::equal(t["1.weight"], at::ones({2})));
  EXPECT_TRUE(at::equal(t["1.bias"], at::zeros({2})));
}

// torch.save({'w': t}): SETITEM, not SETITEMS, which LibTorch's unpickler did not know.
TEST_F(CheckpointTest, OneEntryStateDictsLoad) {
  StatusOr<LoadedCheckpoint> ckpt = Load("one_entry");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->tensors.size(), 1u);
  EXPECT_EQ(ckpt->tensors[0].first, "w");
  EXPECT_TRUE(at::equal(ckpt->tensors[0].second, Arange(4)));
}

TEST_F(CheckpointTest, DtypesViewsSharedStoragesAndParametersLoadAsSaved) {
  StatusOr<LoadedCheckpoint> dtypes = Load("dtypes");
  ASSERT_TRUE(dtypes.ok()) << dtypes.status();
  auto d = ByName(*dtypes);
  for (const auto& [name, type] :
       std::vector<std::pair<std::string, at::ScalarType>>{{"bf16", at::kBFloat16},
                                                           {"fp16", at::kHalf},
                                                           {"i64", at::kLong},
                                                           {"f64", at::kDouble}}) {
    EXPECT_EQ(d[name].scalar_type(), type) << name;
    EXPECT_TRUE(at::equal(d[name], Arange(5, type))) << name;
  }
  EXPECT_TRUE(at::equal(d["bool"], Arange(5) > 2));

  StatusOr<LoadedCheckpoint> views = Load("views");
  ASSERT_TRUE(views.ok()) << views.status();
  auto v = ByName(*views);
  const at::Tensor base = Arange(12, at::kLong);
  EXPECT_EQ(v["t"].strides(), (std::vector<int64_t>{1, 4}));  // the transpose, not a copy
  EXPECT_TRUE(at::equal(v["t"], base.view({3, 4}).t()));
  EXPECT_EQ(v["slice"].storage_offset(), 2);
  EXPECT_TRUE(at::equal(v["slice"], base.slice(0, 2, 5)));
  EXPECT_TRUE(at::equal(v["whole"], base));
  EXPECT_EQ(v["t"].storage().data(), v["whole"].storage().data());  // one storage, shared
  EXPECT_EQ(v["slice"].storage().data(), v["whole"].storage().data());

  StatusOr<LoadedCheckpoint> param = Load("parameter");
  ASSERT_TRUE(param.ok()) << param.status();
  ASSERT_EQ(param->tensors.size(), 1u);
  EXPECT_TRUE(at::equal(param->tensors[0].second, Arange(3)));
}

// torch.jit.save of a scripted module, and LibTorch's OutputArchive (torch::save of a module):
// TorchScript archives whose attributes are read from data.pkl, nested modules dotted.
TEST_F(CheckpointTest, TorchScriptModuleArchivesAreReadAsTheirAttributes) {
  StatusOr<LoadedCheckpoint> py = Load("module_archive");
  ASSERT_TRUE(py.ok()) << py.status();
  EXPECT_EQ(py->format, "torch_archive");
  auto m = ByName(*py);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_TRUE(at::equal(m["inner.weight"], Arange(4).reshape({2, 2})));
  EXPECT_TRUE(at::equal(m["scale"], Arange(2)));

  const std::string archive = dir_->path() + "/output_archive.pt";
  {
    torch::serialize::OutputArchive out, sub;
    sub.write("weight", at::full({3}, 2.0));
    out.write("head", at::zeros({2, 2}));
    out.write("block", sub);
    out.write("running", at::ones({2}), /*is_buffer=*/true);
    out.save_to(archive);
  }
  StatusOr<LoadedCheckpoint> cc = LoadCheckpoint(archive);
  ASSERT_TRUE(cc.ok()) << cc.status();
  EXPECT_EQ(cc->format, "torch_archive");
  auto a = ByName(*cc);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_TRUE(at::equal(a["block.weight"], at::full({3}, 2.0)));
  EXPECT_TRUE(at::equal(a["head"], at::zeros({2, 2})));
  EXPECT_TRUE(at::equal(a["running"], at::ones({2})));
}

TEST_F(CheckpointTest, ATorchScriptArchiveNeverRunsItsCode) {
  // Its __setstate__ maps the canary with torch.from_file(shared=True): reading it as data is
  // impossible (its state is a tuple only that code understands), so it is refused, and the file
  // is not there.
  StatusOr<LoadedCheckpoint> writes = Load("writes_a_file");
  ASSERT_FALSE(writes.ok());
  EXPECT_EQ(writes.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(writes.status().message().find("__setstate__"), std::string::npos) << writes.status();
  EXPECT_NE(writes.status().message().find("torch.save(model.state_dict(), path)"),
            std::string::npos);
  EXPECT_FALSE(Exists(Canary()));
  // The archive is what it claims: torch.jit.load runs that code and the file appears.
  const std::string cmd =
      "/usr/bin/python3 -c \"import torch; torch.jit.load('" + Path("writes_a_file") + "')\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(Exists(Canary()));
  ::unlink(Canary().c_str());

  // Its __setstate__ never returns (torch.jit.load hangs); its state is a dict of tensors, read
  // without it.
  StatusOr<LoadedCheckpoint> loops = Load("never_returns");
  ASSERT_TRUE(loops.ok()) << loops.status();
  ASSERT_EQ(loops->tensors.size(), 1u);
  EXPECT_EQ(loops->tensors[0].first, "w");
  EXPECT_TRUE(at::equal(loops->tensors[0].second, Arange(3)));
}

// Each crashed LibTorch's unpickler, took gigabytes, or gave a tensor larger than its storage.
TEST_F(CheckpointTest, HostileCheckpointsAreErrorsNotCrashes) {
  for (const auto& [name, code, text] :
       std::vector<std::tuple<std::string, StatusCode, std::string>>{
           {"marks", StatusCode::kResourceExhausted, "deeper than 1000 MARKs"},
           {"nested_lists", StatusCode::kResourceExhausted, "deeper than 1000 MARKs"},
           {"memo", StatusCode::kInvalidArgument, "memo entry 268435455"},
           {"oversized_view", StatusCode::kInvalidArgument, "past the end of its storage"},
           {"huge_storage", StatusCode::kInvalidArgument, "its record is 4 bytes"}}) {
    StatusOr<LoadedCheckpoint> ckpt = Load(name);
    ASSERT_FALSE(ckpt.ok()) << name;
    EXPECT_EQ(ckpt.status().code(), code) << ckpt.status();
    EXPECT_NE(ckpt.status().message().find(text), std::string::npos) << ckpt.status();
    EXPECT_NE(ckpt.status().message().find(Path(name)), std::string::npos) << ckpt.status();
  }
}

// The expected size and SHA-256 are checked before a byte is parsed: the TorchScript archive,
// which parsing refuses with kInvalidArgument, is refused with kFailedPrecondition instead.
TEST_F(CheckpointTest, TheFileIsCheckedBeforeItIsParsed) {
  const std::string path = Path("writes_a_file");
  StatusOr<std::string> bytes = ReadFileBytes(path, 1 << 20);
  ASSERT_TRUE(bytes.ok());
  CheckpointExpectation right;
  right.size_bytes = static_cast<int64_t>(bytes->size());
  right.file_sha256 = *Sha256Hex(*bytes);

  CheckpointExpectation other_hash = right;
  other_hash.file_sha256 = *Sha256Hex("another file");
  StatusOr<LoadedCheckpoint> refused = LoadCheckpoint(path, other_hash);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("refused before parsing"), std::string::npos);
  EXPECT_NE(refused.status().message().find(right.file_sha256.substr(0, 16)), std::string::npos);

  CheckpointExpectation other_size = right;
  other_size.size_bytes += 1;
  EXPECT_EQ(LoadCheckpoint(path, other_size).status().code(), StatusCode::kFailedPrecondition);

  EXPECT_EQ(LoadCheckpoint(path, right).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(Canary()));

  StatusOr<LoadedCheckpoint> one = Load("one_entry");
  ASSERT_TRUE(one.ok());
  CheckpointExpectation its;
  its.size_bytes = one->size_bytes;
  its.file_sha256 = one->file_sha256;
  EXPECT_TRUE(LoadCheckpoint(Path("one_entry"), its).ok());
}

// What SaveCheckpoint writes, Python's torch.load and this reader both open, with the same
// values.
TEST_F(CheckpointTest, SaveCheckpointWritesWhatTorchLoadAndThisReaderOpen) {
  const std::string path = dir_->path() + "/saved.pt";
  const at::Tensor base = Arange(12);
  ASSERT_TRUE(SaveCheckpoint(path, {{"a", base.view({3, 4}).t()},
                                    {"b", Arange(3, at::kBFloat16)},
                                    {"c", Arange(2, at::kLong)}})
                  .ok());
  StatusOr<LoadedCheckpoint> back = LoadCheckpoint(path);
  ASSERT_TRUE(back.ok()) << back.status();
  auto t = ByName(*back);
  EXPECT_TRUE(at::equal(t["a"], base.view({3, 4}).t()));
  EXPECT_TRUE(at::equal(t["b"], Arange(3, at::kBFloat16)));
  EXPECT_TRUE(at::equal(t["c"], Arange(2, at::kLong)));
  const std::string cmd =
      "/usr/bin/python3 -c \"import torch; sd = torch.load('" + path +
      "'); assert list(sd) == ['a', 'b', 'c'], list(sd); "
      "assert torch.equal(sd['a'], torch.arange(12.).view(3, 4).t()); "
      "assert sd['b'].dtype == torch.bfloat16 and torch.equal(sd['b'].float(), torch.arange(3.)); "
      "assert torch.equal(sd['c'], torch.arange(2))\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;

  ASSERT_TRUE(SaveCheckpoint(path, {}).ok());  // an empty dict: no tensor
  StatusOr<LoadedCheckpoint> empty = LoadCheckpoint(path);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("holds no tensor"), std::string::npos);
  const std::string text = dir_->path() + "/text.pt";
  ASSERT_TRUE(WriteFileAtomic(text, "not a checkpoint").ok());
  EXPECT_EQ(LoadCheckpoint(text).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, DigestsNameTheFirstDifference) {
  StatusOr<LoadedCheckpoint> ckpt = Load("state_dict");
  ASSERT_TRUE(ckpt.ok());
  std::vector<NamedTensor> changed = ckpt->tensors;
  changed[1].second = changed[1].second.clone();
  changed[1].second[0] = 5;
  auto d1 = TensorDigests(ckpt->tensors);
  auto d2 = TensorDigests(changed);
  ASSERT_TRUE(d1.ok() && d2.ok());
  EXPECT_EQ(FirstDigestDifference(*d1, *d1), "");
  EXPECT_NE(FirstDigestDifference(*d1, *d2).find("tensor '0.bias' differs"), std::string::npos);
  // A list that names only some tensors: the others are not differences.
  std::vector<TensorDigestInfo> some = {(*d1)[0]};
  EXPECT_NE(FirstDigestDifference(some, *d1).find("is not in the recorded checkpoint"),
            std::string::npos);
  EXPECT_EQ(FirstDigestDifference(some, *d1, DigestCoverage::kSome), "");
  std::vector<TensorDigestInfo> bias = {(*d1)[0]};  // sorted: "0.bias" first
  ASSERT_EQ(bias[0].name, "0.bias");
  EXPECT_NE(FirstDigestDifference(bias, *d2, DigestCoverage::kSome).find("'0.bias' differs"),
            std::string::npos);
}

}  // namespace
}  // namespace capsule
