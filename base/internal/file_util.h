// Whole-file reads and crash-safe whole-file writes: the one output-file policy of capsule; and
// RandomAccessFile, for files too large to hold whole (checkpoints).
//
// ReadFileBytes opens without blocking (a FIFO or a terminal never hangs the reader) and refuses
// anything that is not a regular file. WriteFileAtomic writes a uniquely named temporary file in
// the target's directory, fsyncs it, moves it to NAME and fsyncs the directory, so a crash or a
// kill at any point leaves either the old file or the new one under NAME, never a half-written one
// (proto/FORMAT.md §7). It never replaces anything but a regular file, and replaces that only when
// asked to. The directory is opened once and every step happens in it; the final step decides
// atomically, with nothing between a look and the move: without `overwrite` it is exclusive
// (renameat2 RENAME_NOREPLACE, or linkat), and with it the new file is exchanged with what stands
// at NAME (RENAME_EXCHANGE), which is removed if it is a regular file and put back otherwise, so a
// FIFO or device planted after the first check is never replaced. (A file system without
// renameat2's flags gets a check and a plain rename.) The codecs never touch disk; this is the
// thin layer on top.
//
//   CAPSULE_RETURN_IF_ERROR(capsule::WriteFileAtomic("a.capsule", bytes));   // new file only
//   capsule::AtomicWriteOptions replace;
//   replace.overwrite = true;
//   CAPSULE_RETURN_IF_ERROR(capsule::WriteFileAtomic("report.md", text, replace));
//   if (capsule::SameFile(in, out)) return InvalidArgumentError("output is the input");
//   CAPSULE_ASSIGN_OR_RETURN(std::string bytes, capsule::ReadFileBytes("a.capsule", 1 << 30));
//
// Thread safety: thread-safe. Concurrent writers of one NAME each write their own temporary file;
// with `overwrite` the last move wins, without it exactly one succeeds.
#ifndef CAPSULE_BASE_INTERNAL_FILE_UTIL_H_
#define CAPSULE_BASE_INTERNAL_FILE_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "capsule/base/status.h"

namespace capsule {

// A regular file's bytes and the facts about it that callers decide on.
struct RegularFile {
  std::string bytes;
  unsigned mode = 0;  // permission bits (st_mode & 07777)
  uint64_t device = 0;
  uint64_t inode = 0;
};

// Opens `path` with O_NONBLOCK (cleared once it is known to be a regular file) and reads it whole.
// kNotFound when missing; kInvalidArgument "PATH is not a regular file (a fifo)" for a directory,
// FIFO, socket or device, without blocking; kResourceExhausted when larger than `max_bytes`.
StatusOr<RegularFile> ReadRegularFile(const std::string& path, uint64_t max_bytes);
// ReadRegularFile(path, max_bytes).bytes.
StatusOr<std::string> ReadFileBytes(const std::string& path, uint64_t max_bytes);

// A regular file read at any offset, never whole: how a checkpoint of many gigabytes is hashed
// and its tensors read straight into their own memory. Opened as ReadRegularFile opens (a FIFO or a
// device is refused without blocking).
//
//   CAPSULE_ASSIGN_OR_RETURN(capsule::RandomAccessFile f, capsule::RandomAccessFile::Open(path));
//   CAPSULE_RETURN_IF_ERROR(f.ReadAt(offset, n, buffer));
class RandomAccessFile {
 public:
  // kNotFound when missing, kPermissionDenied, kInvalidArgument "PATH is not a regular file (a
  // fifo)" as ReadRegularFile.
  static StatusOr<RandomAccessFile> Open(const std::string& path);
  RandomAccessFile(RandomAccessFile&& other) noexcept;
  RandomAccessFile& operator=(RandomAccessFile&& other) noexcept;
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;
  ~RandomAccessFile();

  // The size when it was opened.
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Exactly `n` bytes from `offset` into `out`. kOutOfRange when the file ends first (it shrank
  // since it was opened, or the range is past size()).
  Status ReadAt(uint64_t offset, size_t n, char* out) const;

 private:
  RandomAccessFile(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// True when `a` and `b` both exist and are the same file (same device and inode, following
// symbolic links): how a command detects that its output would overwrite its own input.
bool SameFile(const std::string& a, const std::string& b);

struct AtomicWriteOptions {
  // Permission bits of the new file, applied whatever the umask (0600 for private keys).
  unsigned mode = 0644;
  // false (the default): kAlreadyExists when NAME exists, decided atomically at the final move.
  // true: an existing regular file NAME is replaced. Anything else at NAME (a directory, FIFO,
  // device, socket or symbolic link) is refused either way (kInvalidArgument), never replaced.
  bool overwrite = false;
};

// Errors: kAlreadyExists (see `overwrite`), kInvalidArgument (NAME is not a regular file),
// kNotFound (no such directory), kPermissionDenied, kResourceExhausted (disk full, file size
// limit; SIGXFSZ is held off while writing), kInternal otherwise. On any error nothing is left
// under NAME that was not there before, and the temporary file is removed.
Status WriteFileAtomic(const std::string& path, std::string_view bytes,
                       const AtomicWriteOptions& options = {});

// The temporary file of WriteFileAtomicWith, for the producer to write through. Errors are those
// of WriteFileAtomic (kResourceExhausted for a full disk, ...).
class AtomicFileWriter {
 public:
  virtual ~AtomicFileWriter() = default;
  // Writes `bytes` after everything written so far.
  virtual Status Append(std::string_view bytes) = 0;
  // Rewrites bytes already written, from `offset` (a header whose fields are known only once the
  // rest is written).
  virtual Status WriteAt(uint64_t offset, std::string_view bytes) = 0;
};

// WriteFileAtomic for content made piece by piece: `produce` writes the file through the writer,
// which goes to disk while the rest is made instead of being held whole first; then the file is
// fsynced and moved as WriteFileAtomic does. An error from `produce` is returned as it is, and
// like any other leaves nothing under NAME and no temporary file.
Status WriteFileAtomicWith(const std::string& path,
                           const std::function<Status(AtomicFileWriter& file)>& produce,
                           const AtomicWriteOptions& options = {});

// Creates `dir` and any missing parents (mode 0755, less the umask); OK when it exists already.
// `what` names the directory in messages ("cannot create capsule directory a/b: ..."). The codes
// of ErrnoError for a component that cannot be created; kFailedPrecondition when `dir` exists and
// is not a directory.
Status MakeDirs(const std::string& dir, std::string_view what = "directory");

}  // namespace capsule

#endif  // CAPSULE_BASE_INTERNAL_FILE_UTIL_H_
