// Whole-file reads, crash-safe writes and directory creation (base/internal/file_util.h),
// WriteCapsuleFile / ReadCapsuleFile, and capsule file names.
#include "capsule/base/internal/file_util.h"

#include <fcntl.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>
#include <vector>

#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/format/capsule_test_util.h"
#include "tests/format/temp_dir.h"

namespace capsule::test {
namespace {

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

class FileUtilTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  TempDir dir_;
};

// Names in the test directory other than "." and "..".
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

AtomicWriteOptions Overwrite() {
  AtomicWriteOptions o;
  o.overwrite = true;
  return o;
}

TEST_F(FileUtilTest, WriteFileAtomicCreatesTheFileAndNothingElse) {
  const std::string path = Path("a.bin");
  const std::string bytes("\x00\x01 capsule \xff", 12);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  EXPECT_EQ(ReadAll(path), bytes);
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"a.bin"});
  EXPECT_EQ(ModeOf(path), 0644u);
}

TEST_F(FileUtilTest, WriteFileAtomicModeIgnoresTheUmask) {
  const std::string path = Path("b.bin");
  AtomicWriteOptions o;
  o.mode = 0640;
  const mode_t old_umask = ::umask(0077);
  const Status s = WriteFileAtomic(path, "x", o);
  ::umask(old_umask);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ModeOf(path), 0640u);
}

TEST_F(FileUtilTest, WriteFileAtomicRefusesToOverwriteByDefault) {
  const std::string path = Path("d.bin");
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  EXPECT_TRUE(HasError(WriteFileAtomic(path, "second"), StatusCode::kAlreadyExists,
                       path + " already exists; not overwriting it"));
  EXPECT_EQ(ReadAll(path), "first");
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"d.bin"});
}

TEST_F(FileUtilTest, WriteFileAtomicReplacesARegularFileWhenAsked) {
  const std::string path = Path("c.bin");
  ASSERT_TRUE(WriteFileAtomic(path, "old contents that are longer").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "new", Overwrite()).ok());
  EXPECT_EQ(ReadAll(path), "new");
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"c.bin"});
}

// As root, `-o /dev/full` used to replace the device with a regular file: whatever stands at the
// target, if it is not a regular file it is refused and left as it was, overwrite or not.
TEST_F(FileUtilTest, FifoTargetIsRefusedAndKept) {
  const std::string path = Path("fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  for (const AtomicWriteOptions& o : {AtomicWriteOptions(), Overwrite()}) {
    EXPECT_TRUE(HasError(WriteFileAtomic(path, "x", o), StatusCode::kInvalidArgument,
                         path + " is a fifo, not a regular file; not replacing it"));
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
  }
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"fifo"});
}

TEST_F(FileUtilTest, DeviceTargetIsRefusedAndKept) {
  // A copy of /dev/full (1,7) inside the test directory; only root may make one.
  const std::string path = Path("full");
  if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) {
    GTEST_SKIP() << "cannot make a device node here (not root)";
  }
  EXPECT_TRUE(HasError(WriteFileAtomic(path, "x", Overwrite()), StatusCode::kInvalidArgument,
                       "is a character device, not a regular file"));
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST_F(FileUtilTest, SymbolicLinkTargetIsRefusedAndKept) {
  const std::string path = Path("null");
  ASSERT_EQ(::symlink("/dev/null", path.c_str()), 0);
  EXPECT_TRUE(HasError(WriteFileAtomic(path, "x", Overwrite()), StatusCode::kInvalidArgument,
                       "is a symbolic link, not a regular file"));
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

TEST_F(FileUtilTest, TargetIsADirectory) {
  const std::string sub = Path("sub");
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((sub + "/inner").c_str(), 0700), 0);
  EXPECT_TRUE(HasError(WriteFileAtomic(sub, "x", Overwrite()), StatusCode::kInvalidArgument,
                       sub + " is a directory, not a regular file"));
  EXPECT_TRUE(HasError(WriteFileAtomic(sub + "/", "x"), StatusCode::kInvalidArgument,
                       "is not a file name"));
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"sub"});
}

