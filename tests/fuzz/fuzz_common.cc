#include "tests/fuzz/fuzz_common.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/zstd_codec.h"

namespace capsule::fuzz {
using ::capsule::internal::LoadLe32;
using ::capsule::internal::LoadLe64;
using ::capsule::internal::StoreLe32;

void Fail(const char* what, const Status& status) {
  std::fprintf(stderr, "fuzz invariant broken: %s (%s)\n", what, status.ToString().c_str());
  std::abort();
}

PrivateKey FuzzSigningKey() {
  // 32 public bytes: this key protects nothing.
  static const char kSeed[] = "capsule fuzz corpus test key v1!";
  static_assert(sizeof(kSeed) - 1 == kEd25519KeySize);
  StatusOr<PrivateKey> key = PrivateKey::FromRaw(std::string_view(kSeed, kEd25519KeySize));
  if (!key.ok()) Fail("fuzz key", key.status());
  return *std::move(key);
}

const ReadOptions& FuzzReadOptions() {
  static const ReadOptions* const options = [] {
    auto* o = new ReadOptions();
    StatusOr<PublicKey> pub = FuzzSigningKey().GetPublicKey();
    if (!pub.ok()) Fail("fuzz public key", pub.status());
    o->trusted_keys.push_back(*pub);
    o->allow_unsigned = true;
    o->max_uncompressed_bytes = 1 << 20;
    o->max_file_bytes = 1 << 20;
    o->verify_tensor_digests = true;
    o->limits.max_unknown_field_bytes = 64 << 10;
    o->limits.max_messages = 4096;
    o->limits.max_repeated_strings = 4096;
    o->limits.max_repeated_numbers = 4096;
    o->limits.max_string_bytes = 64 << 10;
    return o;
  }();
  return *options;
}

std::string SealMessage(std::string_view serialized) {
  StatusOr<std::string> frame = internal::ZstdCompress(serialized, internal::CompressOptions());
  if (!frame.ok()) Fail("compressing", frame.status());
  StatusOr<std::string> sealed = SealEnvelope(*frame, serialized.size(), SealOptions());
  if (!sealed.ok()) Fail("sealing", sealed.status());
  return *std::move(sealed);
}

std::string SerializeDeterministic(const google::protobuf::Message& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

// Header ‖ payload of a capsule-shaped input under an unsigned trailer with a matching digest;
// nullopt when the header's sizes do not lay out inside the input.
std::optional<DecodedCapsule> DecodeFuzzInput(std::string_view bytes) {
  const std::optional<std::string> file =
      bytes.substr(0, kMagicSize) == kMagic ? ResealUnsigned(bytes) : SealMessage(bytes);
  if (!file.has_value()) return std::nullopt;
  StatusOr<DecodedCapsule> d = DecodeCapsule(*file, FuzzReadOptions());
  if (!d.ok()) return std::nullopt;
  return std::move(*d);
}

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
  out.append(*Sha256(*SignedMessage(header, payload)));
  char tail[4];
  StoreLe32(tail, kTrailerFixedSize);
  out.append(tail, sizeof(tail));
  out.append(kEndMagic);
  return out;
}

void QuietProtobuf() {
  static const bool kQuiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)kQuiet;
}

}  // namespace capsule::fuzz
