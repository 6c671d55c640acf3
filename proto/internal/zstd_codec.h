// The payload codec: exactly one zstd frame with its content size and content checksum
// (proto/FORMAT.md, "Payload"). Internal to capsule::format.
//
// Thread safety: the functions are thread-safe.
#ifndef CAPSULE_PROTO_INTERNAL_ZSTD_CODEC_H_
#define CAPSULE_PROTO_INTERNAL_ZSTD_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "proto/status.h"

namespace capsule::internal {

struct CompressOptions {
  int level = 3;    // zstd level; 3 is zstd's own default
  int workers = 0;  // zstd worker threads; 0 = compress in the calling thread
};

// One frame with content size and checksum set. Deterministic for fixed options.
StatusOr<std::string> ZstdCompress(std::string_view data, const CompressOptions& options);

// What a frame declares, read from its header without decompressing.
struct FrameInfo {
  uint64_t content_size = 0;
  bool has_checksum = false;
  uint64_t compressed_size = 0;  // of the first frame
};
StatusOr<FrameInfo> ZstdFrameInfo(std::string_view frame);

// Decompresses a payload that must be exactly one frame declaring `expected_size` bytes with a
// checksum. Refuses (kResourceExhausted) before allocating when the declared size exceeds
// `max_size`.
StatusOr<std::string> ZstdDecompress(std::string_view frame, uint64_t expected_size,
                                     uint64_t max_size);

std::string ZstdVersion();

}  // namespace capsule::internal

#endif  // CAPSULE_PROTO_INTERNAL_ZSTD_CODEC_H_
