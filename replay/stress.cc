#include "capsule/replay/stress.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "capsule/model/model.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/capsule_inputs.h"

namespace capsule {
namespace {

// One generated input: the values of input 0 (FP64, already representable in the optimized
// dtype, so that both paths see the same numbers), an optional differentiable re-layout applied
// to each path's copy, and the batch the layer sees with it.
struct Case {
  std::string name;
  std::string family;
  at::Tensor base;
  std::function<at::Tensor(const at::Tensor&)> layout;
  LayerBatch batch;
};

struct PathRun {
  at::Tensor out;
  std::vector<NamedTensor> grads;  // "input.0" first when input 0 is floating, then parameters
  std::string error;
};

struct DtypeRange {
  double max = 0;  // largest finite value
  double smallest_normal = 0;
};

DtypeRange RangeOf(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return {std::numeric_limits<double>::max(), std::numeric_limits<double>::min()};
    case at::kHalf:
      return {65504.0, 6.103515625e-05};
    case at::kBFloat16:
      return {3.3895313892515355e38, 1.1754943508222875e-38};
    default:
      return {std::numeric_limits<float>::max(), std::numeric_limits<float>::min()};
  }
}

// `t` cut to `len` along `dim`, or its positions repeated up to `len`.
at::Tensor Resize(const at::Tensor& t, int64_t dim, int64_t len) {
  if (!t.defined() || t.dim() <= dim) return t;
  const int64_t have = t.size(dim);
  if (have == 0) return t;
  if (len <= have) return t.narrow(dim, 0, len).contiguous();
  std::vector<at::Tensor> parts;
  for (int64_t got = 0; got < len; got += have) parts.push_back(t);
  return at::cat(parts, dim).narrow(dim, 0, len).contiguous();
}

LayerBatch ResizeBatch(const LayerBatch& b, int64_t dim, int64_t len) {
  LayerBatch out = b;
  for (at::Tensor* t : {&out.input_ids, &out.labels, &out.attention_mask, &out.loss_mask}) {
    *t = Resize(*t, dim, len);
  }
  return out;
}

std::string Number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The lengths probed along a sequence dimension: 1, 2, 3, the tile's boundaries (m - 1, m, m + 1
// for each multiple m of the tile) and the maximum, all within [1, max_length].
std::vector<int64_t> Lengths(int64_t max_length, int64_t tile) {
  std::set<int64_t> out = {1, 2, 3, max_length - 1, max_length};
  if (tile > 0) {
    for (int64_t m = tile; m <= max_length + tile; m += tile) out.insert({m - 1, m, m + 1});
  } else {
    out.insert(max_length / 2 + 1);
  }
  std::vector<int64_t> lengths;
  for (int64_t l : out) {
    if (l >= 1 && l <= max_length) lengths.push_back(l);
  }
  return lengths;
}

std::vector<Case> MakeCases(const at::Tensor& captured, const LayerBatch& batch,
                            const std::optional<LayerInputSpec>& spec, at::ScalarType dtype,
                            v1::StressReport& report) {
  const bool floating = captured.is_floating_point();
  // Values both paths can hold exactly.
  auto exact = [&](const at::Tensor& t) { return floating ? t.to(dtype).to(at::kDouble) : t; };
  std::vector<Case> cases;
  auto add = [&](std::string name, std::string family, const at::Tensor& base, const LayerBatch& b,
                 std::function<at::Tensor(const at::Tensor&)> layout = {}) {
    cases.push_back({std::move(name), std::move(family), exact(base), std::move(layout), b});
  };
  add("captured", "captured", captured, batch);

  // Shapes.
  if (spec && spec->length_dim >= 0 && spec->length_dim < captured.dim() && spec->max_length > 0) {
    for (int64_t len : Lengths(spec->max_length, spec->tile)) {
      add("T=" + std::to_string(len), "shape", Resize(captured, spec->length_dim, len),
          ResizeBatch(batch, 1, len));
    }
  } else {
    report.add_notes(spec ? "no length dimension declared: lengths kept as captured"
                          : "the model declares nothing about this layer's inputs "
                            "(Model::LayerInputs): shapes kept as captured");
  }
  if (spec && spec->batch_dim >= 0 && spec->batch_dim < captured.dim() &&
      captured.size(spec->batch_dim) > 1) {
    LayerBatch one = batch;
    for (at::Tensor* t : {&one.input_ids, &one.labels, &one.attention_mask, &one.loss_mask}) {
      if (t->defined() && t->dim() >= 1) *t = t->narrow(0, 0, 1);
    }
    add("B=1", "shape", captured.narrow(spec->batch_dim, 0, 1), one);
  }

  // Magnitudes.
  if (floating) {
    const DtypeRange range = RangeOf(dtype);
    const double max_abs = spec && spec->max_abs > 0 ? spec->max_abs : std::sqrt(range.max);
    const double peak = captured.abs().max().item<double>();
    if (peak > 0 && std::isfinite(peak)) {
      add("magnitude " + Number(max_abs), "magnitude", captured * (max_abs / peak), batch);
      add("subnormal", "magnitude", captured * (range.smallest_normal / 4 / peak), batch);
    }
    add("zeros", "magnitude", at::zeros_like(captured), batch);
    at::Tensor spike = captured.clone();
    spike.view(-1)[0] = max_abs;
    add("one element at " + Number(max_abs), "magnitude", spike, batch);
    if (spec && spec->nonfinite_legal) {
      for (const double inf :
           {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
        at::Tensor t = captured.clone();
        t.view(-1)[0] = inf;
        add(inf > 0 ? "+inf at one element" : "-inf at one element", "magnitude", t, batch);
      }
    } else {
      report.add_notes("+-Inf inputs not generated: not declared legal for this layer");
    }
  }

  // Layouts: the captured values in other memory.
  if (floating && captured.dim() >= 2) {
    const int64_t last = captured.dim() - 1;
    add("transposed strides", "layout", captured, batch, [last](const at::Tensor& t) {
      return t.transpose(0, last).contiguous().transpose(0, last);
    });
    add("sliced (stride 2)", "layout", captured, batch, [](const at::Tensor& t) {
      return at::stack({t, at::zeros_like(t)}, -1).select(-1, 0);
    });
    if (spec && spec->batch_dim >= 0 && spec->batch_dim < captured.dim()) {
      const int64_t bd = spec->batch_dim;
      add("expanded batch (stride 0)", "layout", captured, batch,
          [bd](const at::Tensor& t) { return t.narrow(bd, 0, 1).expand(t.sizes()); });
    }
  }

  // Masks.
  if (spec && spec->reads_attention_mask && batch.attention_mask.defined() &&
      batch.attention_mask.dim() == 2) {
    LayerBatch all = batch;
    all.attention_mask = batch.attention_mask.clone();
    all.attention_mask[0].fill_(0);
    add("all-masked row", "mask", captured, all);
    LayerBatch single = batch;
    single.attention_mask = batch.attention_mask.clone();
    single.attention_mask[0].fill_(0);
    single.attention_mask[0][-1] = 1;
    add("single-token row", "mask", captured, single);
  }
  return cases;
}

PathRun RunPath(LayerSequence& seq, size_t i, const Case& c, const TensorList& rest, bool backward,
                const at::Tensor& upstream) {
  PathRun r;
  try {
    at::AutoGradMode grad_mode(backward);
    const bool floating = c.base.is_floating_point();
    at::Tensor leaf = floating ? c.base.to(seq.compute_dtype()).detach().clone() : c.base;
    if (backward && floating) leaf.set_requires_grad(true);
    TensorList inputs = {c.layout ? c.layout(leaf) : leaf};
    for (const at::Tensor& t : rest) {
      inputs.push_back(t.defined() && t.is_floating_point() ? t.to(seq.compute_dtype()) : t);
    }
    TensorList out = seq.Forward(i, inputs, c.batch);
    r.out = out.at(0).detach();
    if (!backward || !out[0].requires_grad() || !upstream.defined()) return r;
    std::vector<NamedTensor> wrt;
    if (floating) wrt.emplace_back("input.0", leaf);
    for (const NamedTensor& p : seq.LayerParameters(i)) {
      if (p.second.requires_grad()) wrt.push_back(p);
    }
    TensorList tensors;
    for (const NamedTensor& w : wrt) tensors.push_back(w.second);
    const TensorList grads =
        torch::autograd::grad({out[0]}, tensors, {upstream.to(out[0].scalar_type())},
                              /*retain_graph=*/false, /*create_graph=*/false,
                              /*allow_unused=*/true);
    for (size_t k = 0; k < grads.size(); ++k) r.grads.emplace_back(wrt[k].first, grads[k]);
  } catch (const c10::Error& e) {
    r.error = e.what_without_backtrace();
  }
  return r;
}

void Fill(const TensorComparison& cmp, const std::string& tensor, v1::StressCase& out) {
  out.set_diverged(cmp.diverged);
  out.set_tensor(tensor);
  out.set_max_abs_err(cmp.max_abs_err);
  out.set_max_rel_err(cmp.max_rel_err);
  out.set_mismatched(cmp.failed);
  out.set_nonfinite_mismatch(cmp.nonfinite_mismatch);
}

bool Worse(const TensorComparison& a, const TensorComparison& b) {
  if (a.diverged != b.diverged) return a.diverged;
  if (a.nonfinite_mismatch != b.nonfinite_mismatch) {
    return a.nonfinite_mismatch > b.nonfinite_mismatch;
  }
  return a.max_rel_err > b.max_rel_err;
}

}  // namespace

StatusOr<v1::StressReport> StressLayer(const v1::Capsule& c, const ModelRegistry& registry,
                                       const StressOptions& options) {
  v1::StressReport report;
  std::vector<std::string> warnings;
  CAPSULE_RETURN_IF_ERROR(internal::PinEnvironment(c, options.force, &warnings));
  for (const std::string& w : warnings) report.add_notes(w);
  CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                           registry.Create({c.model().registry_name(), c.model().config_json()}));
  if (c.model().weight_policy() != v1::WEIGHTS_ALL) {
    return FailedPreconditionError(
        "the capsule does not embed the model's weights (weight policy " +
        v1::WeightPolicy_Name(c.model().weight_policy()) + ")");
  }
  CAPSULE_ASSIGN_OR_RETURN(std::vector<NamedTensor> params, internal::ParameterTensors(c));
  CAPSULE_RETURN_IF_ERROR(model->LoadParameters(params));
  CAPSULE_RETURN_IF_ERROR(internal::LoadCapsuleBuffers(c, *model));
  CAPSULE_ASSIGN_OR_RETURN(LayerBatch batch, internal::LoadBatchTensors(c));
  CAPSULE_RETURN_IF_ERROR(internal::RequireInputIds(c, batch));
  batch.training = false;  // the arithmetic is compared, not the dropout masks

