// Derivations (format/derivation.h, FORMAT.md §3.1): a capsule made from another records who
// signed its source and how far its maker trusted them, and every reader holds the capsule to the
// least trusted of its own signer and those sources (DecodeCapsule, check 21), so re-signing an
// untrusted capsule with a trusted key does not make its content trusted.
#include "capsule/format/derivation.h"

#include <gtest/gtest.h>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/format/capsule_test_util.h"

namespace capsule::test {
namespace {

using internal::LoadLe64;

class DerivationTest : public CapsuleBytesTest {
 protected:
  // The envelope of `bytes` as a reader trusting key_ alone (and allowing the rest) sees it.
  EnvelopeInfo Opened(std::string_view bytes) const {
    OpenOptions o;
    o.trusted_keys.push_back(pub_);
    o.allow_untrusted = o.allow_unsigned = true;
    return OrDie(OpenEnvelope(bytes, o)).info;
  }
  // A capsule made by `tool` from `source` (bytes), then signed with key_, the reader's own key.
  std::string DerivedFrom(std::string_view source, const char* tool = "extract") const {
    v1::Capsule out = MakeMinimalCapsule();
    Status s = RecordDerivation(MakeMinimalCapsule(), Opened(source), *Sha256Hex(source), tool,
                                1780000000000000, &out);
    EXPECT_TRUE(s.ok()) << s;
    return EncodeSigned(out);
  }
  // signed_ as a 1.0 writer seals it with `key`, the signature then replaced by zeros: a 1.0
  // capsule carries no signer key, so without the key nothing can tell.
  std::string Format10WithZeroSignature(const PrivateKey& key) const {
    SealOptions seal;
    seal.signing_key = &key;
    seal.embed_signer_key = false;
    std::string bytes = OrDie(SealEnvelope(OrDie(OpenEnvelope(signed_,
                                                              [&] {
                                                                OpenOptions o;
                                                                o.trusted_keys.push_back(pub_);
                                                                return o;
                                                              }()))
                                               .payload,
                                           LoadLe64(&signed_[32]), seal));
    const Layout l = ParseLayout(bytes);
    bytes.replace(l.signature_at(), kEd25519SignatureSize, std::string(64, '\0'));
    return bytes;
  }
};

TEST_F(DerivationTest, RecordNamesTheSourceItsSignerAndTheTrustItHad) {
  const std::string source = ResignWith(signed_, other_key_);
  v1::Capsule out;
  ASSERT_TRUE(RecordDerivation(MakeMinimalCapsule(), Opened(source), *Sha256Hex(source), "extract",
                               1780000000000000, &out)
                  .ok());
  ASSERT_EQ(out.derivations_size(), 1);
  const v1::Derivation& d = out.derivations(0);
  EXPECT_EQ(d.tool(), "extract");
  EXPECT_EQ(d.source_sha256(), *Sha256Hex(source));
  EXPECT_EQ(d.source_trust(), v1::TRUST_VALID_UNKNOWN_SIGNER);
  EXPECT_EQ(d.source_signer_key_id(), other_pub_.KeyIdHex());
  EXPECT_EQ(d.derived_unix_micros(), 1780000000000000);
  // Each signature state, as the reader saw it.
  v1::Capsule trusted = MakeMinimalCapsule();
  v1::Capsule unsigned_source = MakeMinimalCapsule();
  ASSERT_TRUE(RecordDerivation(MakeMinimalCapsule(), Opened(signed_), *Sha256Hex(signed_), "redact",
                               0, &trusted)
                  .ok());
  EXPECT_EQ(trusted.derivations(0).source_trust(), v1::TRUST_VERIFIED);
  EXPECT_EQ(trusted.derivations(0).source_signer_key_id(), pub_.KeyIdHex());
  EXPECT_GT(trusted.derivations(0).derived_unix_micros(), 1700000000000000) << "now, when 0";
  ASSERT_TRUE(RecordDerivation(MakeMinimalCapsule(), Opened(unsigned_), *Sha256Hex(unsigned_),
                               "minimize", 0, &unsigned_source)
                  .ok());
  EXPECT_EQ(unsigned_source.derivations(0).source_trust(), v1::TRUST_UNSIGNED);
  EXPECT_EQ(unsigned_source.derivations(0).source_signer_key_id(), "");
  EXPECT_TRUE(ValidateCapsule(unsigned_source).ok()) << ValidateCapsule(unsigned_source);
}

TEST_F(DerivationTest, TheChainRunsBackToTheFirstCapsule) {
  // A redaction of an extract: the extract's record comes first, also when redact edits the
  // message it read in place.
  v1::Capsule extract = MakeMinimalCapsule();
  const std::string stranger = ResignWith(signed_, other_key_);
  ASSERT_TRUE(RecordDerivation(MakeMinimalCapsule(), Opened(stranger), *Sha256Hex(stranger),
                               "extract", 0, &extract)
                  .ok());
  const std::string extract_bytes = EncodeSigned(extract);
  ASSERT_TRUE(RecordDerivation(extract, Opened(extract_bytes), *Sha256Hex(extract_bytes), "redact",
                               0, &extract)
                  .ok());
  ASSERT_EQ(extract.derivations_size(), 2);
  EXPECT_EQ(extract.derivations(0).tool(), "extract");
  EXPECT_EQ(extract.derivations(1).tool(), "redact");
  EXPECT_EQ(extract.derivations(1).source_trust(), v1::TRUST_VERIFIED);
  // The weakest link is the stranger's capsule, however trusted the later steps.
  ASSERT_NE(UntrustedSource(extract), nullptr);
  EXPECT_EQ(UntrustedSource(extract)->tool(), "extract");
}

TEST_F(DerivationTest, RecordRefusesWhatTheSchemaRefuses) {
  v1::Capsule out;
  EXPECT_TRUE(HasError(RecordDerivation(MakeMinimalCapsule(), Opened(signed_), *Sha256Hex(signed_),
                                        "Redact", 0, &out),
                       StatusCode::kInvalidArgument, "tool name"));
  EXPECT_TRUE(
      HasError(RecordDerivation(MakeMinimalCapsule(), Opened(signed_), "abc", "redact", 0, &out),
               StatusCode::kInvalidArgument, "SHA-256"));
  v1::Capsule full_chain = MakeMinimalCapsule();
  for (int i = 0; i < kMaxDerivations; ++i) {
    ASSERT_TRUE(
        RecordDerivation(full_chain, Opened(signed_), *Sha256Hex(signed_), "redact", 0, &full_chain)
            .ok());
  }
  EXPECT_TRUE(ValidateCapsule(full_chain).ok());
  EXPECT_TRUE(HasError(
      RecordDerivation(full_chain, Opened(signed_), *Sha256Hex(signed_), "redact", 0, &out),
      StatusCode::kResourceExhausted, "start from an earlier one"));
}

TEST_F(DerivationTest, AReaderHoldsACapsuleToItsLeastTrustedSource) {
  // Signed with the reader's own trusted key, made from a capsule signed by a stranger.
  const std::string laundered = DerivedFrom(ResignWith(signed_, other_key_));
  EXPECT_TRUE(HasError(Decode(laundered), StatusCode::kUnauthenticated,
                       "capsule was made by extract from capsule " +
                           Sha256Hex(ResignWith(signed_, other_key_))->substr(0, 16) +
                           ", valid signature by key " + other_pub_.KeyIdHex().substr(0, 16) +
                           ", NOT trusted by its maker"));
  ReadOptions o = Strict();
  o.allow_untrusted = true;
  StatusOr<DecodedCapsule> allowed = DecodeCapsule(laundered, o);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->envelope.signature, SignatureState::kVerified) << "the envelope is the key's";
  // Made from an unsigned capsule: allowing untrusted signers is not enough, as for the capsule.
  const std::string from_unsigned = DerivedFrom(unsigned_, "minimize");
  EXPECT_TRUE(HasError(DecodeCapsule(from_unsigned, o), StatusCode::kUnauthenticated,
                       "capsule was made by minimize from capsule " +
                           Sha256Hex(unsigned_)->substr(0, 16) + ", which was UNSIGNED"));
  o.allow_unsigned = true;
  EXPECT_TRUE(DecodeCapsule(from_unsigned, o).ok());
  // Made from a capsule the maker trusted: trusted as the signer is.
  EXPECT_TRUE(Decode(DerivedFrom(signed_, "redact")).ok());
}

TEST_F(DerivationTest, AFormat10CapsuleWithAZeroSignatureStaysUnchecked) {
  // A 1.0 capsule carries no signer key: without --pubkey its signature (here all zeros) is not
  // checked at all. Re-signing it with the reader's key used to make it verify.
  const std::string zero = Format10WithZeroSignature(other_key_);
  ReadOptions o;
  o.allow_untrusted = true;
  EXPECT_EQ(OrDie(DecodeCapsule(zero, o)).envelope.signature, SignatureState::kNotChecked);
  const std::string laundered = DerivedFrom(zero, "redact");
  EXPECT_TRUE(HasError(Decode(laundered), StatusCode::kUnauthenticated,
                       "(format 1.0), signature NOT checked by its maker"));
}

TEST_F(DerivationTest, TheWeakestSourceIsTheOneNamed) {
  v1::Capsule c = MakeMinimalCapsule();
  for (const auto& [bytes, tool] : {std::pair<std::string, const char*>{signed_, "redact"},
                                    {ResignWith(signed_, other_key_), "extract"},
                                    {unsigned_, "minimize"},
                                    {Format10WithZeroSignature(other_key_), "redact"}}) {
    ASSERT_TRUE(RecordDerivation(c, Opened(bytes), *Sha256Hex(bytes), tool, 0, &c).ok());
  }
  ASSERT_NE(UntrustedSource(c), nullptr);
  EXPECT_EQ(UntrustedSource(c)->source_trust(), v1::TRUST_UNSIGNED);
  EXPECT_EQ(UntrustedSource(c)->tool(), "minimize");
  EXPECT_EQ(UntrustedSource(MakeMinimalCapsule()), nullptr);
  EXPECT_TRUE(CheckDerivations(c, /*allow_untrusted=*/true, /*allow_unsigned=*/true).ok());
  EXPECT_TRUE(HasError(CheckDerivations(c, true, false), StatusCode::kUnauthenticated, "UNSIGNED"));
}

TEST(DescribeDerivationTest, SaysWhoSignedTheSourceAndHowFarItWasTrusted) {
  v1::Derivation d;
  d.set_tool("extract");
  d.set_source_sha256(std::string(64, 'a'));
  d.set_source_signer_key_id(std::string(64, 'b'));
  d.set_source_trust(v1::TRUST_VERIFIED);
  EXPECT_EQ(DescribeDerivation(d),
            "made by extract from capsule aaaaaaaaaaaaaaaa, signed by key bbbbbbbbbbbbbbbb, "
            "trusted by its maker");
  d.set_source_trust(v1::TRUST_VALID_UNKNOWN_SIGNER);
  EXPECT_EQ(DescribeDerivation(d),
            "made by extract from capsule aaaaaaaaaaaaaaaa, valid signature by key "
            "bbbbbbbbbbbbbbbb, NOT trusted by its maker");
  d.set_source_trust(v1::TRUST_NOT_CHECKED);
  EXPECT_EQ(DescribeDerivation(d),
            "made by extract from capsule aaaaaaaaaaaaaaaa, signed by key bbbbbbbbbbbbbbbb "
            "(format 1.0), signature NOT checked by its maker");
  d.set_source_trust(v1::TRUST_UNSIGNED);
  d.clear_source_signer_key_id();
  EXPECT_EQ(DescribeDerivation(d),
            "made by extract from capsule aaaaaaaaaaaaaaaa, which was UNSIGNED");
}

}  // namespace
}  // namespace capsule::test
