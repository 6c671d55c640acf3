// capsule._capsule: the pybind11 binding the Python package (python/capsule) stands on. It is the
// C++ engine itself, not a second implementation: the Monitor, its re-run, the capsule builder and
// writer, the replayer and the command line are the ones the `capsule` CLI and C++ trainers use,
// so a capsule written from Python is the same signed file and replays to the same report.
//
// A Python model reaches the engine as a PyModel: two PyLayerSequences (optimized: the user's
// module; reference: a float64 copy of it, or the user's own reference module) whose stages are
// Python callables `stage(module, x, batch) -> tensor`. Tensors cross with zero copy through
// torch's own pybind11 casters (the same libtorch underneath, docs LIBTORCH-NOTES).
//
// Thread safety: everything runs on the calling Python thread with the GIL held.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/python.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "capsule/capture/generation.h"
#include "capsule/capture/monitor.h"
#include "capsule/capture/optimizer_probe.h"
#include "capsule/cli/cli.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/model/layer_sequence.h"
#include "capsule/model/model.h"
#include "capsule/probe/environment.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/replay/model_registry.h"

namespace py = pybind11;

namespace capsule::python {
namespace {

// A Python exception raised by the user's code the engine called (a stage, a factory): Python's
// own traceback goes to sys.stderr, as Python prints one, and the engine's error carries the one
// line "ValueError: what went wrong (traceback above)". pybind11's what() would put the whole
// traceback in one message, which the command line prints as one escaped line.
std::string PythonError(py::error_already_set& e) {
  py::gil_scoped_acquire gil;
  std::string summary;
  try {
    summary = py::str(e.type().attr("__name__")).cast<std::string>();
    const std::string what = py::str(e.value()).cast<std::string>();
    if (!what.empty()) summary += ": " + what;
    py::module_::import("traceback").attr("print_exception")(e.type(), e.value(), e.trace());
    py::module_::import("sys").attr("stderr").attr("flush")();
    summary += " (traceback above)";
  } catch (py::error_already_set&) {
    summary = e.what();  // the printing itself failed: keep what pybind11 has
  }
  return summary;
}

// The batch as the stages of a path computing in `dtype` see it: a dict of the LayerBatch's
// defined tensors, the floating ones (images, regression targets, float masks) in float64 for a
// float64 path, as its first layer's input is (model/layer_sequence.h FirstLayerInput).
py::dict BatchDict(const LayerBatch& b, at::ScalarType dtype) {
  py::dict d;
  const std::pair<const char*, const at::Tensor*> fields[] = {
      {"input_ids", &b.input_ids}, {"inputs", &b.inputs},
      {"labels", &b.labels},       {"attention_mask", &b.attention_mask},
      {"loss_mask", &b.loss_mask}, {"response_mask", &b.response_mask}};
  for (const auto& [name, t] : fields) {
    if (!t->defined()) continue;
    const bool widen = dtype == at::kDouble && t->is_floating_point() && t->scalar_type() != dtype;
    d[name] = widen ? t->detach().to(dtype) : *t;
  }
  d["labels_shifted"] = b.labels_shifted;
  d["training"] = b.training;
  return d;
}

at::Tensor TensorOr(const py::dict& d, const char* key) {
  if (!d.contains(key) || d[key].is_none()) return {};
  return d[key].cast<at::Tensor>();
}

// A KeyboardInterrupt (Ctrl-C), SystemExit or any other BaseException that is not an Exception,
// raised in Python code the engine calls back (a stage, a model's parameters or config, an RNG's
// save or restore, the log sink, replay's model factory), is the trainer's to handle: the engine
// turns a callback's error into a failed capture or replay and goes on, and that must not swallow
// it. CallPython keeps the first one here and hands the engine a C++ error instead; every entry
// point that ran the engine raises it again once the engine has returned and restored what it
// guards (RaiseIfInterrupted).
class Interrupt {
 public:
  // GIL held. Keeps `e` unless it is an Exception; true when it is kept (or one already was).
  static bool Keep(const py::error_already_set& e) {
    if (e.matches(PyExc_Exception)) return false;
    std::lock_guard<std::mutex> lock(mu());
    if (!kept()) kept().emplace(e);
    return true;
  }

  static bool Pending() {
    std::lock_guard<std::mutex> lock(mu());
    return kept().has_value();
  }

