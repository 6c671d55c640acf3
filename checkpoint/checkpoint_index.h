// The index of a PyTorch checkpoint: the tensors a state dict file holds (name, dtype, sizes,
// strides, storage offset) and where each storage's bytes lie in the file, read without running
// anything the file says. torch.save writes a zip archive whose data.pkl is a Python pickle, and a
// pickle is a program: torch.load (and LibTorch's TorchScript loader) import what it names and
// call it, and a TorchScript archive's own __setstate__ runs on load. This reader interprets only
// the pickle opcodes a state dict is made of and calls only a fixed list of constructors
// (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and _rebuild_parameter, torch.*Storage
// types, torch.jit._pickle's type tags), and reads a TorchScript module archive (torch.jit.save,
// torch::serialize::OutputArchive) as the attributes its data.pkl stores, never its code. Every
// count, size, offset and stride is checked against the bytes there are before anything is
// allocated for it. Pure over bytes and torch-free; snapshot/checkpoint.h turns an index into
// tensors. The subset read is documented in proto/FORMAT.md ("Checkpoints").
//
//   CAPSULE_ASSIGN_OR_RETURN(capsule::CheckpointIndex index,
//                            capsule::ReadCheckpointIndex(capsule::MemorySource(bytes)));
//   for (const capsule::CheckpointTensor& t : index.tensors) { ... index.storages[t.storage] ... }
//
// Thread safety: thread-safe (no shared state); a CheckpointSource's `read` must be callable from
// the thread that reads the index.
#ifndef CAPSULE_CHECKPOINT_CHECKPOINT_INDEX_H_
#define CAPSULE_CHECKPOINT_CHECKPOINT_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"

namespace capsule {

// The element types of torch's typed storages (torch.FloatStorage, ...).
enum class CheckpointDtype : uint8_t {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kComplex64,
  kComplex128,
};

// Bytes per element.
int CheckpointDtypeSize(CheckpointDtype dtype);
// LibTorch's name of the scalar type, as c10::toString spells it: "Float", "BFloat16", ...
const char* CheckpointDtypeName(CheckpointDtype dtype);

// One storage record, archive/data/<key>: exactly numel * element size bytes at `offset`.
struct CheckpointStorage {
  std::string key;
  CheckpointDtype dtype = CheckpointDtype::kFloat32;
  uint64_t numel = 0;
  uint64_t offset = 0;  // of its first byte in the file
  uint64_t bytes = 0;
};

// One named tensor: a view of a storage. Checked: every element it addresses lies inside the
// storage, and it has no more elements than the storage (an expanded view would otherwise make
// a copy larger than the file).
struct CheckpointTensor {
  std::string name;    // the state dict key; a module archive's nested attributes are dotted
  size_t storage = 0;  // index into CheckpointIndex::storages
  uint64_t storage_offset = 0;  // in elements
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // in elements, each >= 0
  bool requires_grad = false;    // a torch.nn.Parameter saved with requires_grad
};

struct CheckpointIndex {
  // "torch_pickle": a dict of tensors (torch.save of a state dict, torch::pickle_save of a
  // c10::Dict); "torch_archive": a TorchScript module archive read as data.
  std::string format;
  std::vector<CheckpointStorage> storages;  // those the tensors use, in the order first named
  std::vector<CheckpointTensor> tensors;    // in the file's order, names unique
};

// What the reader holds a file to. A file over a limit is refused with kResourceExhausted before
// the part that is over it is read or allocated.
struct CheckpointLimits {
  uint64_t max_file_bytes = uint64_t{1} << 40;     // 1 TiB
  uint64_t max_pickle_bytes = uint64_t{64} << 20;  // data.pkl
  uint64_t max_zip_entries = uint64_t{1} << 20;
  // Values the pickle may build: every object and every container slot counts one (about 64
  // bytes each). A state dict costs about 20 per tensor; the default allows ~200k tensors.
  uint64_t max_values = uint64_t{1} << 22;
  size_t max_stack = size_t{1} << 20;  // pickle stack entries
  size_t max_marks = 1000;             // MARKs open at once: the pickle's nesting depth
  int max_module_depth = 64;           // nested modules of a module archive
};

// Random access to a checkpoint's bytes: `read` puts exactly `n` bytes from `offset` into `out`;
// the reader only asks for ranges inside [0, size).
struct CheckpointSource {
  uint64_t size = 0;
  std::function<Status(uint64_t offset, size_t n, char* out)> read;
};

// `bytes` as a source; they must outlive it.
CheckpointSource MemorySource(std::string_view bytes);

// Reads the zip directory, the version and byte-order records and data.pkl; the storages'
// bytes are located, not read. Errors (messages say what is wrong and what to save instead):
//   kInvalidArgument     not a torch.save zip archive (a legacy pre-1.6 file is named as such), or
//                        a pickle that does anything but build a dict of tensors or a module's
//                        attributes: the opcode or the global it names; a tensor that does not
//                        fit its storage; a storage whose record is missing or of another size
//   kDataLoss            a zip directory that contradicts itself or the file's size
//   kUnimplemented       a newer archive version, a big-endian archive, compressed records
//   kResourceExhausted   over a limit of `limits`
// and any error of `source.read`.
StatusOr<CheckpointIndex> ReadCheckpointIndex(const CheckpointSource& source,
                                              const CheckpointLimits& limits = CheckpointLimits());

}  // namespace capsule

#endif  // CAPSULE_CHECKPOINT_CHECKPOINT_INDEX_H_
