#include "tests/fuzz/decode_capsule_fuzzer.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "capsule/base/sha256.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/little_endian.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::fuzz {
using ::capsule::internal::LoadLe32;
using ::capsule::internal::LoadLe64;
using ::capsule::internal::StoreLe32;
namespace {

// Inputs larger than this are only decoded as they are: re-sealing and round trips of big inputs
// slow the fuzzer without reaching new code.
constexpr size_t kMaxDeepInput = 1 << 20;

[[noreturn]] void Fail(const char* what, const Status& status) {
  std::fprintf(stderr, "fuzz invariant broken: %s (%s)\n", what, status.ToString().c_str());
  std::abort();
}

// FuzzReadOptions() derives the public key each call; the fuzzer needs it once.
const ReadOptions& CachedFuzzOptions() {
  static const ReadOptions* const options = new ReadOptions(FuzzReadOptions());
  return *options;
}

std::string SerializeDeterministic(const v1::Capsule& capsule) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    capsule.SerializeToCodedStream(&coded);
  }
  return out;
}

// Decodes and checks what must hold whatever the input: no internal errors, and an accepted
// capsule is complete, consistent with its envelope and valid.
StatusOr<DecodedCapsule> CheckedDecode(std::string_view bytes, const ReadOptions& options) {
  StatusOr<DecodedCapsule> d = DecodeCapsule(bytes, options);
  if (!d.ok()) {
    if (d.status().code() == StatusCode::kInternal || d.status().code() == StatusCode::kOk ||
        d.status().message().empty()) {
      Fail("rejection without a proper code and message", d.status());
    }
    return d;
  }
  if (d->capsule == nullptr) Fail("accepted without a message", Status());
  if (d->envelope.file_size != bytes.size()) Fail("envelope file size", Status());
  if (d->envelope.header.uncompressed_size > options.max_uncompressed_bytes) {
    Fail("accepted over the size cap", Status());
  }
  if (d->envelope.signature == SignatureState::kUnsigned && !options.allow_unsigned) {
    Fail("accepted unsigned", Status());
  }
  if (d->envelope.signature == SignatureState::kNotChecked && !options.allow_untrusted) {
    Fail("accepted untrusted", Status());
  }
  if (options.validate) {
    ValidateOptions v;
    v.verify_tensor_digests = options.verify_tensor_digests;
    const Status s = ValidateCapsule(*d->capsule, v);
    if (!s.ok()) Fail("accepted an invalid capsule", s);
  }
  return d;
}

// Header ‖ payload of a capsule-shaped input under an unsigned trailer with a matching digest;
// nullopt when the header's sizes do not lay out inside the input.
std::optional<std::string> ResealUnsigned(std::string_view bytes) {
  if (bytes.size() < kHeaderSizeV1) return std::nullopt;
  const uint64_t header_size = LoadLe32(&bytes[kOffHeaderSize]);
  const uint64_t payload_size = LoadLe64(&bytes[kOffPayloadSize]);
  if (header_size < kHeaderSizeV1 || header_size > bytes.size() ||
      payload_size > bytes.size() - header_size) {
    return std::nullopt;
  }
  const std::string_view header = bytes.substr(0, header_size);
  const std::string_view payload = bytes.substr(header_size, payload_size);
  std::string out(bytes.substr(0, header_size + payload_size));
  char fixed[8] = {};  // algorithm none, no signature, reserved
  out.append(fixed, sizeof(fixed));
  out.append(kSha256Size, '\0');  // key id
  out.append(Sha256(SignedMessage(header, payload)));
  char tail[4];
  StoreLe32(tail, kTrailerFixedSize);
  out.append(tail, sizeof(tail));
  out.append(kEndMagic);
  return out;
}

// `serialized` compressed and sealed unsigned, as a writer with validation off would make it.
std::string SealMessage(std::string_view serialized) {
  StatusOr<std::string> frame = internal::ZstdCompress(serialized, internal::CompressOptions());
  if (!frame.ok()) Fail("compressing", frame.status());
  StatusOr<std::string> sealed = SealEnvelope(*frame, serialized.size(), SealOptions());
  if (!sealed.ok()) Fail("sealing", sealed.status());
  return *std::move(sealed);
}

// A message the reader accepted is accepted by the writer, and encoding it and reading it back
// gives the same message (compared as deterministic bytes, so NaN payloads compare equal).
void CheckRoundTrip(const v1::Capsule& decoded, const ReadOptions& options) {
  WriteOptions w;
  StatusOr<std::string> encoded = EncodeCapsule(decoded, w);
  if (!encoded.ok()) Fail("the writer refuses what the reader accepted", encoded.status());
  StatusOr<DecodedCapsule> again = DecodeCapsule(*encoded, options);
  if (!again.ok()) Fail("the reader refuses what the writer wrote", again.status());
  if (SerializeDeterministic(*again->capsule) != SerializeDeterministic(decoded)) {
    Fail("round trip changed the message", Status());
  }
}

