// The capsule envelope: Header | Payload | Trailer (proto/FORMAT.md), over bytes only.
//
// SealEnvelope wraps an already-compressed payload frame in a header and a trailer carrying the
// digest and (optionally) an Ed25519 signature. OpenEnvelope runs every check FORMAT.md lists in
// its order — size, magic, version, required flags, declared sizes, end magic, digest, signature —
// before anyone parses the payload, and fails closed with a distinct code per rule. The payload
// codec and the protobuf message live above this layer (capsule_reader.h, capsule_writer.h).
//
//   CAPSULE_ASSIGN_OR_RETURN(std::string file, capsule::SealEnvelope(frame, raw_size, seal));
//   CAPSULE_ASSIGN_OR_RETURN(capsule::OpenedEnvelope env, capsule::OpenEnvelope(file, open));
//   // env.payload is a view into `file`: the zstd frame.
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_FORMAT_ENVELOPE_H_
#define CAPSULE_FORMAT_ENVELOPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/signing.h"

namespace capsule {

struct EnvelopeHeader {
  uint16_t major = kFormatMajor;
  uint16_t minor = kFormatMinor;
  uint32_t header_size = kHeaderSizeV1;
  uint32_t required_flags = 0;
  uint32_t optional_flags = 0;
  uint64_t payload_size = 0;
  uint64_t uncompressed_size = 0;
  uint32_t payload_codec = kPayloadCodecZstd;
};

enum class SignatureState {
  kVerified,  // signed, and the signature checks against a trusted key
  kUnsigned,  // no signature (allowed by OpenOptions::allow_unsigned)
  // Signed by a key outside the trusted set, and the signature checks against the public key the
  // capsule carries (format 1.1): intact since it was signed, by a signer the reader has not
  // chosen to trust (allowed by allow_untrusted). Like gpg's "good signature from unknown key".
  kValidUnknownSigner,
  // Signed by a key outside the trusted set by a 1.0 writer, which does not carry the key: the
  // signature cannot be checked (allowed by allow_untrusted).
  kNotChecked,
};
// "verified", "unsigned", "valid, unknown signer", "not checked"
const char* SignatureStateName(SignatureState s);

struct EnvelopeInfo {
  EnvelopeHeader header;
  uint16_t signature_algorithm = kSigAlgNone;
  std::string key_id;      // raw 32 bytes; all zero when unsigned
  std::string signer_key;  // the raw 32-byte public key the header carries (1.1); else empty
  std::string digest;      // raw 32 bytes: SHA-256 of the signed message
  SignatureState signature = SignatureState::kUnsigned;
  uint64_t file_size = 0;
};

struct SealOptions {
  // Signs with this key when set; the capsule is unsigned otherwise. Not owned.
  const PrivateKey* signing_key = nullptr;
  uint32_t optional_flags = 0;
  // A signed capsule carries the signer's public key in its header (format 1.1), so that a reader
  // who does not know the key can still check the signature. Tests turn it off to write 1.0.
  bool embed_signer_key = true;
  // Writing anything but the defaults below makes a capsule this library refuses to read; only
  // tests and the golden-sample generator set them. The minor is 1 with the signer key, else 0.
  uint16_t major = kFormatMajor;
  std::optional<uint16_t> minor;
  uint32_t required_flags = 0;
};

// The header size SealEnvelopeInPlace writes for `options`: 80 with the signer key, else 48.
size_t SealedHeaderSize(const SealOptions& options);

StatusOr<std::string> SealEnvelope(std::string_view payload, uint64_t uncompressed_size,
                                   const SealOptions& options);

// The same without copying the payload: `buffer` holds SealedHeaderSize(options) bytes of room
// followed by exactly the payload; the header is written in place and the trailer appended.
Status SealEnvelopeInPlace(std::string* buffer, uint64_t uncompressed_size,
                           const SealOptions& options);

// The header and trailer that go around a payload the caller writes between them itself: for a
// writer that streams the payload and hashed it as it went (`payload_sha256`, raw 32 bytes), so
// the payload is not read again. A wrong size or digest makes a capsule every reader refuses as
// corrupt.
struct SealedParts {
  std::string header;  // SealedHeaderSize(options) bytes
  std::string trailer;
};
StatusOr<SealedParts> SealEnvelopeParts(uint64_t payload_size, uint64_t uncompressed_size,
                                        std::string_view payload_sha256,
                                        const SealOptions& options);

struct OpenOptions {
  // Public keys whose signatures are accepted.
  std::vector<PublicKey> trusted_keys;
  // Accept a capsule without a signature (integrity is still checked through the digest).
  bool allow_unsigned = false;
  // Accept a capsule signed by a key outside trusted_keys: its signature is checked against the
  // key the capsule carries (kValidUnknownSigner), or cannot be when it carries none (kNotChecked).
  // A signature that fails is refused either way.
  bool allow_untrusted = false;
};

struct OpenedEnvelope {
  EnvelopeInfo info;
  std::string_view payload;  // points into the bytes given to OpenEnvelope
};

StatusOr<OpenedEnvelope> OpenEnvelope(std::string_view file, const OpenOptions& options);

// domain tag ‖ header bytes ‖ SHA-256(payload): what the digest hashes and Ed25519 signs.
// kInternal when SHA-256 cannot be computed (base/internal/sha256.h).
StatusOr<std::string> SignedMessage(std::string_view header_bytes, std::string_view payload);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_ENVELOPE_H_
