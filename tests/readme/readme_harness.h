// What the README's trainer snippet ("Hooking it into a trainer") assumes a trainer already has:
// its model, data loader, batch, optimizer and a step function. The snippet is pasted, unchanged,
// into a function over these (snippet.cc.in) and compiled with -std=c++17 -Wall -Wextra
// -Wpedantic -Werror, so the README cannot drift from the API.
#ifndef CAPSULE_TESTS_README_README_HARNESS_H_
#define CAPSULE_TESTS_README_README_HARNESS_H_

#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>

#include "capsule/capture/monitor.h"

namespace readme {

struct Loader {
  std::string SaveRngState() const { return "state"; }
};

struct Optimizer {
  void step() {}
};

// Forward and backward of one batch: (loss, gradient norm).
std::pair<double, double> forward_backward(const capsule::StepBatch& batch);

}  // namespace readme

#endif  // CAPSULE_TESTS_README_README_HARNESS_H_
