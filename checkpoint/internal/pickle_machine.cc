#include "capsule/checkpoint/internal/pickle_machine.h"

#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/printable.h"

namespace capsule::internal {
namespace {

// Python's pickle opcodes (Lib/pickletools.py), by name, for messages; the ones run are the
// cases of Machine::Step.
struct OpcodeEntry {
  uint8_t op;
  const char* name;
};

const char* OpcodeName(uint8_t op) {
  static constexpr OpcodeEntry kOpcodes[] = {
      {'(', "MARK"},
      {'.', "STOP"},
      {'0', "POP"},
      {'1', "POP_MARK"},
      {'2', "DUP"},
      {'F', "FLOAT"},
      {'I', "INT"},
      {'J', "BININT"},
      {'K', "BININT1"},
      {'L', "LONG"},
      {'M', "BININT2"},
      {'N', "NONE"},
      {'P', "PERSID"},
      {'Q', "BINPERSID"},
      {'R', "REDUCE"},
      {'S', "STRING"},
      {'T', "BINSTRING"},
      {'U', "SHORT_BINSTRING"},
      {'V', "UNICODE"},
      {'X', "BINUNICODE"},
      {'a', "APPEND"},
      {'b', "BUILD"},
      {'c', "GLOBAL"},
      {'d', "DICT"},
      {'}', "EMPTY_DICT"},
      {'e', "APPENDS"},
      {'g', "GET"},
      {'h', "BINGET"},
      {'i', "INST"},
      {'j', "LONG_BINGET"},
      {'l', "LIST"},
      {']', "EMPTY_LIST"},
      {'o', "OBJ"},
      {'p', "PUT"},
      {'q', "BINPUT"},
      {'r', "LONG_BINPUT"},
      {'s', "SETITEM"},
      {'t', "TUPLE"},
      {')', "EMPTY_TUPLE"},
      {'u', "SETITEMS"},
      {'G', "BINFLOAT"},
      {'B', "BINBYTES"},
      {'C', "SHORT_BINBYTES"},
      {0x80, "PROTO"},
      {0x81, "NEWOBJ"},
      {0x82, "EXT1"},
      {0x83, "EXT2"},
      {0x84, "EXT4"},
      {0x85, "TUPLE1"},
      {0x86, "TUPLE2"},
      {0x87, "TUPLE3"},
      {0x88, "NEWTRUE"},
      {0x89, "NEWFALSE"},
      {0x8a, "LONG1"},
      {0x8b, "LONG4"},
      {0x8c, "SHORT_BINUNICODE"},
      {0x8d, "BINUNICODE8"},
      {0x8e, "BINBYTES8"},
      {0x8f, "EMPTY_SET"},
      {0x90, "ADDITEMS"},
      {0x91, "FROZENSET"},
      {0x92, "NEWOBJ_EX"},
      {0x93, "STACK_GLOBAL"},
      {0x94, "MEMOIZE"},
      {0x95, "FRAME"},
      {0x96, "BYTEARRAY8"},
      {0x97, "NEXT_BUFFER"},
      {0x98, "READONLY_BUFFER"},
  };
  for (const OpcodeEntry& entry : kOpcodes) {
    if (entry.op == op) return entry.name;
  }
  return nullptr;
}

std::string Hex(uint8_t b) {
  static const char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[b >> 4] + kDigits[b & 15];
}

// The storage types torch.save names, by dtype.
struct StorageTypeName {
  const char* name;
  CheckpointDtype dtype;
};
constexpr StorageTypeName kStorageTypes[] = {
    {"DoubleStorage", CheckpointDtype::kFloat64},
    {"FloatStorage", CheckpointDtype::kFloat32},
    {"HalfStorage", CheckpointDtype::kFloat16},
    {"BFloat16Storage", CheckpointDtype::kBFloat16},
    {"LongStorage", CheckpointDtype::kInt64},
    {"IntStorage", CheckpointDtype::kInt32},
    {"ShortStorage", CheckpointDtype::kInt16},
    {"CharStorage", CheckpointDtype::kInt8},
    {"ByteStorage", CheckpointDtype::kUInt8},
    {"BoolStorage", CheckpointDtype::kBool},
    {"ComplexFloatStorage", CheckpointDtype::kComplex64},
    {"ComplexDoubleStorage", CheckpointDtype::kComplex128},
};

constexpr size_t kMaxGlobalName = 256;

using Kind = PickleValue::Kind;
using ObjectKind = PickleObject::Kind;

class Machine {
 public:
  Machine(std::string_view pickle, const CheckpointLimits& limits) : p_(pickle), limits_(limits) {
    graph_.pickle = pickle;
  }

