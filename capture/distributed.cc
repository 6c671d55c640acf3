#include "capsule/capture/distributed.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "capsule/format/dtype.h"
#include "capsule/instrument/health_stats.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/snapshot/internal/tensor_codec.h"

namespace capsule {
namespace {

constexpr int kAgreeColumns = 6;  // kind, local norm, local non-finite, checksum hi, lo, global
// The row a marked reduction carries, in values a float32 holds exactly: kind, local norm (a float:
// its rounding is far below the reduction check's 1e-4), the non-finite count and the checksum
// in four 16-bit parts each.
constexpr int kRowColumns = 10;

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ErrorText(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

void EncodeRow(double* row, TriggerKind kind, double local_norm, int64_t non_finite,
               uint64_t checksum) {
  row[0] = static_cast<double>(kind);
  row[1] = local_norm;
  for (int k = 0; k < 4; ++k) {
    row[2 + k] = static_cast<double>((static_cast<uint64_t>(non_finite) >> (16 * k)) & 0xffff);
    row[6 + k] = static_cast<double>((checksum >> (16 * k)) & 0xffff);
  }
}

// A carried row (kRowColumns) in the agreement's layout (kAgreeColumns; no global norm).
void DecodeRow(const double* in, double* out) {
  uint64_t non_finite = 0, checksum = 0;
  for (int k = 0; k < 4; ++k) {
    non_finite |= static_cast<uint64_t>(in[2 + k]) << (16 * k);
    checksum |= static_cast<uint64_t>(in[6 + k]) << (16 * k);
  }
  out[0] = in[0];
  out[1] = in[1];
  out[2] = static_cast<double>(static_cast<int64_t>(non_finite));
  out[3] = static_cast<double>(checksum >> 32);
  out[4] = static_cast<double>(checksum & 0xffffffffULL);
  out[5] = -1;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t size, uint64_t seed) {
  // Four independent lanes so the multiplies overlap; each word is mixed with its lane's state.
  constexpr uint64_t kPrime = 0x9e3779b97f4a7c15ULL;
  uint64_t lane[4] = {seed ^ 0x243f6a8885a308d3ULL, seed ^ 0x13198a2e03707344ULL,
                      seed ^ 0xa4093822299f31d0ULL, seed ^ 0x082efa98ec4e6c89ULL};
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * kPrime;
      lane[k] ^= lane[k] >> 29;
    }
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, size - i);
  uint64_t h = Mix(lane[0]) ^ Mix(lane[1] + 1) ^ Mix(lane[2] + 2) ^ Mix(lane[3] + 3);
  return Mix(h ^ Mix(tail ^ (size * kPrime)));
}

// Where an entry of the rings is: a collective's sequence, or a point-to-point op's count with
// its peer.
struct InFlight {
  bool p2p = false;
  std::string op;
  int peer = -1;
  uint64_t sequence = 0;
};

struct Distributed::Impl {
  DistributedOptions options;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int world = 1;
  std::string run_id;
  std::string backend;
  uint64_t sequence_base = 0;
  double watchdog_seconds = 0;
  std::string dump_key;
  std::string heartbeat_prefix;
  std::string finished_prefix;

  // Everything below is shared with the watchdog and the backend's threads.
  std::mutex mu;
  uint64_t next_sequence = 0;
  std::deque<v1::Collective> ring;
  // Point-to-point ops, numbered per (peer, "send"/"recv"): this rank's n-th send to a peer is
  // that peer's n-th receive from it.
  std::deque<v1::Collective> p2p_ring;
  std::map<std::pair<int, std::string>, uint64_t> p2p_next;
  std::deque<v1::GradReduction> reductions;
  std::deque<v1::StepFingerprint> fingerprints;
  v1::TriggerAgreement agreement;
  int64_t step = 0;
  bool began = false;
  bool finished = false;  // Finish ran
  bool failed = false;    // a collective through the wrapper failed
  uint64_t params_checksum = 0;
  std::vector<at::Tensor> params;  // SetParameters: what the fingerprint checksums
  // The current step's reduction, for the agreement row.
  bool reduced_this_step = false;
  GradReductionStats last_reduction;
  // Every rank's row (kAgreeColumns each), when they came with the step's marked reduction.
  bool rows_carried = false;
  std::vector<double> carried_rows;
  LossTriggerCheck loss_check;
  bool in_flight = false;
  InFlight in_flight_at;
  std::chrono::steady_clock::time_point in_flight_since;
  std::string position = "setup";
  std::chrono::steady_clock::time_point position_since = std::chrono::steady_clock::now();
  std::string watchdog_position = "idle";
  std::string dump_reason;                      // set when this rank dumps because of the store key
  std::set<std::pair<int, int64_t>> incidents;  // (kind, step) already captured
  IncidentHandler handler;
  int64_t heartbeat_written = -1;
  std::string last_dump_seen;

  std::thread watchdog;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop = false;

  // Serializes incident captures (the watchdog, the training thread and a dying backend thread
  // may all raise one).
  std::mutex incident_mu;

