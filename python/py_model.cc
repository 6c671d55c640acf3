#include "capsule/python/py_model.h"

#include <map>

#include "capsule/python/py_errors.h"

namespace capsule::python {
namespace {

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

}  // namespace

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

TensorList PyLayerSequence::Forward(size_t i, const TensorList& inputs, const LayerBatch& batch) {
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

std::vector<NamedTensor> PyLayerSequence::LayerParameters(size_t i) const {
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

std::vector<ObservedTensor> PyLayerSequence::TakeObserved() {
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

LayerSequence& PyModel::Path(PathKind kind) {
  if (kind == PathKind::kReference) {
    if (!sync_.is_none()) {
      py::gil_scoped_acquire gil;
      CallPython("the reference copy's sync", AfterInterrupt::kRefuse, [&] { sync_(); });
    }
    return reference_;
  }
  return optimized_;
}

std::vector<NamedTensor> PyModel::NamedParameters() const {
  return NamedTensorsOf(optimized_.module(), "named_parameters");
}

std::vector<NamedTensor> PyModel::NamedBuffers() const {
  return NamedTensorsOf(optimized_.module(), "named_buffers");
}

ModelSpecInfo PyModel::Spec() const {
  py::gil_scoped_acquire gil;
  return CallPython("the model's config", AfterInterrupt::kRefuse, [&]() -> ModelSpecInfo {
    return {name_, config_json_().cast<std::string>()};
  });
}

void BindModel(py::module_& m) {
  py::class_<PyModel, std::shared_ptr<PyModel>>(m, "_Model")
      .def(py::init<std::string, py::object, py::object, py::list, py::object, py::list, py::object,
                    py::object>(),
           py::arg("name"), py::arg("config_json"), py::arg("module"), py::arg("stages"),
           py::arg("reference_module"), py::arg("reference_stages"), py::arg("sync"),
           py::arg("observed") = py::none());
}

}  // namespace capsule::python
