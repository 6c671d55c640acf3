#include "capsule/format/capsule_reader.h"

#include <google/protobuf/io/zero_copy_stream.h>

#include <algorithm>
#include <climits>
#include <memory>

#include "capsule/base/internal/file_util.h"
#include "capsule/format/derivation.h"
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
constexpr size_t kDecompressStep = size_t{1} << 20;

// The payload as protobuf's parser pulls it: each window of decompressed bytes is scanned for the
// limits of checks 15-18 before the parser sees it, and the same window is reused for the next
// one. The payload is never held whole: the bytes go from zstd's window to this one to the
// parsed fields, and the only memory as large as the payload is the parsed message itself.
class PayloadStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  PayloadStream(internal::ZstdFrameReader* reader, internal::WireScanner* scanner)
      : reader_(reader), scanner_(scanner), window_(new char[kDecompressStep]) {}

  bool Next(const void** data, int* size) override {
    if (backed_up_ == 0) {
      if (!Fill()) return false;
      backed_up_ = filled_;
    }
    *data = window_.get() + (filled_ - backed_up_);
    *size = static_cast<int>(backed_up_);
    backed_up_ = 0;
    return true;
  }
  void BackUp(int count) override { backed_up_ = static_cast<size_t>(count); }
  bool Skip(int count) override {
    while (count > 0) {
      const void* data = nullptr;
      int size = 0;
      if (!Next(&data, &size)) return false;
      if (size > count) BackUp(size - count);
      count -= std::min(size, count);
    }
    return true;
  }
  int64_t ByteCount() const override {
    return static_cast<int64_t>(reader_->produced() - backed_up_);
  }

  // After the parser stopped, where it stopped: decompresses and scans whatever it did not pull,
  // so a corrupt frame or a limit broken later in the payload is reported as it would be had the
  // payload been decompressed whole before parsing (checks 14-18 before 19). OK when the frame
  // ended, whole, with the message.
  Status Finish() {
    while (Fill()) {
    }
    CAPSULE_RETURN_IF_ERROR(status_);
    return scanner_->Finish();
  }

 private:
  // The next window, decompressed and scanned; false at the end of the frame or on an error.
  bool Fill() {
    if (!status_.ok() || reader_->done()) return false;
    StatusOr<size_t> n = reader_->Read(window_.get(), kDecompressStep);
    if (!n.ok()) {
      status_ = n.status();
      return false;
    }
    const uint64_t end = reader_->produced();
    status_ = scanner_->Advance(window_.get(), end - *n, end);
    filled_ = *n;
    return status_.ok() && *n > 0;
  }

  internal::ZstdFrameReader* const reader_;
  internal::WireScanner* const scanner_;
  std::unique_ptr<char[]> window_;
  size_t filled_ = 0;     // bytes of the window that hold payload
  size_t backed_up_ = 0;  // of those, the ones the parser gave back
  Status status_;
};

}  // namespace

StatusOr<DecodedCapsule> DecodeCapsule(std::string_view bytes, const ReadOptions& options) {
  // Checks 2-10 of FORMAT.md §6: the envelope, digest and signature.
  OpenOptions open;
  open.trusted_keys = options.trusted_keys;
  open.allow_unsigned = options.allow_unsigned;
  open.allow_untrusted = options.allow_untrusted;
  CAPSULE_ASSIGN_OR_RETURN(OpenedEnvelope env, OpenEnvelope(bytes, open));
  CAPSULE_ASSIGN_OR_RETURN(DecodedCapsule out, DecodeOpenedEnvelope(env, options));
  // 21. What the capsule was made from is trusted as far as its own signer must be.
  CAPSULE_RETURN_IF_ERROR(
      CheckDerivations(*out.capsule, options.allow_untrusted, options.allow_unsigned));
  return out;
}

StatusOr<DecodedCapsule> DecodeOpenedEnvelope(const OpenedEnvelope& env,
                                              const ReadOptions& options) {
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
  CAPSULE_ASSIGN_OR_RETURN(
      std::unique_ptr<internal::ZstdFrameReader> reader,
      internal::ZstdFrameReader::Open(env.payload, size, options.max_uncompressed_bytes));
  if (size > uint64_t{INT_MAX}) {
    return ResourceExhaustedError("payload of " + std::to_string(size) +
                                  " bytes is over protobuf's 2 GiB message limit");
  }
  // 14-19. Decompression, the pass over the wire bytes that counts what parsing would build, and
  // parsing, window by window: the parser sees only bytes the pass has let through, so a payload
  // over a limit is refused at the field that breaks it, with nothing built from the bytes after
  // that field. A failed parse is reported only once the rest of the payload has been
  // decompressed and scanned, so the codes come in FORMAT.md's order.
  internal::WireScanner scanner(options.limits, size);
  PayloadStream stream(reader.get(), &scanner);
  DecodedCapsule out;
  out.envelope = env.info;
  out.capsule = std::make_unique<v1::Capsule>();
  const bool parsed = out.capsule->ParseFromZeroCopyStream(&stream);
  CAPSULE_RETURN_IF_ERROR(stream.Finish());
  if (!parsed) return DataLossError("corrupt payload (not a capsule.v1.Capsule message)");
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