  // GIL held: raises the kept exception in Python (pybind11 restores a thrown
  // error_already_set), and forgets it.
  static void RaiseIfInterrupted() {
    std::optional<py::error_already_set> e;
    {
      std::lock_guard<std::mutex> lock(mu());
      e.swap(kept());
    }
    if (e) throw py::error_already_set(*e);
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::optional<py::error_already_set>& kept() {
    static auto* k = new std::optional<py::error_already_set>();  // never destroyed: no GIL then
    return *k;
  }
};

enum class AfterInterrupt {
  kRefuse,  // model code: once interrupted, the engine's further calls fail at once
  kRun,     // state restores and logging: they still run, so the trainer is left as it was
};

// Calls `f` (Python; GIL held) for the engine, named `what` in its errors. A Python Exception
// propagates as py::error_already_set, as any other; a BaseException that is not one is kept for
// the entry point to raise (Interrupt), and the engine gets the c10::Error a model's failure is
// (LayerSequence::Forward's contract).
template <typename F>
auto CallPython(const std::string& what, AfterInterrupt after, F&& f) -> decltype(f()) {
  if (after == AfterInterrupt::kRefuse && Interrupt::Pending()) {
    throw c10::Error(what + ": interrupted", "");
  }
  try {
    return f();
  } catch (py::error_already_set& e) {
    if (!Interrupt::Keep(e)) throw;
    throw c10::Error(
        what + ": interrupted (" + py::str(e.type().attr("__name__")).cast<std::string>() + ")",
        "");
  }
}

LayerBatch BatchFromDict(const py::dict& d) {
  LayerBatch b;
  b.input_ids = TensorOr(d, "input_ids");
  b.inputs = TensorOr(d, "inputs");
  b.labels = TensorOr(d, "labels");
  b.attention_mask = TensorOr(d, "attention_mask");
  b.loss_mask = TensorOr(d, "loss_mask");
  b.response_mask = TensorOr(d, "response_mask");
  if (d.contains("labels_shifted")) b.labels_shifted = d["labels_shifted"].cast<bool>();
  if (d.contains("training")) b.training = d["training"].cast<bool>();
  return b;
}

// What the batch dict declares of the loss: "objective" ("classification", "language_model"),
// "reduction" ("mean", "sum", "sequence_mean"), "ignore_index", "label_smoothing"; absent keys
// keep LossSpec's defaults. An unknown value is refused.
LossSpec LossSpecFromDict(const py::dict& d) {
  LossSpec s;
  if (d.contains("objective") && !d["objective"].is_none()) {
    const std::string v = d["objective"].cast<std::string>();
    if (v == "classification") {
      s.kind = ObjectiveKind::kClassification;
    } else if (v == "language_model") {
      s.kind = ObjectiveKind::kLanguageModel;
    } else {
      throw py::value_error("batch[\"objective\"]: '" + v +
                            "' is neither 'classification' nor 'language_model'");
    }
  }
  if (d.contains("reduction") && !d["reduction"].is_none()) {
    const std::string v = d["reduction"].cast<std::string>();
    const std::map<std::string, LossReduction> names = {
        {"mean", LossReduction::kTokenMean},
        {"sum", LossReduction::kTokenSum},
        {"sequence_mean", LossReduction::kSequenceMean}};
    auto it = names.find(v);
    if (it == names.end()) {
      throw py::value_error("batch[\"reduction\"]: '" + v +
                            "' is not one of 'mean', 'sum', 'sequence_mean'");
    }
    s.reduction = it->second;
  }
  if (d.contains("ignore_index")) s.ignore_index = d["ignore_index"].cast<int64_t>();
  if (d.contains("label_smoothing")) s.label_smoothing = d["label_smoothing"].cast<double>();
  return s;
}

// `module.<method>()` ("named_parameters", "named_buffers") as (name, tensor) pairs.
std::vector<NamedTensor> NamedTensorsOf(const py::object& module, const char* method) {
  py::gil_scoped_acquire gil;
  return CallPython(std::string("the model's ") + method, AfterInterrupt::kRefuse, [&] {
    std::vector<NamedTensor> out;
    for (const py::handle& item : module.attr(method)()) {
      py::tuple t = item.cast<py::tuple>();
      out.emplace_back(t[0].cast<std::string>(), t[1].cast<at::Tensor>());
    }
    return out;
  });
}

// One execution path of a Python model: named stages over a module. A stage named after a
// submodule ("blocks.3") owns that submodule's parameters, named by their full module path.
class PyLayerSequence : public LayerSequence {
 public:
  PyLayerSequence(py::object module, py::list stages, at::ScalarType dtype, py::object observed)
      : module_(std::move(module)), dtype_(dtype), observed_(std::move(observed)) {
    for (const py::handle& s : stages) {
      py::tuple t = s.cast<py::tuple>();
      names_.push_back(t[0].cast<std::string>());
      fns_.push_back(py::reinterpret_borrow<py::object>(t[1]));
      // The third element lists the submodule paths ("" for the whole module) or parameter
      // names whose parameters the stage owns (python/capsule/__init__.py fills it in: by
      // default, the submodule the stage is named after).
      owners_.push_back(t.size() > 2 ? t[2].cast<std::vector<std::string>>()
                                     : std::vector<std::string>{names_.back()});
    }
  }

