#include "samples/tiny_gpt/train_distributed.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "capsule/base/internal/file_util.h"
#include "capsule/capture/distributed.h"
#include "capsule/capture/monitor.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule::tiny_gpt {
namespace {

const std::set<std::string> kFaults = {"none",           "rank-nan",   "skip-collective",
                                       "count-mismatch", "no-average", "desync",
                                       "uneven-data",    "stall"};

double GradNorm(const std::vector<at::Tensor>& params) {
  double sq = 0;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

// One rank's training; returns its exit status.
int RunRank(const DistributedTrainOptions& o, int rank, const std::string& store_path) {
  at::set_num_threads(1);
  const int world = o.world_size;
  const bool faulty = rank == o.fault_rank;
  auto prefix = [rank] { return "rank " + std::to_string(rank) + ": "; };
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
  auto gloo = c10d::ProcessGroupGloo::Options::create(
      std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000)));
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo);

  std::shared_ptr<Distributed> dist;
  if (!o.unarmed) {
    DistributedOptions d;
    d.process_group = pg;
    d.store = store;
    d.timeout_seconds = o.timeout_seconds;
    d.watchdog_seconds = o.watchdog_seconds;
    d.replicated_rngs = {};  // the sampler and torch's generator are rank-local here
    auto made = Distributed::Create(d);
    if (!made.ok()) {
      std::cerr << prefix() << made.status().message() << "\n";
      return 1;
    }
    dist = *made;
  }
  // The unarmed baseline issues the same collectives straight on the group.
  auto all_reduce = [&](std::vector<at::Tensor>& t, const std::string& tag, bool armed) {
    if (armed) {
      dist->AllReduce(t, tag);
    } else {
      pg->allreduce(t)->wait();
    }
  };

  TinyGptConfig config;
  config.n_layers = o.layers;
  // desync: R's weights are drawn from another seed and the broadcast below does not reach them.
  config.seed = o.seed + (o.fault == "desync" && faulty ? 1 : 0);
  if (o.fault == "rank-nan" && faulty) {
    config.fault = FaultSpec{FaultKind::kNan, o.fault_layer, o.fault_step};
  }
  auto model_or = TinyGpt::Create(config);
  if (!model_or.ok()) {
    std::cerr << prefix() << model_or.status().message() << "\n";
    return 2;
  }
  TinyGpt& model = **model_or;
  std::vector<at::Tensor> params = model.parameters();
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& p : params) {
      std::vector<at::Tensor> t{o.fault == "desync" && faulty ? p.detach().clone() : p.detach()};
      if (dist) {
        dist->Broadcast(t, 0, "init.broadcast");
      } else {
        pg->broadcast(t)->wait();
      }
    }
  }
  // Each rank draws its own batches.
  auto loader_or = CorpusLoader::Open(
      CorpusPath(), {o.batch_size, config.seq_len, o.seed * 1000 + static_cast<uint64_t>(rank)});
  if (!loader_or.ok()) {
    std::cerr << prefix() << loader_or.status().message() << "\n";
    return 2;
  }
  CorpusLoader& loader = *loader_or;
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(o.lr));

  MonitorOptions mo;
  mo.capsule_dir = o.capsule_dir;
  mo.signing_key_path = o.key;
  mo.run_name = o.run_name;
  mo.annotations["trainer"] = "capsule-tiny-gpt --world-size " + std::to_string(world);
  mo.log_sink = [prefix](const std::string& line) {
    std::fprintf(stderr, "%s%s\n", prefix().c_str(), line.c_str());
  };
  std::unique_ptr<Monitor> monitor;
  if (!o.unarmed) {
    monitor = std::make_unique<Monitor>(mo);
    monitor->AttachModel(&model, PathKind::kOptimized);
    monitor->RegisterRng(
        "sampler", [&loader] { return loader.SaveRngState(); }, o.seed);
    monitor->AttachDistributed(dist);
  }

  LayerSequence& path = model.Path(PathKind::kOptimized);
  // uneven-data: R's loader holds one batch fewer than the others'.
  const int64_t my_steps = o.fault == "uneven-data" && faulty ? o.steps - 1 : o.steps;
  // --timing alternates blocks of 10 armed and 10 unarmed steps in this one run, so both see the
  // same machine (a separate unarmed run can land on a slower or faster moment: step times here
  // move by 50% from run to run, far more than the difference measured).
  std::vector<double> armed_ms, unarmed_ms;
  int64_t tokens_seen = 0;
  try {
    for (int64_t step = 0; step < my_steps; ++step) {
      const auto start = std::chrono::steady_clock::now();
      const bool armed = monitor != nullptr && (!o.timing || (step / 10) % 2 == 0);
      model.SetStep(step);
      if (o.fault == "stall" && faulty && step == o.fault_step) {
        // A loader stuck on a dead file system: the rank never comes back.
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      CorpusBatch cb = loader.Next();
      capsule::DataCursor cursor{cb.cursor.epoch, cb.cursor.shard, cb.cursor.offset,
                                 cb.cursor.sample_indices, "sampler"};
      StepBatch batch{cb.batch, cb.raw_text, {}, 0, tokens_seen, {}, {}};
      for (int64_t i : cb.cursor.sample_indices) {
        batch.sample_ids.push_back("byte:" + std::to_string(i));
      }
      // Each rank's loss is its own token mean, so the gradients must be averaged over ranks.
      batch.loss = {LossReduction::kTokenMean, static_cast<double>(cb.batch.labels.numel()), 1,
                    -100};
      if (armed) monitor->BeginStep(step, cursor, batch);
      optimizer.zero_grad();
      at::Tensor loss = RunSequence(path, cb.batch);
      loss.backward();
      const double l = loss.item<double>();
      // The step's last gradient reduction carries the agreement rows (Distributed::StepEnd):
      // EndStep's grad_norm below is taken from the reduced gradients, the same on every rank.
      const Distributed::StepEnd step_end{l};
      const bool skip = o.fault == "skip-collective" && faulty && step == o.fault_step;
      if (!skip) {
        std::vector<at::Tensor> reduce = params;
        if (o.fault == "count-mismatch" && faulty && step >= o.fault_step) reduce.pop_back();
        const GradReduce mode =
            o.fault == "no-average" && step >= o.fault_step ? GradReduce::kSum : GradReduce::kMean;
        if (o.reduce_per_param) {
          for (const at::Tensor& p : reduce) {
            if (armed && p.is_same(reduce.back())) {
              dist->ReduceGradients({p}, mode, "grads", step_end);
            } else if (armed) {
              dist->ReduceGradients({p}, mode);
            } else {
              std::vector<at::Tensor> one{p.grad()};
              all_reduce(one, "grads", armed);
              if (mode == GradReduce::kMean) one[0].div_(world);
            }
          }
        } else if (armed) {
          dist->ReduceGradients(reduce, mode, "grads", step_end);
        } else {
          std::vector<at::Tensor> grads;
          for (const at::Tensor& p : reduce) grads.push_back(p.grad().reshape({-1}));
          std::vector<at::Tensor> flat{at::cat(grads)};
          all_reduce(flat, "grads", armed);
          if (mode == GradReduce::kMean) flat[0].div_(world);
          int64_t off = 0;
          for (const at::Tensor& p : reduce) {
            p.grad().copy_(flat[0].narrow(0, off, p.grad().numel()).view_as(p.grad()));
            off += p.grad().numel();
          }
        }
      }
      const double grad_norm = GradNorm(params);
      if (armed) {
        StepScalars scalars;
        scalars.loss = l;
        scalars.grad_norm = grad_norm;
        monitor->EndStep(scalars);
        if (step == o.capture_at_step) {
          monitor->CaptureNow("--capture-at-step " + std::to_string(step));
        }
      }
      if (std::isfinite(l) && std::isfinite(grad_norm)) optimizer.step();
      (armed ? armed_ms : unarmed_ms)
          .push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
      // Captures are reported by the Monitor's log sink above (so are the watchdog's).
      if (!o.quiet && (step % 10 == 0 || step + 1 == my_steps)) {
        std::printf("%sstep %3lld  loss %.4f  grad_norm %.4f\n", prefix().c_str(),
                    static_cast<long long>(step), l, grad_norm);
        std::fflush(stdout);
      }
      tokens_seen += cb.batch.input_ids.numel();
    }
    // The end of training: every rank meets here (the uneven-data rank arrives a step early).
    if (dist) {
      dist->Barrier("end");
    } else {
      pg->barrier()->wait();
    }
  } catch (const std::exception& e) {
    // The capsule is written (COLLECTIVE_ERROR); the group is unusable, so this rank stops.
    std::cerr << prefix() << "stopping: a collective failed\n";
    if (monitor) monitor.reset();
    dist.reset();
    std::fflush(nullptr);
    _exit(1);  // the group's threads may be wedged; do not wait on their destructors
  }
  if (o.timing && rank == 0 && armed_ms.size() > 4 && unarmed_ms.size() > 4) {
    auto median = [](std::vector<double> v) {
      v.erase(v.begin(), v.begin() + 2);  // each block's warm-up is spread over both; drop two
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double a = median(armed_ms), u = median(unarmed_ms);
    std::printf("rank 0: median step armed %.3f ms, unarmed %.3f ms (%zu and %zu steps): %.3f\n", a,
                u, armed_ms.size(), unarmed_ms.size(), a / u);
  }
  if (monitor) {
    std::printf("%strained %lld steps; %d capsule(s) in %s\n", prefix().c_str(),
                static_cast<long long>(my_steps), monitor->capsules_written(),
                o.capsule_dir.c_str());
  }
  std::fflush(nullptr);
  monitor.reset();
  dist.reset();
  return 0;
}

}  // namespace

