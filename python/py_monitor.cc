#include "capsule/python/py_monitor.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capsule/capture/generation.h"
#include "capsule/python/monitor_options.h"
#include "capsule/python/py_errors.h"

namespace capsule::python {
namespace {

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

// Attaching the model, RNGs and the optimizer; the optimizer probe's two calls around its step.
void BindAttach(py::class_<PyMonitor>& cls) {
  cls.def("attach_model",
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
      .def("optimizer_after_step", [](PyMonitor& self) {
        if (!self.probe) throw py::value_error("no optimizer is attached (attach_optimizer)");
        capsule::StepReport r;
        {
          py::gil_scoped_release no_gil;  // the writer may log through Python
          r = self.probe->AfterStep();
        }
        Interrupt::RaiseIfInterrupted();
        return ReportDict(r);
      });
}

// Monitor.set_generation's keywords (capture/generation.h): the GenerationInfo fields, sampling
// and cache settings flattened; unknown keywords are refused.
GenerationInfo GenerationOf(const py::dict& kw) {
  GenerationInfo g;
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
      {"adapter_rank", [&](const py::handle& v) { g.adapter_rank = v.cast<int64_t>(); }},
      {"adapter_alpha", [&](const py::handle& v) { g.adapter_alpha = v.cast<double>(); }},
      {"adapter_sha256", [&](const py::handle& v) { g.adapter_sha256 = v.cast<std::string>(); }},
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

// What the trainer adds to the next capsule: log lines, annotations, events, the identity.
void BindRecord(py::class_<PyMonitor>& cls) {
  cls.def("log", [](PyMonitor& self, const std::string& line) { self.monitor.Log(line); })
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
             const Status s = self.monitor.SetGeneration(GenerationOf(g));
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
           });
}

// The step itself: begin, end, captures on demand, and the background writer's drain.
void BindStep(py::class_<PyMonitor>& cls) {
  cls.def("begin_step",
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
}

}  // namespace

void BindMonitor(py::module_& m) {
  py::class_<PyMonitor> cls(m, "_Monitor");
  cls.def(py::init([](const py::kwargs& kw) { return new PyMonitor(OptionsFrom(kw)); }));
  BindAttach(cls);
  BindRecord(cls);
  BindStep(cls);
  BindMonitorOptions(m);
}

}  // namespace capsule::python
