#include "capsule/base/internal/file_util.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_NOREPLACE
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <limits>
#include <mutex>

namespace capsule {
namespace {

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "a fifo", "a directory", ...: what st_mode says a non-regular file is.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a fifo";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a plain file";
}

Status NotRegular(const std::string& path, mode_t mode) {
  return InvalidArgumentError(path + " is not a regular file (" + KindOf(mode) + ")");
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// A file over RLIMIT_FSIZE raises SIGXFSZ, which would kill the trainer; we want EFBIG instead.
// The disposition is process-wide, so concurrent writers share one swap: the first one in sets
// SIG_IGN, the last one out puts back what was there (two plain swaps could interleave and leave
// SIG_IGN behind for good).
class IgnoreSigxfsz {
 public:
  IgnoreSigxfsz() {
    std::lock_guard<std::mutex> lock(mu_);
    if (users_++ > 0) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    swapped_ = ::sigaction(SIGXFSZ, &ignore, &old_) == 0;
  }
  ~IgnoreSigxfsz() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--users_ > 0) return;
    if (swapped_) ::sigaction(SIGXFSZ, &old_, nullptr);
    swapped_ = false;
  }
  IgnoreSigxfsz(const IgnoreSigxfsz&) = delete;
  IgnoreSigxfsz& operator=(const IgnoreSigxfsz&) = delete;

 private:
  static inline std::mutex mu_;
  static inline int users_ = 0;
  static inline struct sigaction old_ {};
  static inline bool swapped_ = false;
};

Status AlreadyExists(const std::string& path) {
  return Status(StatusCode::kAlreadyExists, path + " already exists; not overwriting it");
}

// What may stand at `name` (in the directory `dir`) before a write: nothing, or (with overwrite) a
// regular file. `path` is how messages name it.
Status CheckTarget(int dir, const std::string& name, const std::string& path, bool overwrite) {
  struct stat st;
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoError(errno, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(path + " is " + KindOf(st.st_mode) +
                                ", not a regular file; not replacing it");
  }
  if (!overwrite) return AlreadyExists(path);
  return Status::Ok();
}

bool RenameFlagsUnsupported(int err) { return err == EINVAL || err == ENOSYS || err == ENOTSUP; }

// Moves `temp` to `name`, both in `dir`, only if nothing is at `name`, atomically:
// renameat2(RENAME_NOREPLACE) where the file system has it, linkat() + unlinkat() where it does
// not. `temp` is removed on failure.
Status MoveExclusive(int dir, const std::string& temp, const std::string& name,
                     const std::string& path) {
  if (::renameat2(dir, temp.c_str(), dir, name.c_str(), RENAME_NOREPLACE) == 0) {
    return Status::Ok();
  }
  int err = errno;
  if (RenameFlagsUnsupported(err)) {
    if (::linkat(dir, temp.c_str(), dir, name.c_str(), 0) == 0) {
      ::unlinkat(dir, temp.c_str(), 0);
      return Status::Ok();
    }
    err = errno;
  }
  ::unlinkat(dir, temp.c_str(), 0);
  if (err == EEXIST) return AlreadyExists(path);
  return ErrnoError(err, "cannot rename to", path);
}

