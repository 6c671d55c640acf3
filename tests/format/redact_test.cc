// RedactCapsule: what each item removes, checked on the decompressed payload of the re-signed
// capsule (the bytes a recipient gets), not on the message in memory.
#include "capsule/format/redact.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <string>
#include <vector>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope_format.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/format/capsule_test_util.h"

namespace capsule {
namespace {

using test::FixedKey;
using test::HasError;
using test::OrDie;
using test::SetTensor;

// Long and distinctive, so a match in the payload cannot be a coincidence.
const char* const kTexts[] = {
    "Patient record 4711: Jonathan Q. Smithereens, born 1961-02-29, diagnosed with wanderlust.",
    "The secret launch code is ZEBRA-OCTOPUS-99 and nobody outside the vault may read it."};

std::vector<int64_t> Tokens(int row) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back(100003 + 7919 * i + 104729 * row);
  return ids;
}

std::string LittleEndian(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) {
    for (int b = 0; b < 8; ++b)
      out.push_back(static_cast<char>(static_cast<uint64_t>(id) >> (8 * b)));
  }
  return out;
}

v1::Capsule MakePrivateCapsule() {
  v1::Capsule c = test::MakeMinimalCapsule();
  c.set_run_name("private-run");
  c.mutable_model()->set_registry_name("tiny_gpt");
  for (const char* layer : {"embed", "blocks.0", "loss"}) c.mutable_model()->add_layers(layer);
  std::string all_ids, all_labels;
  for (int row = 0; row < 2; ++row) {
    v1::Sequence* s = c.mutable_data()->add_sequences();
    s->set_sample_id("sample-" + std::to_string(row));
    s->set_raw_text(kTexts[row]);
    const std::vector<int64_t> ids = Tokens(row);
    for (int64_t id : ids) s->add_token_ids(id);
    std::vector<int64_t> labels(ids.begin() + 1, ids.end());
    labels.push_back(-100);
    for (int64_t l : labels) s->add_labels(l);
    all_ids += LittleEndian(ids);
    all_labels += LittleEndian(labels);
  }
  SetTensor(c.add_tensors(), "input_ids", v1::INT64, {2, 48}, all_ids);
  c.mutable_tensors(0)->set_role(v1::BATCH_INPUT);
  SetTensor(c.add_tensors(), "labels", v1::INT64, {2, 48}, all_labels);
  c.mutable_tensors(1)->set_role(v1::BATCH_INPUT);
  SetTensor(c.add_tensors(), "embed/input.0", v1::INT64, {2, 48}, all_ids);
  c.mutable_tensors(2)->set_role(v1::LAYER_INPUT);
  c.mutable_tensors(2)->set_layer("embed");
  SetTensor(c.add_tensors(), "blocks.0/input.0", v1::FLOAT32, {2}, std::string(8, '\1'));
  c.mutable_tensors(3)->set_role(v1::LAYER_INPUT);
  c.mutable_tensors(3)->set_layer("blocks.0");
  c.mutable_data()->add_tensor_names("input_ids");
  c.mutable_data()->add_tensor_names("labels");

  c.mutable_log()->add_lines("step 6 loss 2.5");
  c.mutable_log()->add_lines(std::string("sample: ") + std::string(kTexts[0]).substr(10, 30));
  c.mutable_log()->add_lines("loaded /home/alice/corpora/tokenizer.json on gpu-node-17");
  c.mutable_log()->set_error(std::string("bad sample ") + kTexts[1]);
  v1::FileIdentity* f = c.mutable_identity()->add_files();
  f->set_role("tokenizer");
  f->set_path("/home/alice/corpora/tokenizer.json");
  f->set_sha256(*Sha256Hex("tokenizer"));
  c.mutable_environment()->set_hostname("gpu-node-17");
  return c;
}

std::string Payload(const std::string& bytes) {
  const test::Layout layout = test::ParseLayout(bytes);
  const char* frame = bytes.data() + layout.header_size;
  const unsigned long long n = ZSTD_getFrameContentSize(frame, layout.payload_size);
  std::string out(static_cast<size_t>(n), '\0');
  const size_t got = ZSTD_decompress(out.data(), out.size(), frame, layout.payload_size);
  EXPECT_FALSE(ZSTD_isError(got));
  out.resize(got);
  return out;
}