  size_t size() const override { return names_.size(); }
  std::string name(size_t i) const override { return names_.at(i); }
  at::ScalarType compute_dtype() const override { return dtype_; }

  TensorList Forward(size_t i, const TensorList& inputs, const LayerBatch& batch) override {
    py::gil_scoped_acquire gil;
    const std::string what = "stage " + names_.at(i);
    try {
      return CallPython(what, AfterInterrupt::kRefuse, [&]() -> TensorList {
        // The stage runs in the batch's mode (train: dropout, BatchNorm's batch statistics;
        // eval: its running statistics), and the module is left in the mode it was in.
        const bool was_training = module_.attr("training").cast<bool>();
        if (was_training != batch.training) module_.attr("train")(batch.training);
        struct ModeBack {
          py::object module;
          bool mode, changed;
          ~ModeBack() {
            try {
              if (changed) module.attr("train")(mode);
            } catch (py::error_already_set&) {
              // The stage's own error, if any, is the one to report.
            }
          }
        } back{module_, was_training, was_training != batch.training};
        py::object x = inputs.size() == 1 ? py::cast(inputs[0]) : py::cast(inputs);
        py::object out = fns_.at(i)(module_, x, BatchDict(batch, dtype_));
        if (py::isinstance<py::list>(out) || py::isinstance<py::tuple>(out)) {
          return out.cast<TensorList>();
        }
        return {out.cast<at::Tensor>()};
      });
    } catch (py::error_already_set& e) {
      // A Python exception in a stage is the model's error: thrown as the c10::Error a C++
      // layer throws (LayerSequence::Forward's contract), which callers at the library boundary
      // (Monitor, replayer) report before carrying on.
      throw c10::Error(what + " raised " + PythonError(e), "");
    }
  }

  std::vector<NamedTensor> LayerParameters(size_t i) const override {
    py::gil_scoped_acquire gil;
    return CallPython("the parameters of " + names_.at(i), AfterInterrupt::kRefuse, [&] {
      std::vector<NamedTensor> out;
      for (const std::string& owner : owners_.at(i)) {
        py::object sub;
        try {
          sub = module_.attr("get_submodule")(owner);
        } catch (py::error_already_set& e) {
          if (!e.matches(PyExc_Exception)) throw;  // an interrupt is not "no submodule"
          // Not a submodule: a parameter of its own ("class_token"), or nothing (a stage named
          // "loss" owns no parameters).
          try {
            out.emplace_back(owner, module_.attr("get_parameter")(owner).cast<at::Tensor>());
          } catch (py::error_already_set& e2) {
            if (!e2.matches(PyExc_Exception)) throw;
          }
          continue;
        }
        const std::string prefix = owner.empty() ? "" : owner + ".";
        for (const py::handle& item : sub.attr("named_parameters")()) {
          py::tuple t = item.cast<py::tuple>();
          out.emplace_back(prefix + t[0].cast<std::string>(), t[1].cast<at::Tensor>());
        }
      }
      return out;
    });
  }

  const py::object& module() const { return module_; }

  // An observe-only model's hooks: `observed()` returns and clears [(name, backward, tensor)].
  std::vector<ObservedTensor> TakeObserved() override {
    if (observed_.is_none()) return {};
    py::gil_scoped_acquire gil;
    return CallPython("the observed tensors", AfterInterrupt::kRefuse, [&] {
      std::vector<ObservedTensor> out;
      for (const py::handle& item : observed_()) {
        py::tuple t = item.cast<py::tuple>();
        out.push_back({t[0].cast<std::string>(), t[1].cast<bool>(), t[2].cast<at::Tensor>()});
      }
      return out;
    });
  }