// Moves `temp` to `name`, both in `dir`, replacing what is there only if it is a regular file, with
// no moment between the look and the move: the two are exchanged atomically
// (renameat2(RENAME_EXCHANGE)), and what came out from under `name` is looked at under `temp`'s
// name. A regular file is then removed; anything else (a FIFO, a device, a directory, a link
// planted after the first check) is exchanged back, untouched. With nothing at `name`, the move is
// exclusive. Where the file system has no exchange, a look and a plain rename (the window this
// closes, on the file systems that have it). `temp` is removed on failure (unless it holds what
// stood at `name` and could not be put back, which the message says).
Status MoveReplacingRegular(int dir, const std::string& temp, const std::string& name,
                            const std::string& path) {
  // Something may come and go between the attempts; a few rounds settle it.
  for (int attempt = 0; attempt < 16; ++attempt) {
    if (::renameat2(dir, temp.c_str(), dir, name.c_str(), RENAME_EXCHANGE) == 0) {
      struct stat st;
      const bool regular =
          ::fstatat(dir, temp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
      if (regular) {
        ::unlinkat(dir, temp.c_str(), 0);
        return Status::Ok();
      }
      // Put it back; `temp` names our file again.
      if (::renameat2(dir, temp.c_str(), dir, name.c_str(), RENAME_EXCHANGE) != 0) {
        return ErrnoError(errno, "cannot move back (from " + temp + ") what stood at", path);
      }
      ::unlinkat(dir, temp.c_str(), 0);
      return InvalidArgumentError(path + " is " + KindOf(st.st_mode) +
                                  ", not a regular file; not replacing it");
    }
    if (errno == ENOENT) {
      // Nothing at `name`: an exclusive move, which fails if something appeared meanwhile, and
      // then the exchange is tried again.
      if (::renameat2(dir, temp.c_str(), dir, name.c_str(), RENAME_NOREPLACE) == 0) {
        return Status::Ok();
      }
      if (errno == EEXIST) continue;
    }
    if (RenameFlagsUnsupported(errno)) {
      Status target = CheckTarget(dir, name, path, /*overwrite=*/true);
      if (target.ok() && ::renameat(dir, temp.c_str(), dir, name.c_str()) == 0) {
        return Status::Ok();
      }
      if (target.ok()) target = ErrnoError(errno, "cannot rename to", path);
      ::unlinkat(dir, temp.c_str(), 0);
      return target;
    }
    break;
  }
  const int err = errno;
  ::unlinkat(dir, temp.c_str(), 0);
  return ErrnoError(err, "cannot rename to", path);
}

// Creates a new file with a unique hidden name derived from `base` in `dir` (O_EXCL: never an
// existing name, never through a link). Returns the descriptor and sets *name.
int CreateTemporary(int dir, const std::string& base, std::string* name) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  for (int attempt = 0; attempt < 100; ++attempt) {
    unsigned char random[6];
    if (::getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
      return -1;
    }
    std::string suffix;
    for (unsigned char r : random) suffix += kChars[r % (sizeof(kChars) - 1)];
    *name = "." + base.substr(0, 200) + "." + suffix;
    const int fd = ::openat(dir, name->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

StatusOr<RegularFile> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer, or a terminal line, would otherwise block here,
  // before fstat can tell us it is not a file.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return ResourceExhaustedError(path + " is " + std::to_string(st.st_size) +
                                  " bytes, over the limit of " + std::to_string(max_bytes));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoError(errno, "cannot read", path);
  }
  RegularFile out;
  out.mode = static_cast<unsigned>(st.st_mode & 07777);
  out.device = static_cast<uint64_t>(st.st_dev);
  out.inode = static_cast<uint64_t>(st.st_ino);
  out.bytes.assign(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.bytes.size()) {
    const ssize_t n = ::read(fd.get(), out.bytes.data() + done, out.bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path);
    }
    if (n == 0) break;  // shrank under us: return what is there; the decoder rejects it
    done += static_cast<size_t>(n);
  }
  out.bytes.resize(done);
  return out;
}

StatusOr<std::string> ReadFileBytes(const std::string& path, uint64_t max_bytes) {
  CAPSULE_ASSIGN_OR_RETURN(RegularFile file, ReadRegularFile(path, max_bytes));
  return std::move(file.bytes);
}

StatusOr<RandomAccessFile> RandomAccessFile::Open(const std::string& path) {
  // O_NONBLOCK as in ReadRegularFile: fstat decides before anything can block.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoError(errno, "cannot read", path);
  }
  return RandomAccessFile(fd.Release(), static_cast<uint64_t>(st.st_size), path);
}

