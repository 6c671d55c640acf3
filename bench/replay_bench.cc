// Bisect against a linear scan: wall time of `capsule replay --bisect` and `--bisect=linear` on a
// tiny_gpt capsule with N layers (N - 4 blocks) and an eps fault in the middle block. Layerwise
// comparison is off so the two differ only in the search. Budget (README, Performance): at N = 32
// bisect takes <= 40% of the linear scan.
//   capsule_bench --benchmark_filter='Bisect|LinearScan'
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <filesystem>
#include <map>

#include "capsule/capture/monitor.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/model_registry.h"
#include "capsule/replay/replayer.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/registration.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

// A manual capture of step 0 of an N-layer tiny_gpt with an eps fault in its middle block.
const v1::Capsule& CapsuleWithLayers(int n) {
  static std::map<int, std::unique_ptr<v1::Capsule>> cache;
  auto& slot = cache[n];
  if (slot) return *slot;
  at::set_num_threads(1);
  tiny_gpt::TinyGptConfig config;
  config.n_layers = n - 4;
  config.fault = {tiny_gpt::FaultKind::kEps, "blocks." + std::to_string(config.n_layers / 2), 0};
  auto model = std::move(*tiny_gpt::TinyGpt::Create(config));
  auto loader = *tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {8, config.seq_len, 0});
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("capsule-bench-" + std::to_string(n))).string();
  std::filesystem::remove_all(dir);
  MonitorOptions options;
  options.capsule_dir = dir;
  options.log_sink = [](const std::string&) {};
  Monitor monitor(options);
  monitor.AttachModel(model.get(), PathKind::kOptimized);
  tiny_gpt::CorpusBatch cb = loader.Next();
  monitor.BeginStep(0, {}, StepBatch{cb.batch, {}, {}, 0, 0, {}, {}});
  StepScalars s;
  s.loss = RunSequence(model->Path(PathKind::kOptimized), cb.batch).item<double>();
  monitor.EndStep(s);
  StepReport r = monitor.CaptureNow("bench");
  ReadOptions ro;
  ro.allow_unsigned = true;
  auto decoded = ReadCapsuleFile(r.capsule_path, ro);
  std::filesystem::remove_all(dir);
  slot = std::move(decoded->capsule);
  return *slot;
}

void RunReplay(benchmark::State& state, BisectMode mode) {
  const int n = static_cast<int>(state.range(0));
  const v1::Capsule& capsule = CapsuleWithLayers(n);
  ModelRegistry registry;
  tiny_gpt::RegisterTinyGpt(registry);
  ReplayOptions options;
  options.forward = false;
  options.bisect = mode;
  int probes = 0;
  for (auto _ : state) {
    auto report = ReplayCapsule(capsule, registry, options);
    if (!report.ok()) {
      state.SkipWithError(report.status().ToString().c_str());
      break;
    }
    probes = report->bisect().probes();
  }
  state.counters["probes"] = probes;
}

void BM_Bisect(benchmark::State& state) { RunReplay(state, BisectMode::kBisect); }
void BM_LinearScan(benchmark::State& state) { RunReplay(state, BisectMode::kLinear); }

BENCHMARK(BM_Bisect)->Arg(8)->Arg(16)->Arg(32)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearScan)->Arg(8)->Arg(16)->Arg(32)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace capsule