  void SetPositionLocked(const std::string& p) {
    position = p;
    position_since = std::chrono::steady_clock::now();
  }

  v1::Collective* FindLocked(const InFlight& at) {
    std::deque<v1::Collective>& in = at.p2p ? p2p_ring : ring;
    for (auto it = in.rbegin(); it != in.rend(); ++it) {
      if (it->sequence() == at.sequence &&
          (!at.p2p || (it->peer() == at.peer && it->op() == at.op))) {
        return &*it;
      }
    }
    return nullptr;
  }

  // Captures a HANG or COLLECTIVE_ERROR capsule of the current step, once per kind and step.
  bool RaiseIncident(TriggerKind kind, const std::string& reason) {
    // Held across the call, so that SetIncidentHandler can wait out a capture in flight before
    // its owner (the Monitor) goes away.
    std::lock_guard<std::mutex> one_at_a_time(incident_mu);
    IncidentHandler h;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!incidents.insert({static_cast<int>(kind), step}).second) return false;
      h = handler;
    }
    if (!h) return false;
    try {
      return h(kind, reason);
    } catch (...) {
      return false;  // a capture never takes the rank down
    }
  }

  void SetDumpKey(const std::string& reason) {
    if (!store) return;
    try {
      const std::vector<uint8_t> value(reason.begin(), reason.end());
      store->set(dump_key, value);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "capsule: cannot set the dump key: %s\n", ErrorText(e).c_str());
    }
  }

  // A call through the wrapper as the ring records it. `out` empty: the output is `in`.
  struct Call {
    std::string op, tag;
    const std::vector<at::Tensor>& in;
    const std::vector<at::Tensor>& out;
    std::string reduce_op;
    int root = 0;
    int peer = -1;                   // >= 0: a point-to-point op with that rank
    bool carries_agreement = false;  // the step's agreement rows ride in it (StepEnd)
  };

  static void AddShapes(const std::vector<at::Tensor>& tensors,
                        google::protobuf::RepeatedPtrField<v1::CollectiveShape>* shapes) {
    for (const at::Tensor& t : tensors) {
      v1::CollectiveShape* s = shapes->Add();
      for (int64_t d : t.sizes()) s->add_dims(d);
    }
  }

  // Records `call` as enqueued: in the collective ring under the next sequence number, or (a
  // point-to-point op) in the point-to-point ring under its count with that peer and direction.
  // Returns where the watchdog and the completion find it.
  InFlight EnqueueLocked(const Call& call) {
    const bool p2p = call.peer >= 0;
    InFlight at{p2p, call.op, call.peer, 0};
    if (p2p) {
      at.sequence = p2p_next[{call.peer, call.op}]++;
    } else {
      at.sequence = next_sequence++;
    }
    v1::Collective rec;
    rec.set_sequence(at.sequence);
    rec.set_op(call.op);
    rec.set_tag(call.tag);
    rec.set_group(options.group_name);
    int64_t numel = 0;
    for (const at::Tensor& t : call.in) numel += t.numel();
    AddShapes(call.in, rec.mutable_in_shapes());
    AddShapes(call.out.empty() ? call.in : call.out, rec.mutable_out_shapes());
    if (!call.in.empty()) {
      rec.set_dtype(DTypeName(DTypeFromScalarType(call.in.front().scalar_type())));
    }
    rec.set_numel(numel);
    rec.set_reduce_op(call.reduce_op);
    rec.set_root(call.root);
    if (p2p) rec.set_peer(call.peer);
    rec.set_carries_agreement(call.carries_agreement);
    rec.set_state(v1::ENQUEUED);
    rec.set_enqueued_unix_micros(NowMicros());
    rec.set_step(step);
    std::deque<v1::Collective>& into = p2p ? p2p_ring : ring;
    into.push_back(std::move(rec));
    while (static_cast<int>(into.size()) > std::max(1, options.ring_size)) into.pop_front();
    in_flight = true;
    in_flight_at = at;
    in_flight_since = std::chrono::steady_clock::now();
    SetPositionLocked("step " + std::to_string(step) + ": in " + Where(at, call.tag));
    return at;
  }

  // "collective allreduce grads (sequence 7)", "recv act from rank 1 (#3)"
  static std::string Where(const InFlight& at, const std::string& tag) {
    if (!at.p2p) {
      return "collective " + at.op + " " + tag + " (sequence " + std::to_string(at.sequence) + ")";
    }
    return at.op + " " + tag + (at.op == "send" ? " to rank " : " from rank ") +
           std::to_string(at.peer) + " (#" + std::to_string(at.sequence) + ")";
  }

  // Issues `call` through `issue`, waits for it, and records how it ended; on failure a
  // COLLECTIVE_ERROR capsule is written before the backend's error is rethrown.
  template <typename IssueFn>
  void Run(const Call& call, IssueFn issue) {
    InFlight at;
    {
      std::lock_guard<std::mutex> lock(mu);
      at = EnqueueLocked(call);
    }
    try {
      c10::intrusive_ptr<c10d::Work> work = issue();
      work->wait();
    } catch (const std::exception& e) {
      const std::string text = ErrorText(e);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (v1::Collective* rec = FindLocked(at)) {
          rec->set_state(v1::FAILED);
          rec->set_error(text);
          rec->set_completed_unix_micros(NowMicros());
        }
        in_flight = false;
        failed = true;
      }
      RaiseIncident(TriggerKind::kCollectiveError, "rank " + std::to_string(rank) + ": " +
                                                       Where(at, call.tag) + " failed: " + text);
      throw;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (v1::Collective* rec = FindLocked(at)) {
      rec->set_state(v1::COMPLETED);
      rec->set_completed_unix_micros(NowMicros());
    }
    in_flight = false;
    SetPositionLocked("step " + std::to_string(step) + ": after " + Where(at, call.tag));
  }

  // Whether a marked reduction of `dtype` carries the step's row (the same answer on every rank:
  // the option and the bucket's dtype are alike everywhere).
  bool CarriesRow(at::ScalarType dtype) const {
    return options.agree_on_triggers && (dtype == at::kFloat || dtype == at::kDouble);
  }
  // What the rows say (`all`: kAgreeColumns per rank), into `result` and the step's records.
  void AnalyzeRows(int64_t at_step, const double* all, const GradReductionStats& mine, bool reduced,
                   int loss_ranks, AgreementResult* result);

  void WatchdogLoop();
  void WriteHeartbeat();
  std::vector<int> MissingRanks(int64_t at_step);
  // The other ranks the store says finished their loop, and their last step.
  std::vector<std::pair<int, int64_t>> FinishedRanks();
};

