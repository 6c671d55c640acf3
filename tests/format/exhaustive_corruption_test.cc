// proto/FORMAT.md §6: every single-byte flip and every truncation of a capsule is rejected with
// the right code. Exhaustive over small capsules; each region of the file is also held to its own
// code.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "capsule/format/capsule_reader.h"
#include "tests/format/capsule_test_util.h"

namespace capsule::test {
namespace {

class ExhaustiveTest : public CapsuleBytesTest {
 protected:
  // The code a flip at `offset` must give in a capsule read with `options`.
  struct Expectation {
    std::optional<StatusCode> code;  // nullopt: any rejection (the field steers the parse)
    const char* substring = "";
  };
  static Expectation Expected(const Layout& l, size_t offset, bool is_signed) {
    if (offset < 8) return {StatusCode::kInvalidArgument, "bad magic"};
    if (offset < 10) return {};  // major: 0 is corrupt, above 1 is newer
    if (offset < 12) return {StatusCode::kDataLoss, "digest mismatch"};  // minor
    if (offset < 16) return {};  // header size: moves the payload and trailer
    if (offset < 20) return {StatusCode::kUnimplemented, "required flags"};
    if (offset < 24) return {StatusCode::kDataLoss, "digest mismatch"};  // optional flags
    if (offset < 32) return {};  // payload size: moves the trailer
    if (offset < 40) return {StatusCode::kDataLoss, "digest mismatch"};  // uncompressed size
    if (offset < 44) return {StatusCode::kDataLoss, "unknown payload codec"};
    if (offset < 48) return {StatusCode::kDataLoss, "reserved field is not zero"};
    if (offset < l.trailer_at) return {StatusCode::kDataLoss, "digest mismatch"};
    if (offset < l.trailer_at + 4) return {};  // algorithm and signature size
    if (offset < l.trailer_at + 8) return {StatusCode::kDataLoss, "reserved field is not zero"};
    if (offset < l.digest_at()) {
      // A signed capsule names its signer twice: the key in the (digested) header, whose SHA-256
      // the trailer's key id must be.
      return is_signed
                 ? Expectation{StatusCode::kDataLoss, "signer key is not the trailer's key id"}
                 : Expectation{StatusCode::kDataLoss, "unsigned capsule with a key id"};
    }
    if (offset < l.signature_at()) return {StatusCode::kDataLoss, "digest mismatch"};
    if (offset < l.trailer_size_at()) return {StatusCode::kUnauthenticated, "bad signature"};
    if (offset < l.end_magic_at()) {
      return {StatusCode::kDataLoss, "trailer size does not match the signature size"};
    }
    return {StatusCode::kDataLoss, "bad end magic"};
  }

  // Flips every byte with each mask; checks the region's code where it has one, and that no flip
  // is accepted or reported as an internal error anywhere.
  void CheckEveryFlip(const std::string& bytes, const ReadOptions& options, bool is_signed) {
    const Layout l = ParseLayout(bytes);
    std::map<StatusCode, int> seen;
    for (size_t i = 0; i < bytes.size(); ++i) {
      for (uint8_t mask : {uint8_t{0x01}, uint8_t{0xff}}) {
        const Status s = DecodeCapsule(FlipByte(bytes, i, mask), options).status();
        ++seen[s.code()];
        ASSERT_FALSE(s.ok()) << "flip of byte " << i << " with mask " << int{mask}
                             << " was accepted";
        ASSERT_NE(s.code(), StatusCode::kInternal) << i << ": " << s;
        ASSERT_NE(s.code(), StatusCode::kUnknown) << i << ": " << s;
        const Expectation e = Expected(l, i, is_signed);
        if (e.code.has_value()) {
          ASSERT_TRUE(HasError(s, *e.code, e.substring))
              << "flip of byte " << i << " with mask " << int{mask};
        }
      }
    }
    for (const auto& [code, n] : seen) {
      RecordProperty(std::string(StatusCodeName(code)), n);
    }
  }

