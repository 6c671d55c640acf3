// One test per reading rule of OpenEnvelope (proto/envelope.cc) and DecodeCapsule
// (proto/capsule_reader.cc), in the order the reader applies them, then tests that the order
// itself holds (cheapest check first; verify before parse).
#include "capsule/format/capsule_reader.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <zstd.h>

#include <cstring>
#include <limits>
#include <memory>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/format/capsule_test_util.h"

namespace capsule::test {
using ::capsule::internal::LoadLe64;
using ::capsule::internal::StoreLe16;
using ::capsule::internal::StoreLe32;
namespace {

// A single frame of `data` as the writer makes it (content size + checksum).
std::string Frame(std::string_view data) {
  return OrDie(internal::ZstdCompress(data, internal::CompressOptions()));
}

class ReaderRulesTest : public CapsuleBytesTest {
 protected:
  // An envelope around `frame`, signed with key_, declaring `uncompressed` bytes.
  std::string Sealed(std::string_view frame, uint64_t uncompressed) const {
    RawHeader h;
    h.uncompressed_size = uncompressed;
    return BuildEnvelope(h, frame, &key_);
  }
  // A well-formed envelope whose payload decompresses to `serialized`.
  std::string SealedMessage(std::string_view serialized) const {
    return Sealed(Frame(serialized), serialized.size());
  }
};

// ---- 1. Size and magic ------------------------------------------------------------------------

TEST_F(ReaderRulesTest, EmptyFileIsNotACapsule) {
  // Not "truncated capsule: 0 bytes, header declares 132": nothing says it ever was one.
  EXPECT_TRUE(
      HasError(Decode(""), StatusCode::kInvalidArgument, "empty file (0 bytes): not a capsule"));
}

TEST_F(ReaderRulesTest, PrefixOfMagicIsTruncated) {
  for (size_t n = 1; n < kMagicSize; ++n) {
    EXPECT_TRUE(HasError(Decode(kMagic.substr(0, n)), StatusCode::kOutOfRange, "truncated")) << n;
  }
}

TEST_F(ReaderRulesTest, ShortFileThatIsNotAMagicPrefixIsNotACapsule) {
  EXPECT_TRUE(HasError(Decode("hello"), StatusCode::kInvalidArgument, "not a capsule"));
  EXPECT_TRUE(HasError(Decode("\211CPX"), StatusCode::kInvalidArgument, "not a capsule"));
}

TEST_F(ReaderRulesTest, BadMagic) {
  for (size_t i = 0; i < kMagicSize; ++i) {
    EXPECT_TRUE(HasError(Decode(FlipByte(signed_, i, 0x20)), StatusCode::kInvalidArgument,
                         "not a capsule (bad magic number)"))
        << i;
  }
  EXPECT_TRUE(HasError(Decode(std::string(200, 'x')), StatusCode::kInvalidArgument, "bad magic"));
}

TEST_F(ReaderRulesTest, NewlineTranslatedCopyIsNotACapsule) {
  // What a text-mode transfer does to "\r\n": the magic is built to catch it.
  std::string mangled = signed_;
  mangled.erase(4, 1);
  EXPECT_TRUE(HasError(Decode(mangled), StatusCode::kInvalidArgument, "bad magic"));
}

TEST_F(ReaderRulesTest, MagicButShorterThanHeaderIsTruncated) {
  for (size_t n = kMagicSize; n < kHeaderSizeV1; ++n) {
    EXPECT_TRUE(
        HasError(Decode(TruncateTo(signed_, n)), StatusCode::kOutOfRange, "truncated capsule"))
        << n;
  }
}

// ---- 2. Version and required flags ------------------------------------------------------------

TEST_F(ReaderRulesTest, NewerMajorVersion) {
  EXPECT_TRUE(HasError(Decode(SetMajor(signed_, 2)), StatusCode::kUnimplemented,
                       "format 2.1 is newer than this reader (reads up to 1.x); upgrade capsule"));
  EXPECT_TRUE(HasError(Decode(SetMajor(signed_, 0xffff)), StatusCode::kUnimplemented,
                       "newer than this reader"));
}

TEST_F(ReaderRulesTest, NewerMajorThatChecksAsV1SaysOnlyUpgrade) {
  // SetMajor re-seals: the file is intact, so it is a genuinely newer capsule.
  const Status s = Decode(SetMajor(signed_, 2)).status();
  EXPECT_TRUE(HasError(s, StatusCode::kUnimplemented, "upgrade capsule"));
  EXPECT_EQ(s.message().find("damaged"), std::string::npos) << s;
}

TEST_F(ReaderRulesTest, MajorChangedInPlaceSaysTheFileMayBeDamaged) {
  // The same edit without re-sealing: the 1.x digest no longer matches, so "upgrade" alone
  // would send the user after a version that does not exist.
  std::string bytes = signed_;
  StoreLe16(&bytes[kOffMajor], 2);
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kUnimplemented,
                       "format 2.1 is newer than this reader (reads up to 1.x); upgrade capsule; "
                       "if no newer capsule wrote it, the file is damaged or was altered"));
}

