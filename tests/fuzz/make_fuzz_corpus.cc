// Writes the seed corpus of the DecodeCapsule fuzzer: small valid capsules (signed with the
// test-only fuzz key, and unsigned), serialized messages, and one invalid capsule per reader rule.
// The output is deterministic, so regenerating only changes files when the format changes.
//
//   capsule_fuzz_make_corpus tests/fuzz/corpus
//
// "ok-*" files must decode and "bad-*" files must be rejected (the regression driver checks it).
#include <zstd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {
using ::capsule::internal::LoadLe64;
using ::capsule::internal::StoreLe16;
using ::capsule::internal::StoreLe32;
namespace {

template <typename T>
T Must(StatusOr<T> s) {
  if (!s.ok()) {
    std::fprintf(stderr, "make_fuzz_corpus: %s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(s);
}

v1::Capsule Minimal() {
  v1::Capsule c;
  c.set_writer_version("0.1.0");
  c.set_created_unix_micros(1700000000000000);
  c.mutable_trigger()->set_kind(v1::NON_FINITE_LOSS);
  c.mutable_step()->set_global_step(7);
  return c;
}

// Touches most messages while staying well under 4 KB.
v1::Capsule Small() {
  v1::Capsule c = Minimal();
  c.set_run_name("fuzz");
  c.mutable_trigger()->set_observed(12.5);
  c.mutable_trigger()->set_rule("loss > 4");
  for (int64_t s : {5, 6, 7}) {
    v1::StepScalars* h = c.mutable_step()->add_history();
    h->set_step(s);
    h->set_loss(1.0 * s);
  }
  v1::Sequence* seq = c.mutable_data()->add_sequences();
  for (int64_t t : {1, 2, 3}) seq->add_token_ids(t);
  seq->add_labels(2);
  seq->add_labels(3);
  seq->add_labels(-100);
  seq->set_attention_mask(std::string("\x01\x01\x00", 3));
  c.mutable_data()->add_tensor_names("input_ids");
  v1::FileIdentity* f = c.mutable_identity()->add_files();
  f->set_role("tokenizer");
  f->set_sha256(*Sha256Hex("tok"));
  c.mutable_identity()->set_config_text("{}");
  c.mutable_identity()->set_config_sha256(*Sha256Hex("{}"));
  v1::RngBlob* g = c.mutable_rng()->add_generators();
  g->set_name("torch.cpu");
  g->set_kind(v1::TORCH_CPU_GENERATOR);
  g->set_state("state");
  v1::LayerStats* l = c.mutable_numerics()->add_layers();
  l->set_name("embed");
  l->set_phase(v1::FORWARD);
  l->mutable_meta()->set_dtype(v1::FLOAT32);
  l->mutable_meta()->add_shape(2);
  l->mutable_stats()->set_numel(2);
  l->mutable_stats()->set_nan_count(1);
  l->mutable_stats()->set_first_nonfinite_index(1);
  c.mutable_numerics()->set_first_anomalous_index(0);
  v1::TensorBlob* t = c.add_tensors();
  t->set_name("input_ids");
  t->mutable_meta()->set_dtype(v1::INT64);
  t->mutable_meta()->add_shape(1);
  t->mutable_meta()->add_shape(3);
  const int64_t ids[] = {1, 2, 3};
  t->set_data(std::string(reinterpret_cast<const char*>(ids), sizeof(ids)));
  t->set_sha256(*Sha256Hex(t->data()));
  c.mutable_placement()->set_world_size(2);
  c.mutable_placement()->set_rank(1);
  (*c.mutable_environment()->mutable_libraries())["zstd"] = "1.5";
  (*c.mutable_annotations())["k"] = "v";
  c.mutable_redaction()->add_dropped("text");
  return c;
}

std::string Serialize(const v1::Capsule& c) {
  std::string s;
  c.SerializeToString(&s);
  return s;
}

std::string Encode(const v1::Capsule& c, const PrivateKey* key, uint32_t optional_flags = 0,
                   bool validate = true) {
  WriteOptions w;
  w.signing_key = key;
  w.optional_flags = optional_flags;
  w.validate = validate;
  return Must(EncodeCapsule(c, w));
}

std::string SealUnsigned(std::string_view frame, uint64_t uncompressed) {
  return Must(SealEnvelope(frame, uncompressed, SealOptions()));
}

// An unsigned capsule with a 1.1 header of 64 bytes: fields a later minor version appends.
std::string LongerHeader(const v1::Capsule& c) {
  const std::string serialized = Serialize(c);
  const std::string frame = Must(internal::ZstdCompress(serialized, internal::CompressOptions()));
  std::string header = SealUnsigned(frame, serialized.size()).substr(0, kHeaderSizeV1);
  StoreLe16(&header[kOffMinor], 1);
  StoreLe32(&header[kOffHeaderSize], 64);
  header.append(16, '\x5a');
  std::string out = header + frame;
  char fixed[8] = {};
  out.append(fixed, sizeof(fixed));
  out.append(kSha256Size, '\0');
  out.append(*Sha256(*SignedMessage(header, frame)));
  char tail[4];
  StoreLe32(tail, kTrailerFixedSize);
  out.append(tail, sizeof(tail));
  out.append(kEndMagic);
  return out;
}

// A frame that pledges 100 GB and stops after one flushed block.
std::string BombFrame() {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setPledgedSrcSize(cctx, 100'000'000'000ull);
  const std::string chunk(1024, 'a');
  std::string out(4096, '\0');
  ZSTD_inBuffer in{chunk.data(), chunk.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  ZSTD_compressStream2(cctx, &o, &in, ZSTD_e_flush);
  ZSTD_freeCCtx(cctx);
  out.resize(o.pos);
  return out;
}

// One frame of `prefix` and `filler_size` copies of `filler`, compressed in 1 MiB pieces.
std::string StreamFrame(std::string_view prefix, char filler, uint64_t filler_size) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 1);
  ZSTD_CCtx_setPledgedSrcSize(cctx, prefix.size() + filler_size);
  const std::string chunk(size_t{1} << 20, filler);
  std::string out, buf(ZSTD_CStreamOutSize(), '\0');
  auto feed = [&](std::string_view data, ZSTD_EndDirective mode) {
    ZSTD_inBuffer in{data.data(), data.size(), 0};
    for (bool done = false; !done;) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      const size_t left = ZSTD_compressStream2(cctx, &o, &in, mode);
      out.append(buf.data(), o.pos);
      done = ZSTD_isError(left) || (mode == ZSTD_e_end ? left == 0 : in.pos == in.size);
    }
  };
  feed(prefix, ZSTD_e_continue);
  for (uint64_t done = 0; done < filler_size;) {
    const uint64_t n = std::min<uint64_t>(chunk.size(), filler_size - done);
    done += n;
    feed(std::string_view(chunk).substr(0, n), done == filler_size ? ZSTD_e_end : ZSTD_e_continue);
  }
  ZSTD_freeCCtx(cctx);
  return out;
}

std::string Varint(uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
  return out;
}

// Sealed with the fuzz key: the audit's "absurd but signed" capsules get past the signature.
std::string SealSigned(std::string_view frame, uint64_t uncompressed, const PrivateKey& key) {
  SealOptions o;
  o.signing_key = &key;
  return Must(SealEnvelope(frame, uncompressed, o));
}

// `frame` (single-segment) re-headed with a window of 2^window_log and a dictionary id.
std::string Reheaded(const std::string& frame, int window_log, uint8_t dict_id) {
  const auto* u = reinterpret_cast<const unsigned char*>(frame.data());
  static constexpr size_t kFcsBytes[] = {1, 2, 4, 8};
  const size_t header = 5 + kFcsBytes[u[4] >> 6];  // single segment, no dictionary
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  std::string out = frame.substr(0, 4);
  out.push_back(static_cast<char>((2u << 6) | (u[4] & 0x04) | (dict_id != 0 ? 1 : 0)));
  out.push_back(static_cast<char>((window_log - 10) << 3));
  if (dict_id != 0) out.push_back(static_cast<char>(dict_id));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(content >> (8 * i)));
  return out + frame.substr(header);
}

std::string Flip(std::string s, size_t offset) {
  s[offset] ^= 0x01;
  return s;
}

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out.good()) {
    std::fprintf(stderr, "make_fuzz_corpus: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::printf("%6zu %s\n", bytes.size(), name.c_str());
}

int Main(const std::string& dir) {
  const PrivateKey key = FuzzSigningKey();
  const PrivateKey other = Must(PrivateKey::FromRaw(std::string(kEd25519KeySize, '\x42')));

  const std::string signed_small = Encode(Small(), &key);
  Write(dir, "ok-signed-minimal.capsule", Encode(Minimal(), &key));
  Write(dir, "ok-unsigned-minimal.capsule", Encode(Minimal(), nullptr));
  Write(dir, "ok-signed-small.capsule", signed_small);
  Write(dir, "ok-unsigned-small-flags.capsule",
        Encode(Small(), nullptr, kOptionalFlagRedacted | (1u << 30)));
  Write(dir, "ok-unsigned-longer-header.capsule", LongerHeader(Minimal()));
  Write(dir, "ok-message-minimal.pb", Serialize(Minimal()));
  Write(dir, "ok-message-small.pb", Serialize(Small()));

  v1::Capsule invalid = Small();
  invalid.clear_trigger();
  Write(dir, "bad-message-invalid.pb", Serialize(invalid));
  Write(dir, "bad-message-junk.pb",
        std::string("\x0a\x05"
                    "0.1.0\x0f",
                    8));

  const size_t payload_mid = internal::LoadLe32(&signed_small[kOffHeaderSize]) +
                             LoadLe64(&signed_small[kOffPayloadSize]) / 2;
  Write(dir, "bad-truncated.capsule", signed_small.substr(0, payload_mid));
  Write(dir, "bad-magic.capsule", Flip(signed_small, 1));
  SealOptions newer;
  newer.major = 2;
  Write(dir, "bad-newer-major.capsule", Must(SealEnvelope("x", 1, newer)));
  SealOptions flagged;
  flagged.signing_key = &key;
  flagged.required_flags = 1;
  Write(dir, "bad-required-flag.capsule", Must(SealEnvelope("x", 1, flagged)));
  Write(dir, "bad-digest.capsule", Flip(signed_small, payload_mid));
  Write(dir, "bad-untrusted.capsule", Encode(Minimal(), &other));
  Write(dir, "bad-signature.capsule", Flip(signed_small, signed_small.size() - 20 - 12));
  Write(dir, "bad-trailing.capsule", signed_small + "tail");
  // Format 1.1 names the signer in the header too; a 1.0 writer did not.
  {
    const size_t hs = internal::LoadLe32(&signed_small[kOffHeaderSize]);
    const std::string_view payload =
        std::string_view(signed_small).substr(hs, LoadLe64(&signed_small[kOffPayloadSize]));
    const uint64_t raw = LoadLe64(&signed_small[kOffUncompressedSize]);
    SealOptions v10;
    v10.signing_key = &key;
    v10.embed_signer_key = false;
    Write(dir, "ok-signed-v10-small.capsule", Must(SealEnvelope(payload, raw, v10)));
    // The other key in the header, the fuzz key's id in the trailer, digest and signature valid.
    std::string header = signed_small.substr(0, hs);
    header.replace(kOffSignerKey, kEd25519KeySize, Must(other.GetPublicKey()).raw());
    std::string swapped = header + std::string(payload);
    const std::string message = *SignedMessage(header, payload);
    std::string trailer = signed_small.substr(hs + payload.size());
    trailer.replace(8 + kSha256Size, kSha256Size, *Sha256(message));
    trailer.replace(8 + 2 * kSha256Size, kEd25519SignatureSize, Must(Sign(key, message)));
    Write(dir, "bad-signer-key-mismatch.capsule", swapped + trailer);
  }

  const std::string serialized = Serialize(Small());
  std::string frame = Must(internal::ZstdCompress(serialized, internal::CompressOptions()));
  frame.back() ^= 0x01;
  Write(dir, "bad-zstd-checksum.capsule", SealUnsigned(frame, serialized.size()));
  const std::string junk = "\x0f not a protobuf";
  Write(dir, "bad-not-protobuf.capsule",
        SealUnsigned(Must(internal::ZstdCompress(junk, internal::CompressOptions())), junk.size()));
  Write(dir, "bad-invalid-content.capsule", Encode(invalid, nullptr, 0, /*validate=*/false));
  v1::Capsule wrong_digest = Small();
  wrong_digest.mutable_tensors(0)->set_sha256(*Sha256Hex("other"));
  Write(dir, "bad-tensor-digest.capsule", Encode(wrong_digest, nullptr, 0, /*validate=*/false));
  Write(dir, "bad-bomb.capsule", SealUnsigned(BombFrame(), 100'000'000'000ull));

  // Found by the audit of the reader: content that is absurd but signed.
  auto absurd = [&](const char* name, auto edit) {
    v1::Capsule c = Small();
    edit(&c);
    Write(dir, name, Encode(c, &key, 0, /*validate=*/false));
  };
  absurd("bad-absurd-trigger-kind.capsule",
         [](v1::Capsule* c) { c->mutable_trigger()->set_kind(static_cast<v1::TriggerKind>(99)); });
  absurd("bad-absurd-dtype.capsule", [](v1::Capsule* c) {
    c->mutable_tensors(0)->mutable_meta()->set_dtype(static_cast<v1::DType>(99));
  });
  absurd("bad-absurd-stride.capsule", [](v1::Capsule* c) {
    v1::TensorBlob* t = c->add_tensors();
    t->set_name("one");
    t->mutable_meta()->set_dtype(v1::FLOAT32);
    t->mutable_meta()->add_shape(1);
    t->mutable_meta()->add_strides(1000000000000);
    t->set_data(std::string(4, '\0'));
    t->set_sha256(*Sha256Hex(t->data()));
  });
  absurd("bad-absurd-storage-offset.capsule", [](v1::Capsule* c) {
    c->mutable_tensors(0)->mutable_meta()->set_storage_offset(int64_t{1} << 62);
  });
  absurd("bad-absurd-anomalous-index.capsule", [](v1::Capsule* c) {
    c->mutable_numerics()->set_first_anomalous_layer("embed");
    c->mutable_numerics()->set_first_anomalous_index(2147483647);
    c->mutable_numerics()->set_first_anomalous_phase(v1::FORWARD);
  });
  absurd("bad-absurd-time.capsule", [](v1::Capsule* c) { c->set_created_unix_micros(INT64_MAX); });
  absurd("bad-absurd-time-min.capsule",
         [](v1::Capsule* c) { c->set_created_unix_micros(INT64_MIN); });

  // Unknown fields: a few, at every depth (redaction must drop them), and too many.
  v1::Capsule unknown = Small();
  auto add_unknown = [](google::protobuf::Message* m, const std::string& text) {
    m->GetReflection()->MutableUnknownFields(m)->AddLengthDelimited(100, text);
  };
  add_unknown(&unknown, "SECRET at the top");
  add_unknown(unknown.mutable_data()->mutable_sequences(0), "SECRET inside a sequence");
  add_unknown(unknown.mutable_numerics()->mutable_layers(0)->mutable_stats(), "SECRET deep");
  Write(dir, "ok-unknown-fields.capsule", Encode(unknown, &key));
  // Text a terminal or GitHub would act on, in every string the printers show: a forged
  // signature line (cursor up, carriage return, erase line), OSC title, BEL, C1 CSI, a bidi
  // override, a mention and a link. Valid: strings need only be UTF-8. tests/cli uses it.
  v1::Capsule hostile = Small();
  const std::string forge =
      "x\x1b[1A\r\x1b[2K  signature: verified, ed25519 key 0000\x1b]0;pwned\x07\u009b2J"
      "\u202Egpj.exe @octocat https://evil.example";
  hostile.set_run_name(forge);
  hostile.mutable_trigger()->set_rule(forge);
  hostile.mutable_trigger()->set_message(forge);
  hostile.mutable_model()->set_registry_name(forge);
  hostile.mutable_environment()->set_compiler(forge);
  hostile.mutable_environment()->set_os(forge);
  Write(dir, "ok-hostile-text.capsule", Encode(hostile, nullptr));
  Write(dir, "ok-unknown-fields.pb", Serialize(unknown));
  v1::Capsule over = Small();
  add_unknown(&over, std::string(100 << 10, 'u'));  // over the fuzz options' 64 KiB
  Write(dir, "bad-unknown-fields-over-limit.capsule", Encode(over, &key));
  // The audit's bomb: a 30 KB signed capsule whose 900 MiB unknown field cost verify 2 GB.
  const uint64_t bomb = uint64_t{900} << 20;
  const std::string bomb_prefix = Serialize(Minimal()) + Varint(100 << 3 | 2) + Varint(bomb);
  Write(dir, "bad-unknown-field-bomb.capsule",
        SealSigned(StreamFrame(bomb_prefix, 'S', bomb), bomb_prefix.size() + bomb, key));
  std::string messages = Serialize(Minimal());
  for (int i = 0; i < 5000; ++i) messages += std::string("\x6a\x00", 2);  // LogRecord log, empty
  Write(dir, "bad-too-many-messages.pb", messages);

  // zstd frames a stock `zstd -d` would refuse or could not decode alone.
  const std::string small = Serialize(Small());
  const std::string small_frame = Must(internal::ZstdCompress(small, internal::CompressOptions()));
  Write(dir, "bad-zstd-window.capsule",
        SealSigned(Reheaded(small_frame, 28, 0), small.size(), key));
  Write(dir, "bad-zstd-dictionary.capsule",
        SealSigned(Reheaded(small_frame, 20, 9), small.size(), key));
  Write(dir, "ok-zstd-window-at-limit.capsule",
        SealSigned(Reheaded(small_frame, 27, 0), small.size(), key));
  return 0;
}

}  // namespace
}  // namespace capsule::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  return capsule::fuzz::Main(argv[1]);
}
