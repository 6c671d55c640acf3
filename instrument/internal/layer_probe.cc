#include "capsule/instrument/internal/layer_probe.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

namespace capsule {
namespace {

std::string DescribeNonFinite(const HealthStats& s, const char* what) {
  std::string r;
  auto add = [&](int64_t n, const char* kind) {
    if (n == 0) return;
    if (!r.empty()) r += ", ";
    r += std::to_string(n) + " " + kind;
  };
  add(s.nan_count, "NaN");
  add(s.pos_inf_count, "+Inf");
  add(s.neg_inf_count, "-Inf");
  return r + " in " + what + " (first at flat index " + std::to_string(s.first_nonfinite_index) +
         " of " + std::to_string(s.numel) + ")";
}

}  // namespace

namespace {

StatusOr<ProbeResult> ProbeLayers(LayerSequence& seq, const LayerBatch& batch,
                                  const ProbeOptions& options) {
  ProbeResult r;
  TensorList x = FirstLayerInput(seq, batch);
  for (size_t i = 0; i < seq.size(); ++i) {
    LayerRecord rec;
    rec.index = static_cast<int>(i);
    rec.name = seq.name(i);
    rec.inputs = x;
    try {
      x = seq.Forward(i, PrivateCopy(x), batch);  // the record keeps x as layer i-1 made it
    } catch (const c10::Error& e) {
      r.error = rec.name + ": " + e.what_without_backtrace();
      r.layers.push_back(std::move(rec));
      return r;
    } catch (const std::exception& e) {
      r.error = rec.name + ": " + e.what();
      r.layers.push_back(std::move(rec));
      return r;
    }
    if (x.empty()) return InternalError("layer " + rec.name + " returned no tensors");
    rec.output = x[0];
    if (rec.output.defined() && rec.output.is_floating_point()) {
      CAPSULE_ASSIGN_OR_RETURN(rec.forward, ComputeHealthStats(rec.output));
      if (!rec.forward.finite() && r.first_anomalous < 0) {
        r.first_anomalous = rec.index;
        r.anomaly_phase = AnomalyPhase::kForward;
        r.anomaly_reason = DescribeNonFinite(rec.forward, "forward output");
      }
    }
    r.layers.push_back(std::move(rec));
  }
  r.loss = x[0];
  try {
    r.loss_value = r.loss.detach().to(at::kDouble).item<double>();
  } catch (const c10::Error& e) {
    return InternalError(std::string("the last layer did not return a scalar loss: ") +
                         e.what_without_backtrace());
  }
  if (!options.backward || !r.loss.requires_grad()) return r;

  // One autograd::grad call for every layer output and every parameter: .grad stays untouched.
  std::vector<at::Tensor> wrt;
  std::vector<int> output_layer;  // wrt[k] is layer output_layer[k]'s output, for k < outputs
  for (const LayerRecord& rec : r.layers) {
    if (rec.output.defined() && rec.output.requires_grad() && rec.index + 1 < (int)seq.size()) {
      wrt.push_back(rec.output);
      output_layer.push_back(rec.index);
    }
  }
  const size_t outputs = wrt.size();
  std::vector<ParameterGrad> params;
  for (size_t i = 0; i < seq.size(); ++i) {
    for (const NamedTensor& p : seq.LayerParameters(i)) {
      if (!p.second.requires_grad()) continue;
      wrt.push_back(p.second);
      params.push_back({p.first, seq.name(i), at::Tensor()});
    }
  }
  std::vector<at::Tensor> grads;
  try {
    grads = torch::autograd::grad({r.loss}, wrt, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
  } catch (const c10::Error& e) {
    r.error = std::string("backward: ") + e.what_without_backtrace();
    return r;
  }
  for (size_t k = 0; k < outputs; ++k) {
    LayerRecord& rec = r.layers[output_layer[k]];
    if (!grads[k].defined()) continue;
    rec.grad = grads[k];
    rec.has_backward = true;
    CAPSULE_ASSIGN_OR_RETURN(rec.backward, ComputeHealthStats(grads[k]));
  }
  double sq = 0;
  for (size_t k = outputs; k < grads.size(); ++k) {
    params[k - outputs].grad = grads[k];
    if (!grads[k].defined()) continue;
    sq += grads[k].detach().to(at::kDouble).pow(2).sum().item<double>();
  }
  r.grad_norm = std::sqrt(sq);
  r.parameter_grads = std::move(params);
  r.backward_done = true;
  if (r.first_anomalous < 0) {
    // Gradients flow from the loss down: the highest non-finite output gradient is the first one
    // that went bad, and the layer after it is the one whose backward produced it.
    for (int k = static_cast<int>(outputs) - 1; k >= 0; --k) {
      const LayerRecord& rec = r.layers[output_layer[k]];
      if (rec.has_backward && !rec.backward.finite()) {
        r.first_anomalous = rec.index + 1;
        r.anomaly_phase = AnomalyPhase::kBackward;
        r.anomaly_reason =
            DescribeNonFinite(rec.backward, ("gradient of " + rec.name + "'s output, from " +
                                             r.layers[rec.index + 1].name + "'s backward")
                                                .c_str());
        break;
      }
    }
  }
  return r;
}

}  // namespace

StatusOr<ProbeResult> ProbeStep(LayerSequence& seq, const LayerBatch& batch,
                                const ProbeOptions& options) {
  StatusOr<ProbeResult> r = ProbeLayers(seq, batch, options);
  // Whatever the run saw inside its layers is taken even when it failed, so the next run starts
  // from nothing.
  std::vector<ObservedTensor> seen = seq.TakeObserved();
  if (!r.ok()) return r;
  for (ObservedTensor& t : seen) {
    ObservedRecord rec;
    rec.name = std::move(t.name);
    rec.backward = t.backward;
    rec.value = std::move(t.value);
    if (rec.value.defined() && rec.value.is_floating_point()) {
      CAPSULE_ASSIGN_OR_RETURN(rec.stats, ComputeHealthStats(rec.value));
    }
    r->observed.push_back(std::move(rec));
  }
  return r;
}

RerunOutcome RerunOutcomeOf(const ProbeResult& r) {
  RerunOutcome o;
  o.loss = r.loss_value;
  o.grad_norm = r.grad_norm;
  o.backward_done = r.backward_done;
  o.threw = !r.error.empty();
  return o;
}

}  // namespace capsule
