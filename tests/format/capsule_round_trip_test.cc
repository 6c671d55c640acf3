// Encode → decode gives back the message; encoding is deterministic; the bytes follow the
// envelope layout field by field (checked here by hand, not through the reader).
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <zstd.h>

#include <functional>
#include <utility>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/format/capsule_test_util.h"
#include "tests/format/temp_dir.h"

namespace capsule::test {
using ::capsule::internal::LoadLe16;
using ::capsule::internal::LoadLe32;
using ::capsule::internal::LoadLe64;
using ::capsule::internal::StoreLe16;
using ::capsule::internal::StoreLe32;
using ::capsule::internal::StoreLe64;
namespace {

using google::protobuf::util::MessageDifferencer;

class RoundTripTest : public CapsuleBytesTest {};

TEST_F(RoundTripTest, FullCapsuleSigned) {
  const v1::Capsule original = MakeFullCapsule();
  const std::string bytes = EncodeSigned(original);
  ReadOptions o = Strict();
  o.verify_tensor_digests = true;
  StatusOr<DecodedCapsule> d = DecodeCapsule(bytes, o);
  ASSERT_TRUE(d.ok()) << d.status();
  std::string diff;
  MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(original, *d->capsule)) << diff;
  EXPECT_TRUE(MessageDifferencer::Equals(original, *d->capsule));
  // Presence of proto3 optionals survives, not just their values.
  EXPECT_FALSE(d->capsule->step().history(0).has_loss_scale());
  EXPECT_TRUE(d->capsule->step().history(1).has_loss_scale());

