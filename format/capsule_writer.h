// Writing capsules: EncodeCapsule (a pure function from message to bytes) and WriteCapsuleFile
// (the same bytes, encoded straight into an atomic, fsynced write).
//
// Encoding serializes the message deterministically (tensor bytes may stay outside it, in
// WriteOptions::tensor_data), compresses it into one zstd frame with content
// size and checksum, and seals it in the envelope with the digest and, when a key is given, an
// Ed25519 signature (proto/FORMAT.md). The same message and options always give the same bytes.
//
//   capsule::WriteOptions options;
//   options.signing_key = &private_key;
//   CAPSULE_RETURN_IF_ERROR(capsule::WriteCapsuleFile(dir + "/" + name, capsule_msg, options));
//
// Thread safety: thread-safe; the message must not be mutated while it is encoded.
#ifndef CAPSULE_FORMAT_CAPSULE_WRITER_H_
#define CAPSULE_FORMAT_CAPSULE_WRITER_H_

#include <cstdint>
#include <string>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/format/signing.h"
#include "capsule/format/validate.h"

namespace capsule {

inline constexpr int kDefaultCompressionLevel = -1;

struct WriteOptions {
  // Signs with this key (not owned) when set; writes an unsigned capsule otherwise.
  const PrivateKey* signing_key = nullptr;
  // zstd level. The default, -1 (zstd's first "fast" level), matches repeated byte runs but
  // leaves literals unencoded: float tensor data gains only ~8% from entropy coding at level 3,
  // which costs ~10x in compression and ~15x in decompression speed. Use 3..19 for archives.
  int compression_level = kDefaultCompressionLevel;
  // zstd worker threads; 0 compresses in the calling thread. Output bytes depend on whether this
  // is 0 or not, never on how many workers there are.
  int compression_workers = 0;
  // FORMAT.md optional flags (kOptionalFlag*).
  uint32_t optional_flags = 0;
  // Refuse to encode a message that fails ValidateCapsule (kInvalidArgument).
  bool validate = true;
  // With `validate`, also recompute each embedded tensor's SHA-256 and refuse one that does not
  // match its data: catches a writer that hashed the wrong bytes, at the cost of one more hash
  // pass over all tensor bytes (as long as the payload's own digest). A caller that has just
  // hashed the very bytes it embeds may turn it off.
  bool verify_tensor_digests = true;
  // WriteCapsuleFile only: replace an existing regular file at PATH. Off by default, so a capsule
  // is never lost to a later one of the same name (kAlreadyExists instead); a target that is not
  // a regular file is refused either way (base/internal/file_util.h).
  bool overwrite = false;
  // Tensor bytes held outside the message (validate.h, TensorDataViews): each non-empty entry is
  // written as that TensorBlob's data, straight from where it lies, so a capture of a model's
  // weights never holds them twice. The capsule is byte for byte the one the message with those
  // fields filled in makes. Not owned; the bytes must not change until the call returns.
  const TensorDataViews* tensor_data = nullptr;
};

StatusOr<std::string> EncodeCapsule(const v1::Capsule& capsule, const WriteOptions& options);

// Encodes into a temporary file next to PATH as it goes (the bytes EncodeCapsule makes, never
// held whole in memory), fsyncs it, moves it to PATH and fsyncs the directory
// (WriteFileAtomicWith): a crash never leaves a partial capsule under PATH. A capsule that fails
// validation is refused before any file is made.
Status WriteCapsuleFile(const std::string& path, const v1::Capsule& capsule,
                        const WriteOptions& options);

// "<run>-step<N>-rank<R>-<trigger>.capsule", with characters outside [A-Za-z0-9._-] in the run
// name replaced by '_'. The trigger is spelled in lowercase with dashes ("non-finite-loss").
std::string CapsuleFileName(const std::string& run, int64_t step, int rank,
                            const std::string& trigger_kind_name);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_CAPSULE_WRITER_H_
