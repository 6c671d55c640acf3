// The data-only checkpoint reader (checkpoint/checkpoint_index.h), over archives built here byte
// by byte: the zip container torch.save writes, and pickles written opcode by opcode. One test per
// rule, each asserting the code and what the message names. Files written by PyTorch itself are
// read in tests/replay/checkpoint_test.cc and by the fuzz regression driver (tests/fuzz/corpus/
// checkpoint).
#include "capsule/checkpoint/checkpoint_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "capsule/base/internal/little_endian.h"

namespace capsule {
namespace {

using internal::StoreLe16;
using internal::StoreLe32;
using internal::StoreLe64;

// ---- a zip writer as PyTorchStreamWriter writes: stored records, zip64 end records ----

struct Record {
  std::string name;
  std::string data;
  uint16_t method = 0;
  uint16_t flags = 0;
};

struct ZipOptions {
  bool zip64_end = true;       // a zip64 end record and locator before the end record (PyTorch)
  bool zip64_entries = false;  // 0xffffffff sizes and offsets, the real ones in a zip64 extra
};

std::string Le16(uint16_t v) {
  std::string s(2, '\0');
  StoreLe16(s.data(), v);
  return s;
}
std::string Le32(uint32_t v) {
  std::string s(4, '\0');
  StoreLe32(s.data(), v);
  return s;
}
std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  StoreLe64(s.data(), v);
  return s;
}

std::string LocalHeader(const Record& r) {
  return Le32(0x04034b50) + Le16(20) + Le16(r.flags) + Le16(r.method) + Le16(0) + Le16(0) +
         Le32(0) + Le32(static_cast<uint32_t>(r.data.size())) +
         Le32(static_cast<uint32_t>(r.data.size())) + Le16(static_cast<uint16_t>(r.name.size())) +
         Le16(0) + r.name;
}

std::string CentralEntry(const Record& r, uint64_t offset, bool zip64) {
  const uint32_t size32 = zip64 ? 0xffffffff : static_cast<uint32_t>(r.data.size());
  const uint32_t offset32 = zip64 ? 0xffffffff : static_cast<uint32_t>(offset);
  const std::string extra =
      zip64 ? Le16(1) + Le16(24) + Le64(r.data.size()) + Le64(r.data.size()) + Le64(offset) : "";
  return Le32(0x02014b50) + Le16(20) + Le16(20) + Le16(r.flags) + Le16(r.method) + Le16(0) +
         Le16(0) + Le32(0) + Le32(size32) + Le32(size32) +
         Le16(static_cast<uint16_t>(r.name.size())) + Le16(static_cast<uint16_t>(extra.size())) +
         Le16(0) + Le16(0) + Le16(0) + Le32(0) + Le32(offset32) + r.name + extra;
}

// The central directory `central` of `count` entries at `cd_offset`, then the end records.
std::string End(size_t count, const std::string& central, uint64_t cd_offset, bool zip64_end) {
  std::string out = central;
  if (zip64_end) {
    const uint64_t record = cd_offset + central.size();
    out += Le32(0x06064b50) + Le64(44) + Le16(45) + Le16(45) + Le32(0) + Le32(0) + Le64(count) +
           Le64(count) + Le64(central.size()) + Le64(cd_offset);
    out += Le32(0x07064b50) + Le32(0) + Le64(record) + Le32(1);
  }
  out += Le32(0x06054b50) + Le16(0) + Le16(0) + Le16(static_cast<uint16_t>(count)) +
         Le16(static_cast<uint16_t>(count)) + Le32(static_cast<uint32_t>(central.size())) +
         Le32(static_cast<uint32_t>(cd_offset)) + Le16(0);
  return out;
}

std::string Zip(const std::vector<Record>& records, const ZipOptions& options = {}) {
  std::string out, central;
  for (const Record& r : records) {
    central += CentralEntry(r, out.size(), options.zip64_entries);
    out += LocalHeader(r) + r.data;
  }
  return out + End(records.size(), central, out.size(), options.zip64_end);
}

// ---- pickles, opcode by opcode ----

std::string U(const std::string& s) { return "X" + Le32(static_cast<uint32_t>(s.size())) + s; }
std::string I(int32_t v) { return "J" + Le32(static_cast<uint32_t>(v)); }
std::string Global(const std::string& module, const std::string& name) {
  return "c" + module + "\n" + name + "\n";
}
std::string Ints(const std::vector<int32_t>& v) {
  std::string s = "(";
  for (int32_t x : v) s += I(x);
  return s + "t";
}
std::string Storage(const std::string& key, int32_t numel,
                    const std::string& type = "FloatStorage") {
  return "(" + U("storage") + Global("torch", type) + U(key) + U("cpu") + I(numel) + "tQ";
}
std::string EmptyOrderedDict() { return Global("collections", "OrderedDict") + ")R"; }
std::string Tensor(const std::string& storage, int32_t offset, const std::vector<int32_t>& sizes,
                   const std::vector<int32_t>& strides) {
  return Global("torch._utils", "_rebuild_tensor_v2") + "(" + storage + I(offset) + Ints(sizes) +
         Ints(strides) + "\x89" + EmptyOrderedDict() + "tR";
}
// {name: value, ...} as torch.save writes a dict: EMPTY_DICT, MARK, pairs, SETITEMS.
std::string Dict(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string s = "\x80\x02}(";
  for (const auto& [k, v] : entries) s += U(k) + v;
  return s + "u.";
}

std::string Floats(size_t n) { return std::string(n * 4, '\0'); }
// BINPUT and BINGET of memo entry `i`.
std::string Put(uint8_t i) { return std::string("q") + static_cast<char>(i); }
std::string Get(uint8_t i) { return std::string("h") + static_cast<char>(i); }

std::string Archive(const std::string& pickle, const std::vector<Record>& more = {},
                    const ZipOptions& options = {}) {
  std::vector<Record> records = {{"archive/data.pkl", pickle}};
  records.insert(records.end(), more.begin(), more.end());
  records.push_back({"archive/version", "3\n"});
  return Zip(records, options);
}

// One float storage '0' of 6 elements, viewed as 2x3.
std::string SimpleCheckpoint(const ZipOptions& options = {}) {
  return Archive(Dict({{"w", Tensor(Storage("0", 6), 0, {2, 3}, {3, 1})}}),
                 {{"archive/data/0", Floats(6)}}, options);
}

StatusOr<CheckpointIndex> Read(const std::string& bytes,
                               const CheckpointLimits& limits = CheckpointLimits()) {
  return ReadCheckpointIndex(MemorySource(bytes), limits);
}

// The read failed with `want_code`, and its message says `want_text`.
#define EXPECT_REFUSED(result, want_code, want_text)                                    \
  do {                                                                                  \
    const auto& r_ = (result);                                                          \
    ASSERT_FALSE(r_.ok());                                                              \
    EXPECT_EQ(r_.status().code(), want_code) << r_.status();                            \
    EXPECT_NE(r_.status().message().find(want_text), std::string::npos) << r_.status(); \
  } while (0)

TEST(CheckpointIndexTest, ReadsAStateDict) {
  const std::string bytes = SimpleCheckpoint();
  StatusOr<CheckpointIndex> index = Read(bytes);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->format, "torch_pickle");
  ASSERT_EQ(index->tensors.size(), 1u);
  ASSERT_EQ(index->storages.size(), 1u);
  const CheckpointTensor& t = index->tensors[0];
  EXPECT_EQ(t.name, "w");
  EXPECT_EQ(t.sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.strides, (std::vector<int64_t>{3, 1}));
  const CheckpointStorage& s = index->storages[0];
  EXPECT_EQ(s.dtype, CheckpointDtype::kFloat32);
  EXPECT_EQ(s.numel, 6u);
  EXPECT_EQ(s.bytes, 24u);
  EXPECT_EQ(bytes.substr(s.offset, s.bytes), Floats(6));
}