  void CheckEveryTruncation(const std::string& bytes, const ReadOptions& options) {
    // Cut to nothing, the file is no capsule at all (FORMAT.md §6 check 2).
    ASSERT_TRUE(HasError(DecodeCapsule(TruncateTo(bytes, 0), options), StatusCode::kInvalidArgument,
                         "empty file (0 bytes): not a capsule"));
    for (size_t n = 1; n < bytes.size(); ++n) {
      ASSERT_TRUE(HasError(DecodeCapsule(TruncateTo(bytes, n), options), StatusCode::kOutOfRange,
                           "truncated capsule"))
          << "truncated to " << n << " of " << bytes.size() << " bytes";
    }
  }
};

TEST_F(ExhaustiveTest, SmallCapsuleIsAcceptedUnmodified) {
  // The baseline the flips start from: otherwise "rejected" proves nothing.
  ASSERT_TRUE(Decode(signed_).ok());
  ASSERT_TRUE(DecodeCapsule(unsigned_, AllowUnsigned()).ok());
  EXPECT_LT(signed_.size(), 512u);
}

TEST_F(ExhaustiveTest, EveryFlipOfASignedCapsuleIsRejected) {
  CheckEveryFlip(signed_, Strict(), /*is_signed=*/true);
}

TEST_F(ExhaustiveTest, EveryFlipOfASignedCapsuleIsRejectedWhenUnsignedIsAllowed) {
  // allow_unsigned must not let a flip of the algorithm byte strip the signature.
  CheckEveryFlip(signed_, AllowUnsigned(), /*is_signed=*/true);
}

TEST_F(ExhaustiveTest, EveryFlipOfAnUnsignedCapsuleIsRejectedByTheDigest) {
  CheckEveryFlip(unsigned_, AllowUnsigned(), /*is_signed=*/false);
}

TEST_F(ExhaustiveTest, EveryFlipOfAFullCapsuleIsRejected) {
  CheckEveryFlip(EncodeSigned(MakeFullCapsule()), Strict(), /*is_signed=*/true);
}

TEST_F(ExhaustiveTest, EveryTruncationOfASignedCapsuleIsOutOfRange) {
  CheckEveryTruncation(signed_, Strict());
}

TEST_F(ExhaustiveTest, EveryTruncationOfAnUnsignedCapsuleIsOutOfRange) {
  CheckEveryTruncation(unsigned_, AllowUnsigned());
}

TEST_F(ExhaustiveTest, EveryTruncationOfAFullCapsuleIsOutOfRange) {
  CheckEveryTruncation(EncodeSigned(MakeFullCapsule()), Strict());
}

TEST_F(ExhaustiveTest, EveryTruncationOfALongerHeaderCapsuleIsOutOfRange) {
  // A 1.x header longer than 48 bytes: cuts inside the unknown header tail are still truncations.
  const std::string serialized = SerializeDeterministic(MakeMinimalCapsule());
  RawHeader h;
  h.header_size = 80;
  h.uncompressed_size = serialized.size();
  const std::string frame = OrDie(EncodeCapsule(MakeMinimalCapsule(), WriteOptions()));
  const Layout inner = ParseLayout(frame);
  const std::string bytes = BuildEnvelope(
      h, std::string_view(frame).substr(inner.header_size, inner.payload_size), &key_);
  ASSERT_TRUE(Decode(bytes).ok()) << Decode(bytes).status();
  CheckEveryTruncation(bytes, Strict());
}

TEST_F(ExhaustiveTest, EveryTrailingExtensionIsDataLoss) {
  for (size_t extra = 1; extra <= 200; ++extra) {
    ASSERT_TRUE(HasError(Decode(signed_ + std::string(extra, '\0')), StatusCode::kDataLoss,
                         "after the declared end"))
        << extra;
  }
}

}  // namespace
}  // namespace capsule::test
