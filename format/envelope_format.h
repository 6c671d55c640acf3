// Constants of the capsule envelope, shared by the reader and the writer. The byte-by-byte layout
// and the meaning of every field is in proto/FORMAT.md; this header only names the numbers.
//
//   if (bytes.substr(0, capsule::kMagicSize) == capsule::kMagic) { ... }
//
// Thread safety: constants only.
#ifndef CAPSULE_FORMAT_ENVELOPE_FORMAT_H_
#define CAPSULE_FORMAT_ENVELOPE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace capsule {

// "\x89CPS\r\n\x1a\n": high first byte (not text, survives no 7-bit channel), CR-LF and LF catch
// newline translation, 0x1a stops a DOS `type`. Same reasoning as PNG's signature.
inline constexpr std::string_view kMagic(
    "\x89"
    "CPS\r\n\x1a\n",
    8);
inline constexpr size_t kMagicSize = 8;
// Last 8 bytes of every capsule: a truncated file lacks them.
inline constexpr std::string_view kEndMagic(
    "\x89"
    "CPSEND\n",
    8);

inline constexpr uint16_t kFormatMajor = 1;
// The newest minor this library writes and reads. 1.1 appends the signer's public key to the
// header of a signed capsule; a capsule without it is written as 1.0, byte for byte.
inline constexpr uint16_t kFormatMinor = 1;

// Header v1.0 is 48 bytes; a later minor version may append fields (header_size grows), which a
// 1.0 reader skips (they are still covered by the digest and signature).
inline constexpr size_t kHeaderSizeV1 = 48;
// A 1.1 header with the signer key: 48 + the raw 32-byte Ed25519 public key.
inline constexpr size_t kHeaderSizeV1SignerKey = 80;
// A header_size above this is corrupt (FORMAT.md §2).
inline constexpr size_t kMaxHeaderSize = size_t{1} << 20;
// Header field offsets.
inline constexpr size_t kOffMajor = 8;
inline constexpr size_t kOffMinor = 10;
inline constexpr size_t kOffHeaderSize = 12;
inline constexpr size_t kOffRequiredFlags = 16;
inline constexpr size_t kOffOptionalFlags = 20;
inline constexpr size_t kOffPayloadSize = 24;
inline constexpr size_t kOffUncompressedSize = 32;
inline constexpr size_t kOffPayloadCodec = 40;
inline constexpr size_t kOffHeaderReserved = 44;
inline constexpr size_t kOffSignerKey = 48;  // 1.1, with kOptionalFlagSignerKey

// Required flags: a reader refuses a capsule with a bit it does not know. None defined in 1.0.
inline constexpr uint32_t kKnownRequiredFlags = 0;
// Optional flags: a reader ignores bits it does not know.
inline constexpr uint32_t kOptionalFlagRedacted = 1u << 0;    // made by `capsule redact`
inline constexpr uint32_t kOptionalFlagHasWeights = 1u << 1;  // embeds all model weights
inline constexpr uint32_t kOptionalFlagExtract = 1u << 2;     // a single-layer extract
// 1.1: header bytes 48..80 hold the signer's raw public key (its SHA-256 is the trailer's key_id),
// so a reader can check the signature of a key it does not know yet.
inline constexpr uint32_t kOptionalFlagSignerKey = 1u << 3;

inline constexpr uint32_t kPayloadCodecZstd = 1;

// Trailer: sig_alg u16, sig_size u16, reserved u32, key_id[32], digest[32], signature[sig_size],
// trailer_size u32, end magic[8].
inline constexpr size_t kTrailerFixedSize = 2 + 2 + 4 + 32 + 32 + 4 + 8;  // 84
inline constexpr size_t kTrailerTailSize = 4 + 8;  // trailer_size + end magic
inline constexpr uint16_t kSigAlgNone = 0;
inline constexpr uint16_t kSigAlgEd25519 = 1;

// Domain separation for the signed message: a signature over a capsule can never be replayed as
// a signature over anything else.
inline constexpr std::string_view kSignatureDomain("capsule/sign/v1\n", 16);

inline constexpr size_t kMinCapsuleSize = kHeaderSizeV1 + kTrailerFixedSize;

}  // namespace capsule

#endif  // CAPSULE_FORMAT_ENVELOPE_FORMAT_H_