TEST(CheckpointIndexTest, ReadsZip64EntriesAndArchivesWithoutZip64) {
  ZipOptions zip64;
  zip64.zip64_entries = true;
  EXPECT_TRUE(Read(SimpleCheckpoint(zip64)).ok()) << Read(SimpleCheckpoint(zip64)).status();
  ZipOptions plain;
  plain.zip64_end = false;
  EXPECT_TRUE(Read(SimpleCheckpoint(plain)).ok()) << Read(SimpleCheckpoint(plain)).status();
}

TEST(CheckpointIndexTest, ReadsOneEntryOrderedDictsParametersAndSharedStorages) {
  // SETITEM (one entry) into an OrderedDict carrying _metadata, as model.state_dict() saves.
  const std::string one = "\x80\x02" + EmptyOrderedDict() + U("w") +
                          Tensor(Storage("0", 6), 0, {6}, {1}) + "s}" + U("_metadata") +
                          EmptyOrderedDict() + "sb.";
  StatusOr<CheckpointIndex> a = Read(Archive(one, {{"archive/data/0", Floats(6)}}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->tensors.size(), 1u);
  EXPECT_EQ(a->tensors[0].name, "w");

  // A Parameter, and two views of one storage (memoized, as torch.save writes them).
  const std::string param = Global("torch._utils", "_rebuild_parameter") + "(" +
                            Tensor(Storage("0", 6) + Put(0), 0, {3}, {1}) + "\x88" +
                            EmptyOrderedDict() + "tR";
  const std::string view = Tensor(Get(0), 3, {3}, {1});
  StatusOr<CheckpointIndex> b =
      Read(Archive(Dict({{"p", param}, {"v", view}}), {{"archive/data/0", Floats(6)}}));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->tensors.size(), 2u);
  EXPECT_TRUE(b->tensors[0].requires_grad);
  EXPECT_FALSE(b->tensors[1].requires_grad);
  EXPECT_EQ(b->storages.size(), 1u);
  EXPECT_EQ(b->tensors[1].storage, b->tensors[0].storage);
  EXPECT_EQ(b->tensors[1].storage_offset, 3u);
}