class RedactTest : public ::testing::Test {
 protected:
  RedactTest() : source_key_(FixedKey('s')), redact_key_(FixedKey('r')) {
    WriteOptions w;
    w.signing_key = &source_key_;
    source_bytes_ = OrDie(EncodeCapsule(MakePrivateCapsule(), w));
  }

  // Decodes the source, redacts `items` and re-signs with redact_key_.
  std::string Redact(const std::string& bytes, const std::string& items) {
    ReadOptions ro;
    ro.allow_untrusted = true;
    DecodedCapsule d = OrDie(DecodeCapsule(bytes, ro));
    RedactOptions options;
    EXPECT_TRUE(ParseRedactItems(items, &options).ok());
    options.source_sha256 = *Sha256Hex(bytes);
    options.now_unix_micros = 1700000001000000;
    const Status s = RedactCapsule(d.capsule.get(), options);
    EXPECT_TRUE(s.ok()) << s;
    WriteOptions w;
    w.signing_key = &redact_key_;
    w.optional_flags = kOptionalFlagRedacted;
    return OrDie(EncodeCapsule(*d.capsule, w));
  }

  v1::Capsule Read(const std::string& bytes) {
    ReadOptions ro;
    ro.trusted_keys.push_back(OrDie(redact_key_.GetPublicKey()));
    return *OrDie(DecodeCapsule(bytes, ro)).capsule;
  }

  PrivateKey source_key_;
  PrivateKey redact_key_;
  std::string source_bytes_;
};

TEST_F(RedactTest, SourcePayloadHoldsThePrivateData) {
  // Guards the other tests: they would pass vacuously if the search could not find anything.
  const std::string payload = Payload(source_bytes_);
  for (const char* text : kTexts) EXPECT_NE(payload.find(text), std::string::npos);
  for (int row = 0; row < 2; ++row) {
    EXPECT_NE(payload.find(LittleEndian(Tokens(row))), std::string::npos);
  }
}

TEST_F(RedactTest, PayloadHoldsNoTextAndNoTokens) {
  const std::string out = Redact(source_bytes_, "text,tokens,paths,host");
  const std::string payload = Payload(out);
  for (const char* text : kTexts) {
    const std::string t(text);
    EXPECT_EQ(payload.find(t), std::string::npos);
    // No 16-byte piece of it either (a truncated sample in a log line).
    for (size_t i = 0; i + 16 <= t.size(); i += 8) {
      EXPECT_EQ(payload.find(t.substr(i, 16)), std::string::npos) << t.substr(i, 16);
    }
  }
  for (int row = 0; row < 2; ++row) {
    const std::string le = LittleEndian(Tokens(row));
    EXPECT_EQ(payload.find(le), std::string::npos) << "row " << row;
    // Nor the labels (the ids shifted by one position).
    EXPECT_EQ(payload.find(le.substr(8, 8 * 16)), std::string::npos) << "row " << row;
  }
  EXPECT_EQ(payload.find("/home/alice"), std::string::npos);
  EXPECT_EQ(payload.find("gpu-node-17"), std::string::npos);
}

TEST_F(RedactTest, UnknownFieldsAreDroppedAtEveryDepthWhateverTheItems) {
  // A newer writer's field 100 holding private text, at the top and inside a sequence and the
  // log: the redacted, re-signed capsule said REDACTED and still carried it.
  v1::Capsule c = MakePrivateCapsule();
  uint64_t added = 0;  // serialized bytes: a 2-byte tag, a 1-byte length, the text
  auto add_unknown = [&](google::protobuf::Message* m, const std::string& text) {
    m->GetReflection()->MutableUnknownFields(m)->AddLengthDelimited(100, text);
    added += 3 + text.size();
  };
  add_unknown(&c, "SECRET top-level field of a newer writer");
  add_unknown(c.mutable_data()->mutable_sequences(1), "SECRET inside sequence 1");
  add_unknown(c.mutable_log(), "SECRET inside the log record");
  c.mutable_environment()
      ->GetReflection()
      ->MutableUnknownFields(c.mutable_environment())
      ->AddVarint(101, 12345);
  added += 2 + 2;
  WriteOptions w;
  w.signing_key = &source_key_;
  const std::string source = OrDie(EncodeCapsule(c, w));
  ASSERT_NE(Payload(source).find("SECRET inside sequence 1"), std::string::npos);
  ASSERT_NE(Payload(source).find("SECRET top-level"), std::string::npos);

  for (const char* items : {"host", "text,tokens,paths,host"}) {
    const std::string out = Redact(source, items);
    const std::string payload = Payload(out);
    EXPECT_EQ(payload.find("SECRET"), std::string::npos) << items;
    const v1::Capsule r = Read(out);
    EXPECT_TRUE(r.GetReflection()->GetUnknownFields(r).empty());
    // The length prefixes of the messages that held them keep their size at these sizes.
    EXPECT_EQ(r.redaction().unknown_field_bytes_dropped(), added) << items;
  }
}

