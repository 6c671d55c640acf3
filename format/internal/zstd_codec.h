// The payload codec: exactly one zstd frame with its content size and content checksum
// (proto/FORMAT.md, "Payload"). Internal to capsule::format.
//
// Thread safety: the functions are thread-safe.
#ifndef CAPSULE_FORMAT_INTERNAL_ZSTD_CODEC_H_
#define CAPSULE_FORMAT_INTERNAL_ZSTD_CODEC_H_

#include <cstdint>
#include <functional>
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

// The same, in steps: decompresses about `step` bytes at a time into `out` and calls
// `progress(done)` after each step with the number of bytes now in `out`. An error from
// `progress` stops the decompression and is returned, so a caller that judges the bytes as they
// arrive never pays for the rest of a payload it refuses.
Status ZstdDecompressInSteps(std::string_view frame, char* out, uint64_t expected_size,
                             uint64_t max_size, uint64_t step,
                             const std::function<Status(uint64_t done)>& progress);

std::string ZstdVersion();

}  // namespace capsule::internal

#endif  // CAPSULE_FORMAT_INTERNAL_ZSTD_CODEC_H_