TEST(CheckpointIndexTest, ReadsAModuleArchiveAsItsAttributes) {
  // __torch__.Outer() with {training, head: tensor, inner: __torch__.Inner() {weight}}; a
  // __setstate__ in its code would never run.
  const std::string inner = Global("__torch__", "Inner") + ")\x81}(" + U("weight") +
                            Tensor(Storage("1", 2), 0, {2}, {1}) + "ub";
  const std::string pickle = "\x80\x02" + Global("__torch__", "Outer") + ")\x81}(" + U("training") +
                             "\x88" + U("head") + Tensor(Storage("0", 6), 0, {6}, {1}) +
                             U("inner") + inner + "ub.";
  StatusOr<CheckpointIndex> index =
      Read(Archive(pickle, {{"archive/data/0", Floats(6)},
                            {"archive/data/1", Floats(2)},
                            {"archive/code/__torch__.py", "def __setstate__(self, s): ..."}}));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->format, "torch_archive");
  ASSERT_EQ(index->tensors.size(), 2u);
  EXPECT_EQ(index->tensors[0].name, "head");
  EXPECT_EQ(index->tensors[1].name, "inner.weight");
}

TEST(CheckpointIndexTest, AnObjectWhoseStateOnlyItsCodeCanRestoreIsRefused) {
  const std::string pickle = "\x80\x02" + Global("__torch__", "Evil") + ")\x81(" +
                             Tensor(Storage("0", 3), 0, {3}, {1}) + "\x88tb.";
  EXPECT_REFUSED(Read(Archive(pickle, {{"archive/data/0", Floats(3)}})),
                 StatusCode::kInvalidArgument, "__setstate__");
}

TEST(CheckpointIndexTest, GlobalsOutsideTheListAreRefusedByName) {
  for (const auto& [module, name] :
       std::vector<std::pair<std::string, std::string>>{{"os", "system"},
                                                        {"builtins", "eval"},
                                                        {"torch.storage", "_load_from_bytes"},
                                                        {"torch", "from_file"},
                                                        {"torch._utils", "_rebuild_qtensor"}}) {
    const std::string pickle = "\x80\x02" + Global(module, name) + "(" + U("x") + "tR.";
    EXPECT_REFUSED(Read(Archive(pickle)), StatusCode::kInvalidArgument, module + "." + name);
  }
  // STACK_GLOBAL is held to the same list.
  EXPECT_REFUSED(Read(Archive("\x80\x04" + U("os") + U("system") + "\x93.")),
                 StatusCode::kInvalidArgument, "os.system");
}

