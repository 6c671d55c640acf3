// What the triage stages cost a replay, against one training step of the same model and batch.
//   BM_TriageStep             forward + backward + AdamW step of tiny_gpt (4 blocks, batch 8)
//   BM_TriageStages/data      the data stage (per-sample FP64 loss) on the reference logits
//   BM_TriageStages/objective the objective stage (hand-written FP64 cross-entropy and variants)
//   BM_TriageStages/gradients the gradients stage over the reference backward's gradients
//   BM_TriageStages/optimizer the optimizer stage (FP64 AdamW redone from the recorded state)
// The reference forward and backward the stages read are computed once, outside the timing: replay
// runs them anyway for the numerics. Budget (README, Performance): the stages together <= 2x a
// step. Read the ratios within one run:
//   capsule_bench --benchmark_filter=Triage --benchmark_repetitions=5
//                 --benchmark_enable_random_interleaving=true
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <memory>

#include "capsule/capture/monitor.h"
#include "capsule/capture/optimizer_probe.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/instrument/internal/layer_probe.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/capsule_inputs.h"
#include "capsule/replay/internal/triage.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

// A trainer's state: tiny_gpt, its loader and an AdamW over it.
struct Trainer {
  Trainer() {
    at::set_num_threads(1);
    model = std::move(*tiny_gpt::TinyGpt::Create(config));
    loader.emplace(*tiny_gpt::CorpusLoader::Open(tiny_gpt::CorpusPath(), {8, config.seq_len, 0}));
    optimizer = std::make_unique<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  }
  tiny_gpt::TinyGptConfig config;
  std::unique_ptr<tiny_gpt::TinyGpt> model;
  std::optional<tiny_gpt::CorpusLoader> loader;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

// Everything the stages read, prepared once: a capsule of step 2 with its optimizer step, the
// batch, the FP64 reference logits and loss and the reference parameter gradients.
struct Prepared {
  std::unique_ptr<v1::Capsule> capsule;
  LayerBatch batch;
  at::Tensor logits;
  double loss = 0;
  std::vector<ParameterGrad> grads;
  double grad_norm = 0;
  std::unique_ptr<tiny_gpt::TinyGpt> model;  // owns the tensors the gradients refer to
};

const Prepared& Prepare() {
  static std::unique_ptr<Prepared> p;
  if (p) return *p;
  p = std::make_unique<Prepared>();
  Trainer t;
  const std::string dir =
      (std::filesystem::temp_directory_path() / "capsule-bench-triage").string();
  std::filesystem::remove_all(dir);
  MonitorOptions options;
  options.capsule_dir = dir;
  options.log_sink = [](const std::string&) {};
  Monitor monitor(options);
  monitor.AttachModel(t.model.get(), PathKind::kOptimized);
  OptimizerProbe probe(monitor, *t.optimizer, t.model->NamedParameters());
  StepReport written;
  for (int64_t step = 0; step < 3; ++step) {
    tiny_gpt::CorpusBatch cb = t.loader->Next();
    monitor.BeginStep(step, {}, StepBatch{cb.batch, {}, {}, 0, 0, {}, {}});
    t.optimizer->zero_grad();
    at::Tensor l = RunSequence(t.model->Path(PathKind::kOptimized), cb.batch);
    l.backward();
    StepScalars s;
    s.loss = l.item<double>();
    monitor.EndStep(s);
    if (step == 2) monitor.CaptureNow("bench");
    probe.BeforeStep();
    t.optimizer->step();
    StepReport r = probe.AfterStep();
    if (r.triggered) written = r;
  }
  ReadOptions ro;
  ro.allow_unsigned = true;
  auto decoded = ReadCapsuleFile(written.capsule_path, ro);
  std::filesystem::remove_all(dir);
  p->capsule = std::move(decoded->capsule);
  p->batch = *internal::LoadBatchTensors(*p->capsule);
  p->model = std::move(*tiny_gpt::TinyGpt::Create(t.config));
  (void)p->model->LoadParameters(*internal::ParameterTensors(*p->capsule));
  LayerSequence& ref = p->model->Path(PathKind::kReference);
  ProbeResult r = *ProbeStep(ref, p->batch, ProbeOptions{});
  p->logits = r.layers[ref.size() - 1].inputs.at(0).detach();
  p->loss = r.loss_value;
  p->grads = r.parameter_grads;
  p->grad_norm = r.grad_norm;
  return *p;
}

void BM_TriageStep(benchmark::State& state) {
  Trainer t;
  for (auto _ : state) {
    tiny_gpt::CorpusBatch cb = t.loader->Next();
    t.optimizer->zero_grad();
    at::Tensor l = RunSequence(t.model->Path(PathKind::kOptimized), cb.batch);
    l.backward();
    benchmark::DoNotOptimize(l.item<double>());
    t.optimizer->step();
  }
}

enum class Stage { kData, kObjective, kGradients, kOptimizer };

void BM_TriageStages(benchmark::State& state, Stage stage) {
  const Prepared& p = Prepare();
  internal::TriageInput in;
  in.capsule = p.capsule.get();
  in.batch = &p.batch;
  in.logits = p.logits;
  in.model_loss = p.loss;
  in.parameter_grads = &p.grads;
  bool ran = false;
  for (auto _ : state) {
    v1::StageReport r = stage == Stage::kData        ? internal::RunDataStage(in)
                        : stage == Stage::kObjective ? internal::RunObjectiveStage(in)
                        : stage == Stage::kGradients
                            ? internal::RunGradientsStage(in)
                            : internal::RunOptimizerStage(*p.capsule, p.grad_norm);
    ran = r.ran();
    benchmark::DoNotOptimize(r);
  }
  if (!ran) state.SkipWithError("the stage did not run");
}

BENCHMARK(BM_TriageStep)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_TriageStages, data, Stage::kData)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_TriageStages, objective, Stage::kObjective)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_TriageStages, gradients, Stage::kGradients)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_TriageStages, optimizer, Stage::kOptimizer)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

}  // namespace
}  // namespace capsule