namespace {

// The Distributed whose capsule a dying process writes (the last one made).
std::atomic<Distributed::Impl*> g_active{nullptr};
std::terminate_handler g_previous_terminate = nullptr;
std::once_flag g_terminate_once;

[[noreturn]] void OnTerminate() {
  if (Distributed::Impl* impl = g_active.load()) {
    std::string what = "unknown exception";
    if (std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = ErrorText(ex);
      } catch (...) {
      }
    }
    // The backend threw on one of its own threads: the process is about to abort. Write what this
    // rank knows first; triage reads it like any other capsule.
    impl->RaiseIncident(TriggerKind::kCollectiveError,
                        "rank " + std::to_string(impl->rank) +
                            ": the process is terminating in the collective backend: " + what);
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

void Distributed::Impl::WriteHeartbeat() {
  int64_t s;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!began || step == heartbeat_written) return;
    s = step;
  }
  try {
    const std::string v = std::to_string(s);
    store->set(heartbeat_prefix + std::to_string(rank), std::vector<uint8_t>(v.begin(), v.end()));
    heartbeat_written = s;
  } catch (const std::exception&) {
    // The store is gone (its host died): the hang check below still runs.
  }
}

std::vector<int> Distributed::Impl::MissingRanks(int64_t at_step) {
  std::vector<int> missing;
  if (!store) return missing;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    try {
      const std::string key = heartbeat_prefix + std::to_string(r);
      if (!store->check({key})) {
        missing.push_back(r);
        continue;
      }
      const std::vector<uint8_t> v = store->get(key);
      const int64_t their = std::stoll(std::string(v.begin(), v.end()));
      if (their < at_step) missing.push_back(r);
    } catch (const std::exception&) {
      missing.push_back(r);
    }
  }
  return missing;
}

void Distributed::Impl::WatchdogLoop() {
  const auto poll = std::chrono::duration<double>(std::max(0.01, options.watchdog_poll_seconds));
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(stop_mu);
      if (stop_cv.wait_for(lock, poll, [this] { return stop; })) return;
    }
    if (store) WriteHeartbeat();
    std::string hang;
    {
      std::lock_guard<std::mutex> lock(mu);
      watchdog_position = "watching";
      const double waited = Seconds(std::chrono::steady_clock::now() - in_flight_since);
      if (in_flight && watchdog_seconds > 0 && waited > watchdog_seconds) {
        const v1::Collective* rec = FindLocked(in_flight_at);
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%.1f", waited);
        hang = "rank " + std::to_string(rank) + ": HANG at step " + std::to_string(step) + ": " +
               Where(in_flight_at, rec ? rec->tag() : std::string("?")) + " in flight for " + secs +
               " s";
      }
    }
    if (!hang.empty()) {
      // Peers first: the stuck rank may be one that is not in a collective at all.
      SetDumpKey(hang);
      last_dump_seen = hang;  // our own request: nothing to dump again when we read it back
      {
        std::lock_guard<std::mutex> lock(mu);
        watchdog_position = "writing a HANG capsule";
      }
      RaiseIncident(TriggerKind::kHang, hang);
      continue;
    }
    if (!store) continue;
    try {
      if (!store->check({dump_key})) continue;
      const std::vector<uint8_t> v = store->get(dump_key);
      const std::string reason(v.begin(), v.end());
      if (reason == last_dump_seen) continue;
      last_dump_seen = reason;
      {
        std::lock_guard<std::mutex> lock(mu);
        dump_reason = reason;
        watchdog_position = "writing a HANG capsule (dump key set)";
      }
      RaiseIncident(TriggerKind::kHang, "dump requested through the store: " + reason);
    } catch (const std::exception&) {
      // The store's host is gone; nothing to learn from it.
    }
  }
}