TEST(CheckpointIndexTest, OpcodesOutsideTheSubsetAreRefusedByName) {
  for (const auto& [op, name] :
       std::vector<std::pair<std::string, std::string>>{{"0", "POP"},
                                                        {"2", "DUP"},
                                                        {"i", "INST"},
                                                        {"o", "OBJ"},
                                                        {"\x92", "NEWOBJ_EX"},
                                                        {"\x82", "EXT1"},
                                                        {"P", "PERSID"}}) {
    EXPECT_REFUSED(Read(Archive("\x80\x02}" + op + ".")), StatusCode::kInvalidArgument, name);
  }
  EXPECT_REFUSED(Read(Archive("\x80\x02}\xff.")), StatusCode::kInvalidArgument,
                 "0xff is not a pickle opcode");
  EXPECT_REFUSED(Read(Archive("\x80\x06}.")), StatusCode::kUnimplemented, "protocol 6");
}

TEST(CheckpointIndexTest, CallsAreHeldToWhatTheirConstructorsTake) {
  // NEWOBJ of anything but a TorchScript class; REDUCE of one.
  EXPECT_REFUSED(Read(Archive("\x80\x02" + EmptyOrderedDict() + "\x29\x81.")),
                 StatusCode::kInvalidArgument, "NEWOBJ");
  EXPECT_REFUSED(Read(Archive("\x80\x02" + Global("__torch__", "M") + ")R.")),
                 StatusCode::kInvalidArgument, "REDUCE calls __torch__.M");
  // A tensor with backward hooks, or whose storage is not a storage.
  const std::string hooked = Global("torch._utils", "_rebuild_tensor_v2") + "(" + Storage("0", 6) +
                             I(0) + Ints({6}) + Ints({1}) + "\x89}" + U("k") + I(1) + "stR";
  EXPECT_REFUSED(Read(Archive(Dict({{"w", hooked}}), {{"archive/data/0", Floats(6)}})),
                 StatusCode::kInvalidArgument, "backward hooks");
  EXPECT_REFUSED(Read(Archive(Dict({{"w", Tensor(I(7), 0, {1}, {1})}}))),
                 StatusCode::kInvalidArgument, "storage is an int");
  // A persistent id that is not a storage.
  EXPECT_REFUSED(Read(Archive("\x80\x02" + U("x") + "Q.")), StatusCode::kInvalidArgument,
                 "persistent id");
}

TEST(CheckpointIndexTest, MalformedPicklesAreRefusedWithTheOffset) {
  EXPECT_REFUSED(Read(Archive("\x80\x02}")), StatusCode::kInvalidArgument, "without STOP");
  EXPECT_REFUSED(Read(Archive("\x80\x02}}.")), StatusCode::kInvalidArgument, "STOP with 2 values");
  EXPECT_REFUSED(Read(Archive("\x80\x02(}.")), StatusCode::kInvalidArgument, "STOP inside a MARK");
  EXPECT_REFUSED(Read(Archive("\x80\x02s.")), StatusCode::kInvalidArgument, "offset 2");
  EXPECT_REFUSED(Read(Archive("\x80\x02X" + Le32(255) + "ab")), StatusCode::kInvalidArgument,
                 "ends inside BINUNICODE");
  EXPECT_REFUSED(Read(Archive("\x80\x02" + U("\xff") + ".")), StatusCode::kInvalidArgument,
                 "not UTF-8");
  EXPECT_REFUSED(Read(Archive("\x80\x02\x8a\x09" + std::string(9, '\x01') + ".")),
                 StatusCode::kInvalidArgument, "wider than 64 bits");
  EXPECT_REFUSED(Read(Archive("\x80\x02}" + Get(5) + ".")), StatusCode::kInvalidArgument,
                 "never put");
  // A pop below the innermost MARK.
  EXPECT_REFUSED(Read(Archive("\x80\x02}(s.")), StatusCode::kInvalidArgument, "SETITEM");
}

// LONG_BINPUT to entry 2^28 cost LibTorch's unpickler gigabytes (the memo grew to the index).
TEST(CheckpointIndexTest, AMemoIndexThatSkipsAheadIsRefused) {
  EXPECT_REFUSED(Read(Archive("\x80\x02}r\xff\xff\xff\x0f.")), StatusCode::kInvalidArgument,
                 "memo entry 268435455");
}

