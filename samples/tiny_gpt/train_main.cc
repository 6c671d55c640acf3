// capsule-tiny-gpt: the sample trainer. Trains tiny_gpt on the sample corpus with capsule's
// Monitor hooked in; an injected fault makes a step go wrong, the Monitor writes a capsule, and
// training goes on.
//
//   capsule-tiny-gpt train --steps 40 --inject nan --inject-layer blocks.2 --inject-step 5
//                    --capsule-dir capsules --key demo.key
//   capsule-tiny-gpt replay capsules/tiny-step5-rank0-non-finite-loss.capsule --pubkey demo.pub
//                    --bisect
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "capsule/capture/monitor.h"
#include "capsule/capture/optimizer_probe.h"
#include "capsule/cli/cli.h"
#include "capsule/replay/model_registry.h"
#include "samples/tiny_gpt/corpus_loader.h"
#include "samples/tiny_gpt/registration.h"
#include "samples/tiny_gpt/tiny_gpt.h"
#include "samples/tiny_gpt/train_distributed.h"

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
  // AdamW's weight decay on matrices and embeddings; biases and layer-norm weights are exempt
  // (the usual rule: no decay on parameters with fewer than two dimensions).
  double weight_decay = 0;
  // Micro-batches per step (gradient accumulation), each of batch_size sequences.
  int64_t accum = 1;
  // Pads each sequence to seq_len after a random length in [seq_len / 4, seq_len], with pad id 0,
  // attention and loss masks 0 and label -100 on the padding.
  bool pad = false;
  // A static loss scale (as a mixed-precision trainer's scaler would hold): the loss is multiplied
  // by it before backward and the gradients divided by it before the step. 0: none.
  double loss_scale = 0;
  // Clip the global gradient norm to this before the step (after unscaling). 0: no clipping.
  double clip = 0;
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

bool DecayExempt(const std::string&, const at::Tensor& p) { return p.dim() < 2; }

// Right-pads every sequence of `b` after a length drawn from `rng`. With `pad_in_loss` (the
// pad-in-loss fault) padding keeps a label and loss mask 1.
void PadBatch(LayerBatch& b, std::mt19937_64& rng, bool pad_in_loss) {
  const int64_t t = b.input_ids.size(1);
  std::uniform_int_distribution<int64_t> length(std::max<int64_t>(1, t / 4), t);
  b.input_ids = b.input_ids.clone();
  b.labels = b.labels.clone();
  b.attention_mask = at::ones_like(b.input_ids);
  b.loss_mask = at::ones_like(b.input_ids);
  for (int64_t i = 0; i < b.input_ids.size(0); ++i) {
    const int64_t n = length(rng);
    if (n == t) continue;
    b.input_ids[i].slice(0, n).fill_(0);
    b.attention_mask[i].slice(0, n).fill_(0);
    b.labels[i].slice(0, n).fill_(pad_in_loss ? 0 : -100);
    if (!pad_in_loss) b.loss_mask[i].slice(0, n).fill_(0);
  }
}

int64_t TargetTokens(const LayerBatch& b) {
  at::Tensor valid = b.labels.ne(-100);
  if (b.loss_mask.defined()) valid = valid.logical_and(b.loss_mask.ne(0));
  return valid.sum().item<int64_t>();
}

