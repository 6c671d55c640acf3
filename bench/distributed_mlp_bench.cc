// Armed vs unarmed data-parallel step of a small perceptron on c10d's Gloo (127.0.0.1, one core
// per rank), reducing each of its 11 parameters with its own all-reduce: a step bound by the
// collectives' fixed latency, not by compute, where any extra collective or pass shows.
//
// Each run forks the ranks anew over a fresh FileStore and alternates blocks of 10 steps: armed
// (a Monitor with a Distributed attached: BeginStep, ReduceGradients per parameter, EndStep) and
// unarmed (the same all-reduces straight on the group, nothing else). Rank 0 prints its medians
// and their ratio; the median of the runs' ratios closes the output.
//   capsule_distributed_mlp_bench [--runs 5] [--steps 600] [--world 2] [--batch 8]
//                                 [--separate-agreement]
// --separate-agreement: the last reduction is not marked as the step's last, so the agreement
// row travels in its own all-reduce at EndStep (the path taken without the marker).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sched.h>
#include <sys/wait.h>
#include <torch/csrc/autograd/autograd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "capsule/capture/distributed.h"
#include "capsule/capture/monitor.h"

namespace capsule {
namespace {

struct BenchOptions {
  int runs = 5;
  int steps = 600;
  int world = 2;
  int batch = 8;
  bool separate_agreement = false;
};

// 32 -> 64 -> 64 -> 64 -> 64 -> 64 -> 10: five layers with a bias and a last one without, 11
// parameters (~19k weights). The same initial weights on every rank.
std::vector<at::Tensor> MakeParams() {
  at::manual_seed(7);
  const int64_t dims[] = {32, 64, 64, 64, 64, 64, 10};
  std::vector<at::Tensor> params;
  for (int l = 0; l < 6; ++l) {
    params.push_back((at::randn({dims[l + 1], dims[l]}) / std::sqrt(dims[l])).requires_grad_());
    if (l < 5) params.push_back(at::zeros({dims[l + 1]}).requires_grad_());
  }
  return params;
}

at::Tensor Forward(const std::vector<at::Tensor>& p, const at::Tensor& x) {
  at::Tensor h = x;
  size_t i = 0;
  for (int l = 0; l < 6; ++l) {
    h = h.matmul(p[i++].t());
    if (l < 5) h = at::tanh(h + p[i++]);
  }
  return h;
}

double Median(std::vector<double> v) {
  v.erase(v.begin(), v.begin() + std::min<size_t>(2, v.size()));  // warm-up
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One rank's run; rank 0 writes "armed_ms unarmed_ms" to `result`.
int RunRank(const BenchOptions& o, int rank, const std::string& store_path,
            const std::string& capsule_dir, FILE* result) {
  at::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, o.world);
  auto gloo = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(60000));
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, o.world, gloo);
  DistributedOptions d;
  d.process_group = pg;
  d.store = store;
  d.timeout_seconds = 60;
  auto dist = Distributed::Create(d);
  if (!dist.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, dist.status().message().c_str());
    return 1;
  }
  std::vector<at::Tensor> params = MakeParams();
  (*dist)->SetParameters(params);
  MonitorOptions mo;
  mo.capsule_dir = capsule_dir;
  mo.log_sink = [rank](const std::string& line) {
    std::fprintf(stderr, "rank %d: %s\n", rank, line.c_str());
  };
  Monitor monitor(mo);
  monitor.AttachDistributed(*dist);
  at::Generator gen = at::detail::createCPUGenerator(1000 + rank);
  const at::Tensor target_w = at::randn({10, 32}, gen);
  std::vector<double> armed_ms, unarmed_ms;
  for (int step = 0; step < o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const bool armed = (step / 10) % 2 == 0;
    const at::Tensor x = at::randn({o.batch, 32}, gen);
    const at::Tensor y = x.matmul(target_w.t());
    StepBatch batch;
    batch.tensors.inputs = x;
    batch.loss.reduction = LossReduction::kSequenceMean;
    DataCursor cursor;
    cursor.offset = step;
    if (armed) monitor.BeginStep(step, cursor, batch);
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    const at::Tensor loss = (Forward(params, x) - y).pow(2).mean();
    loss.backward();
    const double l = loss.item<double>();
    for (size_t i = 0; i < params.size(); ++i) {
      if (armed && i + 1 == params.size() && !o.separate_agreement) {
        (*dist)->ReduceGradients({params[i]}, GradReduce::kMean, "grads", Distributed::StepEnd{l});
      } else if (armed) {
        (*dist)->ReduceGradients({params[i]}, GradReduce::kMean);
      } else {
        std::vector<at::Tensor> one{params[i].grad()};
        pg->allreduce(one)->wait();
        one[0].div_(o.world);
      }
    }
    double sq = 0;
    for (const at::Tensor& p : params) sq += p.grad().pow(2).sum().item<double>();
    if (armed) {
      StepScalars s;
      s.loss = l;
      s.grad_norm = std::sqrt(sq);
      monitor.EndStep(s);
    }
    {
      at::NoGradGuard no_grad;
      for (at::Tensor& p : params) p.sub_(p.grad(), 0.01);
    }
    (armed ? armed_ms : unarmed_ms)
        .push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
  }
  (*dist)->Barrier("end");
  if (rank == 0) std::fprintf(result, "%.6f %.6f\n", Median(armed_ms), Median(unarmed_ms));
  monitor.AttachDistributed(nullptr);
  return 0;
}