  EXPECT_EQ(d->envelope.signature, SignatureState::kVerified);
  EXPECT_EQ(d->envelope.key_id, pub_.KeyId());
  EXPECT_EQ(d->envelope.file_size, bytes.size());
  EXPECT_EQ(d->envelope.header.major, kFormatMajor);
  EXPECT_EQ(d->envelope.header.minor, kFormatMinor);
  EXPECT_EQ(d->envelope.header.uncompressed_size, SerializeDeterministic(original).size());
}

TEST_F(RoundTripTest, FullCapsuleUnsigned) {
  const v1::Capsule original = MakeFullCapsule();
  StatusOr<DecodedCapsule> d = DecodeCapsule(EncodeUnsigned(original), AllowUnsigned());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(MessageDifferencer::Equals(original, *d->capsule));
  EXPECT_EQ(d->envelope.signature, SignatureState::kUnsigned);
}

TEST_F(RoundTripTest, MinimalCapsule) {
  StatusOr<DecodedCapsule> d = Decode(signed_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(MessageDifferencer::Equals(MakeMinimalCapsule(), *d->capsule));
}

TEST_F(RoundTripTest, OptionalFlagsReachTheHeader) {
  WriteOptions w;
  w.signing_key = &key_;
  w.optional_flags = kOptionalFlagRedacted | kOptionalFlagExtract;
  StatusOr<std::string> bytes = EncodeCapsule(MakeMinimalCapsule(), w);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // A signed capsule also says that its header carries the signer key.
  EXPECT_EQ(LoadLe32(&(*bytes)[kOffOptionalFlags]), w.optional_flags | kOptionalFlagSignerKey);
  StatusOr<DecodedCapsule> d = Decode(*bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->envelope.header.optional_flags, w.optional_flags | kOptionalFlagSignerKey);
  w.signing_key = nullptr;
  EXPECT_EQ(LoadLe32(&OrDie(EncodeCapsule(MakeMinimalCapsule(), w))[kOffOptionalFlags]),
            w.optional_flags);
}

TEST_F(RoundTripTest, EncodingIsDeterministic) {
  const v1::Capsule c = MakeFullCapsule();
  EXPECT_EQ(EncodeSigned(c), EncodeSigned(c));
  EXPECT_EQ(EncodeUnsigned(c), EncodeUnsigned(c));
}

TEST_F(RoundTripTest, EncodingDoesNotDependOnTheWorkerCount) {
  const v1::Capsule c = MakeFullCapsule();
  std::vector<std::string> encoded;
  for (int workers : {1, 2, 2, 4}) {
    WriteOptions w;
    w.signing_key = &key_;
    w.compression_workers = workers;
    StatusOr<std::string> bytes = EncodeCapsule(c, w);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    encoded.push_back(*bytes);
  }
  for (const std::string& e : encoded) EXPECT_EQ(e, encoded[0]);
  StatusOr<DecodedCapsule> d = Decode(encoded[1]);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(MessageDifferencer::Equals(c, *d->capsule));
}

TEST_F(RoundTripTest, LargerPayloadWithWorkersIsDeterministic) {
  // Several MiB so zstd actually splits the work between threads.
  v1::Capsule c = MakeFullCapsule();
  std::string data(6 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  SetTensor(c.add_tensors(), "big", v1::UINT8, {static_cast<int64_t>(data.size())}, data);
  WriteOptions w;
  w.compression_workers = 2;
  StatusOr<std::string> a = EncodeCapsule(c, w);
  StatusOr<std::string> b = EncodeCapsule(c, w);
  w.compression_workers = 3;
  StatusOr<std::string> three = EncodeCapsule(c, w);
  ASSERT_TRUE(a.ok() && b.ok() && three.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, *three);
  StatusOr<DecodedCapsule> d = DecodeCapsule(*a, AllowUnsigned());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(MessageDifferencer::Equals(c, *d->capsule));
}

// Payloads past 32 MiB, where decoding used to fall from 1 GB/s to 100 MB/s (a payload-sized
// buffer that malloc maps afresh every time above that size), and a tensor past the 50 MB that
// protobuf reserves at once for a field it reads in pieces: the payload passes through the reader
// a window at a time and the writer streams it, and both must still give back every byte.
TEST_F(RoundTripTest, PayloadsLargerThanAnyBufferRoundTrip) {
  v1::Capsule medium = MakeMinimalCapsule();
  for (int i = 0; i < 33; ++i) {
    std::string data = i % 3 == 0 ? std::string(size_t{1} << 20, static_cast<char>(i))
                                  : Incompressible(size_t{1} << 20);
    data[static_cast<size_t>(i) * 7919] = static_cast<char>(i);  // no two tensors alike
    SetTensor(medium.add_tensors(), "t" + std::to_string(i), v1::UINT8,
              {static_cast<int64_t>(data.size())}, data);
  }
  const std::string odd = Incompressible(777777);  // ends mid-window
  SetTensor(medium.add_tensors(), "odd", v1::UINT8, {static_cast<int64_t>(odd.size())}, odd);
  v1::Capsule large = MakeMinimalCapsule();
  const std::string huge = Incompressible(50'000'000 + 4096 + 3);
  SetTensor(large.add_tensors(), "huge", v1::UINT8, {static_cast<int64_t>(huge.size())}, huge);

  for (const v1::Capsule* c : {&medium, &large}) {
    const std::string bytes = EncodeSigned(*c);
    const Layout layout = ParseLayout(bytes);
    const std::string serialized = SerializeDeterministic(*c);
    EXPECT_GT(serialized.size(), size_t{32} << 20);
    EXPECT_TRUE(
        OrDie(internal::ZstdDecompress(bytes.substr(layout.header_size, layout.payload_size),
                                       serialized.size(), serialized.size())) == serialized);
    StatusOr<DecodedCapsule> d = Decode(bytes);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(SerializeDeterministic(*d->capsule), serialized);
    EXPECT_TRUE(MessageDifferencer::Equals(*c, *d->capsule));
    EXPECT_EQ(EncodeSigned(*d->capsule), bytes);
  }
}

// Tensor bytes held outside the message (a live model's weights) give the capsule the message
// with them filled in makes, byte for byte: small and large tensors, the first and the last, one
// whose blob has fields past the digest, next to a blob that holds its own bytes, in the full
// capsule whose map and later fields follow the tensors.
TEST_F(RoundTripTest, TensorBytesHeldOutsideTheMessageGiveTheSameCapsule) {
  v1::Capsule filled = MakeFullCapsule();
  const std::string big = Incompressible((size_t{3} << 20) + 17);  // a longer length prefix
  SetTensor(filled.add_tensors(), "outside.big", v1::UINT8, {static_cast<int64_t>(big.size())},
            big);
  v1::TensorBlob* small = filled.add_tensors();
  SetTensor(small, "outside.small", v1::FLOAT32, {2}, std::string(8, '\x3f'));
  small->set_role(v1::PARAMETER);  // fields 5 and 6 after the digest
  small->set_layer("blocks.0");
  ASSERT_GE(filled.tensors_size(), 4);

  v1::Capsule hollow = filled;
  std::vector<std::string> kept(static_cast<size_t>(hollow.tensors_size()));
  TensorDataViews views(kept.size());
  for (int i = 0; i < hollow.tensors_size(); ++i) {
    if (i == 1) continue;  // one that keeps its bytes in the message
    kept[i] = hollow.tensors(i).data();
    views[i] = kept[i];
    hollow.mutable_tensors(i)->clear_data();
  }
  const PrivateKey* keys[] = {&key_, nullptr};
  for (const PrivateKey* key : keys) {
    WriteOptions w;
    w.signing_key = key;
    const std::string expected = OrDie(EncodeCapsule(filled, w));
    w.tensor_data = &views;
    EXPECT_EQ(OrDie(EncodeCapsule(hollow, w)), expected);
    const TempDir dir;
    ASSERT_TRUE(WriteCapsuleFile(dir.path() + "/c.capsule", hollow, w).ok());
    EXPECT_EQ(OrDie(ReadFileBytes(dir.path() + "/c.capsule", uint64_t{1} << 30)), expected);
  }
}

TEST_F(RoundTripTest, TensorBytesHeldOutsideTheMessageAreChecked) {
  v1::Capsule c = MakeFullCapsule();
  ASSERT_GE(c.tensors_size(), 2);
  std::string bytes = c.tensors(0).data();
  c.mutable_tensors(0)->clear_data();
  TensorDataViews views(static_cast<size_t>(c.tensors_size()));
  views[0] = bytes;
  WriteOptions w;
  w.tensor_data = &views;
  ASSERT_TRUE(EncodeCapsule(c, w).ok());

  bytes[0] ^= 1;  // the digest no longer matches
  StatusOr<std::string> wrong = EncodeCapsule(c, w);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("sha256 does not match data"), std::string::npos);
  bytes[0] ^= 1;

  views[1] = c.tensors(1).data();  // given twice
  StatusOr<std::string> twice = EncodeCapsule(c, w);
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("both in the message and held outside"),
            std::string::npos);
  w.validate = false;
  EXPECT_EQ(EncodeCapsule(c, w).status().code(), StatusCode::kInvalidArgument);
  w.validate = true;
  views[1] = {};

  views.pop_back();  // one view per tensor, or none
  EXPECT_EQ(EncodeCapsule(c, w).status().code(), StatusCode::kInvalidArgument);
  views.emplace_back();
  views[0] = std::string_view(bytes).substr(1);  // short
  StatusOr<std::string> shortened = EncodeCapsule(c, w);
  EXPECT_EQ(shortened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shortened.status().message().find("bytes, expected"), std::string::npos);
}

TEST_F(RoundTripTest, MapInsertionOrderDoesNotChangeTheBytes) {
  v1::Capsule a = MakeMinimalCapsule();
  v1::Capsule b = MakeMinimalCapsule();
  const char* keys[] = {"zeta", "alpha", "mid", "beta", "omega", "k1", "k10", "k2"};
  for (const char* k : keys) (*a.mutable_annotations())[k] = std::string("v-") + k;
  for (auto it = std::rbegin(keys); it != std::rend(keys); ++it) {
    (*b.mutable_annotations())[*it] = std::string("v-") + *it;
  }
  EXPECT_EQ(EncodeSigned(a), EncodeSigned(b));
}

TEST_F(RoundTripTest, ReEncodingADecodedCapsuleGivesTheSameBytes) {
  const std::string first = EncodeSigned(MakeFullCapsule());
  StatusOr<DecodedCapsule> d = Decode(first);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(EncodeSigned(*d->capsule), first);
}

TEST_F(RoundTripTest, BytesFollowTheEnvelopeLayout) {
  const v1::Capsule c = MakeFullCapsule();
  const std::string bytes = EncodeSigned(c);
  const std::string serialized = SerializeDeterministic(c);

  ASSERT_GE(bytes.size(), kMinCapsuleSize);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\211CPS\r\n\032\n", 8));
  EXPECT_EQ(LoadLe16(&bytes[8]), 1);     // major
  EXPECT_EQ(LoadLe16(&bytes[10]), 1);    // minor: 1.1, with the signer key
  EXPECT_EQ(LoadLe32(&bytes[12]), 80u);  // header size
  EXPECT_EQ(LoadLe32(&bytes[16]), 0u);   // required flags
  EXPECT_EQ(LoadLe32(&bytes[20]), 8u);   // optional flags: SIGNER_KEY
  const uint64_t payload_size = LoadLe64(&bytes[24]);
  EXPECT_EQ(LoadLe64(&bytes[32]), serialized.size());
  EXPECT_EQ(LoadLe32(&bytes[40]), 1u);          // zstd
  EXPECT_EQ(LoadLe32(&bytes[44]), 0u);          // reserved
  EXPECT_EQ(bytes.substr(48, 32), pub_.raw());  // the signer's raw public key

  const std::string payload = bytes.substr(80, payload_size);
  // The payload is a plain zstd frame that `zstd -d` can read.
  std::string raw(serialized.size(), '\0');
  const size_t n = ZSTD_decompress(raw.data(), raw.size(), payload.data(), payload.size());
  ASSERT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  EXPECT_EQ(raw, serialized);
  EXPECT_EQ(ZSTD_getFrameContentSize(payload.data(), payload.size()), serialized.size());

  const size_t t = 80 + payload_size;
  EXPECT_EQ(LoadLe16(&bytes[t]), 1);       // Ed25519
  EXPECT_EQ(LoadLe16(&bytes[t + 2]), 64);  // signature size
  EXPECT_EQ(LoadLe32(&bytes[t + 4]), 0u);  // reserved
  EXPECT_EQ(bytes.substr(t + 8, 32), pub_.KeyId());
  const std::string message = ExpectedSignedMessage(bytes.substr(0, 80), payload);
  EXPECT_EQ(bytes.substr(t + 40, 32), *Sha256(message));
  EXPECT_TRUE(Verify(pub_, message, bytes.substr(t + 72, 64)).ok());
  EXPECT_EQ(LoadLe32(&bytes[t + 136]), 84u + 64u);
  EXPECT_EQ(bytes.substr(t + 140), std::string("\211CPSEND\n", 8));
  EXPECT_EQ(bytes.size(), t + 148);
}

TEST_F(RoundTripTest, UnsignedTrailerLayout) {
  const Layout l = ParseLayout(unsigned_);
  EXPECT_EQ(l.sig_alg, 0);
  EXPECT_EQ(l.sig_size, 0);
  EXPECT_EQ(unsigned_.substr(l.key_id_at(), 32), std::string(32, '\0'));
  EXPECT_EQ(LoadLe32(&unsigned_[l.trailer_size_at()]), 84u);
  EXPECT_EQ(l.file_size, l.trailer_at + 84);
}

TEST_F(RoundTripTest, SealEnvelopeAndOpenEnvelope) {
  SealOptions seal;
  seal.signing_key = &key_;
  seal.optional_flags = kOptionalFlagHasWeights;
  StatusOr<std::string> file = SealEnvelope("payload bytes", 1234, seal);
  ASSERT_TRUE(file.ok()) << file.status();
  OpenOptions open;
  open.trusted_keys.push_back(pub_);
  StatusOr<OpenedEnvelope> env = OpenEnvelope(*file, open);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->payload, "payload bytes");
  EXPECT_EQ(env->info.header.uncompressed_size, 1234u);
  EXPECT_EQ(env->info.header.optional_flags, kOptionalFlagHasWeights | kOptionalFlagSignerKey);
  EXPECT_EQ(env->info.signature, SignatureState::kVerified);
  EXPECT_EQ(env->info.signer_key, pub_.raw());
  // The hand-built envelope and SealEnvelope agree byte for byte: 1.1 with the key, and 1.0
  // without it.
  RawHeader h;
  h.minor = 1;
  h.header_size = 80;
  h.optional_flags = kOptionalFlagHasWeights | kOptionalFlagSignerKey;
  h.uncompressed_size = 1234;
  h.signer_key = pub_.raw();
  EXPECT_EQ(*file, BuildEnvelope(h, "payload bytes", &key_));
  seal.embed_signer_key = false;
  RawHeader v10;
  v10.optional_flags = kOptionalFlagHasWeights;
  v10.uncompressed_size = 1234;
  EXPECT_EQ(OrDie(SealEnvelope("payload bytes", 1234, seal)),
            BuildEnvelope(v10, "payload bytes", &key_));
}