TEST_F(ReaderRulesTest, RequiredFlagSetInPlaceSaysTheFileMayBeDamaged) {
  std::string bytes = signed_;
  StoreLe32(&bytes[kOffRequiredFlags], 1u << 5);
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kUnimplemented,
                       "(required flags 0x00000020); upgrade capsule; if no newer capsule wrote "
                       "it, the file is damaged or was altered"));
  const Status resealed = Decode(SetRequiredFlag(signed_, 1u << 5)).status();
  EXPECT_EQ(resealed.message().find("damaged"), std::string::npos) << resealed;
}

TEST_F(ReaderRulesTest, NewerMinorVersionIsRead) {
  // Minor versions only append: a 1.0 reader reads 1.9.
  StatusOr<DecodedCapsule> d = Decode(EditHeader(signed_, [](char* h) { StoreLe16(h + 10, 9); }));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.header.minor, 9);
}

TEST_F(ReaderRulesTest, MajorVersionZero) {
  EXPECT_TRUE(
      HasError(Decode(SetMajor(signed_, 0)), StatusCode::kDataLoss, "format major version 0"));
}

TEST_F(ReaderRulesTest, UnknownRequiredFlag) {
  for (int bit = 0; bit < 32; ++bit) {
    EXPECT_TRUE(HasError(Decode(SetRequiredFlag(signed_, 1u << bit)), StatusCode::kUnimplemented,
                         "required flags"))
        << bit;
  }
  EXPECT_TRUE(HasError(Decode(SetRequiredFlag(signed_, 1u << 4)), StatusCode::kUnimplemented,
                       "(required flags 0x00000010); upgrade capsule"));
}

TEST_F(ReaderRulesTest, UnknownOptionalFlagIsIgnored) {
  const uint32_t flags = kOptionalFlagRedacted | (1u << 31);
  StatusOr<DecodedCapsule> d = Decode(SetHeader32(signed_, kOffOptionalFlags, flags));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.header.optional_flags, flags);
}

TEST_F(ReaderRulesTest, HeaderSizeTooSmall) {
  for (uint32_t size : {0u, 8u, 47u}) {
    EXPECT_TRUE(HasError(Decode(SetHeader32(signed_, kOffHeaderSize, size)), StatusCode::kDataLoss,
                         "corrupt header (header size " + std::to_string(size) + ")"));
  }
}

TEST_F(ReaderRulesTest, HeaderSizeTooLarge) {
  EXPECT_TRUE(HasError(Decode(SetHeader32(signed_, kOffHeaderSize, (1u << 20) + 1)),
                       StatusCode::kDataLoss, "header size 1048577"));
  EXPECT_TRUE(HasError(Decode(SetHeader32(signed_, kOffHeaderSize, 0xffffffffu)),
                       StatusCode::kDataLoss, "corrupt header (header size"));
}

TEST_F(ReaderRulesTest, LongerHeaderFromALaterMinorIsSkipped) {
  // A later 1.x may append header fields; they are signed but this reader skips them.
  const std::string serialized = SerializeDeterministic(MakeMinimalCapsule());
  RawHeader h;
  h.minor = 3;
  h.header_size = 64;
  h.uncompressed_size = serialized.size();
  std::string bytes = BuildEnvelope(h, Frame(serialized), &key_);
  StatusOr<DecodedCapsule> d = Decode(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.header.header_size, 64u);
  // The appended bytes are covered by the digest.
  EXPECT_TRUE(HasError(Decode(FlipByte(bytes, 50, 0x01)), StatusCode::kDataLoss, "digest"));
}

TEST_F(ReaderRulesTest, UnknownPayloadCodec) {
  for (uint32_t codec : {0u, 2u, 0x80000001u}) {
    EXPECT_TRUE(HasError(Decode(SetHeader32(signed_, kOffPayloadCodec, codec)),
                         StatusCode::kDataLoss, "unknown payload codec " + std::to_string(codec)));
  }
}

TEST_F(ReaderRulesTest, HeaderReservedNotZero) {
  EXPECT_TRUE(HasError(Decode(SetHeader32(signed_, kOffHeaderReserved, 1)), StatusCode::kDataLoss,
                       "corrupt header (reserved field is not zero)"));
}

// ---- 3. Declared sizes against the file size --------------------------------------------------

TEST_F(ReaderRulesTest, TruncatedInHeader) {
  EXPECT_TRUE(HasError(Decode(TruncateTo(signed_, 20)), StatusCode::kOutOfRange,
                       "truncated capsule: 20 bytes"));
}

TEST_F(ReaderRulesTest, TruncatedInPayload) {
  const Layout l = ParseLayout(signed_);
  ASSERT_GT(l.payload_size, 2u);
  EXPECT_TRUE(HasError(Decode(TruncateTo(signed_, l.header_size + l.payload_size / 2)),
                       StatusCode::kOutOfRange, "the copy is incomplete, fetch it again"));
}

TEST_F(ReaderRulesTest, TruncatedInTrailer) {
  const Layout l = ParseLayout(signed_);
  for (size_t n : {l.trailer_at, l.key_id_at() + 5, l.signature_at() + 10, l.end_magic_at() + 7}) {
    EXPECT_TRUE(HasError(Decode(TruncateTo(signed_, n)), StatusCode::kOutOfRange,
                         "truncated capsule: " + std::to_string(n) + " bytes"))
        << n;
  }
}

