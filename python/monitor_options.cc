#include "capsule/python/monitor_options.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capsule/python/py_errors.h"

namespace capsule::python {
namespace {

WeightPolicy ParseWeightPolicy(const std::string& name) {
  if (name == "all") return WeightPolicy::kAll;
  if (name == "anomalous_layer") return WeightPolicy::kAnomalousLayer;
  if (name == "none") return WeightPolicy::kNone;
  throw py::value_error("Monitor: weight_policy is 'all', 'anomalous_layer' or 'none', not '" +
                        name + "'");
}

// {"window": 50, "warmup": 50, "mads": 6.0, "min_ratio": 2.0, "detrend": True,
// "min_rise": 2.0, "max_rise": 4.0}; absent keys keep `base`'s.
SpikeRule ParseSpikeRule(const py::handle& value, SpikeRule base) {
  for (const auto& [k, v] : value.cast<py::dict>()) {
    const std::string key = k.cast<std::string>();
    if (key == "window") {
      base.window = v.cast<int>();
    } else if (key == "warmup") {
      base.warmup = v.cast<int>();
    } else if (key == "mads") {
      base.mads = v.cast<double>();
    } else if (key == "min_ratio") {
      base.min_ratio = v.cast<double>();
    } else if (key == "detrend") {
      base.detrend = v.cast<bool>();
    } else if (key == "min_rise") {
      base.min_rise = v.cast<double>();
    } else if (key == "max_rise") {
      base.max_rise = v.cast<double>();
    } else {
      throw py::type_error("Monitor: unknown spike rule field '" + key + "'");
    }
  }
  return base;
}

// The Monitor's spike rule on `recent` (oldest first): its default rule for `kind` ("loss" or
// "grad_norm") with `rule`'s fields changed.
std::optional<double> SpikeThresholdFor(const std::vector<double>& recent, const std::string& kind,
                                        const py::dict& rule) {
  const MonitorOptions defaults;
  if (kind != "loss" && kind != "grad_norm") {
    throw py::value_error("spike_threshold: kind is 'loss' or 'grad_norm', not '" + kind + "'");
  }
  const SpikeRule& base = kind == "loss" ? defaults.loss_spike : defaults.grad_norm_spike;
  return SpikeThreshold(recent, ParseSpikeRule(rule, base));
}

}  // namespace

// The Python Monitor's keyword options, one for each MonitorOptions field (capture/monitor.h),
// with the same defaults. An unknown name is refused rather than ignored.
MonitorOptions OptionsFrom(const py::kwargs& kw) {
  MonitorOptions o;
  using Setter = std::function<void(const py::handle&)>;
  const std::map<std::string, Setter> setters = {
      {"capsule_dir", [&](const py::handle& v) { o.capsule_dir = v.cast<std::string>(); }},
      {"signing_key", [&](const py::handle& v) { o.signing_key_path = v.cast<std::string>(); }},
      {"run_name", [&](const py::handle& v) { o.run_name = v.cast<std::string>(); }},
      {"max_capsules", [&](const py::handle& v) { o.max_capsules = v.cast<int>(); }},
      {"min_steps_between_same_kind",
       [&](const py::handle& v) { o.min_steps_between_same_kind = v.cast<int64_t>(); }},
      {"weight_policy",
       [&](const py::handle& v) { o.weight_policy = ParseWeightPolicy(v.cast<std::string>()); }},
      {"max_weight_bytes", [&](const py::handle& v) { o.max_weight_bytes = v.cast<uint64_t>(); }},
      {"weights_checkpoint",
       [&](const py::handle& v) { o.weights_checkpoint = v.cast<std::string>(); }},
      {"history_length", [&](const py::handle& v) { o.history_length = v.cast<int>(); }},
      {"log_lines", [&](const py::handle& v) { o.log_lines = v.cast<int>(); }},
      {"trigger_non_finite_loss",
       [&](const py::handle& v) { o.trigger_non_finite_loss = v.cast<bool>(); }},
      {"trigger_non_finite_grad",
       [&](const py::handle& v) { o.trigger_non_finite_grad = v.cast<bool>(); }},
      {"trigger_loss_spike", [&](const py::handle& v) { o.trigger_loss_spike = v.cast<bool>(); }},
      {"trigger_grad_norm_spike",
       [&](const py::handle& v) { o.trigger_grad_norm_spike = v.cast<bool>(); }},
      {"loss_spike", [&](const py::handle& v) { o.loss_spike = ParseSpikeRule(v, o.loss_spike); }},
      {"grad_norm_spike",
       [&](const py::handle& v) { o.grad_norm_spike = ParseSpikeRule(v, o.grad_norm_spike); }},
      {"rerun", [&](const py::handle& v) { o.rerun = v.cast<bool>(); }},
      {"declared_frozen",
       [&](const py::handle& v) { o.declared_frozen = v.cast<std::vector<std::string>>(); }},
      {"background_write", [&](const py::handle& v) { o.background_write = v.cast<bool>(); }},
      {"background_queue_depth",
       [&](const py::handle& v) { o.background_queue_depth = v.cast<int>(); }},
      {"rank", [&](const py::handle& v) { o.rank = v.cast<int>(); }},
      {"world_size", [&](const py::handle& v) { o.world_size = v.cast<int>(); }},
      {"local_rank", [&](const py::handle& v) { o.local_rank = v.cast<int>(); }},
      {"device", [&](const py::handle& v) { o.device = v.cast<std::string>(); }},
      {"annotations",
       [&](const py::handle& v) { o.annotations = v.cast<std::map<std::string, std::string>>(); }},
      {"log_sink",
       [&](const py::handle& v) {
         py::function f = v.cast<py::function>();
         o.log_sink = [f](const std::string& line) {
           py::gil_scoped_acquire gil;
           CallPython("the log sink", AfterInterrupt::kRun, [&] { f(line); });
         };
       }},
  };
  for (const auto& [k, v] : kw) {
    const std::string key = k.cast<std::string>();
    auto it = setters.find(key);
    if (it == setters.end()) throw py::type_error("Monitor: unknown option '" + key + "'");
    it->second(v);
  }
  return o;
}

void BindMonitorOptions(py::module_& m) {
  m.def("spike_threshold", &SpikeThresholdFor, py::arg("recent"), py::arg("kind"), py::arg("rule"));
}

}  // namespace capsule::python
