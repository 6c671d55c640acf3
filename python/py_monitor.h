// The Python Monitor: the engine's Monitor with the Python model it watches, and the optimizer
// probe attached to it. Bound as `_Monitor`, which python/capsule/__init__.py wraps.
//
//   PyMonitor pm(OptionsFrom(kwargs));
//   pm.monitor.AttachModel(model.get(), PathKind::kOptimized);
//
// Thread safety: one Python thread; the engine takes the GIL whenever it calls back into Python.
#ifndef CAPSULE_PYTHON_PY_MONITOR_H_
#define CAPSULE_PYTHON_PY_MONITOR_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "capsule/capture/monitor.h"
#include "capsule/capture/optimizer_probe.h"
#include "capsule/python/py_model.h"

namespace capsule::python {

namespace py = pybind11;

// The Monitor with the Python model it watches kept alive beside it.
struct PyMonitor {
  explicit PyMonitor(MonitorOptions options) : monitor(std::move(options)) {}
  Monitor monitor;
  std::shared_ptr<PyModel> model;
  std::unique_ptr<OptimizerProbe> probe;  // destroyed before the monitor it is attached to
};

// Binds PyMonitor as `_Monitor`, and the Monitor's spike rule as `spike_threshold`.
void BindMonitor(py::module_& m);

}  // namespace capsule::python

#endif  // CAPSULE_PYTHON_PY_MONITOR_H_
