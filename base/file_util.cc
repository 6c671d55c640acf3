#include "capsule/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace capsule {
namespace {

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
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

}  // namespace

StatusOr<std::string> ReadFileBytes(const std::string& path, uint64_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return ResourceExhaustedError(path + " is " + std::to_string(st.st_size) +
                                  " bytes, over the limit of " + std::to_string(max_bytes));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path);
    }
    if (n == 0) break;  // shrank under us: return what is there; the decoder rejects it
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

Status WriteFileAtomic(const std::string& path, std::string_view bytes,
                       const AtomicWriteOptions& options) {
  if (!options.overwrite && ::access(path.c_str(), F_OK) == 0) {
    return Status(StatusCode::kAlreadyExists, path + " already exists; not overwriting it");
  }
  const std::string partial = path + ".partial";
  // A file over RLIMIT_FSIZE raises SIGXFSZ, which would kill the trainer; we want EFBIG instead.
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  const bool swapped = ::sigaction(SIGXFSZ, &ignore, &old) == 0;
  auto restore = [&] {
    if (swapped) ::sigaction(SIGXFSZ, &old, nullptr);
  };

  Fd fd(::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, options.mode));
  if (fd.get() < 0) {
    restore();
    return ErrnoError(errno, "cannot create", partial);
  }
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd.Release());
    ::unlink(partial.c_str());
    restore();
    return ErrnoError(err, what, partial);
  };
  // open() applies the umask; the requested mode is a promise (0600 for keys).
  if (::fchmod(fd.get(), options.mode) != 0) return fail("cannot chmod");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("cannot fsync");
  if (::close(fd.Release()) != 0) {
    const int err = errno;
    ::unlink(partial.c_str());
    restore();
    return ErrnoError(err, "cannot close", partial);
  }
  restore();
  if (::rename(partial.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(partial.c_str());
    return ErrnoError(err, "cannot rename to", path);
  }
  // The rename is durable only once the directory entry is.
  const std::string dir = DirName(path);
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());
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
