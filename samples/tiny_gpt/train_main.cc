// capsule-tiny-gpt: the sample trainer. Trains tiny_gpt on the sample corpus with capsule's
// Monitor hooked in; an injected fault makes a step go wrong, the Monitor writes a capsule, and
// training goes on.
//
//   capsule-tiny-gpt train --steps 40 --inject nan --inject-layer blocks.2 --inject-step 5
//                    --capsule-dir capsules --key demo.key
//   capsule-tiny-gpt replay capsules/tiny-step5-rank0-non-finite-loss.capsule --pubkey demo.pub
//                    --bisect
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "capsule/capture/monitor.h"
#include "capsule/cli/cli.h"
#include "capsule/replay/model_registry.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/registration.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule::tiny_gpt {
namespace {

struct TrainOptions {
  int64_t steps = 50;
  int64_t layers = 4;
  uint64_t seed = 0;
  // 1 by default: LibTorch's OpenMP pool spin-waits, and on a small shared machine two threads
  // can be ten times slower than one for a model this size.
  int threads = 1;
  int64_t batch_size = 8;
  double lr = 3e-3;
  std::string capsule_dir = "capsules";
  std::string key;
  std::string run_name = "tiny";
  int64_t capture_at_step = -1;
  std::string inject = "none";
  std::string inject_layer;
  int64_t inject_step = 0;
  bool quiet = false;
  // When set, one CSV line per step (step, loss, grad_norm, trigger kind or empty): the input of
  // bench/trigger_rates.py, which measures how often the spike triggers fire on clean runs.
  std::string scalars_out;
};

double GlobalGradNorm(const std::vector<at::Tensor>& params) {
  double sq = 0;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

int RunTrain(const TrainOptions& o) {
  at::set_num_threads(o.threads);
  TinyGptConfig config;
  config.n_layers = o.layers;
  config.seed = o.seed;
  auto kind = ParseFaultKind(o.inject);
  if (!kind.ok()) {
    std::cerr << "capsule-tiny-gpt: " << kind.status().message() << "\n";
    return 2;
  }
  config.fault = FaultSpec{*kind, o.inject_layer, o.inject_step};
  auto model_or = TinyGpt::Create(config);
  if (!model_or.ok()) {
    std::cerr << "capsule-tiny-gpt: " << model_or.status().message() << "\n";
    return 2;
  }
  TinyGpt& model = **model_or;
  auto loader_or = CorpusLoader::Open(CorpusPath(), {o.batch_size, config.seq_len, o.seed});
  if (!loader_or.ok()) {
    std::cerr << "capsule-tiny-gpt: " << loader_or.status().message() << "\n";
    return 2;
  }
  CorpusLoader& loader = *loader_or;
  std::vector<at::Tensor> params = model.parameters();
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(o.lr));

  MonitorOptions mo;
  mo.capsule_dir = o.capsule_dir;
  mo.signing_key_path = o.key;
  mo.run_name = o.run_name;
  mo.annotations["trainer"] = "capsule-tiny-gpt";
  // The loop below prints every report's summary; the Monitor's own stderr line would repeat it.
  mo.log_sink = [](const std::string&) {};
  Monitor monitor(mo);
  monitor.AttachModel(&model, PathKind::kOptimized);
  IdentityInfo identity;
  identity.files = {{"tokenizer", TokenizerPath()},
                    {"chat_template", ChatTemplatePath()},
                    {"corpus", CorpusPath()}};
  identity.config_text = config.ToJson();
  (void)monitor.SetIdentity(identity);  // failures are logged by the Monitor; training goes on
  monitor.RegisterRng(
      "sampler", [&loader] { return loader.SaveRngState(); }, o.seed);

  LayerSequence& path = model.Path(PathKind::kOptimized);
  int64_t tokens_seen = 0;
  int triggers = 0;
  bool said_rate_limited = false;
  std::ofstream scalars_csv;
  if (!o.scalars_out.empty()) {
    scalars_csv.open(o.scalars_out);
    if (!scalars_csv) {
      std::cerr << "capsule-tiny-gpt: cannot write " << o.scalars_out << "\n";
      return 2;
    }
    scalars_csv << "step,loss,grad_norm,trigger\n";
  }
  for (int64_t step = 0; step < o.steps; ++step) {
    model.SetStep(step);
    CorpusBatch cb = loader.Next();
    if (FaultCorruptsBatch(config.fault, step)) {
      CorruptBatch(cb.batch, config.fault.kind == FaultKind::kBadBatch);
    }
    if (FaultUnshiftsLabels(config.fault, step)) UnshiftLabels(cb.batch);
    capsule::DataCursor cursor{cb.cursor.epoch, cb.cursor.shard, cb.cursor.offset,
                               cb.cursor.sample_indices, "sampler"};
    StepBatch batch{cb.batch, cb.raw_text, {}, 0, tokens_seen};
    for (int64_t i : cb.cursor.sample_indices)
      batch.sample_ids.push_back("byte:" + std::to_string(i));
    monitor.BeginStep(step, cursor, batch);

    optimizer.zero_grad();
    double loss = NAN;
    StepReport failed = monitor.RunStep([&] {
      at::Tensor l = RunSequence(path, cb.batch);
      l.backward();
      loss = l.item<double>();
    });
    const double grad_norm = GlobalGradNorm(params);
    StepScalars scalars;
    scalars.loss = loss;
    scalars.grad_norm = grad_norm;
    scalars.learning_rate = o.lr;
    StepReport report = failed.triggered ? failed : monitor.EndStep(scalars);
    if (step == o.capture_at_step)
      report = monitor.CaptureNow("--capture-at-step " + std::to_string(step));
    char line[160];
    std::snprintf(line, sizeof(line), "step %3lld  loss %.4f  grad_norm %.4f",
                  static_cast<long long>(step), loss, grad_norm);
    monitor.Log(line);
    if (!o.quiet && (step % 10 == 0 || report.triggered || step + 1 == o.steps)) {
      std::cout << line << "\n";
    }
    if (scalars_csv.is_open()) {
      char row[96];
      std::snprintf(row, sizeof(row), "%lld,%.9g,%.9g,", static_cast<long long>(step), loss,
                    grad_norm);
      scalars_csv << row << (report.triggered ? TriggerKindName(report.trigger) : "") << "\n";
    }
    if (report.triggered) {
      ++triggers;
      if (!report.rate_limited || !said_rate_limited) std::cout << "  " << report.summary << "\n";
      said_rate_limited |= report.rate_limited;
    }
    // Like a mixed-precision loss scaler, skip the update of a step with non-finite numbers so
    // the weights stay usable and training goes on.
    if (std::isfinite(loss) && std::isfinite(grad_norm)) optimizer.step();
    tokens_seen += cb.batch.input_ids.numel();
  }
  std::cout << "trained " << o.steps << " steps; " << triggers << " trigger(s), "
            << monitor.capsules_written() << " capsule(s) in " << o.capsule_dir << "\n";
  return 0;
}

}  // namespace
}  // namespace capsule::tiny_gpt

