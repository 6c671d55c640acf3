#include "capsule/format/internal/zstd_codec.h"

#include <zstd.h>

#include <algorithm>
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
  const unsigned fhd = u[4];  // Frame_Header_Descriptor
  info.has_checksum = (fhd & 0x04) != 0;
  const bool single_segment = (fhd & 0x20) != 0;
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content == ZSTD_CONTENTSIZE_ERROR) return DataLossError("corrupt zstd frame header");
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) {
    return DataLossError("zstd frame does not declare its content size");
  }
  info.content_size = content;
  // Window_Descriptor (RFC 8878 §3.1.1.1.2): the byte after the descriptor, absent for a
  // single-segment frame, whose window is its content size.
  if (single_segment) {
    info.window_size = content;
  } else {
    const unsigned wd = u[5];  // present: ZSTD_getFrameContentSize read the whole header
    const uint64_t base = uint64_t{1} << (10 + (wd >> 3));
    info.window_size = base + (base / 8) * (wd & 7);
  }
  info.dictionary_id = ZSTD_getDictID_fromFrame(frame.data(), frame.size());
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
  if (info.dictionary_id != 0) {
    return DataLossError("zstd frame needs dictionary " + std::to_string(info.dictionary_id) +
                         "; capsules use none");
  }
  if (info.window_size > kMaxWindowSize) {
    return ResourceExhaustedError("zstd frame needs a window of " +
                                  std::to_string(info.window_size) + " bytes, over the limit of " +
                                  std::to_string(kMaxWindowSize) + " (zstd's default)");
  }
  return Status::Ok();
}

Status ZstdDecompressInto(std::string_view frame, char* out, uint64_t expected_size,
                          uint64_t max_size) {
  CAPSULE_RETURN_IF_ERROR(ZstdCheckFrame(frame, expected_size, max_size));
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx(ZSTD_createDCtx());
  if (!dctx) return ResourceExhaustedError("zstd: cannot allocate a decompression context");
  // Already checked from the header; set as well so the decoder itself holds to it.
  ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, 27);
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

Status ZstdDecompressInSteps(std::string_view frame, char* out, uint64_t expected_size,
                             uint64_t max_size, uint64_t step,
                             const std::function<Status(uint64_t done)>& progress) {
  CAPSULE_RETURN_IF_ERROR(ZstdCheckFrame(frame, expected_size, max_size));
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx(ZSTD_createDCtx());
  if (!dctx) return ResourceExhaustedError("zstd: cannot allocate a decompression context");
  // Streaming keeps a window buffer of the frame's window size; ZstdCheckFrame bounded it.
  ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, 27);
  ZSTD_inBuffer in{frame.data(), frame.size(), 0};
  ZSTD_outBuffer o{out, 0, 0};
  for (;;) {
    o.size = static_cast<size_t>(std::min<uint64_t>(expected_size, o.pos + step));
    const size_t in_before = in.pos, out_before = o.pos;
    const size_t left = ZSTD_decompressStream(dctx.get(), &o, &in);
    if (ZSTD_isError(left)) return DataLossError("corrupt payload: zstd: " + ZstdError(left));
    CAPSULE_RETURN_IF_ERROR(progress(o.pos));
    if (left == 0) break;  // the frame is complete and its checksum verified
    if (in.pos == in_before && o.pos == out_before) {
      return DataLossError("zstd frame is truncated or malformed");
    }
  }
  if (o.pos != expected_size) return DataLossError("zstd frame decompressed to the wrong size");
  return Status::Ok();
}

std::string ZstdVersion() { return ZSTD_versionString(); }

}  // namespace capsule::internal
