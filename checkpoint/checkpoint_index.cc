#include "capsule/checkpoint/checkpoint_index.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "capsule/base/internal/printable.h"
#include "capsule/checkpoint/internal/pickle_machine.h"
#include "capsule/checkpoint/internal/zip_directory.h"

namespace capsule {

int CheckpointDtypeSize(CheckpointDtype dtype) {
  switch (dtype) {
    case CheckpointDtype::kFloat64:
    case CheckpointDtype::kInt64:
    case CheckpointDtype::kComplex64:
      return 8;
    case CheckpointDtype::kFloat32:
    case CheckpointDtype::kInt32:
      return 4;
    case CheckpointDtype::kFloat16:
    case CheckpointDtype::kBFloat16:
    case CheckpointDtype::kInt16:
      return 2;
    case CheckpointDtype::kInt8:
    case CheckpointDtype::kUInt8:
    case CheckpointDtype::kBool:
      return 1;
    case CheckpointDtype::kComplex128:
      return 16;
  }
  return 0;
}

const char* CheckpointDtypeName(CheckpointDtype dtype) {
  switch (dtype) {
    case CheckpointDtype::kFloat64:
      return "Double";
    case CheckpointDtype::kFloat32:
      return "Float";
    case CheckpointDtype::kFloat16:
      return "Half";
    case CheckpointDtype::kBFloat16:
      return "BFloat16";
    case CheckpointDtype::kInt64:
      return "Long";
    case CheckpointDtype::kInt32:
      return "Int";
    case CheckpointDtype::kInt16:
      return "Short";
    case CheckpointDtype::kInt8:
      return "Char";
    case CheckpointDtype::kUInt8:
      return "Byte";
    case CheckpointDtype::kBool:
      return "Bool";
    case CheckpointDtype::kComplex64:
      return "ComplexFloat";
    case CheckpointDtype::kComplex128:
      return "ComplexDouble";
  }
  return "unknown";
}

CheckpointSource MemorySource(std::string_view bytes) {
  CheckpointSource source;
  source.size = bytes.size();
  source.read = [bytes](uint64_t offset, size_t n, char* out) {
    if (offset > bytes.size() || n > bytes.size() - offset) {
      return OutOfRangeError("read past the end of the checkpoint's bytes");
    }
    if (n > 0) std::memcpy(out, bytes.data() + offset, n);
    return Status::Ok();
  };
  return source;
}

namespace {

using internal::PickleGraph;
using internal::PickleObject;
using internal::PickleTensor;
using internal::PickleValue;
using internal::ZipEntry;

// What torch.save wrote before PyTorch 1.6: a pickled magic number first (protocol 2, LONG1 of
// 10 bytes: 0x1950a86a20f9469cfc6c).
constexpr std::string_view kLegacyMagic("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19",
                                        14);
// PyTorch's kMaxSupportedFileFormatVersion (caffe2/serialize/inline_container.h).
constexpr uint64_t kMaxArchiveVersion = 10;
constexpr size_t kMaxDims = 64;
constexpr size_t kMaxSmallRecord = 64;  // version, byteorder

const char kSaveStateDict[] = "save the model's state dict: torch.save(model.state_dict(), path)";

StatusOr<std::string> ReadRecord(const CheckpointSource& source, const internal::ZipDirectory& dir,
                                 ZipEntry& entry, uint64_t max_bytes) {
  CAPSULE_RETURN_IF_ERROR(internal::LocateRecord(source, dir, entry));
  if (entry.size > max_bytes) {
    return ResourceExhaustedError(entry.name + " is " + std::to_string(entry.size) +
                                  " bytes, over the limit of " + std::to_string(max_bytes));
  }
  std::string bytes(static_cast<size_t>(entry.size), '\0');
  CAPSULE_RETURN_IF_ERROR(source.read(entry.data_offset, bytes.size(), bytes.data()));
  return bytes;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.remove_suffix(1);
  return s;
}

// The archive's records, by name, all under one folder: "<archive>/data.pkl",
// "<archive>/data/<key>", "<archive>/version", "<archive>/byteorder".
class Archive {
 public:
  static StatusOr<Archive> Open(const CheckpointSource& source, const CheckpointLimits& limits) {
    Archive a;
    CAPSULE_ASSIGN_OR_RETURN(a.dir_, internal::ReadZipDirectory(source, limits));
    constexpr std::string_view kPickle = "/data.pkl";
    for (ZipEntry& e : a.dir_.entries) {
      const std::string_view name = e.name;
      if (name.size() > kPickle.size() && name.substr(name.size() - kPickle.size()) == kPickle &&
          name.find('/') == name.size() - kPickle.size()) {
        if (!a.prefix_.empty()) {
          return InvalidArgumentError("the zip archive holds two pickles, " + a.prefix_ +
                                      "/data.pkl and " + PrintableShort(name));
        }
        a.prefix_ = std::string(name.substr(0, name.size() - kPickle.size()));
      }
      a.by_name_.emplace(name, &e);
    }
    if (a.prefix_.empty()) {
      return InvalidArgumentError(
          "a zip archive without <archive>/data.pkl, so not one torch.save "
          "wrote");
    }
    return a;
  }
  // The record `<archive>/<name>`, or null.
  ZipEntry* Find(const std::string& name) {
    auto it = by_name_.find(prefix_ + "/" + name);
    return it == by_name_.end() ? nullptr : it->second;
  }
  const internal::ZipDirectory& dir() const { return dir_; }

