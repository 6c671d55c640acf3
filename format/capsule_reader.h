// Reading capsules: DecodeCapsule (a pure function over bytes) and ReadCapsuleFile.
//
// Reading is fail-closed and runs the cheapest check first (proto/FORMAT.md, "Reading"): size,
// magic, version and required flags, declared sizes, end magic, digest, signature — all before
// any decompression or parsing — then the uncompressed-size cap, zstd decompression with its
// checksum, protobuf parsing and ValidateCapsule(). Each rejection has its own code and a message
// that says what to do:
//   kNotFound           no such file
//   kOutOfRange         truncated
//   kInvalidArgument    not a capsule (bad magic), or content that breaks a schema rule
//   kUnimplemented      newer major version, unknown required flag or signature algorithm
//   kDataLoss           corrupt (digest, trailer, zstd checksum, protobuf)
//   kUnauthenticated    unsigned (unless allowed), untrusted key (unless allowed), bad signature
//   kResourceExhausted  over the size limits
//
//   capsule::ReadOptions options;
//   options.trusted_keys.push_back(pub);
//   CAPSULE_ASSIGN_OR_RETURN(capsule::DecodedCapsule d, capsule::ReadCapsuleFile(path, options));
//   const capsule::v1::Capsule& c = *d.capsule;   // include "capsule/proto/capsule.pb.h"
//
// Thread safety: thread-safe.
#ifndef CAPSULE_FORMAT_CAPSULE_READER_H_
#define CAPSULE_FORMAT_CAPSULE_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/format/envelope.h"

namespace capsule {

struct ReadOptions {
  std::vector<PublicKey> trusted_keys;  // signatures by these keys are accepted
  bool allow_unsigned = false;          // accept unsigned capsules (digest still checked)
  bool allow_untrusted = false;         // accept signers outside trusted_keys, unchecked
  // Decompression bomb guard: refuse before allocating when the payload declares more.
  uint64_t max_uncompressed_bytes = uint64_t{1} << 30;
  // ReadCapsuleFile refuses larger files before reading them.
  uint64_t max_file_bytes = uint64_t{1} << 30;
  // Run ValidateCapsule() on the parsed message.
  bool validate = true;
  // Also recompute every embedded tensor's SHA-256 during validation. Off by default: the envelope
  // digest already covers those bytes; this catches a writer that hashed the wrong data.
  bool verify_tensor_digests = false;
};

struct DecodedCapsule {
  DecodedCapsule();
  ~DecodedCapsule();
  DecodedCapsule(DecodedCapsule&&) noexcept;
  DecodedCapsule& operator=(DecodedCapsule&&) noexcept;

  EnvelopeInfo envelope;
  std::unique_ptr<v1::Capsule> capsule;
};

StatusOr<DecodedCapsule> DecodeCapsule(std::string_view bytes, const ReadOptions& options);
StatusOr<DecodedCapsule> ReadCapsuleFile(const std::string& path, const ReadOptions& options);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_CAPSULE_READER_H_