TEST_F(RedactTest, UnknownFieldBytesDroppedAccumulate) {
  v1::Capsule c = MakePrivateCapsule();
  c.GetReflection()->MutableUnknownFields(&c)->AddLengthDelimited(100, "0123456789");
  WriteOptions w;
  w.signing_key = &source_key_;
  const std::string once = Redact(OrDie(EncodeCapsule(c, w)), "host");
  EXPECT_EQ(Read(once).redaction().unknown_field_bytes_dropped(), 13u);
  EXPECT_EQ(Read(Redact(once, "host")).redaction().unknown_field_bytes_dropped(), 13u);
}

TEST_F(RedactTest, VerifiesWithTheRedactingKeyAndRecordsWhatWasDropped) {
  const std::string out = Redact(source_bytes_, "tokens,host");
  ReadOptions by_source;
  by_source.trusted_keys.push_back(OrDie(source_key_.GetPublicKey()));
  EXPECT_TRUE(
      HasError(DecodeCapsule(out, by_source), StatusCode::kUnauthenticated, "untrusted key"));

  ReadOptions ro;
  ro.trusted_keys.push_back(OrDie(redact_key_.GetPublicKey()));
  DecodedCapsule d = OrDie(DecodeCapsule(out, ro));
  EXPECT_EQ(d.envelope.header.optional_flags & kOptionalFlagRedacted, kOptionalFlagRedacted);
  const v1::Capsule& c = *d.capsule;
  ASSERT_EQ(c.redaction().dropped_size(), 2);
  EXPECT_EQ(c.redaction().dropped(0), "tokens");
  EXPECT_EQ(c.redaction().dropped(1), "host");
  EXPECT_EQ(c.redaction().source_sha256(), *Sha256Hex(source_bytes_));
  EXPECT_EQ(c.redaction().redacted_unix_micros(), 1700000001000000);
}

TEST_F(RedactTest, TokensBecomeTheirHashAndCount) {
  const v1::Capsule c = Read(Redact(source_bytes_, "tokens"));
  ASSERT_EQ(c.data().sequences_size(), 2);
  for (int row = 0; row < 2; ++row) {
    const v1::Sequence& s = c.data().sequences(row);
    EXPECT_EQ(s.token_ids_size(), 0);
    EXPECT_EQ(s.labels_size(), 0);
    EXPECT_EQ(s.token_count(), 48);
    EXPECT_EQ(s.token_ids_sha256(), *Sha256Hex(LittleEndian(Tokens(row))));
    EXPECT_EQ(s.raw_text(), kTexts[row]);  // only what was asked for goes
  }
  ASSERT_EQ(c.tensors_size(), 1);
  EXPECT_EQ(c.tensors(0).name(), "blocks.0/input.0");
  EXPECT_EQ(c.data().tensor_names_size(), 0);
}

TEST_F(RedactTest, TextDropsRawSampleBytesToo) {
  v1::Capsule c = MakePrivateCapsule();
  c.mutable_data()->mutable_sequences(0)->clear_raw_text();
  c.mutable_data()->mutable_sequences(0)->set_raw_bytes("caf\xc3 and a private cut window");
  WriteOptions w;
  w.signing_key = &source_key_;
  const v1::Capsule redacted = Read(Redact(OrDie(EncodeCapsule(c, w)), "text"));
  for (const auto& seq : redacted.data().sequences()) {
    EXPECT_EQ(seq.raw_bytes(), "");
    EXPECT_EQ(seq.raw_text(), "");
  }
}

