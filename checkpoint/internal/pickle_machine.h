// A pickle interpreter for data only: it runs the opcodes a state dict or a TorchScript module's
// attributes are written with (protocol 2 to 4) and builds the values they describe as a graph of
// plain objects, without importing or calling anything. The globals a pickle may name are a fixed
// list (PickleCallable), and each is "called" by code here that builds data: OrderedDict() an
// empty dict, _rebuild_tensor_v2 a tensor descriptor, a __torch__ class an attribute holder. Any
// other opcode or global is refused, naming it.
//
// Objects live in one array and refer to each other by index, so nothing recurses over the
// graph: a pickle nested a million deep is a long array, not a deep stack, and cycles cost
// nothing. Counts are bounded by CheckpointLimits (stack, MARK depth, values built).
//
//   CAPSULE_ASSIGN_OR_RETURN(PickleGraph g, RunPickle(data_pkl, limits));
//   const PickleObject& root = g.objects[g.root.object];
//
// Thread safety: thread-safe (pure function).
#ifndef CAPSULE_CHECKPOINT_INTERNAL_PICKLE_MACHINE_H_
#define CAPSULE_CHECKPOINT_INTERNAL_PICKLE_MACHINE_H_

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/checkpoint/checkpoint_index.h"

namespace capsule::internal {

// A value: an immediate, a string (a range of the pickle's bytes) or an object of the graph.
struct PickleValue {
  enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kString, kObject };
  Kind kind = Kind::kNone;
  int64_t i = 0;   // kBool (0 or 1), kInt; kString: offset in the pickle
  double f = 0;    // kFloat
  uint32_t n = 0;  // kString: length; kObject: index into PickleGraph::objects
};

// The globals a pickle may name.
enum class PickleCallable : uint8_t {
  kOrderedDict,                // collections.OrderedDict
  kRebuildTensor,              // torch._utils._rebuild_tensor_v2
  kRebuildParameter,           // torch._utils._rebuild_parameter
  kRebuildParameterWithState,  // torch._utils._rebuild_parameter_with_state
  kStorageType,                // torch.FloatStorage, ... (only inside a persistent id)
  kRestoreTypeTag,             // torch.jit._pickle.restore_type_tag(value, type): value
  kBuildList,                  // torch.jit._pickle.build_intlist(list) and friends: list
  kTorchClass,                 // __torch__.*: a TorchScript class, instantiated by NEWOBJ
};

struct PickleObject {
  enum class Kind : uint8_t { kList, kTuple, kDict, kCallable, kStorage, kTensor, kInstance };
  Kind kind = Kind::kList;
  bool ordered = false;                                    // kDict made by collections.OrderedDict
  bool built = false;                                      // BUILD was applied
  PickleCallable callable = PickleCallable::kOrderedDict;  // kCallable
  CheckpointDtype dtype = CheckpointDtype::kFloat32;       // kCallable kStorageType
  uint32_t index = 0;       // kStorage: into storages; kTensor: into tensors; kInstance: its state
                            // dict's object (once built)
  std::string_view module;  // kCallable, kInstance: the global's module ...
  std::string_view name;    // ... and name
  std::vector<PickleValue> items;                            // kList, kTuple
  std::vector<std::pair<PickleValue, PickleValue>> entries;  // kDict
};

// A storage a persistent id named: ('storage', torch.<Dtype>Storage, key, location, numel).
struct PickleStorage {
  std::string_view key;
  CheckpointDtype dtype = CheckpointDtype::kFloat32;
  uint64_t numel = 0;
};

// A tensor _rebuild_tensor_v2 described; not yet checked against its storage.
struct PickleTensor {
  uint32_t storage = 0;  // into PickleGraph::storages
  int64_t storage_offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool requires_grad = false;
};

struct PickleGraph {
  std::string_view pickle;  // the bytes run; string values point into them
  std::vector<PickleObject> objects;
  std::vector<PickleStorage> storages;  // one per distinct key
  std::vector<PickleTensor> tensors;
  PickleValue root;  // what STOP returned

  std::string_view String(const PickleValue& v) const {
    return pickle.substr(static_cast<size_t>(v.i), v.n);
  }
  const PickleObject* Object(const PickleValue& v) const {
    return v.kind == PickleValue::Kind::kObject ? &objects[v.n] : nullptr;
  }
};

// Runs `pickle` (which must outlive the graph). kInvalidArgument naming the opcode or global for
// anything outside the subset, and for a malformed pickle (offset given); kResourceExhausted over
// a limit; kUnimplemented for a protocol above 5.
StatusOr<PickleGraph> RunPickle(std::string_view pickle, const CheckpointLimits& limits);

// "a dict", "an int", "a __torch__.Foo object", ...: what a value is, for messages.
std::string DescribeValue(const PickleGraph& graph, const PickleValue& value);

}  // namespace capsule::internal

#endif  // CAPSULE_CHECKPOINT_INTERNAL_PICKLE_MACHINE_H_
