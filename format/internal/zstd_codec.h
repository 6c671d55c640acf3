// The payload codec: exactly one zstd frame with its content size and content checksum
// (proto/FORMAT.md, "Payload"). Internal to capsule::format.
//
// Thread safety: the functions are thread-safe.
#ifndef CAPSULE_FORMAT_INTERNAL_ZSTD_CODEC_H_
#define CAPSULE_FORMAT_INTERNAL_ZSTD_CODEC_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "capsule/base/status.h"

namespace capsule::internal {

struct CompressOptions {
  int level = -1;   // zstd level (see WriteOptions::compression_level)
  int workers = 0;  // zstd worker threads; 0 = compress in the calling thread
};

// One frame with content size and checksum set. Deterministic for fixed options.
StatusOr<std::string> ZstdCompress(std::string_view data, const CompressOptions& options);
// The same into `out` (capacity at least ZstdCompressBound(data.size())); returns the frame size.
StatusOr<size_t> ZstdCompressInto(std::string_view data, char* out, size_t capacity,
                                  const CompressOptions& options);
size_t ZstdCompressBound(size_t size);

// The largest window a capsule's frame may need: zstd's default decoder limit (ZSTD_d_windowLogMax
// 27), which is also what the stock `zstd -d` accepts without --memory. Our writer's levels never
// need more.
inline constexpr uint64_t kMaxWindowSize = uint64_t{1} << 27;

// What a frame declares, read from its header without decompressing.
struct FrameInfo {
  uint64_t content_size = 0;
  bool has_checksum = false;
  uint64_t compressed_size = 0;  // of the first frame
  uint64_t window_size = 0;      // the content size for a single-segment frame
  uint32_t dictionary_id = 0;
};
StatusOr<FrameInfo> ZstdFrameInfo(std::string_view frame);

// Decompresses a payload that must be exactly one frame declaring `expected_size` bytes with a
// checksum. Refuses (kResourceExhausted) before allocating when the declared size exceeds
// `max_size`.
StatusOr<std::string> ZstdDecompress(std::string_view frame, uint64_t expected_size,
                                     uint64_t max_size);
// The checks ZstdDecompress makes before it allocates: the cap, one frame, declared content size
// equal to `expected_size`, checksum present, no dictionary, window at most kMaxWindowSize.
Status ZstdCheckFrame(std::string_view frame, uint64_t expected_size, uint64_t max_size);
// The same into a caller-provided buffer of exactly `expected_size` bytes (no zero-fill pass).
Status ZstdDecompressInto(std::string_view frame, char* out, uint64_t expected_size,
                          uint64_t max_size);

// Decompresses one frame in pieces into a caller's buffer, so a payload of any size passes
// through a window of fixed size and is never held whole:
//
//   CAPSULE_ASSIGN_OR_RETURN(auto reader, ZstdFrameReader::Open(frame, size, max_size));
//   while (!reader->done()) { CAPSULE_ASSIGN_OR_RETURN(size_t n, reader->Read(buf, cap)); ... }
class ZstdFrameReader {
 public:
  // Runs ZstdCheckFrame first, so nothing is allocated for a frame it refuses.
  static StatusOr<std::unique_ptr<ZstdFrameReader>> Open(std::string_view frame,
                                                         uint64_t expected_size, uint64_t max_size);
  ~ZstdFrameReader();

  // Decompresses up to `capacity` bytes into `out` and returns how many; fewer only at the end.
  // 0 once done(). kDataLoss for a corrupt frame, a checksum mismatch or a wrong size.
  StatusOr<size_t> Read(char* out, size_t capacity);
  // The frame is complete, its checksum verified and its size the declared one.
  bool done() const { return done_; }
  uint64_t produced() const { return produced_; }

 private:
  ZstdFrameReader(std::string_view frame, uint64_t expected_size);
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  const uint64_t expected_size_;
  uint64_t produced_ = 0;
  bool done_ = false;
};

// Compresses one frame from pieces and hands the frame to `sink` in pieces of at most about
// 128 KiB as it is made. The frame declares `content_size`; the piece that completes it ends the
// frame, and Finish checks that one did. The bytes do not depend on how the input is cut. Up to
// zstd's window (512 KiB and more) they are the bytes ZstdCompress makes of the pieces joined;
// past it they may differ by a few matches, since zstd then compresses from its own buffer
// rather than from the whole input at once.
class ZstdFrameWriter {
 public:
  using Sink = std::function<Status(std::string_view piece)>;
  static StatusOr<std::unique_ptr<ZstdFrameWriter>> Start(uint64_t content_size,
                                                          const CompressOptions& options,
                                                          Sink sink);
  ~ZstdFrameWriter();

  Status Write(std::string_view data);
  // Ends the frame (kInternal when the pieces did not add up to `content_size`).
  Status Finish();

 private:
  ZstdFrameWriter(uint64_t content_size, Sink sink);
  Status Drive(std::string_view data, bool end);
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  const uint64_t content_size_;
  uint64_t consumed_ = 0;
  bool ended_ = false;
  Sink sink_;
};

std::string ZstdVersion();

}  // namespace capsule::internal

#endif  // CAPSULE_FORMAT_INTERNAL_ZSTD_CODEC_H_
