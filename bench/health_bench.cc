// Health statistics throughput (budget: README, Performance): the fused kernel against the ATen
// composition a user would write, and against t.sum(), on the same float32 tensor; fused_relu runs
// the fused kernel on that tensor's ReLU, whose minimum is a zero.
//
//   capsule_bench --benchmark_filter='BM_HealthStats|BM_Sum' --benchmark_repetitions=3
//       --benchmark_enable_random_interleaving
//
// Budget: fused >= 10x naive and >= 50% of sum() in bytes per second.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>

#include "capsule/instrument/health_stats.h"

namespace {

// Reductions and the thread pool split depend on the thread count: fix it and record it.
constexpr int kThreads = 2;

const at::Tensor& Float32Tensor(int64_t mib) {
  static std::map<int64_t, at::Tensor> tensors;
  auto it = tensors.find(mib);
  if (it == tensors.end()) {
    const int64_t numel = mib * 1024 * 1024 / static_cast<int64_t>(sizeof(float));
    it = tensors.emplace(mib, at::randn({numel}, at::kFloat)).first;
  }
  return it->second;
}

// A ReLU output: half zeros and a minimum of exactly zero, whose sign the vector kernels must
// settle the way the AVX2 kernel does.
const at::Tensor& ReluTensor(int64_t mib) {
  static std::map<int64_t, at::Tensor> tensors;
  auto it = tensors.find(mib);
  if (it == tensors.end()) it = tensors.emplace(mib, at::relu(Float32Tensor(mib))).first;
  return it->second;
}

const at::Tensor& Prepare(benchmark::State& state) {
  at::set_num_threads(kThreads);
  state.counters["threads"] = at::get_num_threads();
  return Float32Tensor(state.range(0));
}

void Finish(benchmark::State& state, const at::Tensor& t) {
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(t.nbytes()));
}

void HealthStatsLoop(benchmark::State& state, const at::Tensor& t) {
  for (auto _ : state) {
    capsule::StatusOr<capsule::HealthStats> s = capsule::ComputeHealthStats(t);
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(s->rms);
  }
  Finish(state, t);
}

void BM_HealthStatsFused(benchmark::State& state) { HealthStatsLoop(state, Prepare(state)); }

void BM_HealthStatsFusedRelu(benchmark::State& state) {
  Prepare(state);
  HealthStatsLoop(state, ReluTensor(state.range(0)));
}

void BM_HealthStatsNaive(benchmark::State& state) {
  const at::Tensor& t = Prepare(state);
  for (auto _ : state) {
    const bool all_finite = t.isfinite().all().item<bool>();
    const int64_t nan = t.isnan().sum().item<int64_t>();
    const int64_t pos_inf = t.isposinf().sum().item<int64_t>();
    const int64_t neg_inf = t.isneginf().sum().item<int64_t>();
    const double min = t.min().item<double>();
    const double max = t.max().item<double>();
    const double absmax = t.abs().max().item<double>();
    const double mean = t.mean().item<double>();
    const double rms = t.pow(2).mean().sqrt().item<double>();
    const int64_t zeros = t.eq(0).sum().item<int64_t>();
    benchmark::DoNotOptimize(all_finite);
    benchmark::DoNotOptimize(nan + pos_inf + neg_inf + zeros);
    benchmark::DoNotOptimize(min + max + absmax + mean + rms);
  }
  Finish(state, t);
}

void BM_Sum(benchmark::State& state) {
  const at::Tensor& t = Prepare(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(t.sum().item<float>());
  }
  Finish(state, t);
}

// Wall time: the work runs on the intra-op pool, so the main thread's CPU time undercounts it.
BENCHMARK(BM_HealthStatsFused)
    ->Name("BM_HealthStats/fused")
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HealthStatsFusedRelu)
    ->Name("BM_HealthStats/fused_relu")
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HealthStatsNaive)
    ->Name("BM_HealthStats/naive")
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Sum)->Arg(1)->Arg(16)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
