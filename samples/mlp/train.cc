// Trains the MLP on a synthetic regression task (y = sum(x) / 2 + noise) with capsule's Monitor
// hooked in.
//   mlp_train CAPSULE_DIR [STEPS [FAULT_SCALE [BATCH [SEED [BAD_STEP]]]]]   (50, 1, 16, 1, none)
// BAD_STEP corrupts that step's labels (x30): bad data, which the loss-spike trigger should catch.
// FAULT_SCALE != 1 plants a bug in the optimized path's fc2 (1e30 overflows float32): the loss
// goes non-finite and the Monitor writes a capsule that `capsule replay --plugin` diagnoses.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>

#include "capsule/capture/monitor.h"
#include "mlp.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: mlp_train CAPSULE_DIR [STEPS [FAULT_SCALE [BATCH [SEED [BAD_STEP]]]]]\n";
    return 2;
  }
  const int steps = argc > 2 ? std::stoi(argv[2]) : 50;
  mlp::Config config;
  config.fault_scale = argc > 3 ? std::stod(argv[3]) : 1.0;
  const int64_t batch_size = argc > 4 ? std::stoll(argv[4]) : 16;
  config.seed = argc > 5 ? std::stoll(argv[5]) : 1;
  const int64_t bad_step = argc > 6 ? std::stoll(argv[6]) : -1;
  std::unique_ptr<capsule::Model> model = mlp::MakeMlp(config);
  std::vector<at::Tensor> params;
  for (auto& [name, tensor] : model->NamedParameters()) params.push_back(tensor);
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(1e-2));

  capsule::MonitorOptions options;
  options.capsule_dir = argv[1];
  options.run_name = "mlp";
  capsule::Monitor monitor(options);
  monitor.AttachModel(model.get(), capsule::PathKind::kOptimized);
  torch::manual_seed(config.seed + 6);
  for (int64_t step = 0; step < steps; ++step) {
    capsule::StepBatch batch;
    batch.tensors.inputs = torch::randn({batch_size, config.in});
    batch.tensors.labels =
        batch.tensors.inputs.sum(1, /*keepdim=*/true) * 0.5 + torch::randn({batch_size, 1}) * 0.1;
    if (step == bad_step) batch.tensors.labels = batch.tensors.labels * 30;
    monitor.BeginStep(step, {}, batch);
    optimizer.zero_grad();
    at::Tensor loss =
        capsule::RunSequence(model->Path(capsule::PathKind::kOptimized), batch.tensors);
    loss.backward();
    capsule::StepScalars scalars;
    scalars.loss = loss.item<double>();
    monitor.EndStep(scalars);
    if (!std::isfinite(*scalars.loss)) continue;
    optimizer.step();
    if (step % 10 == 0) std::cout << "step " << step << " loss " << *scalars.loss << "\n";
  }
  std::cout << monitor.capsules_written() << " capsule(s) in " << options.capsule_dir << "\n";
  return 0;
}