  StatusOr<PickleGraph> Run() {
    while (pos_ < p_.size()) {
      op_offset_ = pos_;
      op_ = static_cast<uint8_t>(p_[pos_++]);
      if (op_ == '.') return Stop();
      CAPSULE_RETURN_IF_ERROR(Step());
    }
    return Error("data.pkl ends without STOP");
  }

 private:
  // ---- errors ----
  Status Error(const std::string& what) const {
    return InvalidArgumentError("data.pkl offset " + std::to_string(op_offset_) + ": " + what);
  }
  Status Truncated() const {
    return Error(std::string("data.pkl ends inside ") + OpcodeName(op_) + "'s argument");
  }
  std::string Op() const { return OpcodeName(op_); }

  // ---- the pickle's bytes ----
  Status Take(size_t n, const char** out) {
    if (p_.size() - pos_ < n) return Truncated();
    *out = p_.data() + pos_;
    pos_ += n;
    return Status::Ok();
  }
  StatusOr<uint64_t> TakeLe(size_t n) {
    const char* b = nullptr;
    CAPSULE_RETURN_IF_ERROR(Take(n, &b));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    return v;
  }
  // A line of GLOBAL's argument, without its newline.
  StatusOr<std::string_view> TakeLine() {
    const size_t nl = p_.find('\n', pos_);
    if (nl == std::string_view::npos) return Truncated();
    if (nl - pos_ > kMaxGlobalName) return Error("a global name longer than 256 bytes");
    std::string_view line = p_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return line;
  }

  // ---- values ----
  Status Charge(uint64_t n) {
    values_ += n;
    if (values_ > limits_.max_values) {
      return ResourceExhaustedError("data.pkl builds more than " +
                                    std::to_string(limits_.max_values) + " values");
    }
    return Status::Ok();
  }
  StatusOr<uint32_t> NewObject(ObjectKind kind) {
    CAPSULE_RETURN_IF_ERROR(Charge(1));
    if (graph_.objects.size() >= std::numeric_limits<uint32_t>::max()) {
      return ResourceExhaustedError("data.pkl builds too many objects");
    }
    graph_.objects.emplace_back();
    graph_.objects.back().kind = kind;
    return static_cast<uint32_t>(graph_.objects.size() - 1);
  }
  static PickleValue ObjectValue(uint32_t index) {
    PickleValue v;
    v.kind = Kind::kObject;
    v.n = index;
    return v;
  }
  static PickleValue IntValue(int64_t i, Kind kind = Kind::kInt) {
    PickleValue v;
    v.kind = kind;
    v.i = i;
    return v;
  }
  PickleObject* ObjectOf(const PickleValue& v) {
    return v.kind == Kind::kObject ? &graph_.objects[v.n] : nullptr;
  }
  std::string What(const PickleValue& v) const { return DescribeValue(graph_, v); }

  // ---- the stack: a value may be popped only down to the innermost MARK ----
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  Status Push(const PickleValue& v) {
    if (stack_.size() >= limits_.max_stack) {
      return ResourceExhaustedError("data.pkl's stack grows past " +
                                    std::to_string(limits_.max_stack) + " values");
    }
    stack_.push_back(v);
    return Status::Ok();
  }
  Status PushObject(ObjectKind kind) {
    CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(kind));
    return Push(ObjectValue(index));
  }
  StatusOr<PickleValue> Pop() {
    if (stack_.size() <= Floor()) return Error(Op() + " with nothing on the stack to take");
    PickleValue v = stack_.back();
    stack_.pop_back();
    return v;
  }
  StatusOr<PickleValue*> Top() {
    if (stack_.size() <= Floor()) return Error(Op() + " with nothing on the stack to take");
    return &stack_.back();
  }
  // The values pushed since the innermost MARK, which is closed.
  StatusOr<std::vector<PickleValue>> PopMark() {
    if (marks_.empty()) return Error(Op() + " without a MARK");
    const size_t from = marks_.back();
    marks_.pop_back();
    std::vector<PickleValue> items(stack_.begin() + static_cast<std::ptrdiff_t>(from),
                                   stack_.end());
    stack_.resize(from);
    return items;
  }

