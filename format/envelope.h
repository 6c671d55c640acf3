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
  kVerified,    // signed, and the signature checks against a trusted key
  kUnsigned,    // no signature (allowed by OpenOptions::allow_unsigned)
  kNotChecked,  // signed by a key not in the trusted set (allowed by allow_untrusted)
};
const char* SignatureStateName(SignatureState s);  // "verified", "unsigned", "not checked"

struct EnvelopeInfo {
  EnvelopeHeader header;
  uint16_t signature_algorithm = kSigAlgNone;
  std::string key_id;  // raw 32 bytes; all zero when unsigned
  std::string digest;  // raw 32 bytes: SHA-256 of the signed message
  SignatureState signature = SignatureState::kUnsigned;
  uint64_t file_size = 0;
};

struct SealOptions {
  // Signs with this key when set; the capsule is unsigned otherwise. Not owned.
  const PrivateKey* signing_key = nullptr;
  uint32_t optional_flags = 0;
  // Writing anything but the defaults below makes a capsule this library refuses to read; only
  // tests and the golden-sample generator set them.
  uint16_t major = kFormatMajor;
  uint16_t minor = kFormatMinor;
  uint32_t required_flags = 0;
};

StatusOr<std::string> SealEnvelope(std::string_view payload, uint64_t uncompressed_size,
                                   const SealOptions& options);

// The same without copying the payload: `buffer` holds kHeaderSizeV1 bytes of room followed by
// exactly the payload; the header is written in place and the trailer appended.
Status SealEnvelopeInPlace(std::string* buffer, uint64_t uncompressed_size,
                           const SealOptions& options);

struct OpenOptions {
  // Public keys whose signatures are accepted.
  std::vector<PublicKey> trusted_keys;
  // Accept a capsule without a signature (integrity is still checked through the digest).
  bool allow_unsigned = false;
  // Accept a capsule signed by a key outside trusted_keys, without checking the signature.
  bool allow_untrusted = false;
};

struct OpenedEnvelope {
  EnvelopeInfo info;
  std::string_view payload;  // points into the bytes given to OpenEnvelope
};

StatusOr<OpenedEnvelope> OpenEnvelope(std::string_view file, const OpenOptions& options);

// domain tag ‖ header bytes ‖ SHA-256(payload): what the digest hashes and Ed25519 signs.
std::string SignedMessage(std::string_view header_bytes, std::string_view payload);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_ENVELOPE_H_