 private:
  Archive() = default;
  internal::ZipDirectory dir_;
  std::string prefix_;
  std::unordered_map<std::string_view, ZipEntry*> by_name_;  // into dir_.entries
};

// The version and byte-order records, when present (PyTorch writes "version", newer releases
// also ".data/version" and "byteorder").
Status CheckRecords(const CheckpointSource& source, Archive& archive) {
  if (ZipEntry* e = archive.Find("byteorder")) {
    CAPSULE_ASSIGN_OR_RETURN(std::string order,
                             ReadRecord(source, archive.dir(), *e, kMaxSmallRecord));
    if (Trim(order) == "big") return UnimplementedError("a big-endian checkpoint");
    if (Trim(order) != "little") {
      return InvalidArgumentError("byteorder record says '" + PrintableShort(order) + "'");
    }
  }
  for (const char* name : {"version", ".data/version"}) {
    ZipEntry* e = archive.Find(name);
    if (e == nullptr) continue;
    CAPSULE_ASSIGN_OR_RETURN(std::string text,
                             ReadRecord(source, archive.dir(), *e, kMaxSmallRecord));
    const std::string_view v = Trim(text);
    uint64_t version = 0;
    bool ok = !v.empty() && v.size() <= 6;
    for (char c : v) {
      ok = ok && c >= '0' && c <= '9';
      version = version * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!ok) return InvalidArgumentError(std::string(name) + " record is not a number");
    if (version > kMaxArchiveVersion) {
      return UnimplementedError("archive version " + std::to_string(version) +
                                " is newer than this reader (reads up to " +
                                std::to_string(kMaxArchiveVersion) + ")");
    }
  }
  return Status::Ok();
}

// A tensor must address only elements inside its storage, and no more of them than the storage
// holds (a copy of it is then never larger than the file).
Status CheckFits(const std::string& name, const PickleTensor& t, const internal::PickleStorage& s) {
  const std::string what = "tensor '" + PrintableShort(name) + "'";
  if (t.sizes.size() != t.strides.size()) {
    return InvalidArgumentError(what + " has " + std::to_string(t.sizes.size()) + " sizes and " +
                                std::to_string(t.strides.size()) + " strides");
  }
  if (t.sizes.size() > kMaxDims) {
    return InvalidArgumentError(what + " has more than " + std::to_string(kMaxDims) +
                                " dimensions");
  }
  if (t.storage_offset < 0) return InvalidArgumentError(what + " has a negative storage offset");
  bool empty = false;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0 || t.strides[d] < 0) {
      return InvalidArgumentError(what + " has a negative size or stride");
    }
    empty = empty || t.sizes[d] == 0;
  }
  const uint64_t offset = static_cast<uint64_t>(t.storage_offset);
  const std::string storage = " its storage of " + std::to_string(s.numel) + " elements";
  if (empty) {
    if (offset > s.numel) return InvalidArgumentError(what + " starts past the end of" + storage);
    return Status::Ok();
  }
  uint64_t numel = 1, last = offset;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    const uint64_t size = static_cast<uint64_t>(t.sizes[d]);
    const uint64_t stride = static_cast<uint64_t>(t.strides[d]);
    uint64_t reach;
    if (__builtin_mul_overflow(numel, size, &numel) ||
        __builtin_mul_overflow(size - 1, stride, &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      return InvalidArgumentError(what + " is larger than" + storage);
    }
  }
  if (last >= s.numel) {
    return InvalidArgumentError(what + " reaches element " + std::to_string(last) +
                                ", past the end"
                                " of" +
                                storage);
  }
  if (numel > s.numel) {
    return InvalidArgumentError(what + " has " + std::to_string(numel) + " elements, more than" +
                                storage + " (an expanded view); save a copy, t.contiguous()");
  }
  return Status::Ok();
}

