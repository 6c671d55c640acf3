// Whole-file reads, crash-safe writes and directory creation (base/file_util.h), WriteCapsuleFile /
// ReadCapsuleFile, and capsule file names.
#include "capsule/base/file_util.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

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

TEST_F(FileUtilTest, WriteFileAtomicCreatesTheFileAndNoPartial) {
  const std::string path = Path("a.bin");
  const std::string bytes("\x00\x01 capsule \xff", 12);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  EXPECT_EQ(ReadAll(path), bytes);
  EXPECT_FALSE(Exists(path + ".partial"));
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

TEST_F(FileUtilTest, WriteFileAtomicReplacesByDefault) {
  const std::string path = Path("c.bin");
  ASSERT_TRUE(WriteFileAtomic(path, "old contents that are longer").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "new").ok());
  EXPECT_EQ(ReadAll(path), "new");
  EXPECT_FALSE(Exists(path + ".partial"));
}

TEST_F(FileUtilTest, WriteFileAtomicCanRefuseToOverwrite) {
  const std::string path = Path("d.bin");
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  AtomicWriteOptions o;
  o.overwrite = false;
  EXPECT_TRUE(HasError(WriteFileAtomic(path, "second", o), StatusCode::kAlreadyExists,
                       path + " already exists"));
  EXPECT_EQ(ReadAll(path), "first");
}

TEST_F(FileUtilTest, StalePartialFromACrashedWriterIsReplaced) {
  const std::string path = Path("e.bin");
  std::ofstream(path + ".partial") << "half a capsule from a killed writer";
  ASSERT_TRUE(WriteFileAtomic(path, "whole").ok());
  EXPECT_EQ(ReadAll(path), "whole");
  EXPECT_FALSE(Exists(path + ".partial"));
}

TEST_F(FileUtilTest, UnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string ro = Path("ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
  EXPECT_TRUE(HasError(WriteFileAtomic(ro + "/f.bin", "x"), StatusCode::kPermissionDenied,
                       "cannot create " + ro + "/f.bin.partial"));
  EXPECT_FALSE(Exists(ro + "/f.bin"));
}

TEST_F(FileUtilTest, ParentIsARegularFile) {
  // ENOTDIR: fails for root as well, unlike a permission test.
  const std::string file = Path("plain");
  std::ofstream(file) << "x";
  EXPECT_TRUE(HasError(WriteFileAtomic(file + "/f.bin", "x"), StatusCode::kNotFound,
                       "cannot create " + file + "/f.bin.partial"));
}

TEST_F(FileUtilTest, MissingParentDirectory) {
  EXPECT_TRUE(HasError(WriteFileAtomic(Path("no/such/dir/f.bin"), "x"), StatusCode::kNotFound,
                       "cannot create"));
}

TEST_F(FileUtilTest, TargetIsADirectory) {
  const std::string sub = Path("sub");
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((sub + "/inner").c_str(), 0700), 0);
  const Status s = WriteFileAtomic(sub, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot rename to " + sub), std::string::npos) << s;
  EXPECT_FALSE(Exists(sub + ".partial"));
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
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(path + ".partial"));
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
                    s.message().find("cannot write " + path + ".partial") != std::string::npos;
    ::_exit(ok ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
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
                       "is not a regular file"));
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
  EXPECT_FALSE(Exists(path + ".partial"));
  EXPECT_EQ(ReadAll(path), EncodeSigned(MakeFullCapsule()));
  StatusOr<DecodedCapsule> d = ReadCapsuleFile(path, Strict());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(MakeFullCapsule(), *d->capsule));
}

TEST_F(CapsuleFileTest, InvalidCapsuleIsNotWritten) {
  const std::string path = dir_.path() + "/bad.capsule";
  v1::Capsule c = MakeMinimalCapsule();
  c.clear_step();
  EXPECT_TRUE(HasError(WriteCapsuleFile(path, c, WriteOptions()), StatusCode::kInvalidArgument,
                       "refusing to write an invalid capsule: step: must be set"));
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(path + ".partial"));
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