TEST_F(ReaderRulesTest, PayloadSizeBeyondTheFile) {
  // Huge declared sizes must not overflow the arithmetic into an "in bounds" answer.
  for (uint64_t size : {uint64_t{1} << 40, std::numeric_limits<uint64_t>::max(),
                        std::numeric_limits<uint64_t>::max() - 47}) {
    EXPECT_TRUE(HasError(Decode(SetHeader64(signed_, kOffPayloadSize, size)),
                         StatusCode::kOutOfRange, "truncated"))
        << size;
  }
}

TEST_F(ReaderRulesTest, TrailingGarbage) {
  EXPECT_TRUE(HasError(Decode(signed_ + "x"), StatusCode::kDataLoss,
                       "corrupt capsule (1 bytes after the declared end)"));
  EXPECT_TRUE(HasError(Decode(signed_ + signed_), StatusCode::kDataLoss, "after the declared end"));
}

TEST_F(ReaderRulesTest, PayloadSizeSmallerThanThePayload) {
  // The trailer is then read from inside the payload; its sizes do not add up to the file.
  const Layout l = ParseLayout(signed_);
  const Status s = Decode(SetHeader64(signed_, kOffPayloadSize, l.payload_size - 1)).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), StatusCode::kInternal) << s;
}

// ---- 4. End magic and trailer fields ----------------------------------------------------------

TEST_F(ReaderRulesTest, BadEndMagic) {
  const Layout l = ParseLayout(signed_);
  for (size_t i = l.end_magic_at(); i < l.file_size; ++i) {
    EXPECT_TRUE(HasError(Decode(FlipByte(signed_, i, 0x01)), StatusCode::kDataLoss,
                         "corrupt trailer (bad end magic)"))
        << i;
  }
}

TEST_F(ReaderRulesTest, TrailerSizeMismatch) {
  const Layout l = ParseLayout(signed_);
  std::string bytes = signed_;
  StoreLe32(&bytes[l.trailer_size_at()], 84);  // as if unsigned
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kDataLoss,
                       "trailer size does not match the signature size"));
}

TEST_F(ReaderRulesTest, TrailerReservedNotZero) {
  const Layout l = ParseLayout(signed_);
  EXPECT_TRUE(HasError(Decode(FlipByte(signed_, l.trailer_at + 6, 0x80)), StatusCode::kDataLoss,
                       "corrupt trailer (reserved field is not zero)"));
}

// ---- 5. Digest --------------------------------------------------------------------------------

TEST_F(ReaderRulesTest, DigestMismatchOnPayloadFlip) {
  const Layout l = ParseLayout(signed_);
  EXPECT_TRUE(HasError(Decode(FlipByte(signed_, l.header_size + l.payload_size / 2, 0x01)),
                       StatusCode::kDataLoss,
                       "corrupt capsule (digest mismatch: header or payload bytes changed)"));
}

TEST_F(ReaderRulesTest, DigestMismatchOnHeaderEditWithoutReseal) {
  std::string bytes = signed_;
  StoreLe32(&bytes[kOffOptionalFlags], kOptionalFlagRedacted);
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kDataLoss, "digest mismatch"));
}

TEST_F(ReaderRulesTest, DigestMismatchOnDigestFlip) {
  const Layout l = ParseLayout(signed_);
  EXPECT_TRUE(HasError(Decode(FlipByte(signed_, l.digest_at() + 31, 0x01)), StatusCode::kDataLoss,
                       "digest"));
}

TEST_F(ReaderRulesTest, DigestIsCheckedForUnsignedCapsules) {
  const Layout l = ParseLayout(unsigned_);
  EXPECT_TRUE(HasError(DecodeCapsule(FlipByte(unsigned_, l.header_size + 1, 0x04), AllowUnsigned()),
                       StatusCode::kDataLoss, "digest"));
}

TEST_F(ReaderRulesTest, DigestIsOverTheSignedMessage) {
  const Layout l = ParseLayout(signed_);
  const std::string message =
      ExpectedSignedMessage(std::string_view(signed_).substr(0, l.header_size),
                            std::string_view(signed_).substr(l.header_size, l.payload_size));
  EXPECT_EQ(signed_.substr(l.digest_at(), 32), *Sha256(message));
  EXPECT_EQ(*SignedMessage(std::string_view(signed_).substr(0, l.header_size),
                           std::string_view(signed_).substr(l.header_size, l.payload_size)),
            message);
}

// ---- 6. Signature -----------------------------------------------------------------------------

TEST_F(ReaderRulesTest, UnsignedIsRefusedByDefault) {
  EXPECT_TRUE(HasError(Decode(unsigned_), StatusCode::kUnauthenticated, "capsule is unsigned"));
  EXPECT_TRUE(
      HasError(Decode(unsigned_), StatusCode::kUnauthenticated, "so it cannot be verified"));
  EXPECT_TRUE(
      HasError(DecodeCapsule(unsigned_, ReadOptions()), StatusCode::kUnauthenticated, "unsigned"));
}