// One run: forks the ranks; returns rank 0's (armed, unarmed) medians, or {0, 0} on failure.
std::pair<double, double> RunOnce(const BenchOptions& o, const std::string& work, int run) {
  const std::string store_path = work + "/store-" + std::to_string(run);
  const std::string result_path = work + "/result-" + std::to_string(run);
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      cpu_set_t cpus;
      CPU_ZERO(&cpus);
      CPU_SET(r % std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)), &cpus);
      ::sched_setaffinity(0, sizeof(cpus), &cpus);
      FILE* f = r == 0 ? std::fopen(result_path.c_str(), "w") : nullptr;
      int rc = 1;
      try {
        rc = RunRank(o, r, store_path, work + "/capsules", f);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      if (f != nullptr) std::fclose(f);
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  double a = 0, u = 0;
  FILE* f = std::fopen(result_path.c_str(), "r");
  if (f != nullptr) {
    if (std::fscanf(f, "%lf %lf", &a, &u) != 2) ok = false;
    std::fclose(f);
  }
  return ok ? std::make_pair(a, u) : std::make_pair(0.0, 0.0);
}

int Main(int argc, char** argv) {
  BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--runs") {
      o.runs = next();
    } else if (a == "--steps") {
      o.steps = next();
    } else if (a == "--world") {
      o.world = next();
    } else if (a == "--batch") {
      o.batch = next();
    } else if (a == "--separate-agreement") {
      o.separate_agreement = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.runs < 1 || o.steps < 40 || o.world < 2 || o.world > 16 || o.batch < 1) {
    std::fprintf(stderr, "need --runs >= 1, --steps >= 40, --world in [2, 16], --batch >= 1\n");
    return 2;
  }
  const std::string work =
      std::filesystem::temp_directory_path() / ("capsule-mlp-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(work);
  std::vector<double> ratios;
  for (int run = 0; run < o.runs; ++run) {
    const auto [a, u] = RunOnce(o, work, run);
    if (a <= 0 || u <= 0) {
      std::fprintf(stderr, "run %d failed\n", run);
      std::filesystem::remove_all(work);
      return 1;
    }
    ratios.push_back(a / u);
    std::printf("rank 0: median step armed %.3f ms, unarmed %.3f ms: %.3f\n", a, u, a / u);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(work);
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  std::printf("armed / unarmed: median of %d runs = %.3f (min %.3f, max %.3f)\n", o.runs,
              sorted[sorted.size() / 2], sorted.front(), sorted.back());
  return 0;
}

}  // namespace
}  // namespace capsule

int main(int argc, char** argv) { return capsule::Main(argc, argv); }