struct Named {
  std::string name;
  uint32_t tensor;  // into PickleGraph::tensors
};

// The named tensors of what data.pkl returned: a dict of tensors, or a TorchScript module whose
// attributes are tensors and submodules (other attributes are not weights, and are skipped).
class Extractor {
 public:
  Extractor(const PickleGraph& graph, const CheckpointLimits& limits)
      : graph_(graph), limits_(limits), expanded_(graph.objects.size(), false) {}

  StatusOr<std::string> Run(std::vector<Named>& out) {
    const PickleObject* root = graph_.Object(graph_.root);
    if (root != nullptr && root->kind == PickleObject::Kind::kDict) {
      for (const auto& [key, value] : root->entries) {
        CAPSULE_ASSIGN_OR_RETURN(std::string name, Key(key));
        const PickleObject* o = graph_.Object(value);
        if (o == nullptr || o->kind != PickleObject::Kind::kTensor) {
          return InvalidArgumentError("entry '" + PrintableShort(name) + "' is " +
                                      internal::DescribeValue(graph_, value) + ", not a tensor; " +
                                      kSaveStateDict);
        }
        CAPSULE_RETURN_IF_ERROR(Add(std::move(name), o->index, out));
      }
      return std::string("torch_pickle");
    }
    if (root != nullptr && root->kind == PickleObject::Kind::kInstance) {
      CAPSULE_RETURN_IF_ERROR(Module(graph_.root.n, "", 0, out));
      return std::string("torch_archive");
    }
    return InvalidArgumentError("data.pkl holds " + internal::DescribeValue(graph_, graph_.root) +
                                ", not a dict of tensors; " + kSaveStateDict);
  }

 private:
  StatusOr<std::string> Key(const PickleValue& key) {
    if (key.kind != PickleValue::Kind::kString) {
      return InvalidArgumentError("a key that is " + internal::DescribeValue(graph_, key) +
                                  ", not a name");
    }
    return std::string(graph_.String(key));
  }
  Status Add(std::string name, uint32_t tensor, std::vector<Named>& out) {
    if (!names_.insert(name).second) {
      return InvalidArgumentError("tensor '" + PrintableShort(name) + "' is named twice");
    }
    out.push_back({std::move(name), tensor});
    return Status::Ok();
  }
  // Each object is expanded once, so a submodule two attributes share (or a cycle) costs one walk;
  // its tensors are named by the first path that reaches it.
  Status Module(uint32_t object, const std::string& prefix, int depth, std::vector<Named>& out) {
    if (depth > limits_.max_module_depth) {
      return ResourceExhaustedError("modules nest deeper than " +
                                    std::to_string(limits_.max_module_depth));
    }
    if (expanded_[object]) return Status::Ok();
    expanded_[object] = true;
    const PickleObject& module = graph_.objects[object];
    if (!module.built) return Status::Ok();  // no attributes
    for (const auto& [key, value] : graph_.objects[module.index].entries) {
      CAPSULE_ASSIGN_OR_RETURN(std::string name, Key(key));
      const PickleObject* o = graph_.Object(value);
      if (o == nullptr) continue;
      if (o->kind == PickleObject::Kind::kTensor) {
        CAPSULE_RETURN_IF_ERROR(Add(prefix + name, o->index, out));
      } else if (o->kind == PickleObject::Kind::kInstance) {
        CAPSULE_RETURN_IF_ERROR(Module(value.n, prefix + name + ".", depth + 1, out));
      }
    }
    return Status::Ok();
  }

  const PickleGraph& graph_;
  const CheckpointLimits& limits_;
  std::vector<bool> expanded_;
  std::unordered_set<std::string> names_;
};

}  // namespace