// The sequences of several micro-batches as one batch, in order.
CorpusBatch Concat(const std::vector<CorpusBatch>& parts) {
  CorpusBatch out = parts.at(0);
  if (parts.size() == 1) return out;
  auto cat = [&](at::Tensor LayerBatch::*field) {
    std::vector<at::Tensor> ts;
    for (const CorpusBatch& p : parts) ts.push_back(p.batch.*field);
    out.batch.*field = ts[0].defined() ? at::cat(ts, 0) : at::Tensor();
  };
  cat(&LayerBatch::input_ids);
  cat(&LayerBatch::labels);
  cat(&LayerBatch::attention_mask);
  cat(&LayerBatch::loss_mask);
  for (size_t i = 1; i < parts.size(); ++i) {
    out.raw_text.insert(out.raw_text.end(), parts[i].raw_text.begin(), parts[i].raw_text.end());
    out.cursor.sample_indices.insert(out.cursor.sample_indices.end(),
                                     parts[i].cursor.sample_indices.begin(),
                                     parts[i].cursor.sample_indices.end());
  }
  return out;
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
  if (config.fault.kind == FaultKind::kAccumScale && o.accum < 2) {
    std::cerr << "capsule-tiny-gpt: --inject accum-scale needs --accum 2 or more\n";
    return 2;
  }
  // Without padding every micro-batch has the same token count and the accumulation fault has
  // nothing to weigh wrongly; pad-in-loss needs padding to count.
  const bool pad = o.pad || config.fault.kind == FaultKind::kAccumScale ||
                   config.fault.kind == FaultKind::kPadInLoss;
  if (config.fault.kind == FaultKind::kClipBeforeUnscale && (o.loss_scale <= 1 || o.clip <= 0)) {
    std::cerr << "capsule-tiny-gpt: --inject clip-before-unscale needs --loss-scale above 1 and "
                 "--clip above 0\n";
    return 2;
  }
  const double scale = o.loss_scale;
  std::vector<at::Tensor> params = model.parameters();
  // Two AdamW groups: decay on matrices and embeddings, none on biases and norm weights. The
  // decay-on-norm fault puts the norm weights in the decay group.
  std::vector<at::Tensor> decay, no_decay;
  for (const NamedTensor& p : model.NamedParameters()) {
    const bool norm_weight = p.first.find("ln") != std::string::npos && p.first.size() > 7 &&
                             p.first.compare(p.first.size() - 7, 7, ".weight") == 0;
    const bool faulty = config.fault.kind == FaultKind::kDecayOnNorm && norm_weight;
    (DecayExempt(p.first, p.second) && !faulty ? no_decay : decay).push_back(p.second);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(o.lr).weight_decay(0)));
  torch::optim::AdamW optimizer(std::move(groups), torch::optim::AdamWOptions(o.lr));

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
  OptimizerProbeOptions po;
  po.decay_exempt = DecayExempt;
  OptimizerProbe probe(monitor, optimizer, model.NamedParameters(), po);
  std::mt19937_64 pad_rng(o.seed * 1000003 + 17);

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
    if (TrainerFaultActive(config.fault, FaultKind::kFrozenUpdated, step)) {
      // Frozen from here on, but left in the optimizer: its zeroed gradients still step.
      const int64_t layer = config.layer_index(config.fault.layer);
      for (const NamedTensor& p : model.Path(PathKind::kOptimized).LayerParameters(layer)) {
        at::Tensor t = p.second;
        t.set_requires_grad(false);
      }
    }
    std::vector<CorpusBatch> micro;
    for (int64_t k = 0; k < o.accum; ++k) {
      CorpusBatch cb = loader.Next();
      if (FaultCorruptsBatch(config.fault, step) && k == 0) {
        CorruptBatch(cb.batch, config.fault.kind == FaultKind::kBadBatch);
      }
      if (FaultUnshiftsLabels(config.fault, step)) UnshiftLabels(cb.batch);
      if (pad) {
        PadBatch(cb.batch, pad_rng, TrainerFaultActive(config.fault, FaultKind::kPadInLoss, step));
      }
      micro.push_back(std::move(cb));
    }
    const CorpusBatch cb = Concat(micro);
    capsule::DataCursor cursor{cb.cursor.epoch, cb.cursor.shard, cb.cursor.offset,
                               cb.cursor.sample_indices, "sampler"};
    StepBatch batch{cb.batch, cb.raw_text, {}, 0, tokens_seen, {}, {}};
    for (int64_t i : cb.cursor.sample_indices)
      batch.sample_ids.push_back("byte:" + std::to_string(i));
    int64_t step_tokens = 0;
    for (const CorpusBatch& m : micro) {
      batch.micro_batch_sizes.push_back(m.batch.input_ids.size(0));
      step_tokens += TargetTokens(m.batch);
    }
    if (o.accum == 1) batch.micro_batch_sizes.clear();
    batch.loss = {LossReduction::kTokenMean, static_cast<double>(step_tokens), 1, -100};
    monitor.BeginStep(step, cursor, batch);

    optimizer.zero_grad();
    double loss = NAN;
    const bool accum_scale = TrainerFaultActive(config.fault, FaultKind::kAccumScale, step);
    StepReport failed = monitor.RunStep([&] {
      // Each micro-batch's token mean, weighed by its share of the step's target tokens, so the
      // step's loss and gradient are the token mean over all of them (the accum-scale fault
      // divides by the number of micro-batches instead).
      double total = 0;
      for (const CorpusBatch& m : micro) {
        const double share = accum_scale
                                 ? 1.0 / static_cast<double>(micro.size())
                                 : static_cast<double>(TargetTokens(m.batch)) /
                                       static_cast<double>(std::max<int64_t>(step_tokens, 1));
        at::Tensor l = RunSequence(path, m.batch) * share;
        (scale > 1 ? l * scale : l).backward();
        total += l.item<double>();
      }
      loss = total;
    });
    // The gradients are scaled until they are unscaled below; the norm the trainer reports is
    // the true one.
    const double grad_norm = GlobalGradNorm(params) / (scale > 1 ? scale : 1.0);
    StepScalars scalars;
    scalars.loss = loss;
    scalars.grad_norm = grad_norm;
    scalars.learning_rate = o.lr;
    scalars.weight_decay = o.weight_decay;
    if (scale > 1) scalars.loss_scale = scale;
    StepReport report = failed.triggered ? failed : monitor.EndStep(scalars);
    if (step == o.capture_at_step)
      report = monitor.CaptureNow("--capture-at-step " + std::to_string(step));
    // Like a mixed-precision loss scaler, skip the update of a step with non-finite numbers so
    // the weights stay usable and training goes on (the step-on-overflow fault steps anyway).
    const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
    OptimizerStepInfo info;
    info.found_inf = !finite;
    info.loss_scale = scale;
    info.clip_max_norm = o.clip;
    // Unscale, then clip the true norm; the clip-before-unscale fault clips the scaled gradients
    // (whose norm is scale times larger) and unscales after.
    const bool clip_first = TrainerFaultActive(config.fault, FaultKind::kClipBeforeUnscale, step);
    auto unscale = [&] {
      if (scale <= 1) return;
      at::NoGradGuard no_grad;
      for (at::Tensor& p : params) {
        if (p.grad().defined()) p.grad().mul_(1.0 / scale);
      }
    };
    auto clip = [&](double norm) {
      info.grad_norm_before_clip = norm;
      if (o.clip <= 0 || !std::isfinite(norm) || norm <= o.clip) return;
      at::NoGradGuard no_grad;
      for (at::Tensor& p : params) {
        if (p.grad().defined()) p.grad().mul_(o.clip / norm);
      }
    };
    if (clip_first) {
      clip(GlobalGradNorm(params));
      unscale();
      info.order = {"finite_check", "clip", "unscale", "step"};
    } else {
      unscale();
      clip(grad_norm);
      info.order = {"unscale", "finite_check", "clip", "step"};
    }
    if (o.clip <= 0) info.grad_norm_before_clip.reset();
    probe.BeforeStep(info);
    if (finite || TrainerFaultActive(config.fault, FaultKind::kStepOnOverflow, step)) {
      optimizer.step();
    }
    StepReport written = probe.AfterStep();
    if (written.triggered) report = written;
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
  train->add_option("--lr", o.lr, "AdamW learning rate");
  train
      ->add_option("--weight-decay", o.weight_decay,
                   "AdamW weight decay (not on biases and layer-norm weights)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--accum", o.accum, "Micro-batches per step (gradient accumulation)")
      ->check(CLI::Range(1, 64));
  train
      ->add_option("--loss-scale", o.loss_scale,
                   "Static loss scale: the loss is scaled before backward, the gradients "
                   "unscaled before the step")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--clip", o.clip, "Clip the global gradient norm to this (after unscaling)")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--pad", o.pad,
                  "Pad sequences after a random length (attention and loss masks, label -100)");
  train->add_option("--capsule-dir", o.capsule_dir, "Where capsules are written");
  train->add_option("--key", o.key, "Ed25519 private key (PEM, mode 0600) to sign capsules");
  train->add_option("--run-name", o.run_name, "Run name used in capsule file names");
  train->add_option("--capture-at-step", o.capture_at_step,
                    "Capture this step manually (for finite faults such as eps, tail-block)");
  train->add_option(
      "--inject", o.inject,
      "Fault: none, nan, softmax-overflow, tail-block, eps, bad-data, bad-batch, transient, "
      "loss-sum, labels-unshifted, disconnected, pad-in-loss, accum-scale, frozen-updated, "
      "decay-on-norm, step-on-overflow, clip-before-unscale, gelu-grad");
  train->add_option("--inject-layer", o.inject_layer, "Layer of the fault, e.g. blocks.2");
  train->add_option("--inject-step", o.inject_step, "First step of the fault")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--quiet", o.quiet, "Print only triggers and the summary");
  train->add_option("--scalars-out", o.scalars_out,
                    "Write each step's loss, grad norm and trigger to this CSV file");
  // Data-parallel: --world-size N forks N ranks over ProcessGroupGloo on 127.0.0.1.
  capsule::tiny_gpt::DistributedTrainOptions d;
  train
      ->add_option("--world-size", d.world_size,
                   "Data-parallel ranks (2 to 16): one process each, over c10d's Gloo")
      ->check(CLI::Range(1, 16));
  train->add_option("--fault", d.fault,
                    "Distributed fault (with --world-size): none, rank-nan, skip-collective, "
                    "count-mismatch, no-average, desync, uneven-data, stall");
  train->add_option("--fault-rank", d.fault_rank, "The rank of the distributed fault");
  train->add_option("--timeout", d.timeout_seconds, "The process group's timeout in seconds")
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--watchdog", d.watchdog_seconds,
                   "Hang period in seconds (default: a quarter of --timeout)")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--unarmed", d.unarmed, "Distributed: no Monitor (the bench's baseline)");
  train->add_flag("--timing", d.timing, "Distributed: print rank 0's median step time");
  train->add_flag("--reduce-per-param", d.reduce_per_param,
                  "Distributed: one gradient all-reduce per parameter (a collective-bound step)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (train->count("--world-size") > 0 && d.world_size > 1) {
    d.steps = train->count("--steps") > 0 ? o.steps : d.steps;
    d.layers = train->count("--layers") > 0 ? o.layers : d.layers;
    d.batch_size = train->count("--batch-size") > 0 ? o.batch_size : d.batch_size;
    d.seed = o.seed;
    d.lr = o.lr;
    d.capsule_dir = o.capsule_dir;
    d.key = o.key;
    d.run_name = o.run_name;
    d.quiet = o.quiet;
    d.capture_at_step = o.capture_at_step;
    if (train->count("--inject-step") > 0) d.fault_step = o.inject_step;
    if (train->count("--inject-layer") > 0) d.fault_layer = o.inject_layer;
    return capsule::tiny_gpt::RunDistributedTrain(d);
  }
  return capsule::tiny_gpt::RunTrain(o);
}
