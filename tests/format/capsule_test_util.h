// Test-only helpers for the capsule format tests: sample capsules (one that sets every field of
// capsule.proto, one as small as the schema allows), a hand-written envelope builder that does not
// go through SealEnvelope, and the CapsuleBytesTest fixture with byte-surgery helpers.
//
// Surgery helpers that edit a header field re-seal the capsule (digest, and the signature with the
// key that made it) so that only the rule under test fires; FlipByte and TruncateTo do not.
//
//   TEST_F(CapsuleBytesTest, UnknownRequiredFlag) {
//     ExpectError(Decode(SetRequiredFlag(signed_, 1u << 7)), StatusCode::kUnimplemented, "flags");
//   }
//
// Thread safety: the free functions are thread-safe.
#ifndef CAPSULE_TESTS_FORMAT_CAPSULE_TEST_UTIL_H_
#define CAPSULE_TESTS_FORMAT_CAPSULE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::test {

// Test setup that cannot go on without a value: a fixture constructor cannot ASSERT.
template <typename T>
T OrDie(StatusOr<T> s) {
  if (!s.ok()) {
    std::cerr << "test setup failed: " << s.status() << "\n";
    std::abort();
  }
  return std::move(*s);
}

// A deterministic key (32 bytes of `fill` as the seed): failures reproduce byte for byte.
PrivateKey FixedKey(char fill);

// Sets name, meta (dtype, shape), data and the data's SHA-256.
void SetTensor(v1::TensorBlob* t, const std::string& name, v1::DType dtype,
               const std::vector<int64_t>& shape, const std::string& data);

// A capsule with every field of every message set (and maps and repeated fields non-empty);
// AllFieldsSet() checks it, so a field added to capsule.proto must be added here too.
v1::Capsule MakeFullCapsule();
// The smallest capsule ValidateCapsule accepts.
v1::Capsule MakeMinimalCapsule();
// Paths ("step.history[].loss") of fields never set anywhere in `message`; empty when every field
// of every reachable message type is set in at least one instance.
std::vector<std::string> UnsetFieldPaths(const google::protobuf::Message& message);

// Where the parts of a well-formed capsule lie (FORMAT.md envelope layout).
struct Layout {
  size_t header_size = 0;
  size_t payload_size = 0;
  size_t trailer_at = 0;
  uint16_t sig_alg = 0;
  uint16_t sig_size = 0;
  size_t file_size = 0;

  size_t key_id_at() const { return trailer_at + 8; }
  size_t digest_at() const { return trailer_at + 40; }
  size_t signature_at() const { return trailer_at + 72; }
  size_t trailer_size_at() const { return file_size - 12; }
  size_t end_magic_at() const { return file_size - 8; }
};
// Aborts on bytes whose sizes do not add up: only for capsules the test itself made.
Layout ParseLayout(std::string_view bytes);

// domain tag ‖ header bytes ‖ SHA-256(payload), spelled out here rather than taken from
// proto/envelope.cc so a mistake there is not copied into the expectations.
std::string ExpectedSignedMessage(std::string_view header, std::string_view payload);

// Header fields as raw numbers, so tests can write values SealEnvelope never would.
struct RawHeader {
  uint16_t major = 1;
  uint16_t minor = 0;
  uint32_t header_size = 48;  // bytes past 48 are written as zeros
  uint32_t required_flags = 0;
  uint32_t optional_flags = 0;
  std::optional<uint64_t> payload_size;  // the payload's real size when unset
  uint64_t uncompressed_size = 0;
  uint32_t codec = 1;
  uint32_t reserved = 0;
  std::string signer_key;  // written at offset 48 when set (1.1; the caller sets the size, flag)
};

// Header ‖ payload ‖ a trailer with a correct digest; signed with `key` when it is not null.
std::string BuildEnvelope(const RawHeader& header, std::string_view payload, const PrivateKey* key);

// Replaces the trailer of a well-formed capsule by one whose digest (and signature and key id,
// when `key` is not null; unsigned otherwise) match the header and payload as they now are.
std::string Reseal(std::string_view bytes, const PrivateKey* key);

// `n` bytes zstd cannot shrink (xorshift), always the same: the frame stores them in a raw block,
// so a flipped byte in the middle changes the content, not the block structure.
std::string Incompressible(size_t n);

// Deterministic serialization of `capsule` (what EncodeCapsule compresses).
std::string SerializeDeterministic(const v1::Capsule& capsule);

// Asserts the exact code and that the message contains `substring`.
::testing::AssertionResult HasError(const Status& status, StatusCode code,
                                    std::string_view substring);
template <typename T>
::testing::AssertionResult HasError(const StatusOr<T>& s, StatusCode code,
                                    std::string_view substring) {
  return HasError(s.status(), code, substring);
}

class CapsuleBytesTest : public ::testing::Test {
 protected:
  CapsuleBytesTest();

  // Trusts key_ only; unsigned and untrusted are refused.
  ReadOptions Strict() const;
  // Strict() plus allow_unsigned.
  ReadOptions AllowUnsigned() const;
  StatusOr<DecodedCapsule> Decode(std::string_view bytes) const {
    return DecodeCapsule(bytes, Strict());
  }

  std::string EncodeSigned(const v1::Capsule& capsule) const;
  std::string EncodeUnsigned(const v1::Capsule& capsule) const;

  static std::string FlipByte(std::string bytes, size_t offset, uint8_t mask);
  static std::string TruncateTo(std::string bytes, size_t n);
  // Header edits, re-sealed with the key that signed `bytes` (or unsigned, if it was).
  std::string SetRequiredFlag(std::string bytes, uint32_t bit) const;
  std::string SetMajor(std::string bytes, uint16_t major) const;
  std::string SetHeader32(std::string bytes, size_t offset, uint32_t value) const;
  std::string SetHeader64(std::string bytes, size_t offset, uint64_t value) const;
  // Applies `edit` to the header bytes, then re-seals.
  std::string EditHeader(std::string bytes, const std::function<void(char*)>& edit) const;
  // Recomputes digest, key id and signature with `key`.
  static std::string ResignWith(std::string_view bytes, const PrivateKey& key);
  // The key among key_ / other_key_ that signed `bytes`; nullptr when unsigned.
  const PrivateKey* SignerOf(std::string_view bytes) const;

  PrivateKey key_;
  PublicKey pub_;
  PrivateKey other_key_;
  PublicKey other_pub_;
  std::string signed_;    // MakeMinimalCapsule(), signed with key_
  std::string unsigned_;  // MakeMinimalCapsule(), unsigned
};

}  // namespace capsule::test

#endif  // CAPSULE_TESTS_FORMAT_CAPSULE_TEST_UTIL_H_