TEST_F(ReaderRulesTest, UnsignedIsAcceptedWhenAllowed) {
  StatusOr<DecodedCapsule> d = DecodeCapsule(unsigned_, AllowUnsigned());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.signature, SignatureState::kUnsigned);
  EXPECT_EQ(d->envelope.signature_algorithm, kSigAlgNone);
  EXPECT_EQ(d->envelope.key_id, std::string(32, '\0'));
}

TEST_F(ReaderRulesTest, AllowUnsignedDoesNotWeakenSignedCapsules) {
  // A signed capsule is still verified when unsigned ones are allowed.
  const Layout l = ParseLayout(signed_);
  EXPECT_TRUE(HasError(DecodeCapsule(FlipByte(signed_, l.signature_at(), 0x01), AllowUnsigned()),
                       StatusCode::kUnauthenticated, "bad signature"));
}

TEST_F(ReaderRulesTest, UnsignedWithAKeyIdIsCorrupt) {
  const Layout l = ParseLayout(unsigned_);
  EXPECT_TRUE(HasError(DecodeCapsule(FlipByte(unsigned_, l.key_id_at() + 3, 0x01), AllowUnsigned()),
                       StatusCode::kDataLoss, "unsigned capsule with a key id or signature"));
}

TEST_F(ReaderRulesTest, UnsignedWithASignatureIsCorrupt) {
  // Stripping the algorithm to "none" must not turn a signed capsule into an unsigned one.
  const Layout l = ParseLayout(signed_);
  std::string bytes = signed_;
  StoreLe16(&bytes[l.trailer_at], kSigAlgNone);
  EXPECT_TRUE(HasError(DecodeCapsule(bytes, AllowUnsigned()), StatusCode::kDataLoss,
                       "unsigned capsule with a key id or signature"));
}

TEST_F(ReaderRulesTest, VerifiedWithTrustedKey) {
  ReadOptions o;
  o.trusted_keys = {other_pub_, pub_};
  StatusOr<DecodedCapsule> d = DecodeCapsule(signed_, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.signature, SignatureState::kVerified);
  EXPECT_EQ(d->envelope.signature_algorithm, kSigAlgEd25519);
  EXPECT_EQ(d->envelope.key_id, pub_.KeyId());
  EXPECT_EQ(d->envelope.file_size, signed_.size());
}

// signed_ as a 1.0 writer seals it: the same payload, no signer key in the header.
std::string AsFormat10(std::string_view bytes, const PrivateKey& key) {
  StatusOr<OpenedEnvelope> env = OpenEnvelope(bytes, [] {
    OpenOptions o;
    o.allow_untrusted = true;
    return o;
  }());
  SealOptions seal;
  seal.signing_key = &key;
  seal.embed_signer_key = false;
  return OrDie(SealEnvelope(OrDie(std::move(env)).payload, LoadLe64(&bytes[32]), seal));
}

TEST_F(ReaderRulesTest, UntrustedKeyIsRefused) {
  const std::string resigned = ResignWith(signed_, other_key_);
  EXPECT_TRUE(HasError(Decode(resigned), StatusCode::kUnauthenticated,
                       "capsule is signed by untrusted key " + other_pub_.KeyIdHex().substr(0, 16) +
                           " (the signature is valid); to trust it, check its key id " +
                           other_pub_.KeyIdHex() +
                           " with the signer, then trust their public key"));
  EXPECT_TRUE(HasError(DecodeCapsule(signed_, ReadOptions()), StatusCode::kUnauthenticated,
                       "untrusted key"));
  // 1.0 carries no key, so nothing is said about the signature.
  const Status v10 = Decode(AsFormat10(signed_, other_key_)).status();
  EXPECT_TRUE(HasError(v10, StatusCode::kUnauthenticated,
                       "capsule is signed by untrusted key " + other_pub_.KeyIdHex().substr(0, 16) +
                           " (format 1.0 carries no signer key: the signature cannot be checked)"
                           "; to trust it"));
  EXPECT_EQ(v10.message().find("valid"), std::string::npos) << v10;
}

TEST_F(ReaderRulesTest, UnknownSignerIsCheckedWithTheKeyTheCapsuleCarries) {
  ReadOptions o = Strict();
  o.allow_untrusted = true;
  const std::string resigned = ResignWith(signed_, other_key_);
  StatusOr<DecodedCapsule> d = DecodeCapsule(resigned, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.signature, SignatureState::kValidUnknownSigner);
  EXPECT_STREQ(SignatureStateName(d->envelope.signature), "valid, unknown signer");
  EXPECT_EQ(d->envelope.signer_key, other_pub_.raw());
  // A bad signature is refused, trusted key or not: allowing unknown signers is not "unchecked".
  const Layout l = ParseLayout(resigned);
  EXPECT_TRUE(HasError(DecodeCapsule(FlipByte(resigned, l.signature_at() + 9, 0x10), o),
                       StatusCode::kUnauthenticated,
                       "bad signature: capsule was not signed by key " +
                           other_pub_.KeyIdHex().substr(0, 16) + " or was altered"));
  EXPECT_TRUE(HasError(DecodeCapsule(FlipByte(resigned, l.signature_at() + 9, 0x10), Strict()),
                       StatusCode::kUnauthenticated, "bad signature"));
}

