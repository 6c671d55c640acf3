#include "capsule/checkpoint/internal/zip_directory.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "capsule/base/internal/little_endian.h"

namespace capsule::internal {
namespace {

// PKWARE APPNOTE 6.3: signatures and fixed sizes of the records read here.
constexpr uint32_t kEndSignature = 0x06054b50;  // end of central directory
constexpr size_t kEndSize = 22;
constexpr size_t kMaxCommentSize = 0xffff;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr size_t kZip64EndSize = 56;
constexpr uint32_t kCentralSignature = 0x02014b50;
constexpr size_t kCentralSize = 46;
constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr size_t kLocalSize = 30;
constexpr uint16_t kZip64ExtraId = 0x0001;

Status Corrupt(const std::string& what) { return DataLossError("corrupt zip archive: " + what); }

Status Read(const CheckpointSource& source, uint64_t offset, size_t n, std::string& out) {
  if (offset > source.size || n > source.size - offset) {
    return Corrupt("a record at offset " + std::to_string(offset) + " runs past the end");
  }
  out.resize(n);
  return source.read(offset, n, out.data());
}

// The zip64 extended information of a central directory entry: the 64-bit values of the fields
// whose 32-bit (or 16-bit) slot holds all ones, in this order.
Status ApplyZip64Extra(std::string_view extra, uint32_t size32, uint32_t csize32, uint32_t offset32,
                       uint16_t disk16, ZipEntry& e) {
  while (extra.size() >= 4) {
    const uint16_t id = LoadLe16(extra.data());
    const uint16_t len = LoadLe16(extra.data() + 2);
    if (len > extra.size() - 4) return Corrupt("entry " + e.name + ": an extra field runs past it");
    std::string_view field = extra.substr(4, len);
    extra.remove_prefix(4 + size_t{len});
    if (id != kZip64ExtraId) continue;
    auto take = [&](uint64_t& v) {
      if (field.size() < 8) return false;
      v = LoadLe64(field.data());
      field.remove_prefix(8);
      return true;
    };
    if (size32 == 0xffffffff && !take(e.size)) break;
    if (csize32 == 0xffffffff && !take(e.compressed_size)) break;
    if (offset32 == 0xffffffff && !take(e.header_offset)) break;
    if (disk16 == 0xffff && field.size() < 4) break;
    return Status::Ok();
  }
  if (size32 == 0xffffffff || csize32 == 0xffffffff || offset32 == 0xffffffff || disk16 == 0xffff) {
    return Corrupt("entry " + e.name + " lacks the zip64 sizes its header calls for");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ZipDirectory> ReadZipDirectory(const CheckpointSource& source,
                                        const CheckpointLimits& limits) {
  const uint64_t size = source.size;
  if (size < kEndSize) {
    return InvalidArgumentError("not a zip archive (" + std::to_string(size) + " bytes)");
  }
  // The end record is the last thing in the file, followed only by its comment: search the tail
  // from the end for a signature whose comment length reaches exactly the end.
  const uint64_t tail_size = std::min<uint64_t>(size, kEndSize + kMaxCommentSize);
  std::string tail;
  CAPSULE_RETURN_IF_ERROR(Read(source, size - tail_size, static_cast<size_t>(tail_size), tail));
  size_t end = std::string::npos;
  for (size_t i = tail.size() - kEndSize + 1; i-- > 0;) {
    if (LoadLe32(tail.data() + i) == kEndSignature &&
        i + kEndSize + LoadLe16(tail.data() + i + 20) == tail.size()) {
      end = i;
      break;
    }
  }
  if (end == std::string::npos) {
    return InvalidArgumentError("not a zip archive (no end of central directory record)");
  }
  const char* e = tail.data() + end;
  const uint64_t end_offset = size - tail_size + end;
  const uint16_t disk = LoadLe16(e + 4), directory_disk = LoadLe16(e + 6);
  uint64_t count_on_disk = LoadLe16(e + 8), count = LoadLe16(e + 10);
  uint64_t directory_size = LoadLe32(e + 12), directory_offset = LoadLe32(e + 16);
  const bool needs_zip64 = count == 0xffff || count_on_disk == 0xffff ||
                           directory_size == 0xffffffff || directory_offset == 0xffffffff ||
                           disk == 0xffff || directory_disk == 0xffff;
  // A zip64 end record, when there is one, comes before the end record, with a locator between
  // them; PyTorch writes one whatever the archive's size.
  std::string locator;
  if (end_offset >= kZip64LocatorSize) {
    CAPSULE_RETURN_IF_ERROR(
        Read(source, end_offset - kZip64LocatorSize, kZip64LocatorSize, locator));
  }
  uint64_t directory_end = end_offset;  // the central directory ends where the next record starts
  if (locator.size() == kZip64LocatorSize && LoadLe32(locator.data()) == kZip64LocatorSignature) {
    const uint64_t record_offset = LoadLe64(locator.data() + 8);
    if (LoadLe32(locator.data() + 4) != 0 || LoadLe32(locator.data() + 16) > 1) {
      return UnimplementedError("a zip archive split over several disks");
    }
    if (record_offset > end_offset - kZip64LocatorSize ||
        end_offset - kZip64LocatorSize - record_offset < kZip64EndSize) {
      return Corrupt("the zip64 end record lies outside the file");
    }
    std::string record;
    CAPSULE_RETURN_IF_ERROR(Read(source, record_offset, kZip64EndSize, record));
    if (LoadLe32(record.data()) != kZip64EndSignature) {
      return Corrupt("no zip64 end record where the locator says");
    }
    if (LoadLe32(record.data() + 16) != 0 || LoadLe32(record.data() + 20) != 0) {
      return UnimplementedError("a zip archive split over several disks");
    }
    count_on_disk = LoadLe64(record.data() + 24);
    count = LoadLe64(record.data() + 32);
    directory_size = LoadLe64(record.data() + 40);
    directory_offset = LoadLe64(record.data() + 48);
    directory_end = record_offset;
  } else if (needs_zip64) {
    return Corrupt("no zip64 end record, which the end record calls for");
  } else if (disk != 0 || directory_disk != 0) {
    return UnimplementedError("a zip archive split over several disks");
  }
  if (count != count_on_disk) return Corrupt("the entry counts disagree");
  if (count > limits.max_zip_entries) {
    return ResourceExhaustedError("the zip archive has " + std::to_string(count) +
                                  " entries, over the limit of " +
                                  std::to_string(limits.max_zip_entries));
  }
  if (directory_offset > directory_end || directory_size != directory_end - directory_offset) {
    return Corrupt("the central directory (" + std::to_string(directory_size) + " bytes at " +
                   std::to_string(directory_offset) + ") does not end where the end record starts");
  }
  if (count > directory_size / kCentralSize) {
    return Corrupt("the central directory is too small for " + std::to_string(count) + " entries");
  }
  std::string cd;
  CAPSULE_RETURN_IF_ERROR(Read(source, directory_offset, static_cast<size_t>(directory_size), cd));

  ZipDirectory dir;
  dir.directory_offset = directory_offset;
  dir.entries.reserve(static_cast<size_t>(count));
  std::unordered_set<std::string_view> names;
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd.size() - at < kCentralSize || LoadLe32(cd.data() + at) != kCentralSignature) {
      return Corrupt("central directory entry " + std::to_string(i) + " is not where it should be");
    }
    const char* h = cd.data() + at;
    ZipEntry entry;
    entry.flags = LoadLe16(h + 8);
    entry.method = LoadLe16(h + 10);
    const uint32_t csize32 = LoadLe32(h + 20), size32 = LoadLe32(h + 24);
    const size_t name_len = LoadLe16(h + 28), extra_len = LoadLe16(h + 30),
                 comment_len = LoadLe16(h + 32);
    const uint16_t disk16 = LoadLe16(h + 34);
    const uint32_t offset32 = LoadLe32(h + 42);
    if (cd.size() - at - kCentralSize < name_len + extra_len + comment_len) {
      return Corrupt("central directory entry " + std::to_string(i) + " runs past the directory");
    }
    entry.name.assign(h + kCentralSize, name_len);
    entry.size = size32;
    entry.compressed_size = csize32;
    entry.header_offset = offset32;
    CAPSULE_RETURN_IF_ERROR(
        ApplyZip64Extra(std::string_view(h + kCentralSize + name_len, extra_len), size32, csize32,
                        offset32, disk16, entry));
    at += kCentralSize + name_len + extra_len + comment_len;
    dir.entries.push_back(std::move(entry));
  }
  if (at != cd.size()) return Corrupt("bytes after the last central directory entry");
  for (const ZipEntry& entry : dir.entries) {
    if (!names.insert(entry.name).second) {
      return InvalidArgumentError("the zip archive names " + entry.name + " twice");
    }
  }
  return dir;
}

Status LocateRecord(const CheckpointSource& source, const ZipDirectory& dir, ZipEntry& entry) {
  if ((entry.flags & 0x1) != 0) return UnimplementedError("record " + entry.name + " is encrypted");
  if (entry.method != 0) {
    return UnimplementedError("record " + entry.name + " is compressed (method " +
                              std::to_string(entry.method) +
                              "); torch.save stores records uncompressed");
  }
  if (entry.compressed_size != entry.size) {
    return Corrupt("stored record " + entry.name + " has two sizes");
  }
  if (entry.header_offset > dir.directory_offset ||
      dir.directory_offset - entry.header_offset < kLocalSize) {
    return Corrupt("record " + entry.name + " lies outside the file");
  }
  std::string local;
  CAPSULE_RETURN_IF_ERROR(Read(source, entry.header_offset, kLocalSize, local));
  if (LoadLe32(local.data()) != kLocalSignature) {
    return Corrupt("no local header for " + entry.name + " where the directory says");
  }
  const uint64_t name_len = LoadLe16(local.data() + 26), extra_len = LoadLe16(local.data() + 28);
  const uint64_t start = entry.header_offset + kLocalSize + name_len + extra_len;
  if (start > dir.directory_offset || dir.directory_offset - start < entry.size) {
    return Corrupt("record " + entry.name + " runs into the central directory");
  }
  std::string name;
  CAPSULE_RETURN_IF_ERROR(
      Read(source, entry.header_offset + kLocalSize, static_cast<size_t>(name_len), name));
  if (name != entry.name) {
    return Corrupt("the local header at " + std::to_string(entry.header_offset) + " names " + name +
                   ", not " + entry.name);
  }
  entry.data_offset = start;
  return Status::Ok();
}

}  // namespace capsule::internal