TEST_F(RoundTripTest, SealEnvelopeInPlaceMatchesSealEnvelope) {
  SealOptions seal;
  seal.signing_key = &key_;
  ASSERT_EQ(SealedHeaderSize(seal), kHeaderSizeV1SignerKey);
  std::string buffer(kHeaderSizeV1SignerKey, '?');
  buffer += "payload bytes";
  ASSERT_TRUE(SealEnvelopeInPlace(&buffer, 99, seal).ok());
  EXPECT_EQ(buffer, OrDie(SealEnvelope("payload bytes", 99, seal)));
  std::string too_small(kHeaderSizeV1SignerKey - 1, '\0');
  EXPECT_TRUE(HasError(SealEnvelopeInPlace(&too_small, 0, seal), StatusCode::kInternal,
                       "no room for the header"));
}

TEST_F(RoundTripTest, SealEnvelopeWritesTestOnlyFieldsAsAsked) {
  SealOptions seal;
  seal.major = 3;
  seal.minor = 2;
  seal.required_flags = 0x10;
  StatusOr<std::string> file = SealEnvelope("p", 1, seal);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(LoadLe16(&(*file)[kOffMajor]), 3);
  EXPECT_EQ(LoadLe16(&(*file)[kOffMinor]), 2);
  EXPECT_EQ(LoadLe32(&(*file)[kOffRequiredFlags]), 0x10u);
  EXPECT_TRUE(HasError(OpenEnvelope(*file, OpenOptions()), StatusCode::kUnimplemented,
                       "format 3.2 is newer"));
}