TEST_F(ReaderRulesTest, SignerKeyMustBeTheKeyTheTrailerNames) {
  // The digest is resealed over the edit, so only the key-id rule can catch it.
  const std::string swapped = EditHeader(signed_, [&](char* h) {
    std::memcpy(h + kOffSignerKey, other_pub_.raw().data(), kEd25519KeySize);
  });
  EXPECT_TRUE(HasError(Decode(swapped), StatusCode::kDataLoss,
                       "corrupt capsule (the header's signer key is not the trailer's key id)"));
  // The flag on an unsigned capsule, and on a header with no room for the key.
  EXPECT_TRUE(HasError(
      DecodeCapsule(SetHeader32(unsigned_, kOffOptionalFlags, kOptionalFlagSignerKey),
                    AllowUnsigned()),
      StatusCode::kDataLoss, "corrupt header (signer key flag with a header of 48 bytes)"));
  RawHeader h;
  h.header_size = 80;
  h.optional_flags = kOptionalFlagSignerKey;
  h.signer_key = pub_.raw();
  EXPECT_TRUE(HasError(DecodeCapsule(BuildEnvelope(h, "x", nullptr), AllowUnsigned()),
                       StatusCode::kDataLoss,
                       "corrupt capsule (signer key in the header of an unsigned capsule)"));
}

TEST_F(ReaderRulesTest, SmallOrderSignerKeyIsRefusedThoughItsSignatureVerifies) {
  // The identity point as the carried key: R = identity, s = 0 verifies for every message, so
  // anyone can "sign" anything with it. The capsule is otherwise well formed (digest, key id).
  std::string identity(kEd25519KeySize, '\0');
  identity[0] = 1;
  const std::string forgery = identity + std::string(32, '\0');
  const Layout l = ParseLayout(signed_);
  std::string bytes = signed_;
  bytes.replace(kOffSignerKey, kEd25519KeySize, identity);
  const std::string message =
      ExpectedSignedMessage(std::string_view(bytes).substr(0, l.header_size),
                            std::string_view(bytes).substr(l.header_size, l.payload_size));
  bytes.replace(l.key_id_at(), 32, *Sha256(identity));
  bytes.replace(l.digest_at(), 32, *Sha256(message));
  bytes.replace(l.signature_at(), 64, forgery);
  // OpenSSL alone accepts the forgery.
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                  reinterpret_cast<const unsigned char*>(identity.data()), 32),
      EVP_PKEY_free);
  ASSERT_NE(pkey, nullptr);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  ASSERT_EQ(EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()), 1);
  ASSERT_EQ(
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(forgery.data()), 64,
                       reinterpret_cast<const unsigned char*>(message.data()), message.size()),
      1);
  // The reader refuses it, whether unknown signers are allowed or not.
  ReadOptions o = Strict();
  o.allow_untrusted = true;
  o.allow_unsigned = true;
  for (const ReadOptions& options : {Strict(), o}) {
    EXPECT_TRUE(HasError(DecodeCapsule(bytes, options), StatusCode::kUnauthenticated,
                         "not a valid Ed25519 public key: a point of small order"));
  }
}

TEST_F(ReaderRulesTest, Format10SignerOutsideTheTrustedKeysIsNotChecked) {
  ReadOptions o = Strict();
  o.allow_untrusted = true;
  StatusOr<DecodedCapsule> d = DecodeCapsule(AsFormat10(signed_, other_key_), o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.header.minor, 0);
  EXPECT_EQ(d->envelope.header.header_size, 48u);
  EXPECT_EQ(d->envelope.signature, SignatureState::kNotChecked);
  EXPECT_TRUE(d->envelope.signer_key.empty());
  EXPECT_EQ(d->envelope.key_id, other_pub_.KeyId());
  // Given the key, a 1.0 capsule verifies as before.
  o.trusted_keys.push_back(other_pub_);
  EXPECT_EQ(OrDie(DecodeCapsule(AsFormat10(signed_, other_key_), o)).envelope.signature,
            SignatureState::kVerified);
}

TEST_F(ReaderRulesTest, TrustedSignerIsCheckedWhenUnknownSignersAreAllowed) {
  ReadOptions o = Strict();
  o.allow_untrusted = true;
  // A trusted signer is still checked when untrusted ones are allowed.
  const Layout l = ParseLayout(signed_);
  EXPECT_TRUE(HasError(DecodeCapsule(FlipByte(signed_, l.signature_at() + 9, 0x10), o),
                       StatusCode::kUnauthenticated, "bad signature"));
}

TEST_F(ReaderRulesTest, BadSignature) {
  const Layout l = ParseLayout(signed_);
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{63}}) {
    EXPECT_TRUE(HasError(Decode(FlipByte(signed_, l.signature_at() + i, 0x01)),
                         StatusCode::kUnauthenticated,
                         "bad signature: capsule was not signed by key " +
                             pub_.KeyIdHex().substr(0, 16) + " or was altered"))
        << i;
  }
}

