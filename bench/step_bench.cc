// What arming the Monitor costs a training step, next to torch's own anomaly mode.
//   BM_TinyGptStep/unarmed       forward + backward + Adam step of tiny_gpt (4 blocks, batch 8)
//   BM_TinyGptStep/armed         the same with Monitor::BeginStep/EndStep around it
//   BM_TinyGptStep/armed_probe   armed, with an OptimizerProbe's BeforeStep/AfterStep around the
//                                optimizer step
//   BM_TinyGptStep/anomaly_mode  the same under torch::autograd::DetectAnomalyGuard
// Budget (README, Performance): armed / unarmed <= 1.01, armed_probe / unarmed too. Read the ratio
// within one run:
//   capsule_bench --benchmark_filter=TinyGptStep --benchmark_repetitions=5
//                 --benchmark_enable_random_interleaving=true
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/optim/adam.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "capsule/capture/monitor.h"
#include "capsule/capture/optimizer_probe.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

enum class Mode { kUnarmed, kArmed, kArmedProbe, kAnomaly };

void BM_TinyGptStep(benchmark::State& state, Mode mode) {
  at::set_num_threads(1);
  tiny_gpt::TinyGptConfig config;
  auto model = std::move(*tiny_gpt::TinyGpt::Create(config));
  auto loader = *tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {8, config.seq_len, 0});
  std::vector<at::Tensor> params = model->parameters();
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(1e-3));
  MonitorOptions options;
  options.capsule_dir = (std::filesystem::temp_directory_path() / "capsule-bench").string();
  options.log_sink = [](const std::string&) {};
  Monitor monitor(options);
  monitor.AttachModel(model.get(), PathKind::kOptimized);
  std::optional<OptimizerProbe> probe;
  if (mode == Mode::kArmedProbe) probe.emplace(monitor, optimizer, model->NamedParameters());
  const bool armed = mode == Mode::kArmed || mode == Mode::kArmedProbe;
  LayerSequence& path = model->Path(PathKind::kOptimized);
  int64_t step = 0;
  int triggers = 0;
  for (auto _ : state) {
    tiny_gpt::CorpusBatch cb = loader.Next();
    model->SetStep(step);
    if (armed) {
      monitor.BeginStep(step, {cb.cursor.epoch, 0, cb.cursor.offset, cb.cursor.sample_indices, ""},
                        StepBatch{cb.batch, {}, {}, 0, 0, {}, {}});
    }
    optimizer.zero_grad();
    double loss = 0;
    {
      std::optional<torch::autograd::DetectAnomalyGuard> guard;
      if (mode == Mode::kAnomaly) guard.emplace();
      at::Tensor l = RunSequence(path, cb.batch);
      l.backward();
      loss = l.item<double>();
    }
    // Every variant computes the grad norm, as trainers do for clipping and logging; the armed
    // one differs only by BeginStep/EndStep.
    double sq = 0;
    for (const auto& p : params) sq += p.grad().pow(2).sum().item<double>();
    if (armed) {
      StepScalars s;
      s.loss = loss;
      s.grad_norm = std::sqrt(sq);
      triggers += monitor.EndStep(s).triggered;
    }
    benchmark::DoNotOptimize(sq);
    if (probe) probe->BeforeStep();
    optimizer.step();
    if (probe) triggers += probe->AfterStep().triggered;
    ++step;
  }
  state.counters["triggers"] = triggers;
}

BENCHMARK_CAPTURE(BM_TinyGptStep, unarmed, Mode::kUnarmed)
    ->Name("BM_TinyGptStep/unarmed")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);
BENCHMARK_CAPTURE(BM_TinyGptStep, armed, Mode::kArmed)
    ->Name("BM_TinyGptStep/armed")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);
BENCHMARK_CAPTURE(BM_TinyGptStep, armed_probe, Mode::kArmedProbe)
    ->Name("BM_TinyGptStep/armed_probe")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);
BENCHMARK_CAPTURE(BM_TinyGptStep, anomaly_mode, Mode::kAnomaly)
    ->Name("BM_TinyGptStep/anomaly_mode")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);

}  // namespace
}  // namespace capsule