// A million MARKs or nested lists crashed LibTorch's unpickler (recursion): here the first is a
// counted depth, the second a long array of objects and no recursion at all.
TEST(CheckpointIndexTest, DeepNestingIsAnErrorNotACrash) {
  EXPECT_REFUSED(Read(Archive("\x80\x02" + std::string(1000000, '(') + ".")),
                 StatusCode::kResourceExhausted, "deeper than 1000 MARKs");
  std::string lists = "\x80\x02";
  lists += std::string(1000000, ']') + std::string(999999, 'a') + ".";
  EXPECT_REFUSED(Read(Archive(lists)), StatusCode::kInvalidArgument, "holds a list");
  std::string nested = "\x80\x02]";
  for (int i = 0; i < 1000000; ++i) nested += "(]";
  nested += std::string(1000000, 'e') + ".";
  EXPECT_REFUSED(Read(Archive(nested)), StatusCode::kResourceExhausted, "MARKs");
}

TEST(CheckpointIndexTest, StackValuesAndPickleSizeAreBounded) {
  CheckpointLimits small;
  small.max_stack = 100;
  EXPECT_REFUSED(Read(Archive("\x80\x02" + std::string(200, 'N') + "."), small),
                 StatusCode::kResourceExhausted, "stack");
  small = CheckpointLimits();
  small.max_values = 100;
  EXPECT_REFUSED(Read(Archive("\x80\x02]" + std::string(200, '}') + "e."), small),
                 StatusCode::kResourceExhausted, "more than 100 values");
  small = CheckpointLimits();
  small.max_pickle_bytes = 10;
  EXPECT_REFUSED(Read(SimpleCheckpoint(), small), StatusCode::kResourceExhausted, "data.pkl");
  small = CheckpointLimits();
  small.max_file_bytes = 10;
  EXPECT_REFUSED(Read(SimpleCheckpoint(), small), StatusCode::kResourceExhausted, "the limit");
}

TEST(CheckpointIndexTest, ATensorMustFitItsStorage) {
  auto with = [](int32_t numel, int32_t offset, std::vector<int32_t> sizes,
                 std::vector<int32_t> strides) {
    return Read(Archive(Dict({{"w", Tensor(Storage("0", numel), offset, sizes, strides)}}),
                        {{"archive/data/0", Floats(static_cast<size_t>(numel))}}));
  };
  EXPECT_TRUE(with(6, 0, {2, 3}, {3, 1}).ok());
  EXPECT_TRUE(with(12, 0, {4, 3}, {1, 4}).ok());  // a transpose
  EXPECT_TRUE(with(6, 6, {0}, {1}).ok());         // empty, at the end
  EXPECT_REFUSED(with(6, 0, {1073741824}, {1}), StatusCode::kInvalidArgument,
                 "past the end of its storage of 6 elements");
  EXPECT_REFUSED(with(6, 4, {3}, {1}), StatusCode::kInvalidArgument, "reaches element 6");
  EXPECT_REFUSED(with(6, 0, {2, 3}, {4, 1}), StatusCode::kInvalidArgument, "reaches element 6");
  EXPECT_REFUSED(with(6, 7, {0}, {1}), StatusCode::kInvalidArgument, "starts past the end");
  EXPECT_REFUSED(with(6, -1, {1}, {1}), StatusCode::kInvalidArgument, "negative storage offset");
  EXPECT_REFUSED(with(6, 0, {2}, {-1}), StatusCode::kInvalidArgument, "negative size or stride");
  EXPECT_REFUSED(with(6, 0, {2, 3}, {1}), StatusCode::kInvalidArgument, "2 sizes and 1 strides");
  EXPECT_REFUSED(with(6, 0, {65536, 65536, 65536, 65536}, {0, 0, 0, 0}),
                 StatusCode::kInvalidArgument, "larger than its storage");  // 2^64 elements
  EXPECT_REFUSED(with(6, 0, {1000}, {0}), StatusCode::kInvalidArgument, "expanded view");
  EXPECT_REFUSED(with(6, 0, {2147483647, 2147483647, 2147483647}, {2147483647, 2147483647, 1}),
                 StatusCode::kInvalidArgument, "larger than its storage");
}

