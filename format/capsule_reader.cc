#include "capsule/format/capsule_reader.h"

#include <algorithm>
#include <climits>
#include <new>

#include "capsule/base/file_util.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {

DecodedCapsule::DecodedCapsule() = default;
DecodedCapsule::~DecodedCapsule() = default;
DecodedCapsule::DecodedCapsule(DecodedCapsule&&) noexcept = default;
DecodedCapsule& DecodedCapsule::operator=(DecodedCapsule&&) noexcept = default;

StatusOr<DecodedCapsule> DecodeCapsule(std::string_view bytes, const ReadOptions& options) {
  OpenOptions open;
  open.trusted_keys = options.trusted_keys;
  open.allow_unsigned = options.allow_unsigned;
  open.allow_untrusted = options.allow_untrusted;
  CAPSULE_ASSIGN_OR_RETURN(OpenedEnvelope env, OpenEnvelope(bytes, open));

  const uint64_t size = env.info.header.uncompressed_size;
  CAPSULE_RETURN_IF_ERROR(
      internal::ZstdCheckFrame(env.payload, size, options.max_uncompressed_bytes));
  if (size > uint64_t{INT_MAX}) {
    return ResourceExhaustedError("payload of " + std::to_string(size) +
                                  " bytes is over protobuf's 2 GiB message limit");
  }
  // Uninitialised on purpose: zstd writes every byte, and a zero-fill pass would cost as much as
  // the decompression of incompressible tensor data.
  std::unique_ptr<char[]> serialized(new (std::nothrow) char[size == 0 ? 1 : size]);
  if (!serialized)
    return ResourceExhaustedError("cannot allocate " + std::to_string(size) + " bytes");
  CAPSULE_RETURN_IF_ERROR(internal::ZstdDecompressInto(env.payload, serialized.get(), size,
                                                       options.max_uncompressed_bytes));
  DecodedCapsule out;
  out.envelope = env.info;
  out.capsule = std::make_unique<v1::Capsule>();
  if (!out.capsule->ParseFromArray(serialized.get(), static_cast<int>(size))) {
    return DataLossError("corrupt payload (not a capsule.v1.Capsule message)");
  }
  if (options.validate) {
    ValidateOptions vopts;
    vopts.verify_tensor_digests = options.verify_tensor_digests;
    Status s = ValidateCapsule(*out.capsule, vopts);
    if (!s.ok()) return s.WithContext("invalid capsule content");
  }
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