TEST_F(RoundTripTest, StringFieldsThatAreNotUtf8AreRefusedByTheWriter) {
  // proto3 parsing rejects a string field that is not UTF-8 while serializing one succeeds: a
  // writer that let one through would write a capsule nobody can read. Raw sample text, log lines
  // and host names come from outside the trainer's control.
  const std::string bad("caf\xe9", 4);
  const std::pair<std::function<void(v1::Capsule*)>, const char*> cases[] = {
      {[&](v1::Capsule* c) { c->set_run_name(bad); }, "run_name: is not valid UTF-8"},
      {[&](v1::Capsule* c) { c->mutable_data()->mutable_sequences(0)->set_raw_text(bad); },
       "data.sequences[0].raw_text: is not valid UTF-8"},
      {[&](v1::Capsule* c) { c->mutable_log()->add_lines(bad); },
       "log.lines[2]: is not valid UTF-8"},
      {[&](v1::Capsule* c) { c->mutable_environment()->set_hostname(bad); },
       "environment.hostname: is not valid UTF-8"},
      {[&](v1::Capsule* c) { (*c->mutable_annotations())["k"] = bad; }, "is not valid UTF-8"},
  };
  for (const auto& [breaks, message] : cases) {
    v1::Capsule c = MakeFullCapsule();
    breaks(&c);
    EXPECT_TRUE(HasError(EncodeCapsule(c, WriteOptions()), StatusCode::kInvalidArgument, message));
  }
}