// A storage's elements must be exactly its record's bytes: a 300-byte archive that claims
// 2^30 floats is refused from the zip directory, having read no more than the file holds.
TEST(CheckpointIndexTest, ATinyPickleClaimingAHugeStorageIsRefusedBeforeAnythingIsAllocated) {
  const std::string bytes = Archive(Dict({{"w", Tensor(Storage("0", 1 << 30), 0, {1}, {1})}}),
                                    {{"archive/data/0", Floats(1)}});
  CheckpointSource source = MemorySource(bytes);
  uint64_t read = 0;
  const auto inner = source.read;
  source.read = [&](uint64_t offset, size_t n, char* out) {
    read += n;
    return inner(offset, n, out);
  };
  StatusOr<CheckpointIndex> index = ReadCheckpointIndex(source);
  EXPECT_REFUSED(index, StatusCode::kInvalidArgument,
                 "said to hold 1073741824 Float elements, but its record is 4 bytes");
  EXPECT_LE(read, 2 * bytes.size());
}

TEST(CheckpointIndexTest, StorageRecordsMustExistAndAgree) {
  EXPECT_REFUSED(Read(Archive(Dict({{"w", Tensor(Storage("0", 6), 0, {6}, {1})}}))),
                 StatusCode::kInvalidArgument, "has no record data/0");
  const std::string twice = Dict({{"a", Tensor(Storage("0", 6), 0, {6}, {1})},
                                  {"b", Tensor(Storage("0", 3, "DoubleStorage"), 0, {3}, {1})}});
  EXPECT_REFUSED(Read(Archive(twice, {{"archive/data/0", Floats(6)}})),
                 StatusCode::kInvalidArgument, "named twice");
  EXPECT_REFUSED(Read(Archive(Dict({{"w", Tensor(Storage("0", 6, "QInt8Storage"), 0, {6}, {1})}}),
                              {{"archive/data/0", Floats(6)}})),
                 StatusCode::kInvalidArgument, "torch.QInt8Storage");
}

TEST(CheckpointIndexTest, WhatIsNotADictOfNamedTensorsIsRefused) {
  EXPECT_REFUSED(Read(Archive(Dict({}))), StatusCode::kInvalidArgument, "holds no tensor");
  EXPECT_REFUSED(Read(Archive(Dict({{"epoch", I(3)}}))), StatusCode::kInvalidArgument,
                 "entry 'epoch' is an int, not a tensor");
  EXPECT_REFUSED(Read(Archive("\x80\x02" + I(1) + ".")), StatusCode::kInvalidArgument,
                 "holds an int");
  const std::string t = Tensor(Storage("0", 6), 0, {6}, {1});
  const std::string dup = "\x80\x02}(" + U("w") + t + Put(0) + U("w") + Get(0) + "u.";
  EXPECT_REFUSED(Read(Archive(dup, {{"archive/data/0", Floats(6)}})), StatusCode::kInvalidArgument,
                 "'w' is named twice");
}

TEST(CheckpointIndexTest, ModuleNestingIsBoundedAndCyclesCostOneWalk) {
  // A module whose attribute is itself: read once.
  const std::string cycle = "\x80\x02" + Global("__torch__", "M") + ")\x81" + Put(0) + "}(" +
                            U("self") + Get(0) + U("w") + Tensor(Storage("0", 6), 0, {6}, {1}) +
                            "ub.";
  StatusOr<CheckpointIndex> index = Read(Archive(cycle, {{"archive/data/0", Floats(6)}}));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->tensors.size(), 1u);
  // 70 nested modules, over the default of 64.
  std::string deep = "\x80\x02";
  for (int i = 0; i < 70; ++i) deep += Global("__torch__", "M") + ")\x81}(" + U("m");
  deep += Tensor(Storage("0", 6), 0, {6}, {1});
  for (int i = 0; i < 70; ++i) deep += "ub";
  EXPECT_REFUSED(Read(Archive(deep + ".", {{"archive/data/0", Floats(6)}})),
                 StatusCode::kResourceExhausted, "nest deeper than 64");
}

// ---- the container ----

TEST(CheckpointIndexTest, WhatIsNotATorchSaveZipIsNamed) {
  EXPECT_REFUSED(Read("not a checkpoint"), StatusCode::kInvalidArgument, "not a zip archive");
  EXPECT_REFUSED(Read(std::string(100, 'x')), StatusCode::kInvalidArgument, "not a zip archive");
  EXPECT_REFUSED(Read(std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14) +
                      std::string(100, '\0')),
                 StatusCode::kInvalidArgument, "legacy torch.save file");
  EXPECT_REFUSED(Read(Zip({{"archive/version", "3\n"}})), StatusCode::kInvalidArgument,
                 "without <archive>/data.pkl");
  EXPECT_REFUSED(Read(Zip({{"a/data.pkl", "\x80\x02}."}, {"b/data.pkl", "\x80\x02}."}})),
                 StatusCode::kInvalidArgument, "two pickles");
  EXPECT_REFUSED(Read(Zip({{"archive/data.pkl", "\x80\x02}."}, {"archive/data.pkl", "x"}})),
                 StatusCode::kInvalidArgument, "twice");
}

