// Arms a Monitor, feeds it one non-finite loss and prints where the capsule went.
//   arm_monitor DIR
#include <torch/torch.h>

#include <cmath>
#include <iostream>

#include "capsule/capture/monitor.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: arm_monitor DIR\n";
    return 2;
  }
  capsule::MonitorOptions options;
  options.capsule_dir = argv[1];
  options.run_name = "consumer";
  capsule::Monitor monitor(options);
  capsule::StepBatch batch;
  batch.tensors.input_ids = torch::zeros({1, 4}, torch::kLong);
  monitor.BeginStep(0, {}, batch);
  capsule::StepScalars scalars;
  scalars.loss = NAN;
  const capsule::StepReport report = monitor.EndStep(scalars);
  if (report.capsule_path.empty()) {
    std::cerr << report.summary << "\n";
    return 1;
  }
  std::cout << report.capsule_path << "\n";
  return 0;
}
