#include "capsule/python/py_cli.h"

#include <pybind11/stl.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "capsule/cli/cli.h"
#include "capsule/python/py_errors.h"
#include "capsule/python/py_model.h"
#include "capsule/replay/model_registry.h"

namespace capsule::python {
namespace {

// A model the factory made. The registry owns a unique_ptr; the Python object keeps the shared one
// alive through this wrapper.
struct FactoryModel : Model {
  std::shared_ptr<PyModel> m;
  py::object keep;
  // Replay drops the model without the GIL; its Python objects need it.
  ~FactoryModel() override {
    py::gil_scoped_acquire gil;
    m.reset();
    keep = py::object();
  }
  LayerSequence& Path(PathKind k) override { return m->Path(k); }
  std::vector<NamedTensor> NamedParameters() const override { return m->NamedParameters(); }
  std::vector<NamedTensor> NamedBuffers() const override { return m->NamedBuffers(); }
  ModelSpecInfo Spec() const override { return m->Spec(); }
};

// `factory(config_json)` (from --model) as the model of a capsule's spec.
StatusOr<std::unique_ptr<Model>> MakeWithFactory(const py::object& factory,
                                                 const ModelSpecInfo& spec) {
  py::gil_scoped_acquire gil;
  try {
    py::object made = factory(spec.config_json);
    auto model = made.attr("_engine_model")().cast<std::shared_ptr<PyModel>>();
    auto h = std::make_unique<FactoryModel>();
    h->m = std::move(model);
    h->keep = made;
    return std::unique_ptr<Model>(std::move(h));
  } catch (py::error_already_set& e) {
    // An interrupt ends the replay as an error (exit status 2), and is raised again when the
    // command line returns.
    if (Interrupt::Keep(e)) return InternalError("model factory: interrupted");
    return InvalidArgumentError("the --model factory raised " + PythonError(e));
  } catch (const py::cast_error&) {
    return InvalidArgumentError(
        "the --model factory did not return a capsule.Model (it returns "
        "capsule.Model(name, module, stages))");
  }
}

// The `capsule` command line in this process. `factory` (from --model) builds the model of any
// capsule it replays, whatever name the capsule recorded: one factory is named for the capsules at
// hand, wherever FILE stands among the options.
int RunCommandLine(const std::vector<std::string>& args, py::object factory,
                   const std::string& program, const std::vector<std::string>& model_args) {
  ModelRegistry registry;
  if (!factory.is_none()) {
    Status s = registry.SetFallback(
        [factory](const ModelSpecInfo& spec) { return MakeWithFactory(factory, spec); });
    if (!s.ok()) throw std::runtime_error(s.message());
  }
  cli::Invocation invocation;
  invocation.program = program;
  invocation.model_args = model_args;
  std::vector<std::string> argv_storage = args;
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  int rc = 0;
  {
    py::gil_scoped_release no_gil;
    rc = cli::Main(static_cast<int>(argv_storage.size()), argv.data(), registry, invocation);
  }
  std::fflush(stdout);
  Interrupt::RaiseIfInterrupted();
  return rc;
}

}  // namespace

void BindCommandLine(py::module_& m) {
  m.def("cli_main", &RunCommandLine, py::arg("args"), py::arg("factory") = py::none(),
        py::arg("program") = "python3 -P -m capsule",
        py::arg("model_args") = std::vector<std::string>{});
}

}  // namespace capsule::python