TEST_F(RedactTest, TextDropsSampleTextAndTheLogLinesQuotingIt) {
  const v1::Capsule c = Read(Redact(source_bytes_, "text"));
  for (const auto& s : c.data().sequences()) EXPECT_EQ(s.raw_text(), "");
  ASSERT_EQ(c.log().lines_size(), 2);
  EXPECT_EQ(c.log().lines(0), "step 6 loss 2.5");
  EXPECT_EQ(c.log().lines(1), "loaded /home/alice/corpora/tokenizer.json on gpu-node-17");
  EXPECT_EQ(c.log().error(), "<redacted: contained sample text>");
}

TEST_F(RedactTest, PathsBecomeBaseNamesAndHostIsCleared) {
  const v1::Capsule c = Read(Redact(source_bytes_, "paths,host"));
  EXPECT_EQ(c.identity().files(0).path(), "tokenizer.json");
  EXPECT_EQ(c.identity().files(0).name(), "tokenizer.json");
  EXPECT_EQ(c.environment().hostname(), "");
  EXPECT_EQ(c.log().lines(2), "loaded tokenizer.json on <redacted>");
}

TEST_F(RedactTest, TheNamedCheckpointKeepsItsBaseName) {
  v1::Capsule src = MakePrivateCapsule();
  src.mutable_model()->set_weight_policy(v1::WEIGHTS_ANOMALOUS_LAYER);
  v1::WeightsReference& ref = *src.mutable_model()->mutable_weights_reference();
  ref.set_path("/home/alice/ckpt/model-step900.pt");
  ref.set_format("torch_pickle");
  ref.set_tensors_sha256(std::string(64, 'a'));
  v1::TensorDigest& t = *ref.add_tensors();
  t.set_name("w");
  t.set_dtype("Float");
  t.set_sha256(std::string(64, 'b'));
  src.mutable_log()->add_lines("loaded /home/alice/ckpt/model-step900.pt");
  WriteOptions w;
  w.signing_key = &source_key_;
  const v1::Capsule c = Read(Redact(OrDie(EncodeCapsule(src, w)), "paths"));
  EXPECT_EQ(c.model().weights_reference().path(), "model-step900.pt");
  EXPECT_EQ(c.log().lines(c.log().lines_size() - 1), "loaded model-step900.pt");
}

TEST_F(RedactTest, RedactingTwiceChangesOnlyTheRecord) {
  const std::string once = Redact(source_bytes_, "text,tokens,paths,host");
  const std::string twice = Redact(once, "text,tokens,paths,host");
  v1::Capsule a = Read(once);
  v1::Capsule b = Read(twice);
  EXPECT_EQ(b.redaction().source_sha256(), *Sha256Hex(once));
  a.clear_redaction();
  b.clear_redaction();
  EXPECT_EQ(test::SerializeDeterministic(a), test::SerializeDeterministic(b));
  // The token hashes survive: they are not re-computed from the (now empty) ids.
  EXPECT_EQ(b.data().sequences(0).token_ids_sha256(), *Sha256Hex(LittleEndian(Tokens(0))));
}

TEST_F(RedactTest, DroppedItemsAccumulate) {
  const v1::Capsule c = Read(Redact(Redact(source_bytes_, "host"), "text"));
  ASSERT_EQ(c.redaction().dropped_size(), 2);
  EXPECT_EQ(c.redaction().dropped(0), "text");
  EXPECT_EQ(c.redaction().dropped(1), "host");
}

TEST(RedactOptionsTest, UnknownItemIsRefused) {
  RedactOptions o;
  EXPECT_TRUE(HasError(ParseRedactItems("text,weights", &o), StatusCode::kInvalidArgument,
                       "unknown item to drop \"weights\""));
  EXPECT_TRUE(HasError(ParseRedactItems("", &o), StatusCode::kInvalidArgument, "no item"));
}

TEST(RedactOptionsTest, NothingToDropOrNoSourceHashIsRefused) {
  v1::Capsule c = test::MakeMinimalCapsule();
  RedactOptions o;
  o.source_sha256 = *Sha256Hex("x");
  EXPECT_TRUE(HasError(RedactCapsule(&c, o), StatusCode::kInvalidArgument, "no item"));
  o.host = true;
  o.source_sha256 = "abc";
  EXPECT_TRUE(HasError(RedactCapsule(&c, o), StatusCode::kInvalidArgument, "source_sha256"));
}

TEST(TokenIdsSha256Test, HashesLittleEndianInt64) {
  EXPECT_EQ(*TokenIdsSha256({1, -1}),
            *Sha256Hex(std::string("\x01\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff", 16)));
}

}  // namespace
}  // namespace capsule
