#include "capsule/python/monitor_options.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <type_traits>
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

// A field whose Python value pybind11 casts to the field's own type.
template <auto Field>
void SetField(MonitorOptions& o, const py::handle& v) {
  using T = std::remove_reference_t<decltype(o.*Field)>;
  o.*Field = v.cast<T>();
}

void SetWeightPolicy(MonitorOptions& o, const py::handle& v) {
  o.weight_policy = ParseWeightPolicy(v.cast<std::string>());
}

void SetLossSpike(MonitorOptions& o, const py::handle& v) {
  o.loss_spike = ParseSpikeRule(v, o.loss_spike);
}

void SetGradNormSpike(MonitorOptions& o, const py::handle& v) {
  o.grad_norm_spike = ParseSpikeRule(v, o.grad_norm_spike);
}

void SetLogSink(MonitorOptions& o, const py::handle& v) {
  py::function f = v.cast<py::function>();
  o.log_sink = [f](const std::string& line) {
    py::gil_scoped_acquire gil;
    CallPython("the log sink", AfterInterrupt::kRun, [&] { f(line); });
  };
}

// One row per MonitorOptions field (capture/monitor.h, the one declaration): the Python keyword,
// the field's name, and how a Python value sets it. A row naming a field the struct lacks does not
// compile; python/tests/test_monitor_options.py fails when the struct has a field no row names.
struct OptionRow {
  const char* keyword;
  const char* field;
  void (*set)(MonitorOptions&, const py::handle&);
};

#define CAPSULE_FIELD(name) #name, &SetField < &MonitorOptions::name>
constexpr OptionRow kOptionRows[] = {
    {"capsule_dir", CAPSULE_FIELD(capsule_dir)},
    {"signing_key", CAPSULE_FIELD(signing_key_path)},
    {"run_name", CAPSULE_FIELD(run_name)},
    {"max_capsules", CAPSULE_FIELD(max_capsules)},
    {"min_steps_between_same_kind", CAPSULE_FIELD(min_steps_between_same_kind)},
    {"weight_policy", "weight_policy", &SetWeightPolicy},
    {"max_weight_bytes", CAPSULE_FIELD(max_weight_bytes)},
    {"weights_checkpoint", CAPSULE_FIELD(weights_checkpoint)},
    {"history_length", CAPSULE_FIELD(history_length)},
    {"log_lines", CAPSULE_FIELD(log_lines)},
    {"trigger_non_finite_loss", CAPSULE_FIELD(trigger_non_finite_loss)},
    {"trigger_non_finite_grad", CAPSULE_FIELD(trigger_non_finite_grad)},
    {"trigger_loss_spike", CAPSULE_FIELD(trigger_loss_spike)},
    {"trigger_grad_norm_spike", CAPSULE_FIELD(trigger_grad_norm_spike)},
    {"loss_spike", "loss_spike", &SetLossSpike},
    {"grad_norm_spike", "grad_norm_spike", &SetGradNormSpike},
    {"background_write", CAPSULE_FIELD(background_write)},
    {"background_queue_depth", CAPSULE_FIELD(background_queue_depth)},
    {"background_signal_wait_seconds", CAPSULE_FIELD(background_signal_wait_seconds)},
    {"rerun", CAPSULE_FIELD(rerun)},
    {"declared_frozen", CAPSULE_FIELD(declared_frozen)},
    {"rank", CAPSULE_FIELD(rank)},
    {"world_size", CAPSULE_FIELD(world_size)},
    {"local_rank", CAPSULE_FIELD(local_rank)},
    {"device", CAPSULE_FIELD(device)},
    {"annotations", CAPSULE_FIELD(annotations)},
    {"log_sink", "log_sink", &SetLogSink},
};
#undef CAPSULE_FIELD

}  // namespace

MonitorOptions OptionsFrom(const py::kwargs& kw) {
  MonitorOptions o;
  for (const auto& [k, v] : kw) {
    const std::string key = k.cast<std::string>();
    const OptionRow* row = nullptr;
    for (const OptionRow& r : kOptionRows) {
      if (key == r.keyword) row = &r;
    }
    if (row == nullptr) throw py::type_error("Monitor: unknown option '" + key + "'");
    row->set(o, v);
  }
  return o;
}

void BindMonitorOptions(py::module_& m) {
  m.def("spike_threshold", &SpikeThresholdFor, py::arg("recent"), py::arg("kind"), py::arg("rule"));
  // ((keyword, field), ...) in MonitorOptions' order: what capsule.Monitor takes and documents.
  py::list rows;
  for (const OptionRow& r : kOptionRows) rows.append(py::make_tuple(r.keyword, r.field));
  m.attr("MONITOR_OPTIONS") = py::tuple(rows);
}

}  // namespace capsule::python