TEST_F(FileUtilTest, AFifoPlantedBeforeTheMoveIsNeverReplaced) {
  // With overwrite, the writer used to look at NAME and then rename over it: a FIFO (or device)
  // planted between the look and the rename was replaced. A planter thread plants FIFOs at NAME
  // as fast as it can while the writer replaces NAME again and again; each FIFO is held open, and
  // one the writer replaced has no name left (st_nlink 0). Exchanged and put back, it keeps one.
  const std::string path = Path("out.md");
  std::atomic<bool> stop{false};
  std::atomic<int> planted{0}, replaced{0};
  std::thread planter([&] {
    while (!stop) {
      ::unlink(path.c_str());  // the writer's file, or the last FIFO
      for (volatile int spin = 0; spin < 2000; spin = spin + 1) {
      }
      if (::mkfifo(path.c_str(), 0600) != 0) continue;
      const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;
      struct stat st {};
      if (::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) {
        ++planted;
        for (volatile int spin = 0; spin < 20000; spin = spin + 1) {
        }
        if (::fstat(fd, &st) == 0 && st.st_nlink == 0) ++replaced;
      }
      ::close(fd);
    }
  });
  int written = 0, refused = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (std::chrono::steady_clock::now() < deadline && replaced == 0) {
    const Status s = WriteFileAtomic(path, "report", Overwrite());
    if (s.ok()) {
      ++written;
    } else {
      ++refused;
      EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ||
                  s.code() == StatusCode::kInternal)
          << s;
    }
  }
  stop = true;
  planter.join();
  EXPECT_EQ(replaced, 0) << "a FIFO planted at NAME was replaced (" << planted << " planted, "
                         << written << " writes, " << refused << " refused)";
  EXPECT_GT(written, 0);
  EXPECT_GT(refused, 0);
}

TEST_F(FileUtilTest, AFixedTemporaryNameIsNeverFollowed) {
  // A fixed NAME.partial let anyone who can write the directory plant a link there and have the
  // writer truncate and fill the file it points to.
  const std::string path = Path("e.bin");
  const std::string victim = Path("victim");
  std::ofstream(victim) << "precious";
  ASSERT_EQ(::symlink(victim.c_str(), (path + ".partial").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(path, "whole").ok());
  EXPECT_EQ(ReadAll(path), "whole");
  EXPECT_EQ(ReadAll(victim), "precious");
  struct stat st {};
  ASSERT_EQ(::lstat((path + ".partial").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "a file the writer did not create was touched";
}

TEST_F(FileUtilTest, ExclusiveWritersHaveExactlyOneWinner) {
  const std::string path = Path("race.bin");
  constexpr int kWriters = 8;
  std::vector<Status> results(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      results[i] = WriteFileAtomic(path, std::string(4096, static_cast<char>('a' + i)));
    });
  }
  for (std::thread& t : threads) t.join();
  int winners = 0;
  char winner = 0;
  for (int i = 0; i < kWriters; ++i) {
    if (results[i].ok()) {
      ++winners;
      winner = static_cast<char>('a' + i);
    } else {
      EXPECT_EQ(results[i].code(), StatusCode::kAlreadyExists) << results[i];
    }
  }
  EXPECT_EQ(winners, 1);
  EXPECT_EQ(ReadAll(path), std::string(4096, winner));
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"race.bin"});
}

TEST_F(FileUtilTest, AKilledWriterLeavesNothingUnderTheFinalName) {
  // The child writes 256 MiB (pages of /dev/zero, so it costs no memory) and is killed with
  // SIGKILL as soon as its temporary file appears.
  const std::string path = Path("killed.bin");
  constexpr size_t kSize = size_t{256} << 20;
  void* zeros = ::mmap(nullptr, kSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(zeros, MAP_FAILED);
  const pid_t pid = ::fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    const Status s = WriteFileAtomic(path, std::string_view(static_cast<char*>(zeros), kSize));
    ::_exit(s.ok() ? 0 : 1);
  }
  bool seen = false;
  for (int i = 0; i < 20000 && !seen; ++i) {
    seen = !Entries(dir_.path()).empty();
    if (!seen) ::usleep(100);
  }
  ::kill(pid, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ::munmap(zeros, kSize);
  ASSERT_TRUE(seen) << "the writer never created its temporary file";
  if (!WIFSIGNALED(wstatus)) GTEST_SKIP() << "the writer finished before it could be killed";
  EXPECT_FALSE(Exists(path));
  const std::vector<std::string> left = Entries(dir_.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].rfind(".killed.bin.", 0), 0u) << left[0];
  // The leftover never blocks the next writer, nor becomes NAME.
  ASSERT_TRUE(WriteFileAtomic(path, "whole").ok());
  EXPECT_EQ(ReadAll(path), "whole");
}

