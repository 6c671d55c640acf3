// capsule._capsule: the pybind11 binding the Python package (python/capsule) stands on. It is the
// C++ engine itself, not a second implementation: the Monitor, its re-run, the capsule builder and
// writer, the replayer and the command line are the ones the `capsule` CLI and C++ trainers use,
// so a capsule written from Python is the same signed file and replays to the same report.
//
// One file per bound area: py_model (a Python model as the engine's Model), py_monitor (the
// Monitor and its optimizer probe), monitor_options (its keyword options), py_cli (the command
// line), py_errors (how Python errors and interrupts cross the engine).
//
// Thread safety: everything runs on the calling Python thread with the GIL held.
#include <pybind11/pybind11.h>

#include <string>

#include "capsule/python/py_cli.h"
#include "capsule/python/py_model.h"
#include "capsule/python/py_monitor.h"
#include "capsule/snapshot/internal/environment.h"

namespace py = pybind11;

PYBIND11_MODULE(_capsule, m) {
  m.doc() = "capsule's C++ engine: Monitor, replay and the command line (see the capsule package)";
  // Capsules written from this process say they come from Python, so that reports and replay
  // print `python3 -P -m capsule ... --model pkg.module:factory` for them (report/replay_tool.h).
  capsule::AddEnvironmentLibrary(
      "python", py::module_::import("platform").attr("python_version")().cast<std::string>());
  capsule::python::BindModel(m);
  capsule::python::BindMonitor(m);
  capsule::python::BindCommandLine(m);
}