int RunDistributedTrain(const DistributedTrainOptions& o) {
  if (o.world_size < 2 || o.world_size > 16) {
    std::cerr << "capsule-tiny-gpt: --world-size must be in [2, 16]\n";
    return 2;
  }
  if (!kFaults.count(o.fault)) {
    std::cerr << "capsule-tiny-gpt: unknown distributed fault '" << o.fault
              << "' (none, rank-nan, skip-collective, count-mismatch, no-average, desync, "
                 "uneven-data, stall)\n";
    return 2;
  }
  if (o.fault != "none" && o.fault != "no-average" &&
      (o.fault_rank < 0 || o.fault_rank >= o.world_size)) {
    std::cerr << "capsule-tiny-gpt: --fault-rank must be in [0, world size)\n";
    return 2;
  }
  Status made = MakeDirs(o.capsule_dir, "capsule directory");
  if (!made.ok()) {
    std::cerr << "capsule-tiny-gpt: " << made.message() << "\n";
    return 2;
  }
  // A fresh store per run: a FileStore left by an earlier run would hand out its keys.
  const std::string store_path =
      o.capsule_dir + "/.store-" + std::to_string(::getpid()) + "-" + o.run_name;
  ::unlink(store_path.c_str());
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.world_size; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("capsule-tiny-gpt: fork");
      return 1;
    }
    if (pid == 0) {
      if (o.timing) {
        // One core per rank, as a data-parallel launcher binds them: without it the ranks and the
        // backend's threads migrate, and step times vary more than what the bench measures.
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        CPU_SET(r % std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)), &cpus);
        ::sched_setaffinity(0, sizeof(cpus), &cpus);
      }
      int rc = 1;
      try {
        rc = RunRank(o, r, store_path);
      } catch (const std::exception& e) {
        std::cerr << "rank " << r << ": " << e.what() << "\n";
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (int r = 0; r < o.world_size; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    std::string how;
    if (WIFEXITED(status)) {
      how = "exited with status " + std::to_string(WEXITSTATUS(status));
      if (WEXITSTATUS(status) != 0) worst = std::max(worst, 1);
    } else if (WIFSIGNALED(status)) {
      how = "was ended by signal " + std::to_string(WTERMSIG(status));
      worst = std::max(worst, 1);
    }
    if (!o.quiet || worst != 0) std::cout << "rank " << r << " " << how << "\n";
  }
  ::unlink(store_path.c_str());
  return worst;
}

}  // namespace capsule::tiny_gpt