Distributed::Distributed(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void Distributed::Finish() {
  int64_t last;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->finished || !impl_->began || !impl_->store) {
      impl_->finished = true;
      return;
    }
    impl_->finished = true;
    last = impl_->step;
    impl_->SetPositionLocked("finished its training loop after step " + std::to_string(last));
  }
  try {
    const std::string v = std::to_string(last);
    impl_->store->set(impl_->finished_prefix + std::to_string(impl_->rank),
                      std::vector<uint8_t>(v.begin(), v.end()));
  } catch (const std::exception&) {
    // The store's host is gone: the others cannot learn it, and nothing else is lost.
  }
}

std::vector<std::pair<int, int64_t>> Distributed::Impl::FinishedRanks() {
  std::vector<std::pair<int, int64_t>> out;
  if (!store) return out;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    try {
      const std::string key = finished_prefix + std::to_string(r);
      if (!store->check({key})) continue;
      const std::vector<uint8_t> v = store->get(key);
      out.emplace_back(r, std::stoll(std::string(v.begin(), v.end())));
    } catch (const std::exception&) {
      return out;  // the store is gone, or the value is not ours
    }
  }
  return out;
}

Distributed::~Distributed() {
  // A loop that ended by an error did not run out of data: only a clean end is announced.
  bool failed;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    failed = impl_->failed;
  }
  if (!failed && std::uncaught_exceptions() == 0) Finish();
  Impl* self = impl_.get();
  g_active.compare_exchange_strong(self, nullptr);
  {
    std::lock_guard<std::mutex> lock(impl_->stop_mu);
    impl_->stop = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
}

StatusOr<std::shared_ptr<Distributed>> Distributed::Create(const DistributedOptions& options) {
  if (!options.process_group) return InvalidArgumentError("Distributed: no process group");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->pg = options.process_group;
  impl->store = options.store;
  impl->rank = impl->pg->getRank();
  impl->world = impl->pg->getSize();
  try {
    impl->backend = impl->pg->getBackendName();
  } catch (const std::exception&) {
    impl->backend = "unknown";
  }
  impl->run_id = options.run_id;
  try {
    if (impl->run_id.empty() && impl->store) {
      const std::string key = "capsule/" + options.group_name + "/run_id";
      if (impl->rank == 0) {
        std::random_device rd;
        const uint64_t r = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(NowMicros());
        impl->run_id = "run-" + Hex16(r).substr(0, 12);
        impl->store->set(key, std::vector<uint8_t>(impl->run_id.begin(), impl->run_id.end()));
      } else {
        const std::vector<uint8_t> v = impl->store->get(key);
        impl->run_id.assign(v.begin(), v.end());
      }
    }
  } catch (const std::exception& e) {
    return UnavailableError("Distributed: cannot share the run id through the store: " +
                            ErrorText(e));
  }
  if (impl->run_id.empty()) impl->run_id = "run-local";
  // The group's own sequence numbers start from a base rank 0 draws per run; record it so that
  // triage can line our numbering up with the backend's logs. A group whose number the trainer
  // already set keeps it (drawing again would renumber it under the trainer's logs); the number
  // is 0 until set. Every rank takes the same branch: setting is collective through the store.
  try {
    if (impl->pg->getSequenceNumberForGroup() == 0) impl->pg->setSequenceNumberForGroup();
    impl->sequence_base = impl->pg->getSequenceNumberForGroup();
  } catch (const std::exception&) {
    impl->sequence_base = 0;  // the backend keeps none
  }
  impl->dump_key = "capsule/" + impl->run_id + "/dump";
  impl->heartbeat_prefix = "capsule/" + impl->run_id + "/step/";
  impl->finished_prefix = "capsule/" + impl->run_id + "/finished/";
  impl->watchdog_seconds = options.watchdog_seconds >= 0
                               ? options.watchdog_seconds
                               : std::min(300.0, std::max(0.5, options.timeout_seconds / 4));
  Impl* raw = impl.get();
  std::shared_ptr<Distributed> d(new Distributed(std::move(impl)));
  std::call_once(g_terminate_once, [] { g_previous_terminate = std::set_terminate(OnTerminate); });
  g_active.store(raw);
  if (raw->watchdog_seconds > 0 || raw->store) {
    raw->watchdog = std::thread([raw] { raw->WatchdogLoop(); });
  }
  return d;
}

int Distributed::rank() const { return impl_->rank; }
int Distributed::world_size() const { return impl_->world; }
const std::string& Distributed::run_id() const { return impl_->run_id; }
c10d::ProcessGroup& Distributed::process_group() { return *impl_->pg; }

void Distributed::SetIncidentHandler(IncidentHandler handler) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->handler = std::move(handler);
  }
  // A capture that already took the old handler finishes before this returns.
  std::lock_guard<std::mutex> wait(impl_->incident_mu);
}