TEST_F(FileUtilTest, UnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string ro = Path("ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
  EXPECT_TRUE(HasError(WriteFileAtomic(ro + "/f.bin", "x"), StatusCode::kPermissionDenied,
                       "cannot create " + ro + "/f.bin"));
  EXPECT_FALSE(Exists(ro + "/f.bin"));
}

TEST_F(FileUtilTest, ParentIsARegularFile) {
  // ENOTDIR: fails for root as well, unlike a permission test.
  const std::string file = Path("plain");
  std::ofstream(file) << "x";
  EXPECT_TRUE(HasError(WriteFileAtomic(file + "/f.bin", "x"), StatusCode::kNotFound,
                       "cannot stat " + file + "/f.bin"));
}

TEST_F(FileUtilTest, MissingParentDirectory) {
  EXPECT_TRUE(HasError(WriteFileAtomic(Path("no/such/dir/f.bin"), "x"), StatusCode::kNotFound,
                       "cannot create"));
}

// Exit codes of the child below that are not a StatusCode.
constexpr int kChildSigxfszNotRestored = 100;
constexpr int kChildSetrlimitFailed = 101;

TEST_F(FileUtilTest, FileSizeLimitIsResourceExhaustedAndLeavesNothing) {
  // RLIMIT_FSIZE is per process: set it in a child so the test runner is unaffected. The child
  // reports the Status code as its exit code.
  const std::string path = Path("big.bin");
  const pid_t pid = ::fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    struct rlimit rl {};
    rl.rlim_cur = rl.rlim_max = 4096;
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) ::_exit(kChildSetrlimitFailed);
    const Status s = WriteFileAtomic(path, std::string(64 * 1024, 'x'));
    struct sigaction now {};
    ::sigaction(SIGXFSZ, nullptr, &now);
    if (now.sa_handler != SIG_DFL) ::_exit(kChildSigxfszNotRestored);
    ::_exit(static_cast<int>(s.code()));
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus)) << "child killed by signal "
                                  << (WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0);
  ASSERT_NE(WEXITSTATUS(wstatus), kChildSetrlimitFailed);
  ASSERT_NE(WEXITSTATUS(wstatus), kChildSigxfszNotRestored) << "SIGXFSZ handler left changed";
  EXPECT_EQ(WEXITSTATUS(wstatus), static_cast<int>(StatusCode::kResourceExhausted))
      << StatusCodeName(static_cast<StatusCode>(WEXITSTATUS(wstatus)));
  EXPECT_TRUE(Entries(dir_.path()).empty());
}

TEST_F(FileUtilTest, FileSizeLimitMessage) {
  // Same as above, checking the message in the child: the code alone could come from elsewhere.
  const std::string path = Path("big2.bin");
  const pid_t pid = ::fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    struct rlimit rl {};
    rl.rlim_cur = rl.rlim_max = 1024;
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) ::_exit(kChildSetrlimitFailed);
    const Status s = WriteFileAtomic(path, std::string(8 * 1024, 'x'));
    const bool ok = s.code() == StatusCode::kResourceExhausted &&
                    s.message().find("cannot write " + path + ": ") != std::string::npos;
    ::_exit(ok ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

TEST_F(FileUtilTest, WriteFileAtomicWithWritesWhatTheProducerWrote) {
  const std::string path = Path("made.bin");
  ASSERT_TRUE(WriteFileAtomicWith(path, [](AtomicFileWriter& f) {
                Status s = f.Append("....head");
                if (s.ok()) s = f.Append(std::string(100000, 'b'));
                if (s.ok()) s = f.WriteAt(0, "HEAD");
                return s.ok() ? f.Append("tail") : s;
              }).ok());
  EXPECT_EQ(ReadAll(path), "HEADhead" + std::string(100000, 'b') + "tail");
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"made.bin"});
}

