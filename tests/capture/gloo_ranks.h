// OnGlooRanks: runs a test body on several ranks at once, each on its own thread with its own
// torch c10d Gloo process group (127.0.0.1, one shared HashStore) and capsule::Distributed. The
// capture tests use it to exercise real collectives without forking processes.
//
//   GlooRanksOptions o;
//   o.timeout_ms = 20000;
//   OnGlooRanks(3, o, [&](int rank, const std::shared_ptr<Distributed>& d) { ... });
#ifndef CAPSULE_TESTS_CAPTURE_GLOO_RANKS_H_
#define CAPSULE_TESTS_CAPTURE_GLOO_RANKS_H_

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "capsule/capture/distributed.h"

namespace capsule {

struct GlooRanksOptions {
  int timeout_ms = 10000;  // each group's collective timeout
  double watchdog_seconds = 0;
  double watchdog_poll_seconds = 0.5;
  bool agree = true;       // DistributedOptions::agree_on_triggers
  bool may_throw = false;  // a body that throws ends its rank quietly instead of failing the test
  // Runs on each rank's group before Distributed::Create (say, to set its sequence number).
  std::function<void(int rank, c10d::ProcessGroupGloo& group)> before_create;
};

// Runs `body(rank, distributed)` on `world` ranks at once and joins them. A rank whose
// Distributed cannot be made, or whose body throws (unless `may_throw`), fails the test with
// the rank's error.
inline void OnGlooRanks(int world, const GlooRanksOptions& options,
                        const std::function<void(int, const std::shared_ptr<Distributed>&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mu;
  std::vector<std::string> errors;
  auto rank_main = [&](int rank) {
    try {
      auto gloo =
          c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(options.timeout_ms));
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo);
      if (options.before_create) options.before_create(rank, *pg);
      DistributedOptions d;
      d.process_group = pg;
      d.store = store;
      d.watchdog_seconds = options.watchdog_seconds;
      d.watchdog_poll_seconds = options.watchdog_poll_seconds;
      d.agree_on_triggers = options.agree;
      auto dist = Distributed::Create(d);
      ASSERT_TRUE(dist.ok()) << dist.status();
      body(rank, *dist);
    } catch (const std::exception& e) {
      if (options.may_throw) return;
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back("rank " + std::to_string(rank) + ": " + e.what());
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
}

}  // namespace capsule

#endif  // CAPSULE_TESTS_CAPTURE_GLOO_RANKS_H_