void Distributed::SetLossTriggerCheck(LossTriggerCheck check) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->loss_check = std::move(check);
}

void Distributed::SetPosition(const std::string& position) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->SetPositionLocked(position);
}

namespace {

c10d::ReduceOp ReduceOpOf(const std::string& name) {
  if (name == "max") return c10d::ReduceOp::MAX;
  if (name == "min") return c10d::ReduceOp::MIN;
  if (name == "product") return c10d::ReduceOp::PRODUCT;
  return c10d::ReduceOp::SUM;
}

const std::vector<at::Tensor> kNone;

}  // namespace

void Distributed::AllReduce(std::vector<at::Tensor>& tensors, const std::string& tag,
                            const std::string& reduce_op) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = ReduceOpOf(reduce_op);
  impl_->Run({"allreduce", tag, tensors, kNone, reduce_op},
             [&] { return impl_->pg->allreduce(tensors, opts); });
}

void Distributed::Broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& tag) {
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  impl_->Run({"broadcast", tag, tensors, kNone, "", root},
             [&] { return impl_->pg->broadcast(tensors, opts); });
}

void Distributed::AllGather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                            const std::string& tag) {
  std::vector<std::vector<at::Tensor>> out{outputs};
  std::vector<at::Tensor> in{input};
  impl_->Run({"allgather", tag, in, outputs, ""}, [&] { return impl_->pg->allgather(out, in); });
}

void Distributed::ReduceScatter(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                const std::string& tag, const std::string& reduce_op) {
  std::vector<at::Tensor> out{output};
  std::vector<std::vector<at::Tensor>> in{inputs};
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = ReduceOpOf(reduce_op);
  impl_->Run({"reduce_scatter", tag, inputs, out, reduce_op},
             [&] { return impl_->pg->reduce_scatter(out, in, opts); });
}

void Distributed::AllToAll(at::Tensor& output, at::Tensor& input, const std::string& tag) {
  std::vector<int64_t> equal;  // empty split sizes: equal parts along the first dimension
  impl_->Run({"alltoall", tag, {input}, {output}, ""},
             [&] { return impl_->pg->alltoall_base(output, input, equal, equal); });
}

void Distributed::Send(std::vector<at::Tensor>& tensors, int dst, const std::string& tag) {
  impl_->Run({"send", tag, tensors, kNone, "", 0, dst},
             [&] { return impl_->pg->send(tensors, dst, 0); });
}

void Distributed::Recv(std::vector<at::Tensor>& tensors, int src, const std::string& tag) {
  impl_->Run({"recv", tag, tensors, kNone, "", 0, src},
             [&] { return impl_->pg->recv(tensors, src, 0); });
}

void Distributed::Barrier(const std::string& tag) {
  impl_->Run({"barrier", tag, kNone, kNone, ""}, [&] { return impl_->pg->barrier(); });
}

namespace {

// The L2 norm and the non-finite count of `t`, from one fused pass (instrument/health_stats.h).
void Health(const at::Tensor& t, double* norm, int64_t* non_finite) {
  StatusOr<HealthStats> h = ComputeHealthStats(t);
  if (!h.ok()) return;
  *non_finite = h->nan_count + h->pos_inf_count + h->neg_inf_count;
  // rms is over the finite elements: the norm of the whole tensor is non-finite when any is.
  *norm = *non_finite > 0 ? NAN : h->rms * std::sqrt(static_cast<double>(h->numel));
}

}  // namespace