TEST_F(FileUtilTest, AProducerErrorLeavesNothing) {
  const std::string path = Path("failed.bin");
  EXPECT_TRUE(HasError(WriteFileAtomicWith(path,
                                           [](AtomicFileWriter& f) {
                                             Status s = f.Append(std::string(100000, 'x'));
                                             return s.ok() ? DataLossError("made up") : s;
                                           }),
                       StatusCode::kDataLoss, "made up"));
  EXPECT_TRUE(Entries(dir_.path()).empty());
  // An existing file is kept whatever the producer does.
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  EXPECT_FALSE(WriteFileAtomicWith(
                   path, [](AtomicFileWriter&) { return InternalError("no"); }, Overwrite())
                   .ok());
  EXPECT_EQ(ReadAll(path), "old");
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"failed.bin"});
}

TEST_F(FileUtilTest, SameFileComparesDeviceAndInode) {
  const std::string a = Path("a");
  const std::string b = Path("b");
  ASSERT_TRUE(WriteFileAtomic(a, "same bytes").ok());
  ASSERT_TRUE(WriteFileAtomic(b, "same bytes").ok());
  ASSERT_EQ(::link(a.c_str(), Path("hard").c_str()), 0);
  ASSERT_EQ(::symlink(a.c_str(), Path("soft").c_str()), 0);
  EXPECT_TRUE(SameFile(a, a));
  EXPECT_TRUE(SameFile(a, dir_.path() + "/./a"));
  EXPECT_TRUE(SameFile(a, Path("hard")));
  EXPECT_TRUE(SameFile(Path("soft"), a));
  EXPECT_FALSE(SameFile(a, b));  // equal bytes, other file
  EXPECT_FALSE(SameFile(a, Path("missing")));
  EXPECT_FALSE(SameFile(Path("missing"), Path("missing")));
}

TEST_F(FileUtilTest, ReadFileBytes) {
  const std::string path = Path("r.bin");
  const std::string bytes(5000, '\x7f');
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  StatusOr<std::string> read = ReadFileBytes(path, 5000);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
  EXPECT_TRUE(HasError(ReadFileBytes(path, 4999), StatusCode::kResourceExhausted,
                       "is 5000 bytes, over the limit of 4999"));
  EXPECT_TRUE(HasError(ReadFileBytes(Path("missing"), 10), StatusCode::kNotFound,
                       "cannot open " + Path("missing")));
  EXPECT_TRUE(HasError(ReadFileBytes(dir_.path(), 10), StatusCode::kInvalidArgument,
                       "is not a regular file (a directory)"));
  EXPECT_TRUE(HasError(ReadFileBytes("/dev/null", 10), StatusCode::kInvalidArgument,
                       "/dev/null is not a regular file (a character device)"));
}

TEST_F(FileUtilTest, ReadRegularFileReportsModeAndIdentity) {
  const std::string path = Path("m.bin");
  AtomicWriteOptions o;
  o.mode = 0640;
  ASSERT_TRUE(WriteFileAtomic(path, "abc", o).ok());
  StatusOr<RegularFile> f = ReadRegularFile(path, 10);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->bytes, "abc");
  EXPECT_EQ(f->mode, 0640u);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(f->device, static_cast<uint64_t>(st.st_dev));
  EXPECT_EQ(f->inode, static_cast<uint64_t>(st.st_ino));
}

