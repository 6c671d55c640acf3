// Reading capsules: DecodeCapsule (a pure function over bytes) and ReadCapsuleFile.
//
// Reading is fail-closed and runs the cheapest check first (proto/FORMAT.md §6, "Reading"): size,
// magic, version and required flags, declared sizes, end magic, trailer fields, digest, signature
// — all before any decompression or parsing — then the resource limits below (uncompressed size,
// compression ratio, zstd frame parameters), zstd decompression with its checksum, a pass over the
// protobuf wire bytes that counts what parsing would build, parsing, ValidateCapsule(), and last
// the trust of what the capsule was made from (format/derivation.h): a capsule is accepted only as
// far as the least trusted of its signer and its derivations' sources. Each rejection has its own
// code and a message that says what to do:
//   kNotFound           no such file
//   kOutOfRange         truncated
//   kInvalidArgument    not a capsule (empty, bad magic, not a regular file), or content that
//                       breaks a schema rule
//   kUnimplemented      newer major version, unknown required flag or signature algorithm
//   kDataLoss           corrupt (digest, trailer, zstd frame or checksum, protobuf)
//   kUnauthenticated    unsigned (unless allowed), untrusted key (unless allowed), bad signature,
//                       an invalid signer key (a small-order point), made from an unsigned or
//                       untrusted capsule (unless allowed as those would be)
//   kInternal           SHA-256 or Ed25519 could not be computed (OpenSSL; base/internal/sha256.h)
//   kResourceExhausted  over one of the limits in ReadOptions
//
// The limits bound what opening a capsule from a stranger costs: a small multiple of what a
// legitimate capsule of its size needs (FORMAT.md §6, "Resource limits", has the measurements).
// Every command reads the whole capsule — verify and inspect included: a reader cannot vouch for
// content it did not decompress and check — so one set of defaults serves them all.
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

// Limits on the decompressed protobuf bytes, checked by a pass over the wire format before they
// are parsed (kResourceExhausted). Parsing turns each 2-byte empty message into an object of about
// a hundred bytes and each 2-byte string element into forty; these counts bound that. The writer
// refuses to write a capsule over the defaults, so every capsule it writes opens with them.
struct ContentLimits {
  // Fields the schema does not define, at any depth, tag and value bytes together. A newer writer
  // adds small fields; megabytes of them are padding or a bomb. Redaction drops them anyway.
  uint64_t max_unknown_field_bytes = uint64_t{1} << 20;  // 1 MiB
  // Embedded messages, map entries included. A capsule of a 10,000-layer model with both phases
  // holds about 60,000.
  uint64_t max_messages = uint64_t{1} << 18;  // 262,144
  // Elements of repeated string and bytes fields (log lines, layer and tensor names, flags).
  uint64_t max_repeated_strings = uint64_t{1} << 18;  // 262,144
  // Elements of repeated numeric fields (token ids, labels, sample indices, shapes, strides):
  // 4 Mi, token ids and labels of 256 sequences of 8,192 tokens. Each costs 8 bytes parsed from
  // as little as one byte on the wire.
  uint64_t max_repeated_numbers = uint64_t{1} << 22;
  // One string (UTF-8 text) field: config text, a log line, a sample's raw text. Bytes fields
  // (tensor data, RNG state, masks) are bounded only by the payload.
  uint64_t max_string_bytes = uint64_t{16} << 20;  // 16 MiB
};

struct ReadOptions {
  std::vector<PublicKey> trusted_keys;  // signatures by these keys are accepted
  // Accept unsigned capsules (digest still checked), and capsules made from one.
  bool allow_unsigned = false;
  // Accept signers outside trusted_keys (their signature still checked when the capsule carries
  // the key), and capsules made from a capsule whose signer their maker did not trust.
  bool allow_untrusted = false;
  // ReadCapsuleFile refuses larger files before reading them.
  uint64_t max_file_bytes = uint64_t{1} << 30;  // 1 GiB
  // Decompression bomb guard: refuse before allocating when the payload declares more.
  uint64_t max_uncompressed_bytes = uint64_t{1} << 30;  // 1 GiB
  // Optional compression-ratio guard, before anything is decompressed: a payload that declares
  // more than `ratio_free_bytes` uncompressed may declare at most `max_compression_ratio` times
  // its compressed size. Off (0) by default, because no ratio tells a legitimate capsule from an
  // absurd one: tensor data compresses about 1.1:1, but a causal mask reaches 700:1 and an all-zero
  // activation (a dead layer, exactly what a capsule is for) zstd's own maximum of about
  // 30,000:1, as a bomb does. What stops a bomb is `limits`, checked while decompressing: a
  // payload that declares 900 MiB of unknown field is refused at its first megabyte. A service
  // that opens capsules from anyone may still want, say, 4096.
  uint64_t max_compression_ratio = 0;
  uint64_t ratio_free_bytes = uint64_t{1} << 20;  // 1 MiB
  // Checked on the decompressed bytes as they arrive, before protobuf parses them.
  ContentLimits limits;
  // Ignored: every read enforces ValidateCapsule's content rules (FORMAT.md §6, check 20), so a
  // capsule one command accepts is one every command can use. Kept so that older callers build;
  // do not set it.
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

// The rest of DecodeCapsule for an envelope its caller opened with OpenEnvelope and whose trust it
// judges itself (a command that says why it refuses a signer, and how to get round it): checks
// 11-20 on env.payload, which must point into bytes that outlive the call. Neither the trust
// fields of `options` nor check 21 apply; CheckDerivations (format/derivation.h) is check 21.
StatusOr<DecodedCapsule> DecodeOpenedEnvelope(const OpenedEnvelope& env,
                                              const ReadOptions& options);
StatusOr<DecodedCapsule> ReadCapsuleFile(const std::string& path, const ReadOptions& options);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_CAPSULE_READER_H_