GradReductionStats Distributed::Reduce(at::Tensor& buffer, int64_t n, GradReduce mode,
                                       const std::string& tag, const StepEnd* last) {
  GradReductionStats stats, so_far;
  bool reduced_before;
  uint64_t checksum;
  LossTriggerCheck check;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    stats.step = impl_->step;
    stats.sequence = impl_->next_sequence;
    so_far = impl_->last_reduction;
    reduced_before = impl_->reduced_this_step;
    checksum = impl_->params_checksum;
    check = impl_->loss_check;
  }
  at::Tensor grads = n == buffer.numel() ? buffer : buffer.narrow(0, 0, n);
  Health(grads, &stats.local_norm, &stats.local_non_finite);
  const int world = impl_->world;
  at::Tensor rows;
  if (last != nullptr) {
    // This rank's row at its slot, zeros at the others': the sum is every rank's row.
    TriggerKind kind = TriggerKind::kNone;
    try {
      if (check) kind = check(last->loss);
    } catch (...) {
      // A check that throws fires nothing; the row still travels (every rank sends one).
    }
    std::vector<double> block(static_cast<size_t>(world) * kRowColumns, 0.0);
    EncodeRow(block.data() + impl_->rank * kRowColumns, kind,
              reduced_before ? std::hypot(so_far.local_norm, stats.local_norm) : stats.local_norm,
              (reduced_before ? so_far.local_non_finite : 0) + stats.local_non_finite, checksum);
    rows = buffer.narrow(0, n, world * kRowColumns);
    rows.copy_(at::from_blob(block.data(), {world * kRowColumns}, at::kDouble));
  }
  std::vector<at::Tensor> buffers{buffer};
  Impl::Call call{"allreduce", tag, buffers, kNone, "sum"};
  call.carries_agreement = rows.defined();  // triage reads a rank that skips it by this
  c10d::AllreduceOptions opts;
  opts.reduceOp = ReduceOpOf("sum");
  impl_->Run(call, [&] { return impl_->pg->allreduce(buffers, opts); });
  stats.divisor = mode == GradReduce::kMean ? world : 1;
  if (stats.divisor != 1) grads.div_(stats.divisor);
  Health(grads, &stats.global_norm, &stats.global_non_finite);
  std::vector<double> agreed;
  if (rows.defined()) {
    const at::Tensor got = rows.to(at::kCPU, at::kDouble).contiguous();
    agreed.resize(static_cast<size_t>(world) * kAgreeColumns);
    for (int r = 0; r < world; ++r) {
      DecodeRow(got.data_ptr<double>() + r * kRowColumns, agreed.data() + r * kAgreeColumns);
    }
  }
  v1::GradReduction rec;
  rec.set_step(stats.step);
  rec.set_sequence(stats.sequence);
  rec.set_local_norm(stats.local_norm);
  rec.set_local_non_finite(stats.local_non_finite);
  rec.set_global_norm(stats.global_norm);
  rec.set_global_non_finite(stats.global_non_finite);
  rec.set_divisor(stats.divisor);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->reductions.push_back(std::move(rec));
  while (impl_->reductions.size() > 256) impl_->reductions.pop_front();
  // The agreement row speaks for the whole step: the buckets' norms combine as the root of the
  // sum of squares, their non-finite counts add (as triage combines the records).
  GradReductionStats& step = impl_->last_reduction;
  if (!impl_->reduced_this_step) {
    step = stats;
  } else {
    step.local_norm = std::hypot(step.local_norm, stats.local_norm);
    step.global_norm = std::hypot(step.global_norm, stats.global_norm);
    step.local_non_finite += stats.local_non_finite;
    step.global_non_finite += stats.global_non_finite;
  }
  impl_->reduced_this_step = true;
  if (!agreed.empty()) {
    impl_->carried_rows = std::move(agreed);
    impl_->rows_carried = true;
  }
  return stats;
}

GradReductionStats Distributed::ReduceBucket(at::Tensor& bucket, GradReduce mode,
                                             const std::string& tag) {
  return Reduce(bucket, bucket.numel(), mode, tag, nullptr);
}

GradReductionStats Distributed::ReduceBucket(at::Tensor& bucket, GradReduce mode,
                                             const std::string& tag, const StepEnd& last) {
  if (!impl_->CarriesRow(bucket.scalar_type()))
    return Reduce(bucket, bucket.numel(), mode, tag, nullptr);
  const int64_t n = bucket.numel();
  at::Tensor buffer = at::empty({n + impl_->world * kRowColumns}, bucket.options());
  buffer.narrow(0, 0, n).copy_(bucket.reshape({-1}));
  GradReductionStats stats = Reduce(buffer, n, mode, tag, &last);
  bucket.copy_(buffer.narrow(0, 0, n).view(bucket.sizes()));
  return stats;
}

GradReductionStats Distributed::ReduceGradients(const std::vector<at::Tensor>& params,
                                                GradReduce mode, const std::string& tag) {
  return ReduceParams(params, mode, tag, nullptr);
}

GradReductionStats Distributed::ReduceGradients(const std::vector<at::Tensor>& params,
                                                GradReduce mode, const std::string& tag,
                                                const StepEnd& last) {
  return ReduceParams(params, mode, tag, &last);
}

GradReductionStats Distributed::ReduceParams(const std::vector<at::Tensor>& params, GradReduce mode,
                                             const std::string& tag, const StepEnd* last) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  // One contiguous gradient is its own bucket; several are flattened into one and copied back.
  if (grads.size() == 1 && grads[0].is_contiguous()) {
    at::Tensor flat = grads[0].view({-1});
    return last ? ReduceBucket(flat, mode, tag, *last) : ReduceBucket(flat, mode, tag);
  }
  bool carry = last != nullptr && !grads.empty() && impl_->CarriesRow(grads[0].scalar_type());
  std::vector<at::Tensor> flat_views;
  flat_views.reserve(grads.size() + 1);
  for (const at::Tensor& g : grads) {
    carry = carry && g.scalar_type() == grads[0].scalar_type();
    flat_views.push_back(g.reshape({-1}));
  }
  // The row's room comes with the flattening copy the bucket needs anyway.
  const int64_t room = carry ? impl_->world * kRowColumns : 0;
  if (carry) flat_views.push_back(at::zeros({room}, grads[0].options()));
  at::Tensor flat = flat_views.empty() ? at::zeros({0}) : at::cat(flat_views);
  GradReductionStats stats = Reduce(flat, flat.numel() - room, mode, tag, carry ? last : nullptr);
  int64_t offset = 0;
  for (at::Tensor& g : grads) {
    const int64_t numel = g.numel();
    g.copy_(flat.narrow(0, offset, numel).view_as(g));
    offset += numel;
  }
  return stats;
}