 private:
  py::object module_;
  at::ScalarType dtype_;
  py::object observed_;
  std::vector<std::string> names_;
  std::vector<py::object> fns_;
  std::vector<std::vector<std::string>> owners_;
};

// A Python model: the optimized path over the trainer's module and a reference path. `sync`, when
// given, is called before the reference path is used, so a float64 copy follows the trainer's
// current weights (python/capsule/__init__.py makes it).
class PyModel : public Model {
 public:
  PyModel(std::string name, py::object config_json, py::object module, py::list stages,
          py::object reference_module, py::list reference_stages, py::object sync,
          py::object observed)
      : name_(std::move(name)),
        config_json_(std::move(config_json)),
        optimized_(std::move(module), std::move(stages), at::kFloat, observed),
        reference_(std::move(reference_module), std::move(reference_stages), at::kDouble,
                   py::none()),
        sync_(std::move(sync)) {}

  LayerSequence& Path(PathKind kind) override {
    if (kind == PathKind::kReference) {
      if (!sync_.is_none()) {
        py::gil_scoped_acquire gil;
        CallPython("the reference copy's sync", AfterInterrupt::kRefuse, [&] { sync_(); });
      }
      return reference_;
    }
    return optimized_;
  }

  std::vector<NamedTensor> NamedParameters() const override {
    return NamedTensorsOf(optimized_.module(), "named_parameters");
  }

  // The module's buffers (BatchNorm's running statistics), as the engine saves, embeds and loads
  // them; the reference copy follows them through `sync`.
  std::vector<NamedTensor> NamedBuffers() const override {
    return NamedTensorsOf(optimized_.module(), "named_buffers");
  }

  // The config is asked for at capture time: it may hold runtime state (the step, a fault).
  ModelSpecInfo Spec() const override {
    py::gil_scoped_acquire gil;
    return CallPython("the model's config", AfterInterrupt::kRefuse, [&]() -> ModelSpecInfo {
      return {name_, config_json_().cast<std::string>()};
    });
  }

