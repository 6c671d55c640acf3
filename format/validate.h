// ValidateCapsule: the "must" rules of proto/capsule.proto, checked after parsing.
//
// Protobuf accepts any well-formed message; these rules make sure a capsule can be replayed and
// reported without each consumer re-checking: the trigger is set, hashes are well-formed, tensor
// blobs are exactly numel × element-size bytes, RNG blobs are tagged, names are unique, counts are
// within numel. The error names the field: "tensors[3] (blocks.2.attn.qkv.weight): data is 96
// bytes, expected 128 for float32[4,8]".
//
//   CAPSULE_RETURN_IF_ERROR(capsule::ValidateCapsule(msg));
//
// Thread safety: thread-safe.
#ifndef CAPSULE_FORMAT_VALIDATE_H_
#define CAPSULE_FORMAT_VALIDATE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"

namespace capsule {

// The bytes of Capsule.tensors(i).data, held outside the message (a live tensor's storage): one
// entry per TensorBlob, a non-empty entry standing for that blob's data field, which must then be
// empty. What a writer checks and writes is the message with each such field filled in.
using TensorDataViews = std::vector<std::string_view>;

struct ValidateOptions {
  // Recompute each TensorBlob's SHA-256 (costs one hash pass over all embedded tensor bytes).
  bool verify_tensor_digests = true;
  // Not owned; see TensorDataViews. Null: every tensor's bytes are in the message.
  const TensorDataViews* tensor_data = nullptr;
};

// Bounds on what a capsule's content may ask of its readers (FORMAT.md §6.2). Each is far above
// what a real run records; together they keep replay and triage within what the reading machine
// can do, whatever the capsule claims.
// environment.intra_op_threads, environment.inter_op_threads, numerics.intra_op_threads.
inline constexpr int kMaxThreads = 1024;
// placement.world_size (and so every rank a capsule names).
inline constexpr int kMaxWorldSize = 1 << 20;
// model.config_json: its bytes, and how deeply its objects and arrays nest.
inline constexpr size_t kMaxModelConfigBytes = size_t{64} << 10;
inline constexpr int kMaxModelConfigDepth = 32;

// kInvalidArgument naming the first rule broken.
Status ValidateCapsule(const v1::Capsule& capsule, const ValidateOptions& options = {});

// kInvalidArgument unless `views` is null or holds one entry per tensor, none of them standing for
// a tensor whose data is also in the message. ValidateCapsule and the writer both check it.
Status CheckTensorDataViews(const v1::Capsule& capsule, const TensorDataViews* views);

// For a writer given text from outside (log lines, names, paths): replaces each string field, at
// any depth, that is not valid UTF-8 with EscapeInvalidUtf8 of it (base/internal/printable.h), so
// that the capsule stays valid, and returns one note per field changed ("log.lines[3]: not valid
// UTF-8; 2 bytes stored as \xNN escapes"). Raw sample bytes have a lossless home of their own
// (Sequence.raw_bytes); use it before calling this.
std::vector<std::string> MakeStringsUtf8(v1::Capsule* capsule);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_VALIDATE_H_
