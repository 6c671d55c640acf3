// How Python errors cross the engine: a Python exception from the user's code becomes the C++ error
// the engine expects (c10::Error from a model, std::exception from the optimizer probe), and a
// BaseException that is not an Exception (KeyboardInterrupt, SystemExit) is kept and raised again
// once the engine has returned.
//
//   auto t = CallPython("stage blocks.0", AfterInterrupt::kRefuse, [&] { return f(x); });
//   ...
//   Interrupt::RaiseIfInterrupted();  // at the entry point, after the engine returned
//
// Thread safety: CallPython and PythonError need the GIL; Interrupt's state is guarded by a mutex.
#ifndef CAPSULE_PYTHON_PY_ERRORS_H_
#define CAPSULE_PYTHON_PY_ERRORS_H_

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

namespace capsule::python {

namespace py = pybind11;

// A Python exception raised by the user's code the engine called (a stage, a factory): Python's
// own traceback goes to sys.stderr, as Python prints one, and the engine's error carries the one
// line "ValueError: what went wrong (traceback above)". pybind11's what() would put the whole
// traceback in one message, which the command line prints as one escaped line.
std::string PythonError(py::error_already_set& e);

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
  static bool Keep(const py::error_already_set& e);

  static bool Pending();

  // GIL held: raises the kept exception in Python (pybind11 restores a thrown
  // error_already_set), and forgets it.
  static void RaiseIfInterrupted();
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

// A Python error in a call the optimizer probe makes, as the std::exception the probe records (its
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

}  // namespace capsule::python

#endif  // CAPSULE_PYTHON_PY_ERRORS_H_