  LayerSequence& ref = model->Path(PathKind::kReference);
  LayerSequence& opt = model->Path(PathKind::kOptimized);
  size_t index = opt.size();
  std::string names;
  for (size_t i = 0; i < opt.size(); ++i) {
    if (opt.name(i) == options.layer) index = i;
    names += (i == 0 ? "" : ", ") + opt.name(i);
  }
  if (index == opt.size()) {
    return NotFoundError("the model has no layer '" + options.layer + "' (it has " + names + ")");
  }
  report.set_layer(options.layer);
  report.set_layer_index(static_cast<int>(index));

  // The layer's captured input: the reference path's, as replay's layerwise stage feeds it.
  TensorList x = {batch.ModelInput()};
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < index; ++i) x = ref.Forward(i, internal::CastTo(x, at::kDouble), batch);
  } catch (const c10::Error& e) {
    return internal::FromTorch(e, "reference path up to " + options.layer);
  }
  const at::Tensor captured =
      x.at(0).is_floating_point() ? x[0].detach().to(at::kDouble) : x[0].detach();
  const TensorList rest(x.begin() + 1, x.end());
  const std::optional<LayerInputSpec> spec = model->LayerInputs(index);
  report.set_declared(spec.has_value());
  report.set_tile(spec ? spec->tile : 0);
  const std::vector<Case> cases = MakeCases(captured, batch, spec, opt.compute_dtype(), report);

  CompareOptions grad_compare = options.compare;
  grad_compare.atol_scale = AtolScale::kReferenceMax;
  for (size_t n = 0; n < cases.size(); ++n) {
    const Case& k = cases[n];
    if (options.progress) {
      options.progress("case " + std::to_string(n + 1) + "/" + std::to_string(cases.size()) + " " +
                       k.name);
    }
    // The reference first: its output's shape sets the fixed upstream gradient.
    PathRun r_fwd = RunPath(ref, index, k, rest, /*backward=*/false, {});
    at::Tensor upstream;
    if (r_fwd.out.defined() && r_fwd.out.is_floating_point()) {
      at::Generator gen = at::detail::createCPUGenerator(0x5eed + n);
      upstream = at::randn(r_fwd.out.sizes(), gen, at::TensorOptions().dtype(at::kDouble));
    }
    PathRun r = RunPath(ref, index, k, rest, options.backward, upstream);
    PathRun o = RunPath(opt, index, k, rest, options.backward, upstream);
    auto row = [&](v1::Phase phase) -> v1::StressCase& {
      v1::StressCase& sc = *report.add_results();
      sc.set_name(k.name);
      sc.set_family(k.family);
      for (int64_t d : k.base.sizes()) sc.add_shape(d);
      sc.set_phase(phase);
      return sc;
    };
    if (!r.error.empty() || !o.error.empty()) {
      v1::StressCase& sc = row(v1::FORWARD);
      sc.set_diverged(true);
      sc.set_error(!o.error.empty() ? "optimized: " + o.error : "reference: " + r.error);
      continue;
    }
    if (options.forward) {
      CAPSULE_ASSIGN_OR_RETURN(TensorComparison cmp,
                               CompareTensors(o.out, r.out, options.layer, options.compare));
      Fill(cmp, "output", row(v1::FORWARD));
    }
    if (options.backward) {
      std::optional<TensorComparison> worst;
      std::string worst_name;
      for (size_t g = 0; g < r.grads.size() && g < o.grads.size(); ++g) {
        if (!r.grads[g].second.defined() || !o.grads[g].second.defined()) continue;
        CAPSULE_ASSIGN_OR_RETURN(
            TensorComparison cmp,
            CompareTensors(o.grads[g].second, r.grads[g].second, options.layer, grad_compare));
        if (!worst || Worse(cmp, *worst)) {
          worst = cmp;
          worst_name = o.grads[g].first;
        }
      }
      if (worst) Fill(*worst, worst_name, row(v1::BACKWARD));
    }
  }
  report.set_cases(static_cast<int>(cases.size()));
  int diverged = 0;
  std::set<std::string> seen;
  for (const v1::StressCase& sc : report.results()) {
    if (sc.diverged() && seen.insert(sc.name()).second) ++diverged;
  }
  report.set_diverged(diverged);
  return report;
}

}  // namespace capsule