TEST_F(FileUtilTest, FifoInputIsRefusedWithoutBlocking) {
  // open() of a FIFO without a writer blocks until one comes: every reader used to hang here.
  const std::string path = Path("in.fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] { return ReadFileBytes(path, 1 << 20).status(); });
  if (read.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Release the blocked reader so the test ends, then fail.
    const int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    FAIL() << "reading a FIFO blocked";
  }
  EXPECT_TRUE(
      HasError(read.get(), StatusCode::kInvalidArgument, path + " is not a regular file (a fifo)"));
}

TEST_F(FileUtilTest, MakeDirsCreatesParentsOnceAndRefusesAFile) {
  const std::string deep = Path("a/b/c");
  ASSERT_TRUE(MakeDirs(deep).ok());
  struct stat st {};
  ASSERT_EQ(::stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(MakeDirs(deep).ok());  // already there
  EXPECT_TRUE(MakeDirs(deep + "/").ok());
  const std::string file = Path("plain");
  std::ofstream(file) << "x";
  EXPECT_TRUE(HasError(MakeDirs(file), StatusCode::kFailedPrecondition,
                       "directory " + file + " is not a directory"));
  EXPECT_TRUE(HasError(MakeDirs(file + "/sub", "capsule directory"), StatusCode::kNotFound,
                       "cannot create capsule directory " + file + "/sub: "));
}

class CapsuleFileTest : public CapsuleBytesTest {
 protected:
  TempDir dir_;
};

TEST_F(CapsuleFileTest, WriteThenRead) {
  const std::string path = dir_.path() + "/" + CapsuleFileName("run", 7, 0, "NON_FINITE_LOSS");
  WriteOptions w;
  w.signing_key = &key_;
  ASSERT_TRUE(WriteCapsuleFile(path, MakeFullCapsule(), w).ok());
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{std::filesystem::path(path).filename()});
  EXPECT_EQ(ReadAll(path), EncodeSigned(MakeFullCapsule()));
  StatusOr<DecodedCapsule> d = ReadCapsuleFile(path, Strict());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(MakeFullCapsule(), *d->capsule));
}

TEST_F(CapsuleFileTest, AnExistingCapsuleIsReplacedOnlyWhenAsked) {
  const std::string path = dir_.path() + "/c.capsule";
  WriteOptions w;
  w.signing_key = &key_;
  ASSERT_TRUE(WriteCapsuleFile(path, MakeMinimalCapsule(), w).ok());
  EXPECT_TRUE(HasError(WriteCapsuleFile(path, MakeFullCapsule(), w), StatusCode::kAlreadyExists,
                       "already exists; not overwriting it"));
  EXPECT_EQ(ReadAll(path), EncodeSigned(MakeMinimalCapsule()));
  w.overwrite = true;
  ASSERT_TRUE(WriteCapsuleFile(path, MakeFullCapsule(), w).ok());
  EXPECT_EQ(ReadAll(path), EncodeSigned(MakeFullCapsule()));
}

TEST_F(CapsuleFileTest, InvalidCapsuleIsNotWritten) {
  const std::string path = dir_.path() + "/bad.capsule";
  v1::Capsule c = MakeMinimalCapsule();
  c.clear_step();
  EXPECT_TRUE(HasError(WriteCapsuleFile(path, c, WriteOptions()), StatusCode::kInvalidArgument,
                       "refusing to write an invalid capsule: step: must be set"));
  EXPECT_TRUE(Entries(dir_.path()).empty());
}

// WriteCapsuleFile streams the capsule to disk as it is encoded: the file holds the bytes
// EncodeCapsule makes, header (written last) included, whatever the size.
TEST_F(CapsuleFileTest, AStreamedCapsuleIsTheEncodedOne) {
  v1::Capsule c = MakeFullCapsule();
  for (int i = 0; i < 3; ++i) {
    const std::string data = Incompressible((size_t{1} << 20) + 4096 * i);
    SetTensor(c.add_tensors(), "big" + std::to_string(i), v1::UINT8,
              {static_cast<int64_t>(data.size())}, data);
  }
  const std::string path = dir_.path() + "/streamed.capsule";
  WriteOptions w;
  w.signing_key = &key_;
  ASSERT_TRUE(WriteCapsuleFile(path, c, w).ok());
  EXPECT_EQ(ReadAll(path), EncodeSigned(c));
  EXPECT_TRUE(ReadCapsuleFile(path, Strict()).ok());
  EXPECT_EQ(Entries(dir_.path()), std::vector<std::string>{"streamed.capsule"});
}

