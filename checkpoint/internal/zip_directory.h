// The zip container torch.save writes (PyTorchStreamWriter, miniz): one folder of records, each
// stored uncompressed, the central directory at the end, zip64 records once the archive or a
// record passes 4 GiB. Only what a reader of such a file needs: the central directory's entries,
// and for a record that will be read, where its bytes start (past its local header).
//
//   CAPSULE_ASSIGN_OR_RETURN(ZipDirectory dir, ReadZipDirectory(source, limits));
//   CAPSULE_RETURN_IF_ERROR(LocateRecord(source, dir, entry));   // entry.data_offset
//
// Thread safety: thread-safe (pure functions over the source).
#ifndef CAPSULE_CHECKPOINT_INTERNAL_ZIP_DIRECTORY_H_
#define CAPSULE_CHECKPOINT_INTERNAL_ZIP_DIRECTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/checkpoint/checkpoint_index.h"

namespace capsule::internal {

struct ZipEntry {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;  // 0: stored
  uint64_t compressed_size = 0;
  uint64_t size = 0;           // uncompressed
  uint64_t header_offset = 0;  // of the local file header
  uint64_t data_offset = 0;    // of the record's bytes; set by LocateRecord
};

struct ZipDirectory {
  std::vector<ZipEntry> entries;  // in central directory order
  uint64_t directory_offset = 0;  // where the central directory starts: records end before it
};

// kInvalidArgument when there is no end-of-central-directory record (not a zip archive);
// kDataLoss when the directory contradicts the file (offsets or sizes past its end, a count that
// does not match); kUnimplemented for a multi-disk archive; kResourceExhausted over
// limits.max_zip_entries.
StatusOr<ZipDirectory> ReadZipDirectory(const CheckpointSource& source,
                                        const CheckpointLimits& limits);

// Reads `entry`'s local header and sets entry.data_offset. The record must be stored (method 0,
// not encrypted: kUnimplemented otherwise), its local header must name it, and its bytes must end
// before the central directory (kDataLoss otherwise).
Status LocateRecord(const CheckpointSource& source, const ZipDirectory& dir, ZipEntry& entry);

}  // namespace capsule::internal

#endif  // CAPSULE_CHECKPOINT_INTERNAL_ZIP_DIRECTORY_H_
