// The `capsule` command line in a Python process, bound as `cli_main(args, factory, program,
// model_args)`: `python3 -m capsule` runs it, with a --model factory building the Python model of
// any capsule it replays.
//
// Thread safety: GIL held on entry; released while the command runs.
#ifndef CAPSULE_PYTHON_PY_CLI_H_
#define CAPSULE_PYTHON_PY_CLI_H_

#include <pybind11/pybind11.h>

namespace capsule::python {

namespace py = pybind11;

void BindCommandLine(py::module_& m);

}  // namespace capsule::python

#endif  // CAPSULE_PYTHON_PY_CLI_H_