TEST_F(ReaderRulesTest, SignatureByAnotherKeyUnderATrustedKeyId) {
  // An impostor keeps the trusted key id but signs with its own key; the digest is valid.
  const Layout l = ParseLayout(signed_);
  std::string forged = ResignWith(signed_, other_key_);
  forged.replace(l.key_id_at(), 32, pub_.KeyId());
  // The header still names the impostor's key: the two names disagree.
  EXPECT_TRUE(HasError(Decode(forged), StatusCode::kDataLoss,
                       "the header's signer key is not the trailer's key id"));
  // Named consistently (the trusted key in the header too, digest resealed), the signature fails.
  std::string header = signed_.substr(0, l.header_size);
  const std::string payload = signed_.substr(l.header_size, l.payload_size);
  std::string impostor = ResignWith(signed_, other_key_);
  impostor.replace(l.key_id_at(), 32, pub_.KeyId());
  impostor.replace(0, l.header_size, header);
  impostor.replace(l.digest_at(), 32, *Sha256(ExpectedSignedMessage(header, payload)));
  EXPECT_TRUE(HasError(Decode(impostor), StatusCode::kUnauthenticated, "bad signature"));
}

TEST_F(ReaderRulesTest, SignatureIsOverTheSignedMessage) {
  const Layout l = ParseLayout(signed_);
  const std::string message =
      ExpectedSignedMessage(std::string_view(signed_).substr(0, l.header_size),
                            std::string_view(signed_).substr(l.header_size, l.payload_size));
  EXPECT_TRUE(Verify(pub_, message, signed_.substr(l.signature_at(), 64)).ok());
}

TEST_F(ReaderRulesTest, Ed25519SignatureOfTheWrongSize) {
  const Layout l = ParseLayout(signed_);
  std::string bytes = signed_;
  bytes.erase(l.signature_at() + 63, 1);
  StoreLe16(&bytes[l.trailer_at + 2], 63);
  StoreLe32(&bytes[bytes.size() - 12], 84 + 63);
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kDataLoss, "Ed25519 signature of 63 bytes"));
}

TEST_F(ReaderRulesTest, UnknownSignatureAlgorithm) {
  const Layout l = ParseLayout(signed_);
  for (uint16_t alg : {uint16_t{2}, uint16_t{0xffff}}) {
    std::string bytes = signed_;
    StoreLe16(&bytes[l.trailer_at], alg);
    // The trailer is outside the digest: a changed byte and a newer writer look alike.
    EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kUnimplemented,
                         "unknown signature algorithm " + std::to_string(alg) +
                             "; upgrade capsule if a newer capsule wrote it, otherwise the file "
                             "is damaged or was altered"));
  }
}

TEST_F(ReaderRulesTest, Ed25519SignatureOfHalfOrTwiceTheSize) {
  const Layout l = ParseLayout(signed_);
  for (uint16_t n : {uint16_t{32}, uint16_t{128}}) {
    std::string bytes = signed_.substr(0, l.signature_at()) + std::string(n, '\x5a');
    StoreLe16(&bytes[l.trailer_at + 2], n);
    char tail[4];
    StoreLe32(tail, 84 + n);
    bytes.append(tail, 4);
    bytes.append(kEndMagic);
    EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kDataLoss,
                         "corrupt trailer (Ed25519 signature of " + std::to_string(n) + " bytes)"))
        << n;
  }
}

// ---- 7. Uncompressed-size cap -----------------------------------------------------------------

TEST_F(ReaderRulesTest, OverTheUncompressedSizeCap) {
  const uint64_t declared = LoadLe64(&signed_[kOffUncompressedSize]);
  ReadOptions o = Strict();
  o.max_uncompressed_bytes = declared - 1;
  EXPECT_TRUE(HasError(DecodeCapsule(signed_, o), StatusCode::kResourceExhausted,
                       "payload declares " + std::to_string(declared) +
                           " bytes uncompressed, over the limit of " +
                           std::to_string(declared - 1)));
  o.max_uncompressed_bytes = declared;
  EXPECT_TRUE(DecodeCapsule(signed_, o).ok());
}

// ---- 8. zstd ----------------------------------------------------------------------------------

TEST_F(ReaderRulesTest, PayloadIsNotAZstdFrame) {
  EXPECT_TRUE(HasError(Decode(Sealed("not zstd at all", 10)), StatusCode::kDataLoss,
                       "payload is not a zstd frame (bad magic)"));
  EXPECT_TRUE(HasError(Decode(Sealed("\x28\xb5", 10)), StatusCode::kDataLoss,
                       "not a zstd frame (too short)"));
  EXPECT_TRUE(HasError(Decode(Sealed("", 0)), StatusCode::kDataLoss, "not a zstd frame"));
}

TEST_F(ReaderRulesTest, HeaderAndFrameDisagreeOnTheSize) {
  const std::string serialized = SerializeDeterministic(MakeMinimalCapsule());
  EXPECT_TRUE(HasError(Decode(Sealed(Frame(serialized), serialized.size() + 1)),
                       StatusCode::kDataLoss,
                       "zstd frame declares " + std::to_string(serialized.size()) +
                           " bytes but the header says " + std::to_string(serialized.size() + 1)));
}

TEST_F(ReaderRulesTest, FrameWithoutContentSize) {
  const std::string data = SerializeDeterministic(MakeFullCapsule());
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::string frame(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), data.data(), data.size());
  ZSTD_freeCCtx(cctx);
  ASSERT_FALSE(ZSTD_isError(n));
  frame.resize(n);
  EXPECT_TRUE(HasError(Decode(Sealed(frame, data.size())), StatusCode::kDataLoss,
                       "zstd frame does not declare its content size"));
}

