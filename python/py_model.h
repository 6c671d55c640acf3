// A Python model as the engine's Model: two PyLayerSequences (optimized: the user's module;
// reference: a float64 copy of it, or the user's own reference module) whose stages are Python
// callables `stage(module, x, batch) -> tensor`. Tensors cross with zero copy through torch's own
// pybind11 casters (the same libtorch underneath, docs LIBTORCH-NOTES). Also the batch dict a
// trainer passes, as the engine's LayerBatch and LossSpec.
//
//   auto model = std::make_shared<PyModel>(name, config_json, module, stages, reference_module,
//                                          reference_stages, sync, observed);
//   monitor.AttachModel(model.get(), PathKind::kOptimized);
//
// Thread safety: every call into Python takes the GIL itself; the engine may call without it.
#ifndef CAPSULE_PYTHON_PY_MODEL_H_
#define CAPSULE_PYTHON_PY_MODEL_H_

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <string>
#include <vector>

#include "capsule/capture/monitor.h"
#include "capsule/model/layer_sequence.h"
#include "capsule/model/model.h"

namespace capsule::python {

namespace py = pybind11;

// The batch dict's tensors ("input_ids", "inputs", "labels", the masks) and flags.
LayerBatch BatchFromDict(const py::dict& d);

// What the batch dict declares of the loss: "objective" ("classification", "language_model"),
// "reduction" ("mean", "sum", "sequence_mean"), "ignore_index", "label_smoothing"; absent keys
// keep LossSpec's defaults. An unknown value is refused.
LossSpec LossSpecFromDict(const py::dict& d);

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

  TensorList Forward(size_t i, const TensorList& inputs, const LayerBatch& batch) override;

  std::vector<NamedTensor> LayerParameters(size_t i) const override;

  const py::object& module() const { return module_; }

  // An observe-only model's hooks: `observed()` returns and clears [(name, backward, tensor)].
  std::vector<ObservedTensor> TakeObserved() override;

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

  LayerSequence& Path(PathKind kind) override;

  std::vector<NamedTensor> NamedParameters() const override;

  // The module's buffers (BatchNorm's running statistics), as the engine saves, embeds and loads
  // them; the reference copy follows them through `sync`.
  std::vector<NamedTensor> NamedBuffers() const override;

  // The config is asked for at capture time: it may hold runtime state (the step, a fault).
  ModelSpecInfo Spec() const override;

 private:
  std::string name_;
  py::object config_json_;  // () -> JSON text
  PyLayerSequence optimized_;
  PyLayerSequence reference_;
  py::object sync_;
};

// Binds PyModel as `_Model`.
void BindModel(py::module_& m);

}  // namespace capsule::python

#endif  // CAPSULE_PYTHON_PY_MODEL_H_