void Distributed::SetParameters(std::vector<at::Tensor> params) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->params = std::move(params);
}

void Distributed::OnBeginStep(int64_t step, const std::vector<at::Tensor>& params,
                              const std::vector<std::pair<std::string, std::string>>& rng_states,
                              int64_t epoch, int64_t offset,
                              const std::vector<std::string>& sample_ids) {
  std::vector<at::Tensor> own;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    own = impl_->params;
  }
  uint64_t h = 0;
  for (const at::Tensor& p : own.empty() ? params : own) {
    at::Tensor t = p.detach();
    if (!t.is_cpu()) t = t.cpu();
    t = t.contiguous();
    h = Checksum64(t.data_ptr(), t.nbytes(), h);
  }
  const std::set<std::string> replicated(impl_->options.replicated_rngs.begin(),
                                         impl_->options.replicated_rngs.end());
  uint64_t rep = 0, local = 0;
  bool any_rep = false, any_local = false;  // a class with no RNG has no checksum, not zero's
  for (const auto& [name, state] : rng_states) {
    const bool is_replicated = replicated.count(name) != 0;
    uint64_t& into = is_replicated ? rep : local;
    (is_replicated ? any_rep : any_local) = true;
    into = Checksum64(name.data(), name.size(), into);
    into = Checksum64(state.data(), state.size(), into);
  }
  uint64_t ids = 0;
  for (const std::string& id : sample_ids) ids = Checksum64(id.data(), id.size() + 1, ids);
  v1::StepFingerprint f;
  f.set_step(step);
  f.set_params(Hex16(h));
  if (any_rep) f.set_replicated_rng(Hex16(rep));
  if (any_local) f.set_local_rng(Hex16(local));
  f.set_cursor_epoch(epoch);
  f.set_cursor_offset(offset);
  f.set_sample_ids(Hex16(ids));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->fingerprints.empty() && impl_->fingerprints.back().step() >= step) {
    impl_->fingerprints.clear();  // the trainer restarted its step count
  }
  impl_->fingerprints.push_back(std::move(f));
  while (static_cast<int>(impl_->fingerprints.size()) >
         std::max(1, impl_->options.fingerprint_ring)) {
    impl_->fingerprints.pop_front();
  }
  impl_->step = step;
  impl_->began = true;
  impl_->params_checksum = h;
  impl_->reduced_this_step = false;
  impl_->rows_carried = false;
  impl_->SetPositionLocked("step " + std::to_string(step) + ": forward/backward");
}

AgreementResult Distributed::Agree(int64_t step, TriggerKind local, int loss_ranks) {
  AgreementResult result;
  if (!impl_->options.agree_on_triggers) return result;
  const int world = impl_->world;
  GradReductionStats mine;
  bool reduced;
  uint64_t checksum;
  std::vector<double> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    mine = impl_->last_reduction;
    reduced = impl_->reduced_this_step;
    checksum = impl_->params_checksum;
    if (impl_->rows_carried) all = impl_->carried_rows;
    impl_->SetPositionLocked("step " + std::to_string(step) + ": end of step (agreement)");
  }
  result.ran = true;
  result.rows_carried = !all.empty();
  if (all.empty()) {
    at::Tensor rows = at::zeros({world, kAgreeColumns}, at::kDouble);
    double* row = rows.data_ptr<double>() + impl_->rank * kAgreeColumns;
    row[0] = static_cast<double>(local);
    // -1 marks "did not reduce this step"; NaN and Inf norms go through as they are (each slot
    // has one contributor, and x + 0 is x).
    row[1] = reduced ? mine.local_norm : -1;
    row[2] = reduced ? static_cast<double>(mine.local_non_finite) : -1;
    row[3] = static_cast<double>(checksum >> 32);
    row[4] = static_cast<double>(checksum & 0xffffffffULL);
    row[5] = reduced ? mine.global_norm : -1;
    std::vector<at::Tensor> buffers{rows};
    try {
      AllReduce(buffers, "capsule.agree", "sum");
    } catch (const std::exception& e) {
      result.status = UnavailableError("trigger agreement failed: " + ErrorText(e));
      v1::TriggerAgreement agreement;
      agreement.set_step(step);
      agreement.set_error(ErrorText(e));
      for (int r : impl_->MissingRanks(step)) agreement.add_missing_ranks(r);
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->agreement = agreement;
      return result;
    }
    all.assign(rows.data_ptr<double>(), rows.data_ptr<double>() + world * kAgreeColumns);
  }
  impl_->AnalyzeRows(step, all.data(), mine, reduced, loss_ranks, &result);
  return result;
}