TEST_F(ReaderRulesTest, FrameWithoutChecksum) {
  const std::string data = SerializeDeterministic(MakeFullCapsule());
  std::string frame(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(frame.data(), frame.size(), data.data(), data.size(), 3);
  ASSERT_FALSE(ZSTD_isError(n));
  frame.resize(n);
  EXPECT_TRUE(HasError(Decode(Sealed(frame, data.size())), StatusCode::kDataLoss,
                       "zstd frame has no content checksum"));
}

TEST_F(ReaderRulesTest, BytesAfterTheFrame) {
  const std::string serialized = SerializeDeterministic(MakeMinimalCapsule());
  EXPECT_TRUE(HasError(Decode(Sealed(Frame(serialized) + "junk", serialized.size())),
                       StatusCode::kDataLoss, "payload holds bytes after its zstd frame"));
  // Two frames: only one is allowed.
  EXPECT_TRUE(HasError(Decode(Sealed(Frame(serialized) + Frame(serialized), serialized.size())),
                       StatusCode::kDataLoss, "after its zstd frame"));
}

TEST_F(ReaderRulesTest, TruncatedFrame) {
  const std::string serialized = SerializeDeterministic(MakeFullCapsule());
  const std::string frame = Frame(serialized);
  EXPECT_TRUE(HasError(Decode(Sealed(frame.substr(0, frame.size() - 5), serialized.size())),
                       StatusCode::kDataLoss, "zstd frame is truncated or malformed"));
}

TEST_F(ReaderRulesTest, ZstdChecksumCatchesCorruptContent) {
  // The digest is re-sealed over the corrupt frame: only zstd's checksum can catch it.
  const std::string data = Incompressible(4096);
  std::string frame = Frame(data);
  ASSERT_GT(frame.size(), data.size()) << "expected a raw (stored) block";
  frame[frame.size() / 2] ^= 0x01;
  EXPECT_TRUE(HasError(Decode(Sealed(frame, data.size())), StatusCode::kDataLoss,
                       "corrupt payload: zstd: Restored data doesn't match checksum"));
}

TEST_F(ReaderRulesTest, ZstdChecksumFieldCorrupt) {
  const std::string serialized = SerializeDeterministic(MakeFullCapsule());
  std::string frame = Frame(serialized);
  frame.back() ^= 0x40;
  EXPECT_TRUE(
      HasError(Decode(Sealed(frame, serialized.size())), StatusCode::kDataLoss, "checksum"));
}

TEST_F(ReaderRulesTest, CorruptCompressedBlock) {
  const std::string serialized = SerializeDeterministic(MakeFullCapsule());
  const std::string frame = Frame(serialized);
  ASSERT_LT(frame.size(), serialized.size()) << "expected a compressed block";
  // Whatever zstd says about each corruption, it is DATA_LOSS and never a crash.
  for (size_t i = 12; i < frame.size() - 4; i += 7) {
    std::string bad = frame;
    bad[i] ^= 0x5a;
    EXPECT_TRUE(HasError(Decode(Sealed(bad, serialized.size())), StatusCode::kDataLoss, "zstd"))
        << i;
  }
}

// ---- 9. Protobuf parse ------------------------------------------------------------------------

TEST_F(ReaderRulesTest, PayloadIsNotAProtobuf) {
  // Field 1 with wire type 7 does not exist; a truncated length-delimited field neither.
  for (std::string_view junk :
       {std::string_view("\x0f\x00\x00\x00", 4), std::string_view("\x0a\xff\x01", 3)}) {
    EXPECT_TRUE(HasError(Decode(SealedMessage(junk)), StatusCode::kDataLoss,
                         "corrupt payload (not a capsule.v1.Capsule message)"));
  }
}

// ---- 10. ValidateCapsule ----------------------------------------------------------------------

TEST_F(ReaderRulesTest, ValidProtobufInvalidContent) {
  v1::Capsule c = MakeMinimalCapsule();
  c.clear_writer_version();
  EXPECT_TRUE(HasError(Decode(SealedMessage(SerializeDeterministic(c))),
                       StatusCode::kInvalidArgument,
                       "invalid capsule content: writer_version: must be set"));
  EXPECT_TRUE(
      HasError(Decode(SealedMessage("")), StatusCode::kInvalidArgument, "invalid capsule content"));
}

TEST_F(ReaderRulesTest, ValidationCannotBeTurnedOff) {
  // `verify` without --deep set validate = false and accepted content no other command can use
  // (trigger.kind 99, a first anomalous layer that does not exist). Every read checks the rules.
  v1::Capsule c = MakeMinimalCapsule();
  c.clear_trigger();
  ReadOptions o = Strict();
  o.validate = false;
  EXPECT_TRUE(HasError(DecodeCapsule(SealedMessage(SerializeDeterministic(c)), o),
                       StatusCode::kInvalidArgument, "invalid capsule content: trigger.kind"));
  c = MakeMinimalCapsule();
  c.mutable_trigger()->set_kind(static_cast<v1::TriggerKind>(99));
  EXPECT_TRUE(HasError(DecodeCapsule(SealedMessage(SerializeDeterministic(c)), o),
                       StatusCode::kInvalidArgument,
                       "invalid capsule content: trigger.kind: 99 is not a known TriggerKind"));
}

TEST_F(ReaderRulesTest, TensorDigestsAreCheckedOnlyWhenAsked) {
  v1::Capsule c = MakeFullCapsule();
  c.mutable_tensors(1)->set_sha256(*Sha256Hex("something else"));
  const std::string bytes = SealedMessage(SerializeDeterministic(c));
  EXPECT_TRUE(Decode(bytes).ok());
  ReadOptions o = Strict();
  o.verify_tensor_digests = true;
  EXPECT_TRUE(HasError(DecodeCapsule(bytes, o), StatusCode::kInvalidArgument,
                       "invalid capsule content: tensors[1] (blocks.0.attn.qkv.weight): sha256 "
                       "does not match data"));
}

// ---- Order: cheapest check first, verify before parse -----------------------------------------

TEST_F(ReaderRulesTest, MagicBeforeEverything) {
  std::string bytes = SetMajor(signed_, 7);
  bytes[0] = 'P';
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kInvalidArgument, "bad magic"));
}

