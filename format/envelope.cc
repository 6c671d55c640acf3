#include "capsule/format/envelope.h"

#include <cstring>
#include <optional>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"

namespace capsule {
using internal::LoadLe16;
using internal::LoadLe32;
using internal::LoadLe64;
using internal::StoreLe16;
using internal::StoreLe32;
using internal::StoreLe64;

const char* SignatureStateName(SignatureState s) {
  switch (s) {
    case SignatureState::kVerified:
      return "verified";
    case SignatureState::kUnsigned:
      return "unsigned";
    case SignatureState::kValidUnknownSigner:
      return "valid, unknown signer";
    case SignatureState::kNotChecked:
      return "not checked";
  }
  return "unknown";
}

namespace {

std::string SignedMessageOfDigest(std::string_view header_bytes, std::string_view payload_sha256) {
  std::string m;
  m.reserve(kSignatureDomain.size() + header_bytes.size() + kSha256Size);
  m.append(kSignatureDomain);
  m.append(header_bytes);
  m.append(payload_sha256);
  return m;
}

}  // namespace

StatusOr<std::string> SignedMessage(std::string_view header_bytes, std::string_view payload) {
  CAPSULE_ASSIGN_OR_RETURN(std::string payload_sha256, Sha256(payload));
  return SignedMessageOfDigest(header_bytes, payload_sha256);
}

size_t SealedHeaderSize(const SealOptions& options) {
  return options.signing_key != nullptr && options.embed_signer_key ? kHeaderSizeV1SignerKey
                                                                    : kHeaderSizeV1;
}

StatusOr<SealedParts> SealEnvelopeParts(uint64_t payload_size, uint64_t uncompressed_size,
                                        std::string_view payload_sha256,
                                        const SealOptions& options) {
  if (payload_sha256.size() != kSha256Size) return InternalError("seal: not a SHA-256 digest");
  const size_t header_size = SealedHeaderSize(options);
  std::string key_id(kSha256Size, '\0');
  std::optional<PublicKey> pub;
  if (options.signing_key != nullptr) {
    CAPSULE_ASSIGN_OR_RETURN(pub, options.signing_key->GetPublicKey());
    key_id = pub->KeyId();
  }
  const bool embed = header_size == kHeaderSizeV1SignerKey;
  SealedParts parts;
  std::string& h = parts.header;
  h.assign(header_size, '\0');
  std::memcpy(h.data(), kMagic.data(), kMagicSize);
  StoreLe16(&h[kOffMajor], options.major);
  StoreLe16(&h[kOffMinor], options.minor.value_or(embed ? 1 : 0));
  StoreLe32(&h[kOffHeaderSize], static_cast<uint32_t>(header_size));
  StoreLe32(&h[kOffRequiredFlags], options.required_flags);
  StoreLe32(&h[kOffOptionalFlags], options.optional_flags | (embed ? kOptionalFlagSignerKey : 0u));
  StoreLe64(&h[kOffPayloadSize], payload_size);
  StoreLe64(&h[kOffUncompressedSize], uncompressed_size);
  StoreLe32(&h[kOffPayloadCodec], kPayloadCodecZstd);
  StoreLe32(&h[kOffHeaderReserved], 0);
  if (embed) std::memcpy(&h[kOffSignerKey], pub->raw().data(), kEd25519KeySize);

  const std::string message = SignedMessageOfDigest(h, payload_sha256);
  std::string signature;
  uint16_t alg = kSigAlgNone;
  if (options.signing_key != nullptr) {
    CAPSULE_ASSIGN_OR_RETURN(signature, Sign(*options.signing_key, message));
    alg = kSigAlgEd25519;
  }
  const uint32_t trailer_size = static_cast<uint32_t>(kTrailerFixedSize + signature.size());
  std::string& t = parts.trailer;
  char fixed[8];
  StoreLe16(fixed, alg);
  StoreLe16(fixed + 2, static_cast<uint16_t>(signature.size()));
  StoreLe32(fixed + 4, 0);
  t.reserve(trailer_size);
  t.append(fixed, sizeof(fixed));
  CAPSULE_ASSIGN_OR_RETURN(std::string digest, Sha256(message));
  t.append(key_id);
  t.append(digest);
  t.append(signature);
  char tail[4];
  StoreLe32(tail, trailer_size);
  t.append(tail, sizeof(tail));
  t.append(kEndMagic);
  return parts;
}

Status SealEnvelopeInPlace(std::string* buffer, uint64_t uncompressed_size,
                           const SealOptions& options) {
  const size_t header_size = SealedHeaderSize(options);
  if (buffer->size() < header_size) return InternalError("seal: no room for the header");
  const std::string_view payload = std::string_view(*buffer).substr(header_size);
  CAPSULE_ASSIGN_OR_RETURN(std::string payload_sha256, Sha256(payload));
  CAPSULE_ASSIGN_OR_RETURN(SealedParts parts, SealEnvelopeParts(payload.size(), uncompressed_size,
                                                                payload_sha256, options));
  buffer->replace(0, header_size, parts.header);
  buffer->append(parts.trailer);
  return Status::Ok();
}

StatusOr<std::string> SealEnvelope(std::string_view payload, uint64_t uncompressed_size,
                                   const SealOptions& options) {
  std::string out;
  const size_t header_size = SealedHeaderSize(options);
  out.reserve(header_size + payload.size() + kTrailerFixedSize + kEd25519SignatureSize);
  out.resize(header_size);
  out.append(payload);
  CAPSULE_RETURN_IF_ERROR(SealEnvelopeInPlace(&out, uncompressed_size, options));
  return out;
}

namespace {

Status Truncated(uint64_t have, uint64_t need) {
  return OutOfRangeError("truncated capsule: " + std::to_string(have) + " bytes, header declares " +
                         std::to_string(need) + "; the copy is incomplete, fetch it again");
}

// Whether `file` holds a complete 1.x layout whose digest matches, read without trusting the
// version or flags. A version or required flag this reader refuses may be genuine (a newer
// writer) or a byte changed in place; only in the second case does the 1.x digest fail, and the
// message should then say that the file may be damaged rather than only "upgrade".
bool ChecksAsV1(std::string_view file) {
  const uint64_t size = file.size();
  if (size < kMinCapsuleSize || file.substr(0, kMagicSize) != kMagic) return false;
  const uint64_t header_size = LoadLe32(&file[kOffHeaderSize]);
  const uint64_t payload_size = LoadLe64(&file[kOffPayloadSize]);
  if (header_size < kHeaderSizeV1 || header_size > kMaxHeaderSize || payload_size > size) {
    return false;
  }
  const uint64_t trailer_at = header_size + payload_size;
  if (size < trailer_at + kTrailerFixedSize) return false;
  const uint16_t sig_size = LoadLe16(&file[trailer_at + 2]);
  if (size != trailer_at + kTrailerFixedSize + sig_size) return false;
  const std::string_view digest = file.substr(trailer_at + 8 + kSha256Size, kSha256Size);
  // A digest that cannot be computed checks nothing: the file does not check as 1.x then.
  StatusOr<std::string> message =
      SignedMessage(file.substr(0, header_size), file.substr(header_size, payload_size));
  if (!message.ok()) return false;
  StatusOr<std::string> computed = Sha256(*message);
  return computed.ok() && *computed == digest;
}

constexpr const char kMaybeAltered[] =
    "; if no newer capsule wrote it, the file is damaged or was altered (it does not check as a "
    "1.x capsule either)";

// The numbers in the comments are those of FORMAT.md §6 "Reading".

// 2. Magic. An empty file holds nothing to judge (a failed download, a touched name); a non-empty
// prefix of the magic is a capsule cut short.
Status CheckMagic(std::string_view file) {
  const uint64_t size = file.size();
  if (size == 0) return InvalidArgumentError("empty file (0 bytes): not a capsule");
  if (size < kMagicSize) {
    if (file == kMagic.substr(0, size)) return Truncated(size, kMinCapsuleSize);
    return InvalidArgumentError("not a capsule (bad magic number)");
  }
  if (file.substr(0, kMagicSize) != kMagic) {
    return InvalidArgumentError("not a capsule (bad magic number)");
  }
  if (size < kHeaderSizeV1) return Truncated(size, kMinCapsuleSize);
  return Status::Ok();
}

// 3, 4. Version and required flags, before trusting any other field; 5. the other header fields.
Status ReadHeader(std::string_view file, EnvelopeHeader* h) {
  h->major = LoadLe16(&file[kOffMajor]);
  h->minor = LoadLe16(&file[kOffMinor]);
  if (h->major > kFormatMajor) {
    return UnimplementedError(
        "format " + std::to_string(h->major) + "." + std::to_string(h->minor) +
        " is newer than this reader (reads up to " + std::to_string(kFormatMajor) +
        ".x); upgrade capsule" + (ChecksAsV1(file) ? "" : kMaybeAltered));
  }
  if (h->major == 0) return DataLossError("corrupt header (format major version 0)");
  h->required_flags = LoadLe32(&file[kOffRequiredFlags]);
  if ((h->required_flags & ~kKnownRequiredFlags) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", h->required_flags & ~kKnownRequiredFlags);
    return UnimplementedError(
        std::string("capsule needs features this reader lacks (required flags ") + hex +
        "); upgrade capsule" + (ChecksAsV1(file) ? "" : kMaybeAltered));
  }
  h->header_size = LoadLe32(&file[kOffHeaderSize]);
  h->optional_flags = LoadLe32(&file[kOffOptionalFlags]);
  h->payload_size = LoadLe64(&file[kOffPayloadSize]);
  h->uncompressed_size = LoadLe64(&file[kOffUncompressedSize]);
  h->payload_codec = LoadLe32(&file[kOffPayloadCodec]);
  if (h->header_size < kHeaderSizeV1 || h->header_size > kMaxHeaderSize) {
    return DataLossError("corrupt header (header size " + std::to_string(h->header_size) + ")");
  }
  if (h->payload_codec != kPayloadCodecZstd) {
    return DataLossError("corrupt header (unknown payload codec " +
                         std::to_string(h->payload_codec) + ")");
  }
  if (LoadLe32(&file[kOffHeaderReserved]) != 0) {
    return DataLossError("corrupt header (reserved field is not zero)");
  }
  return Status::Ok();
}

// 6. Declared sizes against the actual size. Overflow-safe: each term is bounded first. While the
// trailer's fixed part is missing, sig_size is unknown and the minimum is reported. 7. End magic
// and the trailer's own size and reserved fields. Fills the trailer's fields of `info` and returns
// the signature's bytes.
StatusOr<std::string_view> ReadTrailer(std::string_view file, const EnvelopeHeader& h,
                                       EnvelopeInfo* info) {
  const uint64_t size = file.size();
  if (h.payload_size > size) return Truncated(size, h.header_size + h.payload_size);
  const uint64_t trailer_at = h.header_size + h.payload_size;
  if (size < trailer_at + kTrailerFixedSize) {
    return Truncated(size, trailer_at + kTrailerFixedSize);
  }
  const char* t = file.data() + trailer_at;
  info->signature_algorithm = LoadLe16(t);
  const uint16_t sig_size = LoadLe16(t + 2);
  const uint64_t total = trailer_at + kTrailerFixedSize + sig_size;
  if (size < total) return Truncated(size, total);
  if (size > total) {
    return DataLossError("corrupt capsule (" + std::to_string(size - total) +
                         " bytes after the declared end)");
  }
  if (file.substr(size - kEndMagic.size()) != kEndMagic) {
    return DataLossError("corrupt trailer (bad end magic)");
  }
  if (LoadLe32(&file[size - kTrailerTailSize]) != kTrailerFixedSize + sig_size) {
    return DataLossError("corrupt trailer (trailer size does not match the signature size)");
  }
  if (LoadLe32(t + 4) != 0) return DataLossError("corrupt trailer (reserved field is not zero)");
  info->key_id = std::string(t + 8, kSha256Size);
  info->digest = std::string(t + 8 + kSha256Size, kSha256Size);
  info->file_size = size;
  return std::string_view(t + 8 + 2 * kSha256Size, sig_size);
}

// 8. The signature fields agree with the algorithm. The trailer is not covered by the digest, so
// an unknown algorithm may also be a changed byte: the message says both.
Status CheckSignatureFields(const EnvelopeInfo& info, size_t sig_size) {
  switch (info.signature_algorithm) {
    case kSigAlgNone:
      if (sig_size != 0 || info.key_id != std::string(kSha256Size, '\0')) {
        return DataLossError("corrupt trailer (unsigned capsule with a key id or signature)");
      }
      return Status::Ok();
    case kSigAlgEd25519:
      if (sig_size != kEd25519SignatureSize) {
        return DataLossError("corrupt trailer (Ed25519 signature of " + std::to_string(sig_size) +
                             " bytes)");
      }
      return Status::Ok();
    default:
      return UnimplementedError("unknown signature algorithm " +
                                std::to_string(info.signature_algorithm) +
                                "; upgrade capsule if a newer capsule wrote it, otherwise the "
                                "file is damaged or was altered");
  }
}

// 10, first (1.1). The signer key the header carries must be the key the trailer names; the flag
// without a signature, or without room for the key, is corrupt. After the digest, so that a
// changed key byte reads as the corruption it is.
Status ReadSignerKey(std::string_view file, const EnvelopeHeader& h, EnvelopeInfo* info) {
  if ((h.optional_flags & kOptionalFlagSignerKey) == 0) return Status::Ok();
  if (h.header_size < kHeaderSizeV1SignerKey) {
    return DataLossError("corrupt header (signer key flag with a header of " +
                         std::to_string(h.header_size) + " bytes)");
  }
  if (info->signature_algorithm != kSigAlgEd25519) {
    return DataLossError("corrupt capsule (signer key in the header of an unsigned capsule)");
  }
  info->signer_key = std::string(file.substr(kOffSignerKey, kEd25519KeySize));
  CAPSULE_ASSIGN_OR_RETURN(const std::string signer_key_id, Sha256(info->signer_key));
  if (signer_key_id != info->key_id) {
    return DataLossError("corrupt capsule (the header's signer key is not the trailer's key id)");
  }
  return Status::Ok();
}

// 10. Signature, before the payload is decompressed or parsed: the signature state the options
// accept, or why they do not.
StatusOr<SignatureState> CheckSignature(const EnvelopeInfo& info, const std::string& message,
                                        std::string_view signature, const OpenOptions& options) {
  if (info.signature_algorithm == kSigAlgNone) {
    if (!options.allow_unsigned) {
      return UnauthenticatedError("capsule is unsigned, so it cannot be verified");
    }
    return SignatureState::kUnsigned;
  }
  const PublicKey* key = nullptr;
  for (const PublicKey& k : options.trusted_keys) {
    if (k.KeyId() == info.key_id) key = &k;
  }
  // A key the capsule carries is checked like a trusted one; only trust differs.
  std::optional<PublicKey> carried;
  if (key == nullptr && !info.signer_key.empty()) {
    StatusOr<PublicKey> k = PublicKey::FromRaw(info.signer_key);
    if (!k.ok() && k.status().code() == StatusCode::kInvalidArgument) {
      // Intact (the digest covers it) but worthless: a small-order key verifies forgeries.
      return UnauthenticatedError("capsule's signer key " + HexEncode(info.key_id).substr(0, 16) +
                                  " is " + k.status().message() + "; its signature proves nothing");
    }
    CAPSULE_RETURN_IF_ERROR(k.status());
    carried = std::move(*k);
  }
  const PublicKey* check = key != nullptr ? key : (carried ? &*carried : nullptr);
  if (check != nullptr) {
    Status verified = Verify(*check, message, signature);
    if (verified.code() == StatusCode::kUnauthenticated) {
      return UnauthenticatedError("bad signature: capsule was not signed by key " +
                                  check->KeyIdHex().substr(0, 16) + " or was altered");
    }
    CAPSULE_RETURN_IF_ERROR(verified);
  }
  if (key != nullptr) return SignatureState::kVerified;
  if (!options.allow_untrusted) {
    return UnauthenticatedError(
        "capsule is signed by untrusted key " + HexEncode(info.key_id).substr(0, 16) +
        (carried ? " (the signature is valid)"
                 : " (format 1.0 carries no signer key: the signature cannot be checked)") +
        "; to trust it, check its key id " + HexEncode(info.key_id) +
        " with the signer, then trust their public key");
  }
  return carried ? SignatureState::kValidUnknownSigner : SignatureState::kNotChecked;
}

}  // namespace

StatusOr<OpenedEnvelope> OpenEnvelope(std::string_view file, const OpenOptions& options) {
  CAPSULE_RETURN_IF_ERROR(CheckMagic(file));
  OpenedEnvelope env;
  const EnvelopeHeader& h = env.info.header;
  CAPSULE_RETURN_IF_ERROR(ReadHeader(file, &env.info.header));
  CAPSULE_ASSIGN_OR_RETURN(const std::string_view signature, ReadTrailer(file, h, &env.info));
  CAPSULE_RETURN_IF_ERROR(CheckSignatureFields(env.info, signature.size()));

  // 9. Digest: integrity of header and payload, signed or not.
  const std::string_view header_bytes = file.substr(0, h.header_size);
  env.payload = file.substr(h.header_size, h.payload_size);
  CAPSULE_ASSIGN_OR_RETURN(const std::string message, SignedMessage(header_bytes, env.payload));
  CAPSULE_ASSIGN_OR_RETURN(const std::string digest, Sha256(message));
  if (digest != env.info.digest) {
    return DataLossError("corrupt capsule (digest mismatch: header or payload bytes changed)");
  }

  CAPSULE_RETURN_IF_ERROR(ReadSignerKey(file, h, &env.info));
  CAPSULE_ASSIGN_OR_RETURN(env.info.signature,
                           CheckSignature(env.info, message, signature, options));
  return env;
}

}  // namespace capsule
