#include "capsule/format/internal/zstd_codec.h"

#include <zstd.h>

#include <memory>

namespace capsule::internal {
namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

std::string ZstdError(size_t code) { return ZSTD_getErrorName(code); }

}  // namespace

size_t ZstdCompressBound(size_t size) { return ZSTD_compressBound(size); }

StatusOr<size_t> ZstdCompressInto(std::string_view data, char* out, size_t capacity,
                                  const CompressOptions& options) {
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
  if (!cctx) return ResourceExhaustedError("zstd: cannot allocate a compression context");
  size_t rc = ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, options.level);
  if (!ZSTD_isError(rc)) rc = ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
  if (!ZSTD_isError(rc)) rc = ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1);
  if (!ZSTD_isError(rc) && options.workers > 0) {
    // A libzstd built without threads rejects this; compressing in this thread is still correct.
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_nbWorkers, options.workers);
  }
  if (ZSTD_isError(rc)) return InvalidArgumentError("zstd: " + ZstdError(rc));
  // compress2 writes the content size into the frame header since the whole input is known.
  const size_t n = ZSTD_compress2(cctx.get(), out, capacity, data.data(), data.size());
  if (ZSTD_isError(n)) return InternalError("zstd: compression failed: " + ZstdError(n));
  return n;
}

StatusOr<std::string> ZstdCompress(std::string_view data, const CompressOptions& options) {
  std::string out(ZstdCompressBound(data.size()), '\0');
  CAPSULE_ASSIGN_OR_RETURN(size_t n, ZstdCompressInto(data, out.data(), out.size(), options));
  out.resize(n);
  return out;
}

StatusOr<FrameInfo> ZstdFrameInfo(std::string_view frame) {
  // Only the stable API: the frame layout (RFC 8878 §3.1.1) fixes where the checksum flag lives.
  constexpr uint32_t kZstdMagic = 0xFD2FB528;
  if (frame.size() < 5) return DataLossError("payload is not a zstd frame (too short)");
  const auto* u = reinterpret_cast<const unsigned char*>(frame.data());
  const uint32_t magic = u[0] | u[1] << 8 | u[2] << 16 | static_cast<uint32_t>(u[3]) << 24;
  if (magic != kZstdMagic) return DataLossError("payload is not a zstd frame (bad magic)");
  FrameInfo info;
  info.has_checksum = (u[4] & 0x04) != 0;  // Frame_Header_Descriptor bit 2
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content == ZSTD_CONTENTSIZE_ERROR) return DataLossError("corrupt zstd frame header");
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) {
    return DataLossError("zstd frame does not declare its content size");
  }
  info.content_size = content;
  const size_t csize = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(csize)) return DataLossError("zstd frame is truncated or malformed");
  info.compressed_size = csize;
  return info;
}

Status ZstdCheckFrame(std::string_view frame, uint64_t expected_size, uint64_t max_size) {
  if (expected_size > max_size) {
    return ResourceExhaustedError("payload declares " + std::to_string(expected_size) +
                                  " bytes uncompressed, over the limit of " +
                                  std::to_string(max_size));
  }
  CAPSULE_ASSIGN_OR_RETURN(FrameInfo info, ZstdFrameInfo(frame));
  if (info.content_size != expected_size) {
    return DataLossError("zstd frame declares " + std::to_string(info.content_size) +
                         " bytes but the header says " + std::to_string(expected_size));
  }
  if (!info.has_checksum) return DataLossError("zstd frame has no content checksum");
  if (info.compressed_size != frame.size()) {
    return DataLossError("payload holds bytes after its zstd frame");
  }
  return Status::Ok();
}

Status ZstdDecompressInto(std::string_view frame, char* out, uint64_t expected_size,
                          uint64_t max_size) {
  CAPSULE_RETURN_IF_ERROR(ZstdCheckFrame(frame, expected_size, max_size));
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx(ZSTD_createDCtx());
  if (!dctx) return ResourceExhaustedError("zstd: cannot allocate a decompression context");
  const size_t n = ZSTD_decompressDCtx(dctx.get(), out, expected_size, frame.data(), frame.size());
  if (ZSTD_isError(n)) return DataLossError("corrupt payload: zstd: " + ZstdError(n));
  if (n != expected_size) return DataLossError("zstd frame decompressed to the wrong size");
  return Status::Ok();
}

StatusOr<std::string> ZstdDecompress(std::string_view frame, uint64_t expected_size,
                                     uint64_t max_size) {
  CAPSULE_RETURN_IF_ERROR(ZstdCheckFrame(frame, expected_size, max_size));
  std::string out(expected_size, '\0');
  CAPSULE_RETURN_IF_ERROR(ZstdDecompressInto(frame, out.data(), expected_size, max_size));
  return out;
}

std::string ZstdVersion() { return ZSTD_versionString(); }

}  // namespace capsule::internal
