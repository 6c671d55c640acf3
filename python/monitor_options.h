// The Python Monitor's keyword options: one for each MonitorOptions field (capture/monitor.h),
// with the same defaults, as `_Monitor(**options)` takes them.
//
//   MonitorOptions o = OptionsFrom(kwargs);  // py::type_error for a name it does not know
//
// Thread safety: GIL held.
#ifndef CAPSULE_PYTHON_MONITOR_OPTIONS_H_
#define CAPSULE_PYTHON_MONITOR_OPTIONS_H_

#include <pybind11/pybind11.h>

#include "capsule/capture/monitor.h"

namespace capsule::python {

namespace py = pybind11;

// The options the keywords set; an unknown name is refused rather than ignored.
MonitorOptions OptionsFrom(const py::kwargs& kw);

// Binds `spike_threshold(recent, kind, rule)`, the Monitor's spike rule on a series, and
// `MONITOR_OPTIONS`: ((keyword, MonitorOptions field), ...), one row per field in its order.
void BindMonitorOptions(py::module_& m);

}  // namespace capsule::python

#endif  // CAPSULE_PYTHON_MONITOR_OPTIONS_H_
