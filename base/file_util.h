// Whole-file reads and crash-safe whole-file writes.
//
// WriteFileAtomic writes NAME.partial, fsyncs it, renames it over NAME and fsyncs the directory,
// so a crash or a kill at any point leaves either the old file or the new one under NAME, never a
// half-written file (proto/FORMAT.md §7). Codecs never touch disk; this is the thin layer on top.
//
//   CAPSULE_RETURN_IF_ERROR(capsule::WriteFileAtomic("a.capsule", bytes, 0644));
//   CAPSULE_ASSIGN_OR_RETURN(std::string bytes, capsule::ReadFileBytes("a.capsule", 1 << 30));
//
// Thread safety: thread-safe; concurrent writers of the same NAME race for the final rename.
#ifndef CAPSULE_BASE_FILE_UTIL_H_
#define CAPSULE_BASE_FILE_UTIL_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "capsule/base/status.h"

namespace capsule {

// kNotFound when missing, kResourceExhausted when larger than `max_bytes`.
StatusOr<std::string> ReadFileBytes(const std::string& path, uint64_t max_bytes);

struct AtomicWriteOptions {
  unsigned mode = 0644;
  bool overwrite = true;  // false: kAlreadyExists when NAME exists
};
Status WriteFileAtomic(const std::string& path, std::string_view bytes,
                       const AtomicWriteOptions& options = {});

}  // namespace capsule

#endif  // CAPSULE_BASE_FILE_UTIL_H_