TEST_F(CapsuleFileTest, ACapsuleRefusedWhileStreamingLeavesNothing) {
  // Over a wire limit: found only while the capsule is written, after its file was created.
  v1::Capsule c = MakeMinimalCapsule();
  c.mutable_log()->add_lines(std::string((size_t{16} << 20) + 1, 'l'));
  const std::string path = dir_.path() + "/refused.capsule";
  EXPECT_TRUE(HasError(WriteCapsuleFile(path, c, WriteOptions()), StatusCode::kResourceExhausted,
                       "refusing to write a capsule readers refuse"));
  EXPECT_TRUE(Entries(dir_.path()).empty());
}

TEST_F(CapsuleFileTest, ReadErrorsNameTheFile) {
  const std::string path = dir_.path() + "/cut.capsule";
  ASSERT_TRUE(WriteFileAtomic(path, TruncateTo(signed_, 100)).ok());
  EXPECT_TRUE(HasError(ReadCapsuleFile(path, Strict()), StatusCode::kOutOfRange,
                       path + ": truncated capsule: 100 bytes"));
}

TEST_F(CapsuleFileTest, FileSizeCap) {
  const std::string path = dir_.path() + "/ok.capsule";
  ASSERT_TRUE(WriteFileAtomic(path, signed_).ok());
  ReadOptions o = Strict();
  o.max_file_bytes = signed_.size() - 1;
  EXPECT_TRUE(HasError(ReadCapsuleFile(path, o), StatusCode::kResourceExhausted,
                       "over the limit of " + std::to_string(signed_.size() - 1)));
  o.max_file_bytes = signed_.size();
  EXPECT_TRUE(ReadCapsuleFile(path, o).ok());
}

TEST_F(CapsuleFileTest, NonRegularInputsAreInvalidArgumentWithoutBlocking) {
  const std::string fifo = dir_.path() + "/in.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {dir_.path(), fifo, std::string("/dev/null")}) {
    auto read = std::async(std::launch::async, [&] { return ReadCapsuleFile(path, Strict()); });
    if (read.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) ::close(w);
      FAIL() << "reading " << path << " blocked";
    }
    EXPECT_TRUE(
        HasError(read.get(), StatusCode::kInvalidArgument, path + " is not a regular file"));
  }
}

TEST_F(CapsuleFileTest, EmptyFileIsNotACapsule) {
  const std::string path = dir_.path() + "/empty.capsule";
  std::ofstream(path).close();
  EXPECT_TRUE(HasError(ReadCapsuleFile(path, Strict()), StatusCode::kInvalidArgument,
                       path + ": empty file (0 bytes): not a capsule"));
}

TEST(CapsuleFileNameTest, Formatting) {
  EXPECT_EQ(CapsuleFileName("tiny", 42, 3, "NON_FINITE_LOSS"),
            "tiny-step42-rank3-non-finite-loss.capsule");
  EXPECT_EQ(CapsuleFileName("my run/1:x", 0, 0, "MANUAL"), "my_run_1_x-step0-rank0-manual.capsule");
  EXPECT_EQ(CapsuleFileName("a.b_c-D9", 9000000000, 15, "GRAD_NORM_SPIKE"),
            "a.b_c-D9-step9000000000-rank15-grad-norm-spike.capsule");
  EXPECT_EQ(CapsuleFileName("", 1, 0, "LOSS_SPIKE"), "run-step1-rank0-loss-spike.capsule");
  // A run name can never climb out of the capsule directory.
  EXPECT_EQ(CapsuleFileName("../../etc", 1, 0, "MANUAL"), ".._.._etc-step1-rank0-manual.capsule");
  EXPECT_EQ(CapsuleFileName("caf\xc3\xa9", 1, 0, "MANUAL"), "caf__-step1-rank0-manual.capsule");
}

}  // namespace
}  // namespace capsule::test
