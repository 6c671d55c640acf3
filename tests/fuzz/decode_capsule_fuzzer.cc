#include "tests/fuzz/decode_capsule_fuzzer.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/wire_limits.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {
namespace {

// Inputs larger than this are only decoded as they are: re-sealing and round trips of big inputs
// slow the fuzzer without reaching new code.
constexpr size_t kMaxDeepInput = 1 << 20;

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
  ValidateOptions v;
  v.verify_tensor_digests = options.verify_tensor_digests;
  const Status s = ValidateCapsule(*d->capsule, v);
  if (!s.ok()) Fail("accepted an invalid capsule", s);
  const Status limits =
      internal::CheckWireLimits(SerializeDeterministic(*d->capsule), options.limits);
  if (!limits.ok()) Fail("accepted a capsule over the content limits", limits);
  return d;
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
  c.set_created_unix_micros(1700000000000000);
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
  const Status read = DecodeCapsule(*encoded, FuzzReadOptions()).status();
  if (!read.ok()) Fail("the reader refuses what the writer wrote", read);
}

void FuzzMessage(std::string_view serialized) {
  const ReadOptions& options = FuzzReadOptions();
  StatusOr<DecodedCapsule> d = CheckedDecode(SealMessage(serialized), options);
  // Whether the reader accepts must agree with the wire limits, parsing and validating directly.
  const Status limits = internal::CheckWireLimits(serialized, options.limits);
  v1::Capsule direct;
  const bool parsed = direct.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()));
  // The wire pass calls corrupt only what protobuf cannot parse either.
  if (limits.code() == StatusCode::kDataLoss && parsed) {
    Fail("the wire pass refused what protobuf parses", limits);
  }
  ValidateOptions v;
  v.verify_tensor_digests = options.verify_tensor_digests;
  const bool valid = limits.ok() && parsed && ValidateCapsule(direct, v).ok();
  if (d.ok() != valid) Fail("reader and direct limits+parse+validate disagree", d.status());
  if (d.ok()) CheckRoundTrip(*d->capsule, options);
}

void TestOneInput(std::string_view bytes) {
  const ReadOptions* const kFuzzOptions = &FuzzReadOptions();
  static const ReadOptions* const kDefaultOptions = new ReadOptions();
  QuietProtobuf();

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