  // ---- the opcodes ----
  Status Step() {
    if (std::optional<Status> s = StepScalar()) return *std::move(s);
    if (std::optional<Status> s = StepContainer()) return *std::move(s);
    if (std::optional<Status> s = StepMemoOrObject()) return *std::move(s);
    return UnknownOpcode();
  }

  // Framing, MARK and the scalar values; nullopt when op_ is not one of them.
  std::optional<Status> StepScalar() {
    switch (op_) {
      case 0x80: {  // PROTO
        CAPSULE_ASSIGN_OR_RETURN(uint64_t v, TakeLe(1));
        if (v > 5)
          return UnimplementedError("data.pkl is pickle protocol " + std::to_string(v) +
                                    ", newer than 5");
        return Status::Ok();
      }
      case 0x95: {  // FRAME: a length hint for buffered readers; the bytes follow inline
        CAPSULE_ASSIGN_OR_RETURN(uint64_t n, TakeLe(8));
        if (n > p_.size() - pos_) return Error("a FRAME longer than the rest of data.pkl");
        return Status::Ok();
      }
      case '(':  // MARK
        if (marks_.size() >= limits_.max_marks) {
          return ResourceExhaustedError("data.pkl nests deeper than " +
                                        std::to_string(limits_.max_marks) + " MARKs");
        }
        marks_.push_back(stack_.size());
        return Status::Ok();
      case 'N':
        return Push(PickleValue());
      case 0x88:  // NEWTRUE
      case 0x89:  // NEWFALSE
        return Push(IntValue(op_ == 0x88 ? 1 : 0, Kind::kBool));
      case 'J': {  // BININT: signed 32-bit
        CAPSULE_ASSIGN_OR_RETURN(uint64_t v, TakeLe(4));
        return Push(IntValue(static_cast<int32_t>(static_cast<uint32_t>(v))));
      }
      case 'K': {  // BININT1
        CAPSULE_ASSIGN_OR_RETURN(uint64_t v, TakeLe(1));
        return Push(IntValue(static_cast<int64_t>(v)));
      }
      case 'M': {  // BININT2
        CAPSULE_ASSIGN_OR_RETURN(uint64_t v, TakeLe(2));
        return Push(IntValue(static_cast<int64_t>(v)));
      }
      case 0x8a:    // LONG1
      case 0x8b: {  // LONG4
        CAPSULE_ASSIGN_OR_RETURN(uint64_t n, TakeLe(op_ == 0x8a ? 1 : 4));
        if (n > 8) return Error("an integer wider than 64 bits");
        CAPSULE_ASSIGN_OR_RETURN(uint64_t v, TakeLe(static_cast<size_t>(n)));
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign
        return Push(IntValue(static_cast<int64_t>(v)));
      }
      case 'G': {  // BINFLOAT: big-endian IEEE 754 double
        const char* b = nullptr;
        CAPSULE_RETURN_IF_ERROR(Take(8, &b));
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = bits << 8 | static_cast<uint8_t>(b[i]);
        PickleValue v;
        v.kind = Kind::kFloat;
        std::memcpy(&v.f, &bits, sizeof v.f);
        return Push(v);
      }
      case 'X':     // BINUNICODE
      case 0x8c:    // SHORT_BINUNICODE
      case 0x8d: {  // BINUNICODE8
        CAPSULE_ASSIGN_OR_RETURN(uint64_t n, TakeLe(op_ == 'X' ? 4 : op_ == 0x8c ? 1 : 8));
        if (n > p_.size() - pos_) return Truncated();
        const std::string_view s = p_.substr(pos_, static_cast<size_t>(n));
        if (!IsUtf8(s)) return Error("a string that is not UTF-8");
        PickleValue v;
        v.kind = Kind::kString;
        v.i = static_cast<int64_t>(pos_);
        v.n = static_cast<uint32_t>(n);  // n <= the pickle's size, itself < 4 GiB (limits)
        pos_ += static_cast<size_t>(n);
        return Push(v);
      }
      default:
        return std::nullopt;
    }
  }

