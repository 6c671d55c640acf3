// What a parity replay costs, as a multiple of one decode step of the same model: one token
// through every layer over a cache of the prompt. The replay runs the FP64 reference over the
// whole sequence, the decoder twice over the whole schedule (the eval-mode determinism check),
// and compares every position of every layer and cached tensor.
// In adapter mode it also merges every adapter and measures each merged weight in FP64.
//   capsule_bench --benchmark_filter=Parity
// Counters: decode_step_ms (the unit), parity_x (one RunParity / one decode step).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <chrono>

#include "capsule/model/decoder.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/replay/parity.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Mean seconds of one decode step at position `prompt` (the prompt prefilled once, untimed).
double DecodeStepSeconds(IncrementalDecoder& dec, const at::Tensor& ids, int64_t prompt) {
  constexpr int kSteps = 20;
  double total = 0;
  for (int k = 0; k < kSteps; ++k) {
    dec.ResetCache();
    DecodeStep prefill{ids.slice(1, 0, prompt), {}, 0};
    TensorList x = {prefill.input_ids};
    for (size_t i = 0; i < dec.size(); ++i) x = dec.ForwardStep(i, x, prefill);
    DecodeStep step{ids.slice(1, prompt, prompt + 1), {}, prompt};
    const auto t0 = std::chrono::steady_clock::now();
    x = {step.input_ids};
    for (size_t i = 0; i < dec.size(); ++i) x = dec.ForwardStep(i, x, step);
    total += Seconds(t0);
  }
  return total / kSteps;
}

// Arg 0: sequence length; the prompt is half of it. Arg 1 (adapter mode): 0 none; 1 a rank-4
// adapter on every block, merged in float32; 2 the same merged in bfloat16. The unit is then a
// decode step with the adapter applied at run time.
void BM_ParityReplay(benchmark::State& state) {
  at::set_num_threads(1);
  at::NoGradGuard no_grad;
  const int64_t t = state.range(0);
  const int64_t adapter = state.range(1);
  tiny_gpt::TinyGptConfig config;
  config.seq_len = t;
  if (adapter > 0) config.lora_rank = 4;
  auto model = std::move(*tiny_gpt::TinyGpt::Create(config));
  LayerBatch batch;
  batch.input_ids = at::randint(config.vocab_size, {4, t}, at::kLong);
  batch.training = false;
  ParityOptions options;
  options.prefill = t / 2;
  if (adapter > 0) options.adapter_merge = adapter == 1 ? at::kFloat : at::kBFloat16;
  const double step_s = DecodeStepSeconds(model->Decoder(), batch.input_ids, t / 2);
  double parity_s = 0;
  int64_t runs = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto report = RunParity(*model, batch, options);
    parity_s += Seconds(t0);
    ++runs;
    if (!report.ok() || report->diverged() || report->findings_size() > 0) {
      state.SkipWithError("parity failed or diverged on a clean model");
      break;
    }
  }
  state.counters["decode_step_ms"] = 1e3 * step_s;
  state.counters["parity_x"] = runs > 0 ? parity_s / runs / step_s : 0;
}

BENCHMARK(BM_ParityReplay)
    ->Args({16, 0})
    ->Args({32, 0})
    ->Args({16, 1})
    ->Args({32, 1})
    ->Args({32, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace capsule