 private:
  std::string name_;
  py::object config_json_;  // () -> JSON text
  PyLayerSequence optimized_;
  PyLayerSequence reference_;
  py::object sync_;
};

py::dict ReportDict(const StepReport& r) {
  py::dict d;
  d["triggered"] = r.triggered;
  d["trigger"] = std::string(r.triggered ? TriggerKindName(r.trigger) : "");
  d["summary"] = r.summary;
  d["capsule_path"] = r.capsule_path;
  d["ok"] = r.status.ok();
  d["error"] = r.status.ok() ? std::string() : r.status.message();
  d["rate_limited"] = r.rate_limited;
  // Why no capsule was taken for a trigger that fired: a rate limit (the summary says which).
  d["refused"] = r.rate_limited ? r.summary : std::string();
  d["first_anomalous_layer"] = r.first_anomalous_layer;
  d["rerun_reproduced"] = r.rerun_reproduced;
  d["queued"] = r.queued;  // background_write: capsule_path is where it will land
  // Built, and written after the optimizer step (Monitor.attach_optimizer's probe).
  d["pending"] = r.pending;
  return d;
}

// The Monitor with the Python model it watches kept alive beside it.
struct PyMonitor {
  explicit PyMonitor(MonitorOptions options) : monitor(std::move(options)) {}
  Monitor monitor;
  std::shared_ptr<PyModel> model;
  std::unique_ptr<OptimizerProbe> probe;  // destroyed before the monitor it is attached to
};

// A Python error in a call the probe makes, as the std::exception the probe records (its
// traceback printed, as PythonError does).
template <typename F>
auto ForProbe(const std::string& what, F&& f) -> decltype(f()) {
  py::gil_scoped_acquire gil;
  try {
    return CallPython(what, AfterInterrupt::kRun, f);
  } catch (py::error_already_set& e) {
    throw std::runtime_error(what + " raised " + PythonError(e));
  }
}

// `read()` (python/capsule/__init__.py's _optimizer_state) as the probe's OptimizerState:
// {"kind", "class", "not_captured", "groups": [dict], "params": {name: (group, step, exp_avg,
// exp_avg_sq)}}.
OptimizerState OptimizerStateFrom(const py::object& read) {
  return ForProbe("the optimizer's state", [&] {
    const py::dict d = read().cast<py::dict>();
    OptimizerState s;
    const std::string kind = d["kind"].cast<std::string>();
    s.kind = kind == "adamw"  ? OptimizerState::Kind::kAdamW
             : kind == "adam" ? OptimizerState::Kind::kAdam
                              : OptimizerState::Kind::kOther;
    s.optimizer_class = d["class"].cast<std::string>();
    s.not_captured = d["not_captured"].cast<std::string>();
    for (const py::handle& item : d["groups"]) {
      const py::dict g = item.cast<py::dict>();
      OptimizerGroupState gs;
      gs.lr = g["lr"].cast<double>();
      gs.beta1 = g["beta1"].cast<double>();
      gs.beta2 = g["beta2"].cast<double>();
      gs.eps = g["eps"].cast<double>();
      gs.weight_decay = g["weight_decay"].cast<double>();
      gs.amsgrad = g["amsgrad"].cast<bool>();
      gs.maximize = g["maximize"].cast<bool>();
      s.groups.push_back(gs);
    }
    for (const auto& [name, item] : d["params"].cast<py::dict>()) {
      const py::tuple t = item.cast<py::tuple>();
      OptimizerParamState ps;
      ps.group = t[0].cast<int>();
      ps.step = t[1].cast<int64_t>();
      if (!t[2].is_none()) ps.exp_avg = t[2].cast<at::Tensor>();
      if (!t[3].is_none()) ps.exp_avg_sq = t[3].cast<at::Tensor>();
      s.params[name.cast<std::string>()] = ps;
    }
    return s;
  });
}

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

// Monitor.set_generation's keywords (capture/generation.h): the GenerationInfo fields, sampling
// and cache settings flattened; unknown keywords are refused.
capsule::GenerationInfo GenerationOf(const py::dict& kw) {
  capsule::GenerationInfo g;
  const std::map<std::string, std::function<void(const py::handle&)>> setters = {
      {"prompt_length", [&](const py::handle& v) { g.prompt_length = v.cast<int64_t>(); }},
      {"prefill_chunk", [&](const py::handle& v) { g.prefill_chunk = v.cast<int64_t>(); }},
      {"temperature", [&](const py::handle& v) { g.sampling.temperature = v.cast<double>(); }},
      {"top_k", [&](const py::handle& v) { g.sampling.top_k = v.cast<int32_t>(); }},
      {"top_p", [&](const py::handle& v) { g.sampling.top_p = v.cast<double>(); }},
      {"seed", [&](const py::handle& v) { g.sampling.seed = v.cast<uint64_t>(); }},
      {"stop_tokens",
       [&](const py::handle& v) { g.sampling.stop_tokens = v.cast<std::vector<int64_t>>(); }},
      {"cache_layout", [&](const py::handle& v) { g.cache.layout = v.cast<std::string>(); }},
      {"cache_dtype", [&](const py::handle& v) { g.cache.dtype = v.cast<std::string>(); }},
      {"post_rotation_keys",
       [&](const py::handle& v) { g.cache.post_rotation_keys = v.cast<bool>(); }},
      {"quant_scale", [&](const py::handle& v) { g.cache.quant_scale = v.cast<double>(); }},
      {"adapter_merged", [&](const py::handle& v) { g.adapter_merged = v.cast<bool>(); }},
      {"adapter_name", [&](const py::handle& v) { g.adapter_name = v.cast<std::string>(); }},
      {"tokenizer_sha256",
       [&](const py::handle& v) { g.tokenizer_sha256 = v.cast<std::string>(); }},
      {"template_sha256", [&](const py::handle& v) { g.template_sha256 = v.cast<std::string>(); }},
  };
  for (const auto& [k, v] : kw) {
    const std::string key = k.cast<std::string>();
    auto it = setters.find(key);
    if (it == setters.end()) throw py::type_error("set_generation: unknown field '" + key + "'");
    it->second(v);
  }
  return g;
}

}  // namespace
}  // namespace capsule::python

using capsule::DataCursor;
using capsule::IdentityInfo;
using capsule::InternalError;
using capsule::InvalidArgumentError;
using capsule::LayerSequence;
using capsule::Model;
using capsule::ModelRegistry;
using capsule::ModelSpecInfo;
using capsule::NamedTensor;
using capsule::PathKind;
using capsule::ReadCapsuleFile;
using capsule::ReadOptions;
using capsule::Status;
using capsule::StatusOr;
using capsule::StepBatch;
using capsule::StepScalars;
using capsule::python::AfterInterrupt;
using capsule::python::BatchFromDict;
using capsule::python::CallPython;
using capsule::python::ForProbe;
using capsule::python::Interrupt;
using capsule::python::LossSpecFromDict;
using capsule::python::OptimizerStateFrom;
using capsule::python::OptionsFrom;
using capsule::python::PyModel;
using capsule::python::PyMonitor;
using capsule::python::PythonError;
using capsule::python::ReportDict;
using capsule::python::SpikeThresholdFor;

PYBIND11_MODULE(_capsule, m) {
  m.doc() = "capsule's C++ engine: Monitor, replay and the command line (see the capsule package)";
  // Capsules written from this process say they come from Python, so that reports and replay
  // print `python3 -P -m capsule ... --model pkg.module:factory` for them (report/replay_tool.h).
  capsule::AddEnvironmentLibrary(
      "python", py::module_::import("platform").attr("python_version")().cast<std::string>());

  py::class_<PyModel, std::shared_ptr<PyModel>>(m, "_Model")
      .def(py::init<std::string, py::object, py::object, py::list, py::object, py::list, py::object,
                    py::object>(),
           py::arg("name"), py::arg("config_json"), py::arg("module"), py::arg("stages"),
           py::arg("reference_module"), py::arg("reference_stages"), py::arg("sync"),
           py::arg("observed") = py::none());

  py::class_<PyMonitor>(m, "_Monitor")
      .def(py::init([](const py::kwargs& kw) { return new PyMonitor(OptionsFrom(kw)); }))
      .def("attach_model",
           [](PyMonitor& self, std::shared_ptr<PyModel> model) {
             self.model = std::move(model);
             self.monitor.AttachModel(self.model.get(), PathKind::kOptimized);
             Interrupt::RaiseIfInterrupted();
           })
      .def(
          "register_rng",
          [](PyMonitor& self, const std::string& name, py::function save, uint64_t seed,
             py::object restore) {
            auto saver = [save, name]() {
              py::gil_scoped_acquire gil;
              return CallPython("RNG " + name + "'s save", AfterInterrupt::kRun,
                                [&] { return save().cast<std::string>(); });
            };
            if (restore.is_none()) {
              self.monitor.RegisterRng(name, saver, seed);
              return;
            }
            self.monitor.RegisterRng(name, saver, seed, [restore, name](const std::string& state) {
              py::gil_scoped_acquire gil;
              CallPython("RNG " + name + "'s restore", AfterInterrupt::kRun,
                         [&] { restore(py::bytes(state)); });
            });
          },
          py::arg("name"), py::arg("save"), py::arg("seed") = 0, py::arg("restore") = py::none())
      .def(
          "attach_optimizer",
          [](PyMonitor& self, py::object read, const std::vector<NamedTensor>& named,
             py::object decay_exempt, uint64_t max_state_bytes) {
            self.probe.reset();  // one probe per Monitor: the last attached
            capsule::OptimizerProbeOptions options;
            options.max_state_bytes = max_state_bytes;
            if (!decay_exempt.is_none()) {
              options.decay_exempt = [decay_exempt](const std::string& name, const at::Tensor& p) {
                return ForProbe("decay_exempt", [&] { return decay_exempt(name, p).cast<bool>(); });
              };
            }
            auto reader = [read](const std::vector<NamedTensor>&) {
              return OptimizerStateFrom(read);
            };
            self.probe = std::make_unique<capsule::OptimizerProbe>(self.monitor, reader, named,
                                                                   std::move(options));
          },
          py::arg("read"), py::arg("named"), py::arg("decay_exempt") = py::none(),
          py::arg("max_state_bytes") = uint64_t{256} << 20)
      .def("optimizer_before_step",
           [](PyMonitor& self, double clip_max_norm, std::optional<double> grad_norm_before_clip,
              double loss_scale, bool found_inf, const std::vector<std::string>& order,
              const std::vector<std::optional<double>>& scheduled_lr) {
             if (!self.probe) throw py::value_error("no optimizer is attached (attach_optimizer)");
             capsule::OptimizerStepInfo info;
             info.clip_max_norm = clip_max_norm;
             info.grad_norm_before_clip = grad_norm_before_clip;
             info.loss_scale = loss_scale;
             info.found_inf = found_inf;
             info.order = order;
             info.scheduled_lr = scheduled_lr;
             {
               py::gil_scoped_release no_gil;  // the reader takes the GIL to read the optimizer
               self.probe->BeforeStep(info);
             }
             Interrupt::RaiseIfInterrupted();
           })
      .def("optimizer_after_step",
           [](PyMonitor& self) {
             if (!self.probe) throw py::value_error("no optimizer is attached (attach_optimizer)");
             capsule::StepReport r;
             {
               py::gil_scoped_release no_gil;  // the writer may log through Python
               r = self.probe->AfterStep();
             }
             Interrupt::RaiseIfInterrupted();
             return ReportDict(r);
           })
      .def("log", [](PyMonitor& self, const std::string& line) { self.monitor.Log(line); })
      .def("annotate", [](PyMonitor& self, const std::string& key,
                          const std::string& value) { self.monitor.Annotate(key, value); })
      .def("add_event",
           [](PyMonitor& self, int64_t step, const std::string& kind, const std::string& detail) {
             self.monitor.AddEvent(step, kind, detail);
           })
      .def("set_generation",
           [](PyMonitor& self, const py::dict& g) {
             if (g.empty()) {
               (void)self.monitor.SetGeneration(std::nullopt);
               return;
             }
             const capsule::Status s = self.monitor.SetGeneration(capsule::python::GenerationOf(g));
             if (!s.ok()) throw py::value_error(s.message());
           })
      .def(
          "set_weights_checkpoint",
          [](PyMonitor& self, const std::string& path) { self.monitor.SetWeightsCheckpoint(path); })
      .def("set_identity",
           [](PyMonitor& self, const std::vector<std::pair<std::string, std::string>>& files,
              const std::string& chat_template, const std::string& config_text,
              const std::string& code_revision) {
             IdentityInfo info;
             for (const auto& [role, path] : files) info.files.push_back({role, path});
             info.chat_template = chat_template;
             info.config_text = config_text;
             info.code_revision = code_revision;
             Status s = self.monitor.SetIdentity(info);
             Interrupt::RaiseIfInterrupted();  // the model hash reads its parameters
             return s.ok() ? std::string() : s.message();
           })
      .def("begin_step",
           [](PyMonitor& self, int64_t step, const py::dict& batch, const py::dict& cursor,
              const std::vector<std::string>& raw_text, const std::vector<std::string>& sample_ids,
              int64_t tokens_seen) {
             DataCursor c;
             if (cursor.contains("epoch")) c.epoch = cursor["epoch"].cast<int64_t>();
             if (cursor.contains("shard")) c.shard = cursor["shard"].cast<int64_t>();
             if (cursor.contains("offset")) c.offset = cursor["offset"].cast<int64_t>();
             if (cursor.contains("sample_indices")) {
               c.sample_indices = cursor["sample_indices"].cast<std::vector<int64_t>>();
             }
             if (cursor.contains("sampler_rng")) {
               c.sampler_rng = cursor["sampler_rng"].cast<std::string>();
             }
             StepBatch b;
             b.tensors = BatchFromDict(batch);
             b.loss = LossSpecFromDict(batch);
             b.raw_text = raw_text;
             b.sample_ids = sample_ids;
             b.tokens_seen = tokens_seen;
             {
               py::gil_scoped_release no_gil;  // the engine takes the GIL when it calls Python
               self.monitor.BeginStep(step, c, b);
             }
             Interrupt::RaiseIfInterrupted();
           })
      .def("end_step",
           [](PyMonitor& self, std::optional<double> loss, std::optional<double> grad_norm,
              std::optional<double> learning_rate, std::optional<double> loss_scale) {
             StepScalars s;
             s.loss = loss;
             s.grad_norm = grad_norm;
             s.learning_rate = learning_rate;
             s.loss_scale = loss_scale;
             capsule::StepReport r;
             {
               // A trigger re-runs the step through the Python stages and runs autograd, which
               // must not be entered with the GIL held.
               py::gil_scoped_release no_gil;
               r = self.monitor.EndStep(s);
             }
             Interrupt::RaiseIfInterrupted();
             return ReportDict(r);
           })
      .def("capture_now",
           [](PyMonitor& self, const std::string& reason) {
             capsule::StepReport r;
             {
               py::gil_scoped_release no_gil;
               r = self.monitor.CaptureNow(reason);
             }
             Interrupt::RaiseIfInterrupted();
             return ReportDict(r);
           })
      .def("capture_exception",
           [](PyMonitor& self, const std::string& what) {
             // The exception happened in Python; RunStep turns it into the EXCEPTION capture it
             // makes of a C++ step that throws.
             capsule::StepReport r;
             {
               py::gil_scoped_release no_gil;
               r = self.monitor.RunStep([&what] { throw std::runtime_error(what); });
             }
             Interrupt::RaiseIfInterrupted();
             return ReportDict(r);
           })
      .def("wait_for_writes",
           [](PyMonitor& self) {
             {
               py::gil_scoped_release no_gil;  // the writer thread may log through Python
               self.monitor.WaitForWrites();
             }
             Interrupt::RaiseIfInterrupted();
           })
      .def_property_readonly("capsules_written",
                             [](const PyMonitor& self) { return self.monitor.capsules_written(); })
      .def_property_readonly("captures_failed",
                             [](const PyMonitor& self) { return self.monitor.captures_failed(); });

  m.def("spike_threshold", &SpikeThresholdFor, py::arg("recent"), py::arg("kind"), py::arg("rule"));

  m.def(
      "cli_main",
      [](const std::vector<std::string>& args, py::object factory, const std::string& program,
         const std::vector<std::string>& model_args) {
        // The `capsule` command line in this process. `factory` (from --model) builds the model
        // of any capsule it replays, whatever name the capsule recorded: one factory is named for
        // the capsules at hand, wherever FILE stands among the options.
        ModelRegistry registry;
        if (!factory.is_none()) {
          Status s = registry.SetFallback(
              [factory](const ModelSpecInfo& spec) -> StatusOr<std::unique_ptr<Model>> {
                py::gil_scoped_acquire gil;
                try {
                  py::object made = factory(spec.config_json);
                  auto model = made.attr("_engine_model")().cast<std::shared_ptr<PyModel>>();
                  // The registry owns a unique_ptr; the Python object keeps the shared one alive
                  // through this wrapper.
                  struct Holder : Model {
                    std::shared_ptr<PyModel> m;
                    py::object keep;
                    // Replay drops the model without the GIL; its Python objects need it.
                    ~Holder() override {
                      py::gil_scoped_acquire gil;
                      m.reset();
                      keep = py::object();
                    }
                    LayerSequence& Path(PathKind k) override { return m->Path(k); }
                    std::vector<NamedTensor> NamedParameters() const override {
                      return m->NamedParameters();
                    }
                    std::vector<NamedTensor> NamedBuffers() const override {
                      return m->NamedBuffers();
                    }
                    ModelSpecInfo Spec() const override { return m->Spec(); }
                  };
                  auto h = std::make_unique<Holder>();
                  h->m = std::move(model);
                  h->keep = made;
                  return std::unique_ptr<Model>(std::move(h));
                } catch (py::error_already_set& e) {
                  // An interrupt ends the replay as an error (exit status 2), and is raised
                  // again when the command line returns.
                  if (Interrupt::Keep(e)) return InternalError("model factory: interrupted");
                  return InvalidArgumentError("the --model factory raised " + PythonError(e));
                } catch (const py::cast_error&) {
                  return InvalidArgumentError(
                      "the --model factory did not return a capsule.Model (it returns "
                      "capsule.Model(name, module, stages))");
                }
              });
          if (!s.ok()) throw std::runtime_error(s.message());
        }
        capsule::cli::Invocation invocation;
        invocation.program = program;
        invocation.model_args = model_args;
        std::vector<std::string> argv_storage = args;
        std::vector<char*> argv;
        for (std::string& a : argv_storage) argv.push_back(a.data());
        argv.push_back(nullptr);
        int rc = 0;
        {
          py::gil_scoped_release no_gil;
          rc = capsule::cli::Main(static_cast<int>(argv_storage.size()), argv.data(), registry,
                                  invocation);
        }
        std::fflush(stdout);
        Interrupt::RaiseIfInterrupted();
        return rc;
      },
      py::arg("args"), py::arg("factory") = py::none(),
      py::arg("program") = "python3 -P -m capsule",
      py::arg("model_args") = std::vector<std::string>{});
}