  // Lists, tuples and dicts, built and filled; nullopt when op_ is not one of them.
  std::optional<Status> StepContainer() {
    switch (op_) {
      case ']':
        return PushObject(ObjectKind::kList);
      case ')':
        return PushObject(ObjectKind::kTuple);
      case '}':
        return PushObject(ObjectKind::kDict);
      case 'l':    // LIST
      case 't': {  // TUPLE
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> items, PopMark());
        return PushContainer(op_ == 'l' ? ObjectKind::kList : ObjectKind::kTuple, std::move(items));
      }
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        const size_t n = op_ - 0x84u;
        std::vector<PickleValue> items(n);
        for (size_t i = n; i-- > 0;) {
          CAPSULE_ASSIGN_OR_RETURN(items[i], Pop());
        }
        return PushContainer(ObjectKind::kTuple, std::move(items));
      }
      case 'd': {  // DICT
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> items, PopMark());
        CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(ObjectKind::kDict));
        CAPSULE_RETURN_IF_ERROR(SetItems(index, items));
        return Push(ObjectValue(index));
      }
      case 'a': {  // APPEND
        CAPSULE_ASSIGN_OR_RETURN(PickleValue v, Pop());
        CAPSULE_ASSIGN_OR_RETURN(PickleValue * target, Top());
        return Append(*target, {v});
      }
      case 'e': {  // APPENDS
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> items, PopMark());
        CAPSULE_ASSIGN_OR_RETURN(PickleValue * target, Top());
        return Append(*target, items);
      }
      case 's': {  // SETITEM
        CAPSULE_ASSIGN_OR_RETURN(PickleValue value, Pop());
        CAPSULE_ASSIGN_OR_RETURN(PickleValue key, Pop());
        CAPSULE_ASSIGN_OR_RETURN(PickleValue * target, Top());
        return SetItemsOn(*target, {key, value});
      }
      case 'u': {  // SETITEMS
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> items, PopMark());
        CAPSULE_ASSIGN_OR_RETURN(PickleValue * target, Top());
        return SetItemsOn(*target, items);
      }
      default:
        return std::nullopt;
    }
  }

  // The memo, globals and the objects they build; nullopt when op_ is not one of them.
  std::optional<Status> StepMemoOrObject() {
    switch (op_) {
      case 'q':    // BINPUT
      case 'r': {  // LONG_BINPUT
        CAPSULE_ASSIGN_OR_RETURN(uint64_t index, TakeLe(op_ == 'q' ? 1 : 4));
        return Put(index);
      }
      case 0x94:  // MEMOIZE
        return Put(memo_.size());
      case 'h':    // BINGET
      case 'j': {  // LONG_BINGET
        CAPSULE_ASSIGN_OR_RETURN(uint64_t index, TakeLe(op_ == 'h' ? 1 : 4));
        if (index >= memo_.size()) {
          return Error(Op() + " of memo entry " + std::to_string(index) + ", never put");
        }
        return Push(memo_[static_cast<size_t>(index)]);
      }
      case 'c': {  // GLOBAL module\nname\n
        CAPSULE_ASSIGN_OR_RETURN(std::string_view module, TakeLine());
        CAPSULE_ASSIGN_OR_RETURN(std::string_view name, TakeLine());
        return PushGlobal(module, name);
      }
      case 0x93: {  // STACK_GLOBAL
        CAPSULE_ASSIGN_OR_RETURN(PickleValue name, Pop());
        CAPSULE_ASSIGN_OR_RETURN(PickleValue module, Pop());
        if (module.kind != Kind::kString || name.kind != Kind::kString) {
          return Error("STACK_GLOBAL of something other than two strings");
        }
        if (module.n > kMaxGlobalName || name.n > kMaxGlobalName) {
          return Error("a global name longer than 256 bytes");
        }
        return PushGlobal(graph_.String(module), graph_.String(name));
      }
      case 'Q':
        return PersistentLoad();
      case 'R':
        return Reduce();
      case 0x81:
        return NewObj();
      case 'b':
        return Build();
      default:
        return std::nullopt;
    }
  }

  Status UnknownOpcode() const {
    const char* name = OpcodeName(op_);
    if (name == nullptr) return Error("byte " + Hex(op_) + " is not a pickle opcode");
    return Error(std::string("pickle opcode ") + name + " (" + Hex(op_) +
                 ") is not one a state dict is written with; this reader runs only those");
  }

  Status PushContainer(ObjectKind kind, std::vector<PickleValue> items) {
    CAPSULE_RETURN_IF_ERROR(Charge(items.size()));
    CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(kind));
    graph_.objects[index].items = std::move(items);
    return Push(ObjectValue(index));
  }

  Status Append(const PickleValue& target, const std::vector<PickleValue>& items) {
    PickleObject* list = ObjectOf(target);
    if (list == nullptr || list->kind != ObjectKind::kList) {
      return Error(Op() + " to " + What(target) + ", not a list");
    }
    CAPSULE_RETURN_IF_ERROR(Charge(items.size()));
    list->items.insert(list->items.end(), items.begin(), items.end());
    return Status::Ok();
  }

  Status SetItemsOn(const PickleValue& target, const std::vector<PickleValue>& items) {
    PickleObject* dict = ObjectOf(target);
    if (dict == nullptr || dict->kind != ObjectKind::kDict) {
      return Error(Op() + " on " + What(target) + ", not a dict");
    }
    return SetItems(target.n, items);
  }
  Status SetItems(uint32_t dict, const std::vector<PickleValue>& items) {
    if (items.size() % 2 != 0) return Error(Op() + " with a key but no value");
    CAPSULE_RETURN_IF_ERROR(Charge(items.size()));
    auto& entries = graph_.objects[dict].entries;
    for (size_t i = 0; i < items.size(); i += 2) entries.emplace_back(items[i], items[i + 1]);
    return Status::Ok();
  }

  Status Put(uint64_t index) {
    CAPSULE_ASSIGN_OR_RETURN(PickleValue * top, Top());
    // The picklers number memo entries 0, 1, 2, ... in order; a pickle that skips ahead would
    // make the memo as large as the number it names.
    if (index > memo_.size()) {
      return Error(Op() + " to memo entry " + std::to_string(index) + ", past the next one (" +
                   std::to_string(memo_.size()) + ")");
    }
    if (index == memo_.size()) {
      CAPSULE_RETURN_IF_ERROR(Charge(1));
      memo_.push_back(*top);
    } else {
      memo_[static_cast<size_t>(index)] = *top;
    }
    return Status::Ok();
  }

  Status PushGlobal(std::string_view module, std::string_view name) {
    PickleCallable callable;
    CheckpointDtype dtype = CheckpointDtype::kFloat32;
    if (module == "collections" && name == "OrderedDict") {
      callable = PickleCallable::kOrderedDict;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      callable = PickleCallable::kRebuildTensor;
    } else if (module == "torch._utils" && name == "_rebuild_parameter") {
      callable = PickleCallable::kRebuildParameter;
    } else if (module == "torch._utils" && name == "_rebuild_parameter_with_state") {
      callable = PickleCallable::kRebuildParameterWithState;
    } else if (module == "torch.jit._pickle" && name == "restore_type_tag") {
      callable = PickleCallable::kRestoreTypeTag;
    } else if (module == "torch.jit._pickle" &&
               (name == "build_intlist" || name == "build_doublelist" || name == "build_boollist" ||
                name == "build_tensorlist")) {
      callable = PickleCallable::kBuildList;
    } else if (module == "__torch__" || module.rfind("__torch__.", 0) == 0) {
      callable = PickleCallable::kTorchClass;
    } else {
      bool found = false;
      if (module == "torch") {
        for (const StorageTypeName& s : kStorageTypes) {
          if (name == s.name) {
            found = true;
            dtype = s.dtype;
          }
        }
      }
      if (!found) {
        return Error("the pickle names " +
                     Printable(std::string(module) + "." + std::string(name)) +
                     ", which this reader does not call: it reads only tensors, dicts and "
                     "TorchScript module attributes");
      }
      callable = PickleCallable::kStorageType;
    }
    CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(ObjectKind::kCallable));
    PickleObject& o = graph_.objects[index];
    o.callable = callable;
    o.dtype = dtype;
    o.module = module;
    o.name = name;
    return Push(ObjectValue(index));
  }

  // BINPERSID: ('storage', torch.<Dtype>Storage, key, location, numel), torch.save's reference
  // to archive/data/<key>. One storage object per key: tensors that name it share it.
  Status PersistentLoad() {
    CAPSULE_ASSIGN_OR_RETURN(PickleValue pid, Pop());
    const PickleObject* t = ObjectOf(pid);
    const auto is_string = [&](size_t i, std::string_view want = {}) {
      return t->items[i].kind == Kind::kString &&
             (want.empty() || graph_.String(t->items[i]) == want);
    };
    if (t == nullptr || t->kind != ObjectKind::kTuple || t->items.size() != 5 ||
        !is_string(0, "storage") || !is_string(2) || !is_string(3) ||
        t->items[4].kind != Kind::kInt) {
      return Error("a persistent id other than ('storage', type, key, location, numel): " +
                   What(pid));
    }
    const PickleObject* type = ObjectOf(t->items[1]);
    if (type == nullptr || type->kind != ObjectKind::kCallable ||
        type->callable != PickleCallable::kStorageType) {
      return Error("a storage whose type is " + What(t->items[1]));
    }
    const std::string_view key = graph_.String(t->items[2]);
    const int64_t numel = t->items[4].i;
    if (numel < 0)
      return Error("storage '" + PrintableShort(key) + "' of " + std::to_string(numel) +
                   " elements");
    const CheckpointDtype dtype = type->dtype;
    auto it = storage_objects_.find(key);
    if (it != storage_objects_.end()) {
      const PickleStorage& s = graph_.storages[graph_.objects[it->second].index];
      if (s.dtype != dtype || s.numel != static_cast<uint64_t>(numel)) {
        return Error("storage '" + PrintableShort(key) + "' named twice, as " +
                     std::to_string(s.numel) + " " + CheckpointDtypeName(s.dtype) + " and " +
                     std::to_string(numel) + " " + CheckpointDtypeName(dtype));
      }
      return Push(ObjectValue(it->second));
    }
    CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(ObjectKind::kStorage));
    graph_.objects[index].index = static_cast<uint32_t>(graph_.storages.size());
    graph_.storages.push_back({key, dtype, static_cast<uint64_t>(numel)});
    storage_objects_.emplace(key, index);
    return Push(ObjectValue(index));
  }

  // The arguments of a call, which must be a tuple of `min`..`max` values.
  StatusOr<std::vector<PickleValue>> Args(const PickleValue& args, const PickleObject& callee,
                                          size_t min, size_t max) {
    const PickleObject* t = ObjectOf(args);
    if (t == nullptr || t->kind != ObjectKind::kTuple || t->items.size() < min ||
        t->items.size() > max) {
      return Error(Describe(callee) + " called with " + What(args));
    }
    return t->items;
  }
  static std::string Describe(const PickleObject& callable) {
    return Printable(std::string(callable.module) + "." + std::string(callable.name));
  }
  bool IsEmptyDict(const PickleValue& v) {
    const PickleObject* o = ObjectOf(v);
    return o != nullptr && o->kind == ObjectKind::kDict && o->entries.empty();
  }
  StatusOr<std::vector<int64_t>> Ints(const PickleValue& v, const char* what) {
    const PickleObject* o = ObjectOf(v);
    if (o == nullptr || (o->kind != ObjectKind::kTuple && o->kind != ObjectKind::kList)) {
      return Error(std::string("a tensor whose ") + what + " is " + What(v));
    }
    std::vector<int64_t> out;
    out.reserve(o->items.size());
    for (const PickleValue& x : o->items) {
      if (x.kind != Kind::kInt)
        return Error(std::string("a tensor whose ") + what + " holds " + What(x));
      out.push_back(x.i);
    }
    return out;
  }

  Status Reduce() {
    CAPSULE_ASSIGN_OR_RETURN(PickleValue args, Pop());
    CAPSULE_ASSIGN_OR_RETURN(PickleValue callable_value, Pop());
    const PickleObject* callable = ObjectOf(callable_value);
    if (callable == nullptr || callable->kind != ObjectKind::kCallable) {
      return Error("REDUCE calls " + What(callable_value));
    }
    const PickleObject callee = *callable;  // objects_ may grow below
    switch (callee.callable) {
      case PickleCallable::kOrderedDict: {
        CAPSULE_RETURN_IF_ERROR(Args(args, callee, 0, 0).status());
        CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(ObjectKind::kDict));
        graph_.objects[index].ordered = true;
        return Push(ObjectValue(index));
      }
      case PickleCallable::kRebuildTensor: {
        // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> a, Args(args, callee, 6, 7));
        const PickleObject* storage = ObjectOf(a[0]);
        if (storage == nullptr || storage->kind != ObjectKind::kStorage) {
          return Error("a tensor whose storage is " + What(a[0]));
        }
        if (a[1].kind != Kind::kInt) return Error("a tensor whose offset is " + What(a[1]));
        PickleTensor tensor;
        tensor.storage = storage->index;
        tensor.storage_offset = a[1].i;
        CAPSULE_ASSIGN_OR_RETURN(tensor.sizes, Ints(a[2], "size"));
        CAPSULE_ASSIGN_OR_RETURN(tensor.strides, Ints(a[3], "stride"));
        if (a[4].kind != Kind::kBool) return Error("requires_grad is " + What(a[4]));
        tensor.requires_grad = a[4].i != 0;
        if (!IsEmptyDict(a[5])) return Error("a tensor with backward hooks: " + What(a[5]));
        if (a.size() == 7 && a[6].kind != Kind::kNone &&
            (ObjectOf(a[6]) == nullptr || ObjectOf(a[6])->kind != ObjectKind::kDict)) {
          return Error("a tensor whose metadata is " + What(a[6]));
        }
        return PushTensor(std::move(tensor));
      }
      case PickleCallable::kRebuildParameter:
      case PickleCallable::kRebuildParameterWithState: {
        // (data, requires_grad, backward_hooks[, state])
        const size_t n = callee.callable == PickleCallable::kRebuildParameter ? 3 : 4;
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> a, Args(args, callee, n, n));
        const PickleObject* data = ObjectOf(a[0]);
        if (data == nullptr || data->kind != ObjectKind::kTensor) {
          return Error("a Parameter whose data is " + What(a[0]));
        }
        if (a[1].kind != Kind::kBool) return Error("requires_grad is " + What(a[1]));
        if (!IsEmptyDict(a[2])) return Error("a Parameter with backward hooks: " + What(a[2]));
        if (n == 4 && a[3].kind != Kind::kNone &&
            (ObjectOf(a[3]) == nullptr || ObjectOf(a[3])->kind != ObjectKind::kDict)) {
          return Error("a Parameter whose state is " + What(a[3]));
        }
        PickleTensor tensor = graph_.tensors[data->index];
        tensor.requires_grad = a[1].i != 0;
        return PushTensor(std::move(tensor));
      }
      case PickleCallable::kRestoreTypeTag: {
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> a, Args(args, callee, 2, 2));
        if (a[1].kind != Kind::kString) return Error("a type tag that is " + What(a[1]));
        return Push(a[0]);
      }
      case PickleCallable::kBuildList: {
        CAPSULE_ASSIGN_OR_RETURN(std::vector<PickleValue> a, Args(args, callee, 1, 1));
        const PickleObject* list = ObjectOf(a[0]);
        if (list == nullptr || list->kind != ObjectKind::kList) {
          return Error(Describe(callee) + " of " + What(a[0]));
        }
        return Push(a[0]);
      }
      case PickleCallable::kStorageType:
      case PickleCallable::kTorchClass:
        break;
    }
    return Error("REDUCE calls " + Describe(callee) +
                 ", which is not a constructor this reader "
                 "runs");
  }

  Status PushTensor(PickleTensor tensor) {
    CAPSULE_RETURN_IF_ERROR(Charge(tensor.sizes.size() + tensor.strides.size()));
    CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(ObjectKind::kTensor));
    graph_.objects[index].index = static_cast<uint32_t>(graph_.tensors.size());
    graph_.tensors.push_back(std::move(tensor));
    return Push(ObjectValue(index));
  }

  // NEWOBJ cls () of a TorchScript class: an object whose state a BUILD gives.
  Status NewObj() {
    CAPSULE_ASSIGN_OR_RETURN(PickleValue args, Pop());
    CAPSULE_ASSIGN_OR_RETURN(PickleValue cls_value, Pop());
    const PickleObject* cls = ObjectOf(cls_value);
    if (cls == nullptr || cls->kind != ObjectKind::kCallable ||
        cls->callable != PickleCallable::kTorchClass) {
      return Error("NEWOBJ of " + What(cls_value) +
                   "; only TorchScript (__torch__) classes are "
                   "read");
    }
    const PickleObject callee = *cls;
    CAPSULE_RETURN_IF_ERROR(Args(args, callee, 0, 0).status());
    CAPSULE_ASSIGN_OR_RETURN(uint32_t index, NewObject(ObjectKind::kInstance));
    graph_.objects[index].module = callee.module;
    graph_.objects[index].name = callee.name;
    return Push(ObjectValue(index));
  }

  // BUILD: a TorchScript object's attributes (a dict), or an OrderedDict's own attributes
  // (state_dict()'s _metadata), which a state dict does not need.
  Status Build() {
    CAPSULE_ASSIGN_OR_RETURN(PickleValue state, Pop());
    CAPSULE_ASSIGN_OR_RETURN(PickleValue * target_value, Top());
    PickleObject* target = ObjectOf(*target_value);
    const PickleObject* state_object = ObjectOf(state);
    const bool state_is_dict = state_object != nullptr && state_object->kind == ObjectKind::kDict;
    if (target != nullptr && !target->built && target->kind == ObjectKind::kInstance) {
      if (!state_is_dict) {
        return Error("a " + Describe(*target) + " object whose state is " + What(state) +
                     ": it restores itself with its own code (__setstate__), which this reader "
                     "does not run; save its state dict instead, torch.save(model.state_dict(), "
                     "path)");
      }
      target->built = true;
      target->index = state.n;
      return Status::Ok();
    }
    if (target != nullptr && !target->built && target->kind == ObjectKind::kDict &&
        target->ordered && (state_is_dict || state.kind == Kind::kNone)) {
      target->built = true;
      return Status::Ok();
    }
    return Error("BUILD of " + What(*target_value) + " with " + What(state));
  }

  StatusOr<PickleGraph> Stop() {
    if (!marks_.empty()) return Error("STOP inside a MARK");
    if (stack_.size() != 1) {
      return Error("STOP with " + std::to_string(stack_.size()) + " values on the stack, not 1");
    }
    graph_.root = stack_.back();
    return std::move(graph_);
  }

  const std::string_view p_;
  const CheckpointLimits& limits_;
  size_t pos_ = 0;
  size_t op_offset_ = 0;
  uint8_t op_ = 0;
  uint64_t values_ = 0;
  std::vector<PickleValue> stack_;
  std::vector<size_t> marks_;
  std::vector<PickleValue> memo_;
  std::unordered_map<std::string_view, uint32_t> storage_objects_;  // key -> its object
  PickleGraph graph_;
};

}  // namespace