TEST(CheckpointIndexTest, RecordsMustBeStoredAndVersionsKnown) {
  Record compressed{"archive/data.pkl", Dict({}), 8, 0};
  EXPECT_REFUSED(Read(Zip({compressed})), StatusCode::kUnimplemented, "compressed");
  Record encrypted{"archive/data.pkl", Dict({}), 0, 1};
  EXPECT_REFUSED(Read(Zip({encrypted})), StatusCode::kUnimplemented, "encrypted");
  const std::string pickle = Dict({{"w", Tensor(Storage("0", 6), 0, {6}, {1})}});
  const Record data{"archive/data/0", Floats(6)};
  EXPECT_REFUSED(Read(Zip({{"archive/data.pkl", pickle}, data, {"archive/version", "11\n"}})),
                 StatusCode::kUnimplemented, "archive version 11");
  EXPECT_REFUSED(Read(Zip({{"archive/data.pkl", pickle}, data, {"archive/version", "three"}})),
                 StatusCode::kInvalidArgument, "not a number");
  EXPECT_REFUSED(Read(Zip({{"archive/data.pkl", pickle}, data, {"archive/byteorder", "big"}})),
                 StatusCode::kUnimplemented, "big-endian");
  EXPECT_TRUE(Read(Zip({{"archive/data.pkl", pickle},
                        data,
                        {"archive/byteorder", "little"},
                        {"archive/.data/version", "3\n"}}))
                  .ok());
}

// Records may not share bytes: a storage whose local header lies inside data.pkl's bytes (after
// its STOP) would let one file stand for many copies of itself.
TEST(CheckpointIndexTest, RecordsThatOverlapAreCorrupt) {
  const Record storage{"archive/data/0", Floats(6)};
  const std::string pickle = Dict({{"w", Tensor(Storage("0", 6), 0, {6}, {1})}});
  const Record outer{"archive/data.pkl", pickle + LocalHeader(storage) + storage.data};
  const std::string body = LocalHeader(outer) + outer.data;
  const uint64_t inner_offset = LocalHeader(outer).size() + pickle.size();
  const std::string central =
      CentralEntry(outer, 0, false) + CentralEntry(storage, inner_offset, false);
  EXPECT_REFUSED(Read(body + End(2, central, body.size(), true)), StatusCode::kDataLoss, "overlap");
}

// Byte surgery on the directory: offsets and sizes that point outside the file, into the
// central directory, or at a local header for another name.
TEST(CheckpointIndexTest, ADirectoryThatContradictsTheFileIsCorrupt) {
  const std::string good = SimpleCheckpoint(ZipOptions{false, false});
  const size_t cd = internal::LoadLe32(good.data() + good.size() - 6);
  auto poke32 = [&](size_t at, uint32_t v) {
    std::string bad = good;
    StoreLe32(bad.data() + at, v);
    return bad;
  };
  // The first central entry's local header offset (at +42) past the directory.
  EXPECT_REFUSED(Read(poke32(cd + 42, static_cast<uint32_t>(cd))), StatusCode::kDataLoss,
                 "outside the file");
  // Its size (at +20, +24) reaching into the directory.
  std::string bad = poke32(cd + 20, static_cast<uint32_t>(cd));
  StoreLe32(bad.data() + cd + 24, static_cast<uint32_t>(cd));
  EXPECT_REFUSED(Read(bad), StatusCode::kDataLoss, "runs into the central directory");
  // The end record's directory offset (at end-6).
  EXPECT_REFUSED(Read(poke32(good.size() - 6, 3)), StatusCode::kDataLoss, "does not end where");
  // The local header's name.
  bad = good;
  bad[30] = 'X';
  EXPECT_REFUSED(Read(bad), StatusCode::kDataLoss, "names");
  // Every truncation is refused, none crashes.
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(Read(good.substr(0, n)).ok()) << n;
}

}  // namespace
}  // namespace capsule
