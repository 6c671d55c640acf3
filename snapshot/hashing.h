// Identity hashes: the canonical model hash and file hashes (SHA-256 through OpenSSL).
//
// The canonical model hash names a set of weights independently of how they were saved: the
// parameters sorted by name, each contributing its name, dtype name, shape and contiguous
// little-endian bytes, with length prefixes so no two different models can produce the same byte
// stream. Replay refuses `--weights` whose canonical hash differs from the capsule's.
//
//   std::string h = capsule::CanonicalModelHash(model.NamedParameters());   // 64 hex chars
//   CAPSULE_ASSIGN_OR_RETURN(capsule::FileHash f, capsule::HashFile("data/tokenizer.json"));
//
// Thread safety: thread-safe; parameters must not be written while they are hashed.
#ifndef CAPSULE_SNAPSHOT_HASHING_H_
#define CAPSULE_SNAPSHOT_HASHING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/layer_sequence.h"

namespace capsule {

// Lowercase hex SHA-256; kInternal when a parameter cannot be read (e.g. a failed device copy).
StatusOr<std::string> CanonicalModelHash(const std::vector<NamedTensor>& parameters);

struct FileHash {
  std::string path;
  std::string name;  // base name
  int64_t size_bytes = 0;
  std::string sha256;  // lowercase hex
};
StatusOr<FileHash> HashFile(const std::string& path);

}  // namespace capsule

#endif  // CAPSULE_SNAPSHOT_HASHING_H_