StatusOr<PickleGraph> RunPickle(std::string_view pickle, const CheckpointLimits& limits) {
  if (pickle.size() > limits.max_pickle_bytes ||
      pickle.size() >= std::numeric_limits<uint32_t>::max()) {
    return ResourceExhaustedError("data.pkl is " + std::to_string(pickle.size()) +
                                  " bytes, over the limit of " +
                                  std::to_string(limits.max_pickle_bytes));
  }
  return Machine(pickle, limits).Run();
}

std::string DescribeValue(const PickleGraph& graph, const PickleValue& value) {
  switch (value.kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return value.i ? "True" : "False";
    case Kind::kInt:
      return "an int";
    case Kind::kFloat:
      return "a float";
    case Kind::kString:
      return "a string";
    case Kind::kObject:
      break;
  }
  const PickleObject& o = graph.objects[value.n];
  switch (o.kind) {
    case ObjectKind::kList:
      return "a list";
    case ObjectKind::kTuple:
      return "a tuple of " + std::to_string(o.items.size());
    case ObjectKind::kDict:
      return o.ordered ? "an OrderedDict" : "a dict";
    case ObjectKind::kCallable:
      return Printable(std::string(o.module) + "." + std::string(o.name));
    case ObjectKind::kStorage:
      return "a storage";
    case ObjectKind::kTensor:
      return "a tensor";
    case ObjectKind::kInstance:
      return "a " + Printable(std::string(o.module) + "." + std::string(o.name)) + " object";
  }
  return "a value";
}

}  // namespace capsule::internal