// Whatever text a trainer puts into a string field, a capsule the writer accepts must be one the
// reader opens (proto3 parsing rejects strings that are not UTF-8; serializing does not).
void CheckWriterOutputIsReadable(std::string_view text) {
  v1::Capsule c;
  c.set_writer_version("0.1.0");
  c.set_created_unix_micros(1);
  c.mutable_trigger()->set_kind(v1::MANUAL);
  c.mutable_step();
  const std::string t(text);
  c.set_run_name(t);
  (*c.mutable_annotations())[t.empty() ? "k" : t] = t;  // map keys are strings too
  StatusOr<std::string> encoded = EncodeCapsule(c, WriteOptions());
  if (!encoded.ok()) {
    if (encoded.status().code() != StatusCode::kInvalidArgument) {
      Fail("the writer failed other than on its input", encoded.status());
    }
    return;
  }
  const Status read = DecodeCapsule(*encoded, CachedFuzzOptions()).status();
  if (!read.ok()) Fail("the reader refuses what the writer wrote", read);
}

void FuzzMessage(std::string_view serialized) {
  const ReadOptions& options = CachedFuzzOptions();
  StatusOr<DecodedCapsule> d = CheckedDecode(SealMessage(serialized), options);
  // Whether the reader accepts must agree with parsing and validating directly.
  v1::Capsule direct;
  const bool parsed = direct.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()));
  ValidateOptions v;
  v.verify_tensor_digests = options.verify_tensor_digests;
  const bool valid = parsed && ValidateCapsule(direct, v).ok();
  if (d.ok() != valid) Fail("reader and direct parse+validate disagree", d.status());
  if (d.ok()) CheckRoundTrip(*d->capsule, options);
}

void TestOneInput(std::string_view bytes) {
  const ReadOptions* const kFuzzOptions = &CachedFuzzOptions();
  static const ReadOptions* const kDefaultOptions = new ReadOptions();
  // protobuf logs every string field that is not UTF-8 to stderr; at a thousand inputs a second
  // that is most of the fuzzer's time. The rejection itself is what the target checks.
  static const bool kQuiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)kQuiet;

  StatusOr<DecodedCapsule> d = CheckedDecode(bytes, *kFuzzOptions);
  const Status strict = CheckedDecode(bytes, *kDefaultOptions).status();
  // The default options trust no key and allow nothing unsigned: they never accept.
  if (strict.ok()) Fail("default options accepted a capsule", strict);
  if (d.ok()) CheckRoundTrip(*d->capsule, *kFuzzOptions);
  if (bytes.size() > kMaxDeepInput) return;
  CheckWriterOutputIsReadable(bytes.substr(0, 64));

  if (bytes.substr(0, kMagicSize) == kMagic) {
    if (std::optional<std::string> resealed = ResealUnsigned(bytes)) {
      StatusOr<DecodedCapsule> r = CheckedDecode(*resealed, *kFuzzOptions);
      if (r.ok()) CheckRoundTrip(*r->capsule, *kFuzzOptions);
    }
  } else {
    FuzzMessage(bytes);
  }
}

}  // namespace

PrivateKey FuzzSigningKey() {
  // 32 public bytes: this key protects nothing.
  static const char kSeed[] = "capsule fuzz corpus test key v1!";
  static_assert(sizeof(kSeed) - 1 == kEd25519KeySize);
  StatusOr<PrivateKey> key = PrivateKey::FromRaw(std::string_view(kSeed, kEd25519KeySize));
  if (!key.ok()) Fail("fuzz key", key.status());
  return *std::move(key);
}

ReadOptions FuzzReadOptions() {
  ReadOptions o;
  StatusOr<PublicKey> pub = FuzzSigningKey().GetPublicKey();
  if (!pub.ok()) Fail("fuzz public key", pub.status());
  o.trusted_keys.push_back(*pub);
  o.allow_unsigned = true;
  o.max_uncompressed_bytes = 1 << 20;
  o.max_file_bytes = 1 << 20;
  o.verify_tensor_digests = true;
  return o;
}

Status DecodeForRegression(std::string_view bytes) {
  if (bytes.substr(0, kMagicSize) == kMagic) {
    return DecodeCapsule(bytes, FuzzReadOptions()).status();
  }
  return DecodeCapsule(SealMessage(bytes), FuzzReadOptions()).status();
}

}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  capsule::fuzz::TestOneInput(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
