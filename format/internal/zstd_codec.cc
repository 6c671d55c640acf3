#include "capsule/format/internal/zstd_codec.h"

#include <zstd.h>

#include <algorithm>
#include <memory>
#include <utility>

namespace capsule::internal {
namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

std::string ZstdError(size_t code) { return ZSTD_getErrorName(code); }

// The parameters every capsule frame is made with: content size and checksum in the header.
Status Configure(ZSTD_CCtx* cctx, const CompressOptions& options) {
  size_t rc = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, options.level);
  if (!ZSTD_isError(rc)) rc = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  if (!ZSTD_isError(rc)) rc = ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
  if (!ZSTD_isError(rc) && options.workers > 0) {
    // A libzstd built without threads rejects this; compressing in this thread is still correct.
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_nbWorkers, options.workers);
  }
  if (ZSTD_isError(rc)) return InvalidArgumentError("zstd: " + ZstdError(rc));
  return Status::Ok();
}

}  // namespace

size_t ZstdCompressBound(size_t size) { return ZSTD_compressBound(size); }

StatusOr<size_t> ZstdCompressInto(std::string_view data, char* out, size_t capacity,
                                  const CompressOptions& options) {
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
  if (!cctx) return ResourceExhaustedError("zstd: cannot allocate a compression context");
  CAPSULE_RETURN_IF_ERROR(Configure(cctx.get(), options));
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

struct ZstdFrameReader::Ctx {
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx;
  ZSTD_inBuffer in{};
};

ZstdFrameReader::ZstdFrameReader(std::string_view frame, uint64_t expected_size)
    : ctx_(std::make_unique<Ctx>()), expected_size_(expected_size) {
  ctx_->in = ZSTD_inBuffer{frame.data(), frame.size(), 0};
}

ZstdFrameReader::~ZstdFrameReader() = default;

StatusOr<std::unique_ptr<ZstdFrameReader>> ZstdFrameReader::Open(std::string_view frame,
                                                                 uint64_t expected_size,
                                                                 uint64_t max_size) {
  CAPSULE_RETURN_IF_ERROR(ZstdCheckFrame(frame, expected_size, max_size));
  std::unique_ptr<ZstdFrameReader> reader(new ZstdFrameReader(frame, expected_size));
  reader->ctx_->dctx.reset(ZSTD_createDCtx());
  if (!reader->ctx_->dctx) {
    return ResourceExhaustedError("zstd: cannot allocate a decompression context");
  }
  // Streaming keeps a buffer of the frame's window size; ZstdCheckFrame bounded it, and the
  // decoder holds to the same bound itself.
  ZSTD_DCtx_setParameter(reader->ctx_->dctx.get(), ZSTD_d_windowLogMax, 27);
  return reader;
}

StatusOr<size_t> ZstdFrameReader::Read(char* out, size_t capacity) {
  if (done_) return size_t{0};
  ZSTD_outBuffer o{out, capacity, 0};
  ZSTD_inBuffer& in = ctx_->in;
  while (o.pos < o.size) {
    const size_t in_before = in.pos, out_before = o.pos;
    const size_t left = ZSTD_decompressStream(ctx_->dctx.get(), &o, &in);
    if (ZSTD_isError(left)) return DataLossError("corrupt payload: zstd: " + ZstdError(left));
    if (left == 0) {  // the frame is complete and its checksum verified
      done_ = true;
      break;
    }
    if (in.pos == in_before && o.pos == out_before) {
      return DataLossError("zstd frame is truncated or malformed");
    }
  }
  produced_ += o.pos;
  if (produced_ > expected_size_ || (done_ && produced_ != expected_size_)) {
    return DataLossError("zstd frame decompressed to the wrong size");
  }
  return o.pos;
}

struct ZstdFrameWriter::Ctx {
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx;
  std::unique_ptr<char[]> out;
  size_t out_size = 0;
};

ZstdFrameWriter::ZstdFrameWriter(uint64_t content_size, Sink sink)
    : ctx_(std::make_unique<Ctx>()), content_size_(content_size), sink_(std::move(sink)) {}

ZstdFrameWriter::~ZstdFrameWriter() = default;

StatusOr<std::unique_ptr<ZstdFrameWriter>> ZstdFrameWriter::Start(uint64_t content_size,
                                                                  const CompressOptions& options,
                                                                  Sink sink) {
  std::unique_ptr<ZstdFrameWriter> writer(new ZstdFrameWriter(content_size, std::move(sink)));
  Ctx& ctx = *writer->ctx_;
  ctx.cctx.reset(ZSTD_createCCtx());
  if (!ctx.cctx) return ResourceExhaustedError("zstd: cannot allocate a compression context");
  CAPSULE_RETURN_IF_ERROR(Configure(ctx.cctx.get(), options));
  // The pledged size goes into the frame header, as compress2 writes the size it was given, and
  // sizes the window as compress2 sizes it.
  const size_t rc = ZSTD_CCtx_setPledgedSrcSize(ctx.cctx.get(), content_size);
  if (ZSTD_isError(rc)) return InvalidArgumentError("zstd: " + ZstdError(rc));
  // Room for a whole compressed block: zstd then writes each block here directly.
  ctx.out_size = ZSTD_CStreamOutSize();
  ctx.out.reset(new char[ctx.out_size]);
  return writer;
}

Status ZstdFrameWriter::Drive(std::string_view data, bool end) {
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  for (;;) {
    ZSTD_outBuffer o{ctx_->out.get(), ctx_->out_size, 0};
    const size_t left =
        ZSTD_compressStream2(ctx_->cctx.get(), &o, &in, end ? ZSTD_e_end : ZSTD_e_continue);
    if (ZSTD_isError(left)) return InternalError("zstd: compression failed: " + ZstdError(left));
    if (o.pos > 0) CAPSULE_RETURN_IF_ERROR(sink_(std::string_view(ctx_->out.get(), o.pos)));
    if (end ? left == 0 : in.pos == in.size) {
      ended_ = end;
      return Status::Ok();
    }
  }
}

Status ZstdFrameWriter::Write(std::string_view data) {
  if (data.empty()) return Status::Ok();
  if (data.size() > content_size_ - consumed_) {
    return InternalError("zstd: more bytes than the frame declares");
  }
  consumed_ += data.size();
  // The last bytes end the frame in the same call, as compress2 ends it: otherwise a payload of a
  // whole number of blocks would end in an empty last block of its own.
  return Drive(data, /*end=*/consumed_ == content_size_);
}

Status ZstdFrameWriter::Finish() {
  if (consumed_ != content_size_) return InternalError("zstd: fewer bytes than the frame declares");
  return ended_ ? Status::Ok() : Drive(std::string_view(), /*end=*/true);
}

std::string ZstdVersion() { return ZSTD_versionString(); }

}  // namespace capsule::internal