void Distributed::Impl::AnalyzeRows(int64_t at_step, const double* all,
                                    const GradReductionStats& mine, bool reduced, int loss_ranks,
                                    AgreementResult* result) {
  v1::TriggerAgreement record;
  record.set_step(at_step);
  std::string summary;
  for (int r = 0; r < world; ++r) {
    const int kind = static_cast<int>(all[r * kAgreeColumns]);
    if (kind == 0) continue;
    result->fired.emplace_back(r, static_cast<TriggerKind>(kind));
    v1::RankTrigger* t = record.add_fired();
    t->set_rank(r);
    t->set_kind(static_cast<v1::TriggerKind>(kind));
    summary += (summary.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " " +
               v1::TriggerKind_Name(static_cast<v1::TriggerKind>(kind));
  }
  if (!summary.empty()) summary = "fired: " + summary;
  // Replicas: the checksum most ranks share is the reference (rank 0's when there is a tie).
  std::map<std::pair<double, double>, int> votes;
  for (int r = 0; r < world; ++r) ++votes[{all[r * kAgreeColumns + 3], all[r * kAgreeColumns + 4]}];
  std::pair<double, double> ref{all[3], all[4]};
  for (const auto& [k, n] : votes) {
    if (n > votes[ref]) ref = k;
  }
  for (int r = 0; r < world; ++r) {
    if (std::make_pair(all[r * kAgreeColumns + 3], all[r * kAgreeColumns + 4]) != ref) {
      result->desynced_ranks.push_back(r);
    }
  }
  // The reduction's scale: a mean of the local gradients can never be longer than the mean of
  // their norms (triangle inequality). Only when the loss is rank-local (a per-rank mean, or not
  // declared): a trainer whose loss is normalised over every rank sums, and declares it.
  double sum_norms = 0;
  bool all_finite = true;
  for (int r = 0; r < world; ++r) {
    const double n = all[r * kAgreeColumns + 1];
    if (n < 0 || !std::isfinite(n)) all_finite = false;
    sum_norms += n;
  }
  if (reduced && all_finite && loss_ranks <= 1 && world > 1 && std::isfinite(mine.global_norm)) {
    const double m = sum_norms / world;
    result->reduction_ratio = m > 0 ? mine.global_norm / m : 0;
    result->reduction_not_a_mean = m > 0 && mine.global_norm > m * (1 + 1e-4);
  }
  std::lock_guard<std::mutex> lock(mu);
  if (reduced && !reductions.empty() && reductions.back().step() == at_step) {
    v1::GradReduction& rec = reductions.back();
    rec.clear_rank_local_norms();
    rec.clear_rank_local_non_finite();
    for (int r = 0; r < world; ++r) {
      rec.add_rank_local_norms(all[r * kAgreeColumns + 1]);
      rec.add_rank_local_non_finite(static_cast<int64_t>(all[r * kAgreeColumns + 2]));
    }
  }
  agreement = record;
  result->summary = summary;
}

void Distributed::FillSection(v1::Capsule* capsule) {
  const std::vector<std::pair<int, int64_t>> finished = impl_->FinishedRanks();  // not under `mu`
  std::lock_guard<std::mutex> lock(impl_->mu);
  v1::Distributed& d = *capsule->mutable_distributed();
  for (const auto& [r, last] : finished) {
    v1::FinishedRank& f = *d.add_finished();
    f.set_rank(r);
    f.set_last_step(std::max<int64_t>(0, last));
  }
  d.set_run_id(impl_->run_id);
  d.set_backend(impl_->backend);
  d.set_group_name(impl_->options.group_name);
  d.set_sequence_base(impl_->sequence_base);
  for (const v1::Collective& c : impl_->ring) *d.add_collectives() = c;
  for (const v1::Collective& c : impl_->p2p_ring) *d.add_point_to_point() = c;
  for (const v1::GradReduction& r : impl_->reductions) *d.add_reductions() = r;
  for (const v1::StepFingerprint& f : impl_->fingerprints) *d.add_fingerprints() = f;
  *d.mutable_agreement() = impl_->agreement;
  const auto now = std::chrono::steady_clock::now();
  v1::ThreadPosition* trainer = d.add_threads();
  trainer->set_thread("trainer");
  trainer->set_position(impl_->position);
  trainer->set_step(impl_->step);
  trainer->set_seconds(std::max(0.0, Seconds(now - impl_->position_since)));
  v1::ThreadPosition* watchdog = d.add_threads();
  watchdog->set_thread("watchdog");
  watchdog->set_position(impl_->watchdog_position);
  watchdog->set_step(impl_->step);
  d.set_last_step(std::max<int64_t>(0, impl_->step));
  d.set_watchdog_seconds(impl_->watchdog_seconds);
  d.set_timeout_seconds(std::max(0.0, impl_->options.timeout_seconds));
  if (impl_->store) d.set_dump_key(impl_->dump_key);
  d.set_dump_reason(impl_->dump_reason);
  v1::Placement& p = *capsule->mutable_placement();
  p.set_rank(impl_->rank);
  p.set_world_size(impl_->world);
  p.set_local_rank(impl_->options.local_rank >= 0 ? impl_->options.local_rank : impl_->rank);
  p.set_data_parallel_rank(impl_->rank);
  p.set_device(impl_->options.device);
}

}  // namespace capsule
