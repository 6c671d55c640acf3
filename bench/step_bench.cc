// What arming the Monitor costs a training step, next to torch's own anomaly mode.
//   BM_TinyGptStep/unarmed       forward + backward + Adam step of tiny_gpt (4 blocks, batch 8)
//   BM_TinyGptStep/armed         the same with Monitor::BeginStep/EndStep around it
//   BM_TinyGptStep/armed_probe   armed, with an OptimizerProbe's BeforeStep/AfterStep around the
//                                optimizer step
//   BM_TinyGptStep/anomaly_mode  the same under torch::autograd::DetectAnomalyGuard
//   BM_CaptureLatency/d_model    a step that captures (CaptureNow): the time the trainer is held,
//                                split into re-run, build and encode+sign+write, each as a
//                                multiple of the plain step time measured in the same loop
//   BM_StepsAfterTrigger         the capturing step and the 3 after it, capsule written in the
//                                trainer's thread or on the background writer
// Budget (README, Performance): armed / unarmed <= 1.01, armed_probe / unarmed too. Read the ratio
// within one run:
//   capsule_bench --benchmark_filter=TinyGptStep --benchmark_repetitions=5
//                 --benchmark_enable_random_interleaving=true
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/optim/adam.h>

#include <chrono>
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

// Each iteration: one plain step (timed), then the same step again under the Monitor with a
// manual capture (timed by the Monitor's own StepReport). Counters are means over iterations.
void BM_CaptureLatency(benchmark::State& state) {
  at::set_num_threads(1);
  tiny_gpt::TinyGptConfig config;
  config.d_model = state.range(0);
  auto model = std::move(*tiny_gpt::TinyGpt::Create(config));
  auto loader = *tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {8, config.seq_len, 0});
  MonitorOptions options;
  options.capsule_dir = (std::filesystem::temp_directory_path() / "capsule-bench-latency").string();
  options.log_sink = [](const std::string&) {};
  options.max_capsules = 1 << 30;
  options.min_steps_between_same_kind = 0;
  Monitor monitor(options);
  monitor.AttachModel(model.get(), PathKind::kOptimized);
  double step_s = 0, rerun_s = 0, build_s = 0, write_s = 0;
  int64_t step = 0, bytes = 0;
  for (auto _ : state) {
    tiny_gpt::CorpusBatch cb = loader.Next();
    const auto t0 = std::chrono::steady_clock::now();
    RunSequence(model->Path(PathKind::kOptimized), cb.batch).backward();
    step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    model->SetStep(step);
    monitor.BeginStep(step, DataCursor{}, StepBatch{cb.batch, cb.raw_text, {}, 0, 0, {}, {}});
    monitor.RunStep([&] { RunSequence(model->Path(PathKind::kOptimized), cb.batch).backward(); });
    const StepReport r = monitor.CaptureNow("bench");
    if (r.capsule_path.empty()) {
      state.SkipWithError(("no capsule: " + r.summary).c_str());
      break;
    }
    rerun_s += r.rerun_seconds;
    build_s += r.build_seconds;
    write_s += r.write_seconds;
    bytes = static_cast<int64_t>(std::filesystem::file_size(r.capsule_path));
    std::filesystem::remove(r.capsule_path);
    for (const at::Tensor& p : model->parameters()) p.mutable_grad() = at::Tensor();
    ++step;
  }
  if (step == 0 || step_s <= 0) return;
  state.counters["step_ms"] = 1e3 * step_s / static_cast<double>(step);
  state.counters["rerun_x"] = rerun_s / step_s;
  state.counters["build_x"] = build_s / step_s;
  state.counters["write_x"] = write_s / step_s;
  state.counters["held_x"] = (rerun_s + build_s + write_s) / step_s;
  state.counters["capsule_MB"] = static_cast<double>(bytes) / 1e6;
}

BENCHMARK(BM_CaptureLatency)
    ->ArgName("d_model")
    ->Arg(64)
    ->Arg(512)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);

// The steps around a capture, with the capsule written in the trainer's thread (arg 0) or on the
// background writer (arg 1), for a model of d_model = range(1) (its capsule embeds every weight).
// After 3 warm-up steps, each iteration: 4 plain steps (their mean is the reference), a step that
// captures (CaptureNow after its backward), then 3 more steps, each timed; the writes are waited
// for after them, untimed. Counters, as multiples of the plain step: trigger_x (the capturing step,
// capture included) and after1_x..after3_x (the steps right after it, which share the CPU with a
// write still in progress).
void BM_StepsAfterTrigger(benchmark::State& state) {
  at::set_num_threads(1);
  tiny_gpt::TinyGptConfig config;
  config.d_model = state.range(1);
  auto model = std::move(*tiny_gpt::TinyGpt::Create(config));
  auto loader = *tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {8, config.seq_len, 0});
  std::vector<at::Tensor> params = model->parameters();
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(1e-4));
  MonitorOptions options;
  options.capsule_dir = (std::filesystem::temp_directory_path() / "capsule-bench-after").string();
  options.log_sink = [](const std::string&) {};
  options.max_capsules = 1 << 30;
  options.min_steps_between_same_kind = 0;
  options.background_write = state.range(0) == 1;
  Monitor monitor(options);
  monitor.AttachModel(model.get(), PathKind::kOptimized);
  int64_t step = 0;
  double plain_s = 0, trigger_s = 0, after_s[3] = {0, 0, 0}, bytes = 0;
  int64_t rounds = 0;
  auto train = [&](bool capture) {
    tiny_gpt::CorpusBatch cb = loader.Next();
    model->SetStep(step);
    const auto t0 = std::chrono::steady_clock::now();
    monitor.BeginStep(step, DataCursor{}, StepBatch{cb.batch, {}, {}, 0, 0, {}, {}});
    optimizer.zero_grad();
    RunSequence(model->Path(PathKind::kOptimized), cb.batch).backward();
    std::string path;
    if (capture) path = monitor.CaptureNow("bench").capsule_path;
    optimizer.step();
    ++step;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::make_pair(s, path);
  };
  for (int i = 0; i < 3; ++i) train(false);  // allocator, gradients and Adam state warmed up
  for (auto _ : state) {
    for (int i = 0; i < 4; ++i) plain_s += train(false).first / 4;
    const auto [held, path] = train(true);
    trigger_s += held;
    for (double& a : after_s) a += train(false).first;
    monitor.WaitForWrites();
    if (path.empty() || !std::filesystem::exists(path)) {
      state.SkipWithError("no capsule written");
      break;
    }
    bytes = static_cast<double>(std::filesystem::file_size(path));
    std::filesystem::remove(path);
    ++rounds;
  }
  if (rounds == 0 || plain_s <= 0) return;
  state.counters["step_ms"] = 1e3 * plain_s / static_cast<double>(rounds);
  state.counters["trigger_x"] = trigger_s / plain_s;
  state.counters["after1_x"] = after_s[0] / plain_s;
  state.counters["after2_x"] = after_s[1] / plain_s;
  state.counters["after3_x"] = after_s[2] / plain_s;
  state.counters["capsule_MB"] = bytes / 1e6;
}

BENCHMARK(BM_StepsAfterTrigger)
    ->ArgNames({"background", "d_model"})
    ->ArgsProduct({{0, 1}, {64, 512}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(10.0);

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