TEST_F(ReaderRulesTest, VersionBeforeSizes) {
  // A 2.x file may lay out its sizes differently: it must read as "newer", not "truncated".
  EXPECT_TRUE(HasError(Decode(TruncateTo(SetMajor(signed_, 2), 60)), StatusCode::kUnimplemented,
                       "newer than this reader"));
  EXPECT_TRUE(HasError(Decode(SetMajor(signed_, 2) + "more"), StatusCode::kUnimplemented, "newer"));
}

TEST_F(ReaderRulesTest, RequiredFlagsBeforeDigest) {
  std::string bytes = SetRequiredFlag(signed_, 1u << 3);
  bytes[ParseLayout(bytes).header_size + 2] ^= 0x01;
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kUnimplemented, "required flags"));
}

TEST_F(ReaderRulesTest, TrailerFieldsBeforeDigest) {
  // FORMAT.md §6 check 8 comes before check 9: the algorithm, signature size and key id are
  // judged without hashing anything.
  const Layout l = ParseLayout(unsigned_);
  std::string bytes = FlipByte(unsigned_, l.key_id_at(), 0x01);
  bytes[l.header_size + 1] ^= 0x01;
  EXPECT_TRUE(HasError(DecodeCapsule(bytes, AllowUnsigned()), StatusCode::kDataLoss,
                       "unsigned capsule with a key id or signature"));
  std::string unknown = signed_;
  StoreLe16(&unknown[ParseLayout(signed_).trailer_at], 7);
  unknown[ParseLayout(signed_).header_size + 1] ^= 0x01;
  EXPECT_TRUE(HasError(Decode(unknown), StatusCode::kUnimplemented, "unknown signature algorithm"));
}

TEST_F(ReaderRulesTest, DigestBeforeSignature) {
  const Layout l = ParseLayout(signed_);
  std::string bytes = ResignWith(signed_, other_key_);
  bytes[l.header_size] ^= 0x01;
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kDataLoss, "digest"));
}

TEST_F(ReaderRulesTest, SignatureBeforeDecompression) {
  // A corrupt frame under a bad signature: nothing is decompressed for an unauthenticated sender.
  const std::string data = Incompressible(512);
  std::string frame = Frame(data);
  frame[frame.size() / 2] ^= 0x01;
  std::string bytes = Sealed(frame, data.size());
  const Layout l = ParseLayout(bytes);
  bytes[l.signature_at() + 5] ^= 0x01;
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kUnauthenticated, "bad signature"));
  EXPECT_TRUE(HasError(Decode(Sealed(frame, data.size())), StatusCode::kDataLoss, "checksum"));
}

TEST_F(ReaderRulesTest, UnsignedRefusedBeforeDecompression) {
  RawHeader h;
  h.uncompressed_size = 100;
  const std::string bytes = BuildEnvelope(h, "junk that is not zstd", nullptr);
  EXPECT_TRUE(HasError(Decode(bytes), StatusCode::kUnauthenticated, "unsigned"));
  EXPECT_TRUE(HasError(DecodeCapsule(bytes, AllowUnsigned()), StatusCode::kDataLoss, "zstd"));
}

TEST_F(ReaderRulesTest, SizeCapBeforeDecompression) {
  RawHeader h;
  h.uncompressed_size = uint64_t{1} << 40;
  EXPECT_TRUE(HasError(Decode(BuildEnvelope(h, "junk that is not zstd", &key_)),
                       StatusCode::kResourceExhausted, "over the limit"));
}

TEST_F(ReaderRulesTest, ReadCapsuleFileNamesThePath) {
  ReadOptions o = Strict();
  StatusOr<DecodedCapsule> missing = ReadCapsuleFile("/nonexistent/dir/x.capsule", o);
  EXPECT_TRUE(HasError(missing, StatusCode::kNotFound, "/nonexistent/dir/x.capsule"));
}

}  // namespace
}  // namespace capsule::test