StatusOr<CheckpointIndex> ReadCheckpointIndex(const CheckpointSource& source,
                                              const CheckpointLimits& limits) {
  if (source.size > limits.max_file_bytes) {
    return ResourceExhaustedError("the checkpoint is " + std::to_string(source.size) +
                                  " bytes, over the limit of " +
                                  std::to_string(limits.max_file_bytes));
  }
  if (source.size >= kLegacyMagic.size()) {
    std::string head(kLegacyMagic.size(), '\0');
    CAPSULE_RETURN_IF_ERROR(source.read(0, head.size(), head.data()));
    if (head == kLegacyMagic) {
      return InvalidArgumentError(
          "a legacy torch.save file (written before PyTorch 1.6, or with "
          "_use_new_zipfile_serialization=False); save it again as a zip archive, the default");
    }
  }
  CAPSULE_ASSIGN_OR_RETURN(Archive archive, Archive::Open(source, limits));
  CAPSULE_RETURN_IF_ERROR(CheckRecords(source, archive));
  ZipEntry* pickle_entry = archive.Find("data.pkl");
  CAPSULE_ASSIGN_OR_RETURN(std::string pickle, ReadRecord(source, archive.dir(), *pickle_entry,
                                                          limits.max_pickle_bytes));
  CAPSULE_ASSIGN_OR_RETURN(PickleGraph graph, internal::RunPickle(pickle, limits));

  // Every storage the pickle names is a record of exactly its size. Records read must not
  // overlap: together they are then never larger than the file.
  std::vector<const ZipEntry*> records = {pickle_entry};
  std::vector<CheckpointStorage> storages;
  for (const internal::PickleStorage& s : graph.storages) {
    const std::string key(s.key);
    ZipEntry* e = archive.Find("data/" + key);
    if (e == nullptr) {
      return InvalidArgumentError("storage '" + PrintableShort(key) + "' has no record data/" +
                                  PrintableShort(key));
    }
    CAPSULE_RETURN_IF_ERROR(internal::LocateRecord(source, archive.dir(), *e));
    uint64_t bytes;
    if (__builtin_mul_overflow(s.numel, static_cast<uint64_t>(CheckpointDtypeSize(s.dtype)),
                               &bytes) ||
        bytes != e->size) {
      return InvalidArgumentError("storage '" + PrintableShort(key) + "' is said to hold " +
                                  std::to_string(s.numel) + " " + CheckpointDtypeName(s.dtype) +
                                  " elements, but its record is " + std::to_string(e->size) +
                                  " bytes");
    }
    records.push_back(e);
    storages.push_back({key, s.dtype, s.numel, e->data_offset, bytes});
  }
  std::sort(records.begin(), records.end(), [](const ZipEntry* a, const ZipEntry* b) {
    return a->header_offset < b->header_offset;
  });
  for (size_t i = 1; i < records.size(); ++i) {
    if (records[i]->header_offset < records[i - 1]->data_offset + records[i - 1]->size) {
      return DataLossError("corrupt zip archive: records " + PrintableShort(records[i - 1]->name) +
                           " and " + PrintableShort(records[i]->name) + " overlap");
    }
  }

  std::vector<Named> named;
  CheckpointIndex index;
  CAPSULE_ASSIGN_OR_RETURN(index.format, Extractor(graph, limits).Run(named));
  if (named.empty()) {
    return InvalidArgumentError("it holds no tensor; " + std::string(kSaveStateDict));
  }
  // Only the storages the named tensors use, renumbered in the order first used.
  std::vector<size_t> renumbered(storages.size(), SIZE_MAX);
  for (Named& n : named) {
    const PickleTensor& t = graph.tensors[n.tensor];
    CAPSULE_RETURN_IF_ERROR(CheckFits(n.name, t, graph.storages[t.storage]));
    if (renumbered[t.storage] == SIZE_MAX) {
      renumbered[t.storage] = index.storages.size();
      index.storages.push_back(storages[t.storage]);
    }
    CheckpointTensor out;
    out.name = std::move(n.name);
    out.storage = renumbered[t.storage];
    out.storage_offset = static_cast<uint64_t>(t.storage_offset);
    out.sizes = t.sizes;
    out.strides = t.strides;
    out.requires_grad = t.requires_grad;
    index.tensors.push_back(std::move(out));
  }
  return index;
}

}  // namespace capsule
