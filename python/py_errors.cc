#include "capsule/python/py_errors.h"

#include <mutex>
#include <optional>

namespace capsule::python {
namespace {

std::mutex& InterruptMutex() {
  static std::mutex m;
  return m;
}

std::optional<py::error_already_set>& KeptInterrupt() {
  static auto* k = new std::optional<py::error_already_set>();  // never destroyed: no GIL then
  return *k;
}

}  // namespace

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

bool Interrupt::Keep(const py::error_already_set& e) {
  if (e.matches(PyExc_Exception)) return false;
  std::lock_guard<std::mutex> lock(InterruptMutex());
  if (!KeptInterrupt()) KeptInterrupt().emplace(e);
  return true;
}

bool Interrupt::Pending() {
  std::lock_guard<std::mutex> lock(InterruptMutex());
  return KeptInterrupt().has_value();
}

void Interrupt::RaiseIfInterrupted() {
  std::optional<py::error_already_set> e;
  {
    std::lock_guard<std::mutex> lock(InterruptMutex());
    e.swap(KeptInterrupt());
  }
  if (e) throw py::error_already_set(*e);
}

}  // namespace capsule::python
