// The background writer: a bounded queue that refuses when full, and queued capsules that land
// on disk whole however the process ends (destructor, exit(), SIGTERM, abort()), each checked in
// a child process whose capsule is still being written when it ends.
#include "capsule/capture/internal/background_writer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "capsule/capture/internal/capture_writer.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/snapshot/internal/tensor_codec.h"
#include "tests/format/temp_dir.h"

namespace capsule::internal {
namespace {

using ::capsule::test::TempDir;

namespace fs = std::filesystem;

// A valid capsule of `step` holding `mib` MiB of random float32 (zstd cannot shrink it, so its
// write takes at least tens of milliseconds).
WriteJob Job(int64_t step, int64_t mib) {
  WriteJob job;
  v1::Capsule& c = job.capsule;
  c.set_writer_version("0.1.0");
  c.set_created_unix_micros(1780000000000000);
  c.mutable_trigger()->set_kind(v1::MANUAL);
  c.mutable_step()->set_global_step(step);
  at::manual_seed(step);
  EXPECT_TRUE(TensorToBlob("big", at::rand({mib << 18}), c.add_tensors()).ok());
  job.what = "MANUAL at step " + std::to_string(step);
  return job;
}

MonitorOptions Options(const std::string& dir) {
  MonitorOptions o;
  o.capsule_dir = dir;
  o.run_name = "bg";
  o.log_sink = [](const std::string&) {};
  return o;
}

// The capsule `job` of `step` is on disk, whole and valid.
void ExpectLanded(const std::string& dir, int64_t step) {
  v1::Capsule c;
  c.mutable_trigger()->set_kind(v1::MANUAL);
  c.mutable_step()->set_global_step(step);
  const std::string path = CapturedCapsulePath(c, Options(dir));
  ASSERT_TRUE(fs::exists(path)) << path << " did not land";
  ReadOptions o;
  o.allow_unsigned = true;
  o.verify_tensor_digests = true;
  StatusOr<DecodedCapsule> d = ReadCapsuleFile(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->capsule->step().global_step(), step);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "a temporary file was left behind";
}

TEST(BackgroundWriter, WritesWhatItQueuedAndReportsIt) {
  TempDir dir;
  BackgroundWriter writer(Options(dir.path()), 2, 10);
  WriteJob a = Job(1, 1), b = Job(2, 1);
  ASSERT_TRUE(writer.Push(a));
  ASSERT_TRUE(writer.Push(b));
  writer.Drain();
  std::vector<FinishedWrite> done = writer.TakeFinished();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].what, "MANUAL at step 1");
  EXPECT_TRUE(done[0].report.status.ok()) << done[0].report.status;
  EXPECT_GT(done[0].report.write_seconds, 0);
  EXPECT_TRUE(fs::exists(done[1].report.capsule_path));
  EXPECT_TRUE(writer.TakeFinished().empty());
}

TEST(BackgroundWriter, AFullQueueRefusesAndLeavesTheJobToTheCaller) {
  TempDir dir;
  BackgroundWriter writer(Options(dir.path()), 1, 10);
  WriteJob slow = Job(1, 64), next = Job(2, 1);
  ASSERT_TRUE(writer.Push(slow));
  // 64 MiB take tens of milliseconds to hash, compress and write: the queue is still full.
  EXPECT_FALSE(writer.Push(next));
  EXPECT_EQ(next.capsule.tensors_size(), 1) << "a refused job must come back whole";
  EXPECT_FALSE(next.capsule.tensors(0).data().empty());
  writer.Drain();
  EXPECT_TRUE(writer.Push(next));
  writer.Drain();
  EXPECT_EQ(writer.TakeFinished().size(), 2u);
}

TEST(BackgroundWriter, AFailedWriteIsReportedNotThrown) {
  TempDir dir;
  const std::string file = dir.path() + "/not-a-dir";
  { std::ofstream(file) << "x"; }
  BackgroundWriter writer(Options(file + "/caps"), 2, 10);
  WriteJob job = Job(1, 1);
  ASSERT_TRUE(writer.Push(job));
  writer.Drain();
  std::vector<FinishedWrite> done = writer.TakeFinished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].report.status.ok());
  EXPECT_TRUE(done[0].report.capsule_path.empty());
}

// How a child that queued a 64 MiB capsule ends, right after queueing it.
enum class End { kDestructor, kExit, kSigterm, kAbort };

// Forks a child that queues the capsule and ends as `end` says; returns its wait status.
int RunChild(const std::string& dir, End end) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    at::set_num_threads(1);
    WriteJob job = Job(5, 64);
    {
      BackgroundWriter writer(Options(dir), 2, 30);
      if (!writer.Push(job)) ::_exit(90);
      switch (end) {
        case End::kDestructor:
          break;
        case End::kExit:
          std::exit(7);  // the writer is not destroyed: exit() waits for the queue
        case End::kSigterm:
          ::kill(::getpid(), SIGTERM);  // process-directed, as `kill PID` sends it
          ::pause();
          ::_exit(91);
        case End::kAbort:
          std::abort();
      }
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(BackgroundWriter, TheDestructorWaitsForTheQueue) {
  TempDir dir;
  const int status = RunChild(dir.path(), End::kDestructor);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ExpectLanded(dir.path(), 5);
}

TEST(BackgroundWriter, ExitWaitsForTheQueue) {
  TempDir dir;
  const int status = RunChild(dir.path(), End::kExit);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
  ExpectLanded(dir.path(), 5);
}

TEST(BackgroundWriter, SigtermWaitsForTheQueueThenEndsTheProcess) {
  TempDir dir;
  const int status = RunChild(dir.path(), End::kSigterm);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the signal must still end the process";
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  ExpectLanded(dir.path(), 5);
}

TEST(BackgroundWriter, AbortWaitsForTheQueueThenEndsTheProcess) {
  TempDir dir;
  const int status = RunChild(dir.path(), End::kAbort);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGABRT);
  ExpectLanded(dir.path(), 5);
}

}  // namespace
}  // namespace capsule::internal