TEST_F(RoundTripTest, WhatTheWriterAcceptsTheReaderReads) {
  // Edge cases of UTF-8 validity: the writer's check must agree with protobuf's parser exactly.
  const std::string cases[] = {
      std::string("\xed\xa0\x80", 3),      // surrogate
      std::string("\xc0\x80", 2),          // overlong NUL
      std::string("\xe0\x80\x80", 3),      // overlong
      std::string("\xf0\x80\x80\x80", 4),  // overlong
      std::string("\xf4\x90\x80\x80", 4),  // above U+10FFFF
      std::string("\xf5\x80\x80\x80", 4),  // not a lead byte
      std::string("\xe2\x82", 2),          // cut short
      std::string("\x80", 1),              // lone continuation
      std::string("\xef\xbf\xbf", 3),      // U+FFFF, a noncharacter but valid
      std::string("\xf4\x8f\xbf\xbf", 4),  // U+10FFFF
      std::string("\xed\x9f\xbf", 3),      // U+D7FF
      std::string("\xe0\xa0\x80", 3),      // U+0800
      std::string("\xf0\x90\x80\x80", 4),  // U+10000
      std::string("a\0b", 3),              // NUL is valid UTF-8
      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
  };
  for (const std::string& text : cases) {
    v1::Capsule c = MakeMinimalCapsule();
    c.set_run_name(text);
    StatusOr<std::string> bytes = EncodeCapsule(c, WriteOptions());
    if (!bytes.ok()) {
      EXPECT_TRUE(HasError(bytes, StatusCode::kInvalidArgument, "UTF-8")) << HexEncode(text);
      continue;
    }
    StatusOr<DecodedCapsule> d = DecodeCapsule(*bytes, AllowUnsigned());
    ASSERT_TRUE(d.ok()) << HexEncode(text) << ": " << d.status();
    EXPECT_EQ(d->capsule->run_name(), text);
  }
}

TEST(SignatureStateTest, Names) {
  EXPECT_STREQ(SignatureStateName(SignatureState::kVerified), "verified");
  EXPECT_STREQ(SignatureStateName(SignatureState::kUnsigned), "unsigned");
  EXPECT_STREQ(SignatureStateName(SignatureState::kNotChecked), "not checked");
}

TEST(LittleEndianTest, StoreAndLoad) {
  char b[8];
  StoreLe64(b, 0x0102030405060708ull);
  EXPECT_EQ(std::string(b, 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
  EXPECT_EQ(LoadLe64(b), 0x0102030405060708ull);
  StoreLe32(b, 0xdeadbeef);
  EXPECT_EQ(LoadLe32(b), 0xdeadbeefu);
  EXPECT_EQ(static_cast<unsigned char>(b[0]), 0xef);
  StoreLe16(b, 0xff01);
  EXPECT_EQ(LoadLe16(b), 0xff01);
  EXPECT_EQ(static_cast<unsigned char>(b[1]), 0xff);
}

}  // namespace
}  // namespace capsule::test
