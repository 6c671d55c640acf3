#include "capsule/format/capsule_reader.h"

#include <algorithm>
#include <climits>
#include <new>

#include "capsule/base/file_util.h"
#include "capsule/format/internal/wire_limits.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {

DecodedCapsule::DecodedCapsule() = default;
DecodedCapsule::~DecodedCapsule() = default;
DecodedCapsule::DecodedCapsule(DecodedCapsule&&) noexcept = default;
DecodedCapsule& DecodedCapsule::operator=(DecodedCapsule&&) noexcept = default;

namespace {
// Bytes decompressed between two looks at them.
constexpr uint64_t kDecompressStep = uint64_t{1} << 20;
}  // namespace

StatusOr<DecodedCapsule> DecodeCapsule(std::string_view bytes, const ReadOptions& options) {
  // Checks 2-10 of FORMAT.md §6: the envelope, digest and signature.
  OpenOptions open;
  open.trusted_keys = options.trusted_keys;
  open.allow_unsigned = options.allow_unsigned;
  open.allow_untrusted = options.allow_untrusted;
  CAPSULE_ASSIGN_OR_RETURN(OpenedEnvelope env, OpenEnvelope(bytes, open));

  // 11-13. What decompression would cost, before anything is allocated.
  const uint64_t size = env.info.header.uncompressed_size;
  if (size > options.max_uncompressed_bytes) {
    return ResourceExhaustedError("payload declares " + std::to_string(size) +
                                  " bytes uncompressed, over the limit of " +
                                  std::to_string(options.max_uncompressed_bytes));
  }
  const uint64_t compressed = env.payload.size();
  if (options.max_compression_ratio != 0 && size > options.ratio_free_bytes &&
      (compressed == 0 || size / compressed >= options.max_compression_ratio)) {
    return ResourceExhaustedError(
        "payload declares " + std::to_string(size) + " bytes uncompressed from " +
        std::to_string(compressed) + ", a compression ratio over the limit of " +
        std::to_string(options.max_compression_ratio) + ":1 (a decompression bomb?)");
  }
  CAPSULE_RETURN_IF_ERROR(
      internal::ZstdCheckFrame(env.payload, size, options.max_uncompressed_bytes));
  if (size > uint64_t{INT_MAX}) {
    return ResourceExhaustedError("payload of " + std::to_string(size) +
                                  " bytes is over protobuf's 2 GiB message limit");
  }
  // 14-18. Decompression, with a pass over the wire bytes as they arrive that counts what
  // parsing would build: a payload over a limit is refused at the field that breaks it, after at
  // most one more step of decompression. Uninitialised on purpose: zstd writes every byte, and a
  // zero-fill pass would cost as much as decompressing incompressible tensor data (and would
  // touch every page of a payload that is refused early).
  std::unique_ptr<char[]> serialized(new (std::nothrow) char[size == 0 ? 1 : size]);
  if (!serialized)
    return ResourceExhaustedError("cannot allocate " + std::to_string(size) + " bytes");
  internal::WireScanner scanner(options.limits, size);
  CAPSULE_RETURN_IF_ERROR(internal::ZstdDecompressInSteps(
      env.payload, serialized.get(), size, options.max_uncompressed_bytes, kDecompressStep,
      [&](uint64_t done) { return scanner.Advance(serialized.get(), done); }));
  CAPSULE_RETURN_IF_ERROR(scanner.Finish());
  // 19. Parsing.
  DecodedCapsule out;
  out.envelope = env.info;
  out.capsule = std::make_unique<v1::Capsule>();
  if (!out.capsule->ParseFromArray(serialized.get(), static_cast<int>(size))) {
    return DataLossError("corrupt payload (not a capsule.v1.Capsule message)");
  }
  serialized.reset();
  // 20. Content rules, for every reader: `options.validate` no longer turns them off.
  ValidateOptions vopts;
  vopts.verify_tensor_digests = options.verify_tensor_digests;
  Status s = ValidateCapsule(*out.capsule, vopts);
  if (!s.ok()) return s.WithContext("invalid capsule content");
  return out;
}

StatusOr<DecodedCapsule> ReadCapsuleFile(const std::string& path, const ReadOptions& options) {
  auto bytes = ReadFileBytes(path, options.max_file_bytes);
  if (!bytes.ok()) return bytes.status();
  auto decoded = DecodeCapsule(*bytes, options);
  if (!decoded.ok()) return decoded.status().WithContext(path);
  return decoded;
}

}  // namespace capsule