int main(int argc, char** argv) {
  // Everything but `train` is the capsule CLI with tiny_gpt registered, so this one binary can
  // also replay what it recorded: `capsule-tiny-gpt replay run.capsule --bisect`.
  if (argc < 2 || std::string(argv[1]) != "train") {
    capsule::ModelRegistry registry;
    capsule::tiny_gpt::RegisterTinyGpt(registry);
    const bool help =
        argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h");
    if (argc < 2 || help) {
      std::cout << "capsule-tiny-gpt train [--help]: train tiny_gpt with capsule's Monitor\n"
                << "capsule-tiny-gpt SUBCOMMAND ...: the capsule CLI with tiny_gpt registered\n\n";
    }
    return capsule::cli::Main(argc, argv, registry);
  }
  using capsule::tiny_gpt::TrainOptions;
  CLI::App app{"capsule-tiny-gpt: the tiny_gpt sample trainer with capsule's Monitor"};
  app.require_subcommand(1);
  TrainOptions o;
  CLI::App* train =
      app.add_subcommand("train", "Train tiny_gpt; write a capsule when a step fails");
  train->add_option("--steps", o.steps, "Training steps")->check(CLI::PositiveNumber);
  train->add_option("--layers", o.layers, "Transformer blocks")->check(CLI::Range(1, 64));
  train->add_option("--seed", o.seed, "Seed of the weights and the data sampler");
  train->add_option("--threads", o.threads, "Intra-op threads")->check(CLI::Range(1, 256));
  train->add_option("--batch-size", o.batch_size, "Sequences per batch")
      ->check(CLI::PositiveNumber);
  train->add_option("--lr", o.lr, "Adam learning rate");
  train->add_option("--capsule-dir", o.capsule_dir, "Where capsules are written");
  train->add_option("--key", o.key, "Ed25519 private key (PEM, mode 0600) to sign capsules");
  train->add_option("--run-name", o.run_name, "Run name used in capsule file names");
  train->add_option("--capture-at-step", o.capture_at_step,
                    "Capture this step manually (for finite faults such as eps, tail-block)");
  train->add_option(
      "--inject", o.inject,
      "Fault: none, nan, softmax-overflow, tail-block, eps, bad-data, bad-batch, transient, "
      "loss-sum, labels-unshifted, disconnected");
  train->add_option("--inject-layer", o.inject_layer, "Layer of the fault, e.g. blocks.2");
  train->add_option("--inject-step", o.inject_step, "First step of the fault")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--quiet", o.quiet, "Print only triggers and the summary");
  train->add_option("--scalars-out", o.scalars_out,
                    "Write each step's loss, grad norm and trigger to this CSV file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return capsule::tiny_gpt::RunTrain(o);
}
