#include "capsule/capture/internal/background_writer.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "capsule/capture/internal/capture_writer.h"

namespace capsule::internal {
namespace {

// Capsules queued or being written, in every writer of the process: what exit() and a fatal
// signal wait for. Lock-free, so the signal handler may read it.
std::atomic<int> g_in_flight{0};
// How long a fatal signal waits for them, in milliseconds (the longest any writer asked for).
std::atomic<int> g_signal_wait_ms{0};
static_assert(std::atomic<int>::is_always_lock_free, "read from a signal handler");

constexpr int kFatalSignals[] = {SIGTERM, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_previous[NSIG];

// Waits, sleeping 10 ms at a time, while capsules are in flight, for at most `ms`. Only
// async-signal-safe calls: an atomic load and nanosleep.
void WaitInFlight(int ms) {
  for (int waited = 0; waited < ms && g_in_flight.load() > 0; waited += 10) {
    timespec ten_ms{0, 10'000'000};
    ::nanosleep(&ten_ms, nullptr);
  }
}

void OnFatalSignal(int sig) {
  // The writer keeps writing while this thread waits: it blocks SIGTERM, and a fault is the
  // faulting thread's own. (A fault in the writer itself waits out the limit, then ends.)
  WaitInFlight(g_signal_wait_ms.load());
  ::sigaction(sig, &g_previous[sig], nullptr);
  ::raise(sig);  // delivered, with the handler the process had before, once this one returns
}

void WaitAtExit() { WaitInFlight(g_signal_wait_ms.load()); }

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kFatalSignals) {
      struct sigaction action {};
      action.sa_handler = OnFatalSignal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      ::sigaction(sig, &action, &g_previous[sig]);
    }
  });
}

}  // namespace

BackgroundWriter::BackgroundWriter(MonitorOptions options, int depth, double signal_wait_seconds)
    : options_(std::move(options)),
      depth_(static_cast<size_t>(std::max(depth, 1))),
      buffers_(depth_),
      buffer_busy_(depth_, false) {
  const int ms = static_cast<int>(std::clamp(signal_wait_seconds, 0.0, 3600.0) * 1000);
  int seen = g_signal_wait_ms.load();
  while (seen < ms && !g_signal_wait_ms.compare_exchange_weak(seen, ms)) {
  }
  InstallOnce();
  // exit() runs atexit functions and static destructors in the reverse order of their
  // registration: registered now, after whatever the capture has initialised (OpenSSL's cleanup
  // among them), the wait runs before those are torn down, while the writer still needs them.
  std::atexit(WaitAtExit);
  // The thread starts with SIGTERM blocked, so that it goes to a thread that waits for this one
  // rather than stopping the writes it waits for.
  // (Faults are the faulting thread's own and cannot be blocked; SIGTERM is the process's.)
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  thread_ = std::thread([this] { Run(); });
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

BackgroundWriter::~BackgroundWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();  // Run returns once the queue is empty
}

bool BackgroundWriter::Push(WriteJob& job) {
  size_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || queue_.size() + writing_ + copying_ >= depth_) return false;
    while (buffer_busy_[slot]) ++slot;  // depth_ buffers, fewer than depth_ jobs in flight
    buffer_busy_[slot] = true;
    ++copying_;
    g_in_flight.fetch_add(1);
  }
  // The copy runs in the caller's thread, outside the lock: the buffer is this job's alone.
  size_t total = 0;
  for (std::string_view v : job.held) total += v.size();
  char* out = buffers_[slot].Reserve(total);
  for (std::string_view& v : job.held) {
    if (v.empty()) continue;
    std::memcpy(out, v.data(), v.size());
    v = std::string_view(out, v.size());
    out += v.size();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Queued{std::move(job), slot});
    --copying_;
  }
  wake_.notify_one();
  return true;
}

void BackgroundWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && writing_ == 0 && copying_ == 0; });
}

std::vector<FinishedWrite> BackgroundWriter::TakeFinished() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(finished_, {});
}

void BackgroundWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    WriteJob job = std::move(queue_.front().job);
    const size_t slot = queue_.front().slot;
    queue_.pop_front();
    ++writing_;
    lock.unlock();
    FinishedWrite done{std::move(job.what), std::move(job.report)};
    const auto start = std::chrono::steady_clock::now();
    StatusOr<std::string> path = InternalError("background write failed");
    try {
      path = WriteCapturedCapsule(job.capsule, options_, job.key ? &*job.key : nullptr, &job.held);
    } catch (const std::exception& e) {
      path = InternalError(std::string("background write failed: ") + e.what());
    }
    done.report.write_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    done.report.status = path.status();
    if (path.ok()) done.report.capsule_path = *path;
    lock.lock();
    finished_.push_back(std::move(done));
    buffer_busy_[slot] = false;
    --writing_;
    g_in_flight.fetch_sub(1);
    idle_.notify_all();
  }
}

}  // namespace capsule::internal