RandomAccessFile::RandomAccessFile(RandomAccessFile&& other) noexcept
    : fd_(other.fd_), size_(other.size_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

RandomAccessFile& RandomAccessFile::operator=(RandomAccessFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status RandomAccessFile::ReadAt(uint64_t offset, size_t n, char* out) const {
  size_t done = 0;
  while (done < n) {
    const uint64_t at = offset + done;
    if (at < offset || at > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
      return OutOfRangeError(path_ + " ends before offset " + std::to_string(offset));
    }
    const ssize_t got = ::pread(fd_, out + done, n - done, static_cast<off_t>(at));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path_);
    }
    if (got == 0) {
      return OutOfRangeError(path_ + " ends at byte " + std::to_string(at) + ", before the " +
                             std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                             " (it shrank while being read?)");
    }
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

namespace {

class TempFileWriter final : public AtomicFileWriter {
 public:
  explicit TempFileWriter(int fd) : fd_(fd) {}

  Status Append(std::string_view bytes) override {
    CAPSULE_RETURN_IF_ERROR(WriteAt(size_, bytes));
    size_ += bytes.size();
#if defined(SYNC_FILE_RANGE_WRITE)
    // Starts writing back what is complete while the producer makes the rest, so the fsync at the
    // end waits for the last stretch only, not for the whole file. A hint: failures are ignored,
    // the fsync decides.
    if (size_ - started_ >= kWritebackStep) {
      ::sync_file_range(fd_, static_cast<off_t>(started_), static_cast<off_t>(size_ - started_),
                        SYNC_FILE_RANGE_WRITE);
      started_ = size_;
    }
#endif
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, std::string_view bytes) override {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                                 static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        errno_ = errno;
        return ErrnoError(errno_, "cannot write", "the temporary file");
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  // The errno of the first failed write; 0 when none failed.
  int write_errno() const { return errno_; }

 private:
  static constexpr uint64_t kWritebackStep = uint64_t{8} << 20;
  const int fd_;
  uint64_t size_ = 0;
  uint64_t started_ = 0;  // writeback was started for bytes [0, started_)
  int errno_ = 0;
};

}  // namespace

Status WriteFileAtomic(const std::string& path, std::string_view bytes,
                       const AtomicWriteOptions& options) {
  return WriteFileAtomicWith(
      path, [bytes](AtomicFileWriter& file) { return file.Append(bytes); }, options);
}

Status WriteFileAtomicWith(const std::string& path,
                           const std::function<Status(AtomicFileWriter& file)>& produce,
                           const AtomicWriteOptions& options) {
  const std::string base = BaseName(path);
  if (base.empty() || base == "." || base == "..") {
    return InvalidArgumentError(path + " is not a file name");
  }
  // The directory is resolved once: the check, the temporary file and the move all happen in the
  // directory this descriptor holds, whatever its path comes to name meanwhile.
  const std::string dir_path = DirName(path);
  Fd dir(::open(dir_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) {
    return ErrnoError(errno, errno == ENOTDIR ? "cannot stat" : "cannot create", path);
  }
  // Checked first so that a refusal costs nothing; the move below decides again, atomically.
  CAPSULE_RETURN_IF_ERROR(CheckTarget(dir.get(), base, path, options.overwrite));

  // A unique name in the target's directory (same file system, so the move is a rename). Hidden,
  // and never a name any other writer uses: two writers never share a temporary file, and a
  // leftover from a killed writer is never mistaken for, nor moved to, NAME.
  IgnoreSigxfsz sigxfsz;
  std::string temp;
  Fd fd(CreateTemporary(dir.get(), base, &temp));
  if (fd.get() < 0) return ErrnoError(errno, "cannot create", path);
  auto fail = [&](int err, const char* what) {
    if (fd.get() >= 0) ::close(fd.Release());
    ::unlinkat(dir.get(), temp.c_str(), 0);
    return ErrnoError(err, what, path);
  };
  // Created 0600 whatever the umask; the requested mode is a promise either way.
  if (::fchmod(fd.get(), options.mode) != 0) return fail(errno, "cannot chmod");
  TempFileWriter writer(fd.get());
  if (Status produced = produce(writer); !produced.ok()) {
    // A failed write is reported against NAME, as the writer could not name it.
    if (writer.write_errno() != 0) return fail(writer.write_errno(), "cannot write");
    ::close(fd.Release());
    ::unlinkat(dir.get(), temp.c_str(), 0);
    return produced;
  }
  if (::fsync(fd.get()) != 0) return fail(errno, "cannot fsync");
  if (::close(fd.Release()) != 0) return fail(errno, "cannot close");

  CAPSULE_RETURN_IF_ERROR(options.overwrite ? MoveReplacingRegular(dir.get(), temp, base, path)
                                            : MoveExclusive(dir.get(), temp, base, path));
  // The move is durable only once the directory entry is (an O_PATH descriptor cannot be synced).
  Fd sync(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (sync.get() >= 0 && ::fsync(sync.get()) != 0 && errno != EINVAL) {
    return ErrnoError(errno, "cannot fsync the directory of", path);
  }
  return Status::Ok();
}

Status MakeDirs(const std::string& dir, std::string_view what) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!partial.empty() && ::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(errno, "cannot create " + std::string(what), partial);
      }
    }
    if (i < dir.size()) partial += dir[i];
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(std::string(what) + " " + dir + " is not a directory");
  }
  return Status::Ok();
}

}  // namespace capsule
