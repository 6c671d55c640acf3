// Background writer: encodes, compresses, signs and writes captured capsules on its own thread, so
// the trainer is held only for what must see the step (the re-run, the build and a copy of the
// embedded tensor bytes), not for the I/O (MonitorOptions::background_write).
//
// The queue is bounded: Push refuses a job when `depth` capsules are already waiting or being
// written, and the Monitor then writes that one in the trainer's thread (nothing is dropped, and
// the memory held is at most `depth` capsules). Queued capsules are written before the process
// ends: the destructor and exit() wait for them, and so does a fatal signal (SIGTERM, SIGSEGV,
// SIGBUS, SIGFPE, SIGILL, SIGABRT), whose handler waits up to `signal_wait_seconds` before the
// signal takes its course. A SIGKILL or power loss leaves no half file: every write is atomic.
//
//   internal::BackgroundWriter writer(options, /*depth=*/2, /*signal_wait_seconds=*/10);
//   if (!writer.Push(job)) { ... full: write `job` here ... }
//   writer.Drain();
//   for (internal::FinishedWrite& w : writer.TakeFinished()) ...
//
// Thread safety: thread-safe.
#ifndef CAPSULE_CAPTURE_INTERNAL_BACKGROUND_WRITER_H_
#define CAPSULE_CAPTURE_INTERNAL_BACKGROUND_WRITER_H_

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "capsule/base/internal/byte_buffer.h"
#include "capsule/base/status.h"
#include "capsule/capture/monitor.h"
#include "capsule/format/signing.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::internal {

struct WriteJob {
  v1::Capsule capsule;
  // Tensor bytes outside the message (TensorDataViews; empty: all are in it). Push copies them
  // into a buffer of the writer's, so the caller's tensors may change once it returns.
  TensorDataViews held;
  std::optional<PrivateKey> key;
  std::string what;  // "NON_FINITE_LOSS at step 5", for the report
  StepReport report;
};

struct FinishedWrite {
  std::string what;
  StepReport report;  // capsule_path, write_seconds and status filled in
};

class BackgroundWriter {
 public:
  // `options` gives the directory, names and log sink; `depth` >= 1.
  BackgroundWriter(MonitorOptions options, int depth, double signal_wait_seconds);
  ~BackgroundWriter();  // writes what is queued, then stops
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Queues the job, copying its held bytes (the synchronous snapshot); false (the job untouched)
  // when the queue is full. The copies go to one of `depth` buffers the writer keeps for the next
  // capsule: a later capture of the same model copies at memory speed, with no page faults
  // (base/internal/byte_buffer.h), at the price of keeping up to `depth` snapshots' worth of
  // memory.
  bool Push(WriteJob& job);
  // Blocks until every job pushed so far is written or has failed.
  void Drain();
  // The writes finished since the last call, oldest first.
  std::vector<FinishedWrite> TakeFinished();

 private:
  void Run();

  const MonitorOptions options_;
  const size_t depth_;
  std::mutex mu_;
  std::condition_variable wake_;  // a job came, or stop
  std::condition_variable idle_;  // a job finished
  struct Queued {
    WriteJob job;
    size_t slot;  // the buffer holding job.held's bytes
  };
  std::deque<Queued> queue_;
  std::vector<ByteBuffer> buffers_;  // depth_ of them
  std::vector<bool> buffer_busy_;
  size_t writing_ = 0;  // jobs taken off the queue and not finished
  size_t copying_ = 0;  // jobs being copied by Push, not queued yet
  bool stop_ = false;
  std::vector<FinishedWrite> finished_;
  std::thread thread_;
};

}  // namespace capsule::internal

#endif  // CAPSULE_CAPTURE_INTERNAL_BACKGROUND_WRITER_H_
