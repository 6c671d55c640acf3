#include "capsule/replay/replayer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/strings.h"
#include "capsule/bisect/search.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/dtype.h"
#include "capsule/instrument/internal/layer_probe.h"
#include "capsule/instrument/trigger_rule.h"
#include "capsule/model/decoder.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/extract.h"
#include "capsule/replay/internal/capsule_inputs.h"
#include "capsule/replay/internal/diagnosis.h"
#include "capsule/replay/internal/generation_checks.h"
#include "capsule/replay/internal/triage.h"
#include "capsule/snapshot/checkpoint.h"
#include "capsule/snapshot/internal/environment.h"
#include "capsule/snapshot/internal/tensor_codec.h"
#include "capsule/snapshot/rng_state.h"

namespace capsule {

Tolerance DefaultBisectTolerance(at::ScalarType candidate_dtype) {
  // Composite runs accumulate the error of every optimized layer in the prefix, so the oracle
  // allows ten times the per-layer tolerance; the measurements are in docs/TOLERANCES.md.
  const Tolerance layer = DefaultTolerance(candidate_dtype);
  return Tolerance{layer.atol * 10, layer.rtol * 10};
}

namespace {

using internal::CastTo;
using internal::FillComparison;
using internal::FromTorch;

StatusOr<LayerBatch> LoadBatch(const v1::Capsule& c) {
  CAPSULE_ASSIGN_OR_RETURN(LayerBatch b, internal::LoadBatchTensors(c));
  CAPSULE_RETURN_IF_ERROR(internal::RequireInputIds(c, b));
  return b;
}

// Where the checkpoint a capsule names is: a relative path is relative to the capsule's own
// directory (the capture records it so), never to the current directory.
StatusOr<std::string> ReferencedCheckpointPath(const v1::WeightsReference& ref,
                                               const ReplayOptions& options) {
  if (!options.checkpoint_path.empty()) return options.checkpoint_path;
  const std::string& recorded = ref.path();
  if (recorded.empty()) {
    return FailedPreconditionError(
        "the capsule names a weights checkpoint whose path was redacted; give the checkpoint's "
        "path");
  }
  if (recorded[0] == '/') return recorded;
  if (options.capsule_path.empty()) {
    return FailedPreconditionError("the capsule names checkpoint " + recorded +
                                   " relative to its own directory, which is not known here; "
                                   "give the checkpoint's path");
  }
  return (std::filesystem::path(options.capsule_path).parent_path() / recorded).string();
}

// The checkpoint a capsule names (model.weights_reference). The file must be the one recorded
// (size and SHA-256, checked before a byte of it is parsed), and every tensor's hash the recorded
// one (the first that is not is named). With `force` both are warnings.
StatusOr<std::vector<NamedTensor>> LoadReferencedCheckpoint(const v1::Capsule& c,
                                                            const ReplayOptions& options,
                                                            v1::ReplayReport& report) {
  const v1::WeightsReference& ref = c.model().weights_reference();
  CAPSULE_ASSIGN_OR_RETURN(const std::string path, ReferencedCheckpointPath(ref, options));
  CheckpointExpectation expected;
  if (!ref.file_sha256().empty() && !options.force) {
    expected.size_bytes = ref.size_bytes();
    expected.file_sha256 = ref.file_sha256();
  }
  StatusOr<LoadedCheckpoint> ckpt = LoadCheckpoint(path, expected);
  if (!ckpt.ok()) {
    return ckpt.status().WithContext(ckpt.status().code() == StatusCode::kFailedPrecondition
                                         ? "not the weights checkpoint the capsule names"
                                         : "the capsule's weights checkpoint");
  }
  if (!ref.file_sha256().empty() && ckpt->file_sha256 != ref.file_sha256()) {
    report.add_warnings("checkpoint " + path + " is not the file the capsule names (sha256 " +
                        ckpt->file_sha256.substr(0, 16) + "…, recorded " +
                        ref.file_sha256().substr(0, 16) + "…); its tensors were compared instead");
  }
  CAPSULE_ASSIGN_OR_RETURN(std::vector<TensorDigestInfo> got, TensorDigests(ckpt->tensors));
  std::vector<TensorDigestInfo> recorded;
  for (const v1::TensorDigest& t : ref.tensors()) {
    // One spelling for both sides: older capsules hold LibTorch's name ("Float").
    recorded.push_back({t.name(),
                        CanonicalDTypeName(t.dtype()),
                        {t.shape().begin(), t.shape().end()},
                        t.sha256()});
  }
  const std::string differs = FirstDigestDifference(recorded, got);
  if (!differs.empty()) {
    const std::string msg = "checkpoint " + path + " is not the one the capsule names: " + differs;
    if (!options.force) return FailedPreconditionError(msg);
    report.add_warnings(msg);
  }
  if (!ref.matches_step()) {
    report.add_warnings("the capsule recorded that checkpoint " + ref.path() +
                        " did not hold the step's weights (training had moved them)");
  }
  return std::move(ckpt->tensors);
}

// The digests of the step's weights that the capsule holds, sorted by name: the parameters it
// embeds, and the checkpoint it names when that held the step's weights.
std::vector<TensorDigestInfo> RecordedDigests(const v1::Capsule& c) {
  std::map<std::string, TensorDigestInfo> by_name;
  if (c.model().has_weights_reference() && c.model().weights_reference().matches_step()) {
    for (const v1::TensorDigest& t : c.model().weights_reference().tensors()) {
      // One spelling for both sides: older capsules hold LibTorch's name ("Float").
      by_name[t.name()] = {t.name(),
                           CanonicalDTypeName(t.dtype()),
                           {t.shape().begin(), t.shape().end()},
                           t.sha256()};
    }
  }
  for (const v1::TensorBlob& t : c.tensors()) {
    if (t.role() != v1::PARAMETER || DTypeElementSize(t.meta().dtype()) == 0) continue;
    by_name[t.name()] = {t.name(),
                         DTypeName(t.meta().dtype()),
                         {t.meta().shape().begin(), t.meta().shape().end()},
                         t.sha256()};
  }
  std::vector<TensorDigestInfo> out;
  for (auto& [name, d] : by_name) out.push_back(std::move(d));
  return out;
}

// Which of `params` makes their hash differ from the capsule's, as far as the digests the capsule
// holds can tell.
std::string WhichTensorDiffers(const v1::Capsule& c, const std::vector<NamedTensor>& params) {
  const std::vector<TensorDigestInfo> recorded = RecordedDigests(c);
  if (recorded.empty()) return "the capsule holds no tensor digest to say which tensor differs";
  StatusOr<std::vector<TensorDigestInfo>> actual = TensorDigests(params);
  if (!actual.ok()) return actual.status().message();
  const std::string differs = FirstDigestDifference(recorded, *actual, DigestCoverage::kSome);
  if (!differs.empty()) return differs;
  return "the " + std::to_string(recorded.size()) +
         " tensors whose digests the capsule holds agree; another one differs";
}

// The weights a replay loads, read and checked against the capsule before any model is built: a
// capsule whose config asks for a huge model is refused for its weights first, when they are
// not the ones it recorded.
struct Weights {
  std::vector<NamedTensor> params;
  std::vector<NamedTensor> buffers;  // a state dict's running statistics (TensorDigest.buffer)
  std::string source;                // "the capsule", the --weights file, "checkpoint PATH"
};

// A checkpoint's tensors split as the capture recorded them: those it marked as buffers, and the
// parameters.
Weights SplitRecordedBuffers(const v1::WeightsReference& ref, std::vector<NamedTensor> tensors) {
  std::set<std::string> buffer_names;
  for (const v1::TensorDigest& t : ref.tensors()) {
    if (t.buffer()) buffer_names.insert(t.name());
  }
  Weights w;
  for (NamedTensor& t : tensors) {
    (buffer_names.count(t.first) != 0 ? w.buffers : w.params).push_back(std::move(t));
  }
  return w;
}

StatusOr<Weights> ReadWeights(const v1::Capsule& c, const ReplayOptions& options,
                              v1::ReplayReport& report) {
  Weights w;
  if (!options.weights_path.empty()) {
    ReadOptions ro;
    ro.allow_unsigned = true;  // a weights file is checked by its canonical hash, not its signer
    ro.allow_untrusted = true;
    auto weights = ReadCapsuleFile(options.weights_path, ro);
    if (!weights.ok()) return weights.status().WithContext("weights " + options.weights_path);
    CAPSULE_ASSIGN_OR_RETURN(w.params, internal::ParameterTensors(*weights->capsule));
    w.source = options.weights_path;
  } else if (c.model().weight_policy() != v1::WEIGHTS_ALL && c.model().has_weights_reference()) {
    CAPSULE_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors,
                             LoadReferencedCheckpoint(c, options, report));
    w = SplitRecordedBuffers(c.model().weights_reference(), std::move(tensors));
    CAPSULE_ASSIGN_OR_RETURN(const std::string path,
                             ReferencedCheckpointPath(c.model().weights_reference(), options));
    w.source = "checkpoint " + path;
  } else {
    if (c.model().weight_policy() != v1::WEIGHTS_ALL) {
      return FailedPreconditionError(
          "the capsule does not embed the model's weights (weight policy " +
          v1::WeightPolicy_Name(c.model().weight_policy()) + ")");
    }
    CAPSULE_ASSIGN_OR_RETURN(w.params, internal::ParameterTensors(c));
    w.source = "the capsule";
  }
  if (w.params.empty()) return FailedPreconditionError("no parameters in " + w.source);
  // A set of parameters is the model's whole state: its canonical hash is the model hash the
  // loaded model will have. Compared now, before the model is built (LoadWeights compares again
  // after loading, and is where --force turns a mismatch into a warning).
  if (!options.force) {
    CAPSULE_ASSIGN_OR_RETURN(const std::string differs,
                             internal::ModelHashMismatch(c, w.params, w.source));
    if (!differs.empty()) {
      return FailedPreconditionError(differs + ": " + WhichTensorDiffers(c, w.params) +
                                     "; these are another model's weights");
    }
  }
  return w;
}

Status LoadWeights(const v1::Capsule& c, const ReplayOptions& options, const Weights& weights,
                   Model& model, v1::ReplayReport& report) {
  Status s = model.LoadParameters(weights.params);
  if (!s.ok()) return s.WithContext("cannot load the weights from " + weights.source);
  CAPSULE_ASSIGN_OR_RETURN(const std::string differs,
                           internal::ModelHashMismatch(c, model.NamedParameters(), weights.source));
  if (!differs.empty()) {
    const std::string msg = differs + ": " + WhichTensorDiffers(c, model.NamedParameters());
    if (!options.force) return FailedPreconditionError(msg + "; these are another model's weights");
    report.add_warnings(msg);
  }
  // The buffers the capture recorded (BatchNorm's running statistics): an eval-mode model
  // computes with them. A checkpoint's come first; those the capsule embeds are the step's.
  if (!weights.buffers.empty()) {
    s = model.LoadBuffers(weights.buffers);
    if (!s.ok()) return s.WithContext("cannot load the buffers from " + weights.source);
  }
  return internal::LoadCapsuleBuffers(c, model);
}

// Parameters the trainer had frozen (requires_grad false in the capsule) are frozen here too, so
// the reference backward sees the graph the trainer's did.
void ApplyFrozen(const v1::Capsule& c, Model& model) {
  std::set<std::string> frozen;
  for (const v1::TensorBlob& t : c.tensors()) {
    if (t.role() == v1::PARAMETER && !t.meta().requires_grad()) frozen.insert(t.name());
  }
  for (const v1::ParamStep& p : c.optimizer().params()) {
    if (!p.requires_grad()) frozen.insert(p.name());
  }
  for (const NamedTensor& p : model.NamedParameters()) {
    if (frozen.count(p.first) != 0 && p.second.is_leaf()) {
      at::Tensor t = p.second;
      t.set_requires_grad(false);
    }
  }
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out.empty() ? "(none)" : out;
}

Status RestoreRng(const v1::Capsule& c) {
  std::vector<RngBlobData> blobs;
  for (const auto& g : c.rng().generators()) {
    blobs.push_back({g.name(), g.kind(), g.device(), g.state(), g.seed()});
  }
  return RestoreTorchRngs(blobs);
}

// Which comparison is the worse: a divergence beats none, then the larger relative error.
bool Worse(const TensorComparison& a, const TensorComparison& b) {
  if (a.diverged != b.diverged) return a.diverged;
  if (a.nonfinite_mismatch != b.nonfinite_mismatch) {
    return a.nonfinite_mismatch > b.nonfinite_mismatch;
  }
  return a.max_rel_err > b.max_rel_err;
}

bool IsLogits(const at::Tensor& t, size_t i, size_t n) {
  // The last non-scalar output before the loss layer is treated as logits (top-1 agreement).
  return i + 2 == n && t.dim() >= 2;
}

struct ReferenceRun {
  std::vector<LayerRecord> layers;  // inputs and first output of each layer, and output grads
  std::vector<TensorList> outputs;  // full outputs of each layer (no grad)
  double loss = 0;
  bool anomalous = false;
  double grad_norm = 0;
  std::vector<ParameterGrad> parameter_grads;  // when the backward ran
};

StatusOr<ReferenceRun> RunReference(LayerSequence& ref, const LayerBatch& batch, bool backward) {
  ProbeOptions po;
  po.backward = backward;
  CAPSULE_ASSIGN_OR_RETURN(ProbeResult r, ProbeStep(ref, batch, po));
  if (!r.error.empty()) return InternalError("reference path threw: " + r.error);
  ReferenceRun run;
  run.loss = r.loss_value;
  run.grad_norm = r.grad_norm;
  run.anomalous = r.first_anomalous >= 0 || !std::isfinite(r.loss_value);
  const size_t n = r.layers.size();
  for (size_t i = 0; i < n; ++i) {
    run.outputs.push_back(i + 1 < n ? r.layers[i + 1].inputs : TensorList{r.loss});
  }
  run.layers = std::move(r.layers);
  run.parameter_grads = std::move(r.parameter_grads);
  return run;
}

// Forward layerwise: layer i gets the reference input of layer i on both paths.
Status CompareForward(Model& model, const ReferenceRun& ref_run, const LayerBatch& batch,
                      const ReplayOptions& options, v1::ReplayReport& report) {
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  const size_t n = opt.size();
  for (size_t i = 0; i < n; ++i) {
    if (options.progress) {
      options.progress("layerwise forward " + std::to_string(i + 1) + "/" + std::to_string(n) +
                       " " + opt.name(i));
    }
    TensorList out;
    try {
      at::NoGradGuard no_grad;
      out = opt.Forward(i, CastTo(ref_run.layers[i].inputs, opt.compute_dtype()), batch);
    } catch (const c10::Error& e) {
      return FromTorch(e, "optimized layer " + opt.name(i));
    }
    const at::Tensor& reference = ref_run.outputs[i].at(0);
    CAPSULE_ASSIGN_OR_RETURN(TensorComparison cmp,
                             CompareTensors(out.at(0), reference, opt.name(i), options.compare,
                                            IsLogits(reference, i, n)));
    v1::LayerComparison& lc = *report.add_layers();
    lc.set_index(static_cast<int>(i));
    lc.set_name(opt.name(i));
    lc.set_phase(v1::FORWARD);
    lc.set_tensor("output");
    FillComparison(cmp, &lc);
  }
  return Status::Ok();
}

// Backward layerwise: for layer i, both paths get the reference input and the reference upstream
// gradient (d loss / d output_i); their input and parameter gradients are compared.
// One layer's gradients on both paths, by name: the worst comparison, or, when a tensor has a
// gradient on one path and none on the other (a detach() on one path only), that tensor against
// zeros, marked in `reason`. Adds nothing when neither path has a gradient.
Status CompareLayerGrads(const std::vector<NamedTensor>& ref_grads,
                         const std::vector<NamedTensor>& opt_grads, int index,
                         const std::string& name, const CompareOptions& compare,
                         v1::ReplayReport& report) {
  std::optional<TensorComparison> worst;
  std::string worst_name, missing;
  for (const NamedTensor& r : ref_grads) {
    at::Tensor o;
    for (const NamedTensor& c : opt_grads) {
      if (c.first == r.first) o = c.second;
    }
    if (!r.second.defined() && !o.defined()) continue;
    const at::Tensor want = r.second.defined() ? r.second : at::zeros_like(o);
    const at::Tensor got = o.defined() ? o : at::zeros_like(r.second);
    // A gradient of zeros on one path and none on the other agree.
    const at::Tensor& present = o.defined() ? o : r.second;
    const char* none = r.second.defined() && o.defined()   ? nullptr
                       : !present.ne(0).any().item<bool>() ? nullptr
                       : !o.defined()                      ? "optimized"
                                                           : "reference";
    CAPSULE_ASSIGN_OR_RETURN(TensorComparison cmp, CompareTensors(got, want, name, compare));
    if (none != nullptr) {
      cmp.diverged = true;
      if (missing.empty()) missing = r.first + " has no gradient on the " + none + " path";
    }
    if (!worst || (none != nullptr && !worst->diverged) || Worse(cmp, *worst)) {
      worst = cmp;
      worst_name = r.first;
    }
  }
  if (!worst) return Status::Ok();
  v1::LayerComparison& lc = *report.add_layers();
  lc.set_index(index);
  lc.set_name(name);
  lc.set_phase(v1::BACKWARD);
  lc.set_tensor(worst_name);
  FillComparison(*worst, &lc);
  if (!missing.empty()) {
    lc.set_verdict(v1::DIVERGED);
    lc.set_reason(missing + (lc.reason().empty() ? "" : "; " + lc.reason()));
  }
  return Status::Ok();
}

Status CompareBackward(Model& model, const ReferenceRun& ref_run, const LayerBatch& batch,
                       const ReplayOptions& options, v1::ReplayReport& report) {
  LayerSequence& ref = model.Path(PathKind::kReference);
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  const size_t n = opt.size();
  // Gradients have no fixed scale (it follows the loss normalization): atol is a fraction of each
  // reference gradient's largest magnitude (comparator.h, AtolScale::kReferenceMax).
  CompareOptions compare = options.compare;
  compare.atol_scale = AtolScale::kReferenceMax;
  auto grads_of = [&](LayerSequence& seq, size_t i, at::ScalarType dtype,
                      const at::Tensor& upstream) -> StatusOr<std::vector<NamedTensor>> {
    TensorList in = CastTo(ref_run.layers[i].inputs, dtype, /*requires_grad=*/true);
    std::vector<NamedTensor> wrt;
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k].defined() && in[k].requires_grad())
        wrt.emplace_back("input." + std::to_string(k), in[k]);
    }
    for (const NamedTensor& p : seq.LayerParameters(i)) {
      if (p.second.requires_grad()) wrt.push_back(p);
    }
    if (wrt.empty()) return wrt;
    try {
      TensorList out = seq.Forward(i, PrivateCopy(in), batch);  // `in` are the leaves
      if (!out.at(0).requires_grad()) {
        // Cut off from every input and parameter (a detach()): none of them gets a gradient.
        for (auto& w : wrt) w.second = at::Tensor();
        return wrt;
      }
      TensorList tensors;
      for (const auto& w : wrt) tensors.push_back(w.second);
      const at::Tensor g =
          upstream.defined() ? upstream.detach().to(out[0].scalar_type()) : at::ones_like(out[0]);
      TensorList grads = torch::autograd::grad({out[0]}, tensors, {g}, /*retain_graph=*/false,
                                               /*create_graph=*/false, /*allow_unused=*/true);
      std::vector<NamedTensor> named;
      for (size_t k = 0; k < grads.size(); ++k) named.emplace_back(wrt[k].first, grads[k]);
      return named;
    } catch (const c10::Error& e) {
      return FromTorch(e, "backward of layer " + seq.name(i));
    }
  };
  for (size_t i = n; i-- > 0;) {
    if (options.progress) {
      options.progress("layerwise backward " + std::to_string(n - i) + "/" + std::to_string(n) +
                       " " + opt.name(i));
    }
    const at::Tensor upstream = i + 1 < n ? ref_run.layers[i].grad : at::Tensor();
    if (i + 1 < n && !upstream.defined()) continue;  // the loss does not depend on this output
    CAPSULE_ASSIGN_OR_RETURN(auto ref_grads, grads_of(ref, i, ref.compute_dtype(), upstream));
    CAPSULE_ASSIGN_OR_RETURN(auto opt_grads, grads_of(opt, i, opt.compute_dtype(), upstream));
    CAPSULE_RETURN_IF_ERROR(
        CompareLayerGrads(ref_grads, opt_grads, static_cast<int>(i), opt.name(i), compare, report));
  }
  return Status::Ok();
}

// Composite run k: layers [0, k) on OPTIMIZED, [k, n) on REFERENCE; returns every layer output.
StatusOr<std::vector<TensorList>> RunComposite(Model& model, const LayerBatch& batch, size_t k) {
  LayerSequence& ref = model.Path(PathKind::kReference);
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  std::vector<TensorList> outputs;
  TensorList x = {batch.ModelInput()};
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < opt.size(); ++i) {
      LayerSequence& seq = i < k ? opt : ref;
      x = seq.Forward(i, CastTo(x, seq.compute_dtype()), batch);
      outputs.push_back(x);
    }
  } catch (const c10::Error& e) {
    return FromTorch(e, "composite run k=" + std::to_string(k));
  }
  return outputs;
}

// One probe's errors, accumulated over the tensors its oracle compares.
void AddToProbe(const TensorComparison& cmp, v1::BisectProbe& probe) {
  probe.set_max_rel_err(std::max(probe.max_rel_err(), cmp.max_rel_err));
  probe.set_max_abs_err(std::max(probe.max_abs_err(), cmp.max_abs_err));
  probe.set_nonfinite_mismatch(probe.nonfinite_mismatch() + cmp.nonfinite_mismatch);
}

// Runs the layer search `mode` asks for with `oracle` over `opt`'s layers and records the result,
// for the forward and the backward bisect alike.
Status SearchLayers(BisectMode mode, LayerSequence& opt, v1::Phase phase, const std::string& what,
                    const bisect::Oracle& oracle, v1::BisectReport& br) {
  const size_t n = opt.size();
  std::unique_ptr<bisect::Strategy> strategy;
  if (mode == BisectMode::kLinear) {
    strategy = std::make_unique<bisect::LinearStrategy>(bisect::LinearOptions{/*scan_all=*/true});
  } else {
    strategy = std::make_unique<bisect::BisectStrategy>();
  }
  const bisect::SearchResult r = bisect::Search(*strategy, n, oracle);
  if (!r.ok()) return InternalError(what + ": " + r.error);
  br.set_phase(phase);
  br.set_strategy(std::string(strategy->name()));
  br.set_layers(static_cast<int>(n));
  br.set_probes(static_cast<int>(r.probes));
  br.set_monotonic(r.monotonic());
  br.set_probe_bound(static_cast<int>(std::ceil(std::log2(static_cast<double>(n)))) + 1);
  br.set_first_bad_index(r.first_bad ? static_cast<int>(*r.first_bad) : -1);
  if (r.first_bad) br.set_first_bad_layer(opt.name(*r.first_bad));
  return Status::Ok();
}

Status RunBisect(Model& model, const ReferenceRun& ref_run, const LayerBatch& batch,
                 const ReplayOptions& options, v1::ReplayReport& report) {
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  const size_t n = opt.size();
  CompareOptions oracle_opts;
  oracle_opts.tolerance = options.bisect_tolerance ? *options.bisect_tolerance
                                                   : DefaultBisectTolerance(opt.compute_dtype());
  // Compared outputs: the loss and, when there is one, the last non-scalar output (the logits).
  std::vector<size_t> compared = {n - 1};
  if (n >= 2 && ref_run.outputs[n - 2].at(0).dim() >= 1) compared.push_back(n - 2);
  v1::BisectReport& br = *report.mutable_bisect();
  auto oracle = [&](size_t k) -> bisect::OracleAnswer {
    if (options.progress) options.progress("bisect probe k=" + std::to_string(k));
    auto outs = RunComposite(model, batch, k);
    if (!outs.ok()) return bisect::OracleAnswer::Error(outs.status().message());
    v1::BisectProbe& probe = *br.add_probe_log();
    probe.set_k(static_cast<int>(k));
    bool bad = false;
    for (size_t j : compared) {
      auto cmp =
          CompareTensors((*outs)[j].at(0), ref_run.outputs[j].at(0), opt.name(j), oracle_opts);
      if (!cmp.ok()) return bisect::OracleAnswer::Error(cmp.status().message());
      bad |= cmp->diverged;
      AddToProbe(*cmp, probe);
    }
    probe.set_bad(bad);
    return bisect::OracleAnswer::FromBool(bad);
  };
  return SearchLayers(options.bisect, opt, v1::FORWARD, "bisect", oracle, br);
}

// A parameter the backward bisect compares, with the tensors that hold it on each path, by the
// layers that own them: a model whose reference path is a float64 copy (the Python default) holds
// two tensors per parameter, one that shares its weights holds one.
struct CompositeParameter {
  std::string name;
  at::Tensor reference_grad;                            // the reference run's gradient
  std::vector<std::pair<size_t, at::Tensor>> opt, ref;  // (owning layer, tensor) per path
};

std::vector<CompositeParameter> CompositeParameters(Model& model, const ReferenceRun& ref_run) {
  LayerSequence& ref = model.Path(PathKind::kReference);
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  std::map<std::string, size_t> index;
  std::vector<CompositeParameter> out;
  for (const ParameterGrad& p : ref_run.parameter_grads) {
    if (!p.grad.defined() || index.count(p.name)) continue;
    index[p.name] = out.size();
    out.push_back({p.name, p.grad, {}, {}});
  }
  for (size_t i = 0; i < opt.size(); ++i) {
    for (const NamedTensor& t : opt.LayerParameters(i)) {
      auto it = index.find(t.first);
      if (it != index.end() && t.second.requires_grad())
        out[it->second].opt.push_back({i, t.second});
    }
    for (const NamedTensor& t : ref.LayerParameters(i)) {
      auto it = index.find(t.first);
      if (it != index.end() && t.second.requires_grad())
        out[it->second].ref.push_back({i, t.second});
    }
  }
  return out;
}

// A composite run forward and backward: layers [0, k) OPTIMIZED, [k, n) REFERENCE, and the
// gradient of the loss with respect to each parameter, summed over the tensors the layers that ran
// used for it: the optimized path's own below k, the reference path's from k (undefined where
// the gradient does not reach).
StatusOr<std::vector<at::Tensor>> CompositeGradients(
    Model& model, const LayerBatch& batch, size_t k,
    const std::vector<CompositeParameter>& params) {
  LayerSequence& ref = model.Path(PathKind::kReference);
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  std::vector<at::Tensor> wrt;
  std::vector<std::vector<size_t>> slots(params.size());  // params[j]'s tensors in wrt
  for (size_t j = 0; j < params.size(); ++j) {
    auto add = [&](const at::Tensor& t) {
      for (size_t s : slots[j]) {
        if (wrt[s].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return;
      }
      slots[j].push_back(wrt.size());
      wrt.push_back(t);
    };
    for (const auto& [layer, t] : params[j].opt) {
      if (layer < k) add(t);
    }
    for (const auto& [layer, t] : params[j].ref) {
      if (layer >= k) add(t);
    }
  }
  try {
    at::AutoGradMode grad_mode(true);
    TensorList x = FirstLayerInput(k > 0 ? opt : ref, batch);
    for (size_t i = 0; i < opt.size(); ++i) {
      LayerSequence& seq = i < k ? opt : ref;
      TensorList in;
      for (const at::Tensor& t : x) {
        in.push_back(t.defined() && t.is_floating_point() ? t.to(seq.compute_dtype()) : t);
      }
      x = seq.Forward(i, PrivateCopy(in), batch);
    }
    std::vector<at::Tensor> grads(params.size());
    if (!x.at(0).requires_grad() || wrt.empty()) return grads;
    const std::vector<at::Tensor> g =
        torch::autograd::grad({x.at(0)}, wrt, {}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t j = 0; j < params.size(); ++j) {
      for (size_t s : slots[j]) {
        if (!g[s].defined()) continue;
        const at::Tensor gs = g[s].to(at::kDouble);
        grads[j] = grads[j].defined() ? grads[j] + gs : gs;
      }
    }
    return grads;
  } catch (const c10::Error& e) {
    return FromTorch(e, "composite backward k=" + std::to_string(k));
  }
}

// The bisect over the backward phase: the oracle compares every parameter gradient of composite
// run k with the reference run's (atol a fraction of each reference gradient's largest
// magnitude, as the layerwise backward does). A layer whose backward alone is wrong is bad here
// and good in the forward bisect.
Status RunBackwardBisect(Model& model, const ReferenceRun& ref_run, const LayerBatch& batch,
                         const ReplayOptions& options, v1::ReplayReport& report) {
  LayerSequence& opt = model.Path(PathKind::kOptimized);
  const std::vector<CompositeParameter> params = CompositeParameters(model, ref_run);
  if (params.empty()) return Status::Ok();  // nothing has a gradient: nothing to search
  CompareOptions oracle_opts;
  oracle_opts.tolerance = options.bisect_tolerance ? *options.bisect_tolerance
                                                   : DefaultBisectTolerance(opt.compute_dtype());
  oracle_opts.atol_scale = AtolScale::kReferenceMax;
  v1::BisectReport& br = *report.mutable_backward_bisect();
  auto oracle = [&](size_t k) -> bisect::OracleAnswer {
    if (options.progress) options.progress("backward bisect probe k=" + std::to_string(k));
    auto grads = CompositeGradients(model, batch, k, params);
    if (!grads.ok()) return bisect::OracleAnswer::Error(grads.status().message());
    v1::BisectProbe& probe = *br.add_probe_log();
    probe.set_k(static_cast<int>(k));
    bool bad = false;
    for (size_t j = 0; j < params.size(); ++j) {
      const at::Tensor& want = params[j].reference_grad;
      const at::Tensor g = (*grads)[j].defined() ? (*grads)[j] : at::zeros_like(want);
      auto cmp = CompareTensors(g, want, params[j].name, oracle_opts);
      if (!cmp.ok()) return bisect::OracleAnswer::Error(cmp.status().message());
      bad |= cmp->diverged;
      AddToProbe(*cmp, probe);
    }
    probe.set_bad(bad);
    return bisect::OracleAnswer::FromBool(bad);
  };
  return SearchLayers(options.bisect, opt, v1::BACKWARD, "backward bisect", oracle, br);
}

bool SameBits(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(double)) == 0;
}

}  // namespace

namespace internal {

// The captured value of the quantity the trigger watched, and whether the replayed run fires it
// (the rule the Monitor's capture re-run uses too: instrument/trigger_rule.h).
void JudgeFidelity(const v1::Capsule& c, const ProbeResult& run, v1::ReplayReport& report) {
  const v1::Trigger& t = c.trigger();
  const TriggerKind kind = static_cast<TriggerKind>(t.kind());
  const RerunOutcome outcome = RerunOutcomeOf(run);
  const bool grad = WatchesGradNorm(kind);
  const double replayed = WatchedValue(kind, outcome);
  const double captured = t.observed();
  report.set_trigger(t.kind());
  report.set_captured_value(captured);
  report.set_replayed_value(replayed);
  const bool fires = TriggerFiresAgain(kind, captured, t.threshold(), outcome);
  // Bitwise: same value and the same forward stats at every layer.
  bool exact = fires && SameBits(replayed, captured);
  if (exact) {
    std::map<std::string, const v1::HealthStats*> captured_stats;
    for (const auto& l : c.numerics().layers()) {
      if (l.phase() == v1::FORWARD) captured_stats[l.name()] = &l.stats();
    }
    for (const LayerRecord& rec : run.layers) {
      auto it = captured_stats.find(rec.name);
      if (it == captured_stats.end()) continue;
      const v1::HealthStats& s = *it->second;
      exact &= s.nan_count() == rec.forward.nan_count && s.numel() == rec.forward.numel &&
               SameBits(s.min(), rec.forward.min) && SameBits(s.max(), rec.forward.max) &&
               SameBits(s.mean(), rec.forward.mean) && SameBits(s.rms(), rec.forward.rms);
    }
  }
  auto show = [](double v) { return FormatSignificant(v, 9); };
  std::string detail = std::string(grad ? "grad norm" : "loss") + ": captured " + show(captured) +
                       ", replayed " + show(replayed);
  v1::Fidelity fidelity = !fires  ? v1::NOT_REPRODUCED
                          : exact ? v1::REPRODUCED_EXACT
                                  : v1::REPRODUCED_APPROX;
  if (kind == TriggerKind::kException) {
    // What matters is the exception, not the loss: did the model's layers throw again?
    const std::string captured_text = PrintableShort(t.message(), 200);
    detail = run.error.empty()
                 ? "the exception did not recur in the model's layers (captured: \"" +
                       captured_text + "\"); replayed loss " + show(replayed)
                 : "the exception recurred in the model's layers: \"" +
                       PrintableShort(run.error, 200) + "\" (captured: \"" + captured_text + "\")";
  }
  bool step_loss_recorded = false;
  for (const auto& h : c.step().history()) {
    step_loss_recorded |= h.step() == c.step().global_step() && h.has_loss();
  }
  if (kind == TriggerKind::kManual && std::isnan(captured) && !step_loss_recorded) {
    fidelity = v1::NOT_CHECKED;
    detail =
        "manual capture before the step reported its loss: nothing to compare (replayed "
        "loss " +
        show(replayed) + ")";
  } else if (kind == TriggerKind::kManual && c.data().micro_batches() > 1) {
    // The trainer's loss of an accumulated step is its own sum over micro-batches, which one
    // forward pass over all of them equals only when the normalisation is right: the objective
    // stage judges that, not fidelity.
    fidelity = v1::NOT_CHECKED;
    detail = "manual capture of a step accumulated over " +
             std::to_string(c.data().micro_batches()) + " micro-batches: the trainer's loss " +
             show(captured) +
             " is judged by the objective stage (one pass over the batch: " + show(replayed) + ")";
  }
  report.set_fidelity(fidelity);
  report.set_fidelity_detail(detail);
}

}  // namespace internal

namespace {

bool ReferenceShowsAnomaly(const v1::Capsule& c, const ReferenceRun& ref) {
  const v1::Trigger& t = c.trigger();
  switch (t.kind()) {
    case v1::NON_FINITE_LOSS:
    case v1::NON_FINITE_GRAD:
      return ref.anomalous || !std::isfinite(ref.grad_norm);
    case v1::LOSS_SPIKE:
      return ref.loss > t.threshold();
    case v1::GRAD_NORM_SPIKE:
      return ref.grad_norm > t.threshold();
    default:
      return ref.anomalous;
  }
}

}  // namespace

namespace {

StatusOr<v1::ReplayReport> ReplayOnce(const v1::Capsule& c, const ModelRegistry& registry,
                                      const ReplayOptions& options);

// The metrics of a run by name, for the spread of repeated runs.
std::vector<std::pair<std::string, double>> Metrics(const v1::ReplayReport& r) {
  std::vector<std::pair<std::string, double>> m = {{"replayed_value", r.replayed_value()},
                                                   {"optimized_loss", r.optimized_loss()},
                                                   {"reference_loss", r.reference_loss()}};
  for (int i = 0; i < r.layers_size(); ++i) {
    const v1::LayerComparison& l = r.layers(i);
    const std::string at =
        "layers[" + std::to_string(i) + "] " + l.name() + " " + v1::Phase_Name(l.phase()) + " ";
    m.emplace_back(at + "max_abs_err", l.max_abs_err());
    m.emplace_back(at + "max_rel_err", l.max_rel_err());
    m.emplace_back(at + "worst_ratio", l.worst_ratio());
  }
  for (int i = 0; i < r.bisect().probe_log_size(); ++i) {
    m.emplace_back("bisect.probe_log[" + std::to_string(i) + "] max_rel_err",
                   r.bisect().probe_log(i).max_rel_err());
  }
  return m;
}

bool Reproduced(const v1::ReplayReport& r) {
  return r.fidelity() == v1::REPRODUCED_EXACT || r.fidelity() == v1::REPRODUCED_APPROX;
}

StatusOr<v1::ReplayReport> ReplayRepeated(const v1::Capsule& c, const ModelRegistry& registry,
                                          const ReplayOptions& options) {
  if (options.repeat <= 1) return ReplayOnce(c, registry, options);
  CAPSULE_ASSIGN_OR_RETURN(v1::ReplayReport first, ReplayOnce(c, registry, options));
  const std::string first_bytes = first.SerializeAsString();
  const std::vector<std::pair<std::string, double>> base = Metrics(first);
  std::vector<std::pair<std::string, double>> lo = base, hi = base;
  std::vector<bool> differs(base.size(), false);
  v1::RepeatReport repeat;
  repeat.set_runs(options.repeat);
  repeat.set_bitwise_identical(true);
  repeat.set_reproduced_runs(Reproduced(first) ? 1 : 0);
  repeat.set_not_checked_runs(first.fidelity() == v1::NOT_CHECKED ? 1 : 0);
  for (int run = 1; run < options.repeat; ++run) {
    if (options.progress) options.progress("repeat " + std::to_string(run + 1));
    CAPSULE_ASSIGN_OR_RETURN(v1::ReplayReport again, ReplayOnce(c, registry, options));
    repeat.set_reproduced_runs(repeat.reproduced_runs() + (Reproduced(again) ? 1 : 0));
    repeat.set_not_checked_runs(repeat.not_checked_runs() +
                                (again.fidelity() == v1::NOT_CHECKED ? 1 : 0));
    if (again.SerializeAsString() == first_bytes) continue;
    repeat.set_bitwise_identical(false);
    const auto m = Metrics(again);
    for (size_t k = 0; k < m.size() && k < lo.size(); ++k) {
      if (m[k].first != lo[k].first) continue;  // a run with other layers: compared by position
      differs[k] = differs[k] || std::memcmp(&m[k].second, &base[k].second, sizeof(double)) != 0;
      lo[k].second = std::fmin(lo[k].second, m[k].second);
      hi[k].second = std::fmax(hi[k].second, m[k].second);
    }
  }
  for (size_t k = 0; k < lo.size(); ++k) {
    if (!differs[k]) continue;
    v1::MetricSpread& s = *repeat.add_spreads();
    s.set_metric(lo[k].first);
    s.set_min(lo[k].second);
    s.set_max(hi[k].second);
  }
  *first.mutable_repeat() = repeat;
  return first;
}

// The features bisect (ReplayOptions::bisect_features). Invariant of the search: the switches in
// `required` plus all of `candidates` make the target diverge. Each round finds the shortest
// prefix of `candidates` that still does with `required` (the switch ending it is needed), then
// checks whether `required` alone now suffices.
StatusOr<v1::FeatureBisectReport> BisectFeatures(const v1::Capsule& c,
                                                 const ModelRegistry& registry,
                                                 const ReplayOptions& options,
                                                 const v1::ReplayReport& base) {
  v1::FeatureBisectReport fb;
  std::vector<std::string> on = options.features.value_or(std::vector<std::string>{});
  if (!options.features) {
    CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                             registry.Create({c.model().registry_name(), c.model().config_json()}));
    on = model->EnabledFeatures();
  }
  for (const std::string& name : on) fb.add_switches(name);
  const size_t s = on.size();
  fb.set_replay_bound(s == 0 ? 0 : static_cast<int>(std::ceil(std::log2(double(s)))) + 1);
  if (s == 0) {
    fb.set_outcome(v1::FeatureBisectReport::NO_SWITCHES);
    return fb;
  }
  if (!base.has_first_divergent_layer()) {
    fb.set_outcome(v1::FeatureBisectReport::NO_TARGET);
    return fb;
  }
  fb.set_target_layer(base.first_divergent_layer());
  fb.set_target_phase(base.first_divergent_phase());

  ReplayOptions probe_options = options;
  probe_options.bisect = BisectMode::kNone;
  probe_options.bisect_features = false;
  probe_options.repeat = 1;
  std::map<std::set<std::string>, bool> answers;
  answers[std::set<std::string>(on.begin(), on.end())] = true;  // the replay given
  // Switches in the model's order, so that probes read alike.
  auto ordered = [&](const std::set<std::string>& set) {
    std::vector<std::string> out;
    for (const std::string& name : on) {
      if (set.count(name) != 0) out.push_back(name);
    }
    return out;
  };
  auto diverges = [&](const std::set<std::string>& set) -> StatusOr<bool> {
    if (const auto it = answers.find(set); it != answers.end()) return it->second;
    probe_options.features = ordered(set);
    if (options.progress) {
      options.progress("features probe: " + JoinNames(*probe_options.features));
    }
    CAPSULE_ASSIGN_OR_RETURN(v1::ReplayReport r, ReplayOnce(c, registry, probe_options));
    v1::FeatureProbe& probe = *fb.add_probes();
    for (const std::string& name : *probe_options.features) probe.add_enabled(name);
    for (const v1::LayerComparison& l : r.layers()) {
      if (l.name() != fb.target_layer() || l.phase() != fb.target_phase()) continue;
      probe.set_bad(probe.bad() || l.verdict() == v1::DIVERGED);
      probe.set_max_rel_err(std::max(probe.max_rel_err(), l.max_rel_err()));
    }
    fb.set_replays(fb.replays() + 1);
    answers[set] = probe.bad();
    return probe.bad();
  };

  std::set<std::string> required;
  std::vector<std::string> candidates = on;
  while (true) {
    auto with_prefix = [&](size_t k) {
      std::set<std::string> set = required;
      set.insert(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k));
      return set;
    };
    // Prefix `bad` diverges; prefix `good` does not, or (good == 0) is not known to.
    size_t good = 0, bad = candidates.size();
    while (bad - good > 1) {
      const size_t mid = good + (bad - good) / 2;
      CAPSULE_ASSIGN_OR_RETURN(bool b, diverges(with_prefix(mid)));
      (b ? bad : good) = mid;
    }
    std::set<std::string> needed = required;
    needed.insert(candidates[bad - 1]);
    if (good == 0) {
      // `required` alone (every switch off in the first round) was never shown not to diverge.
      CAPSULE_ASSIGN_OR_RETURN(bool without, diverges(required));
      if (without && required.empty()) {
        fb.set_outcome(v1::FeatureBisectReport::NOT_IN_SWITCHES);
        return fb;
      }
      if (!without) required = needed;
      break;
    }
    // The prefix without candidates[bad - 1] probed good: that switch is needed. Is it enough?
    CAPSULE_ASSIGN_OR_RETURN(bool enough, diverges(needed));
    required = needed;
    if (enough) break;
    candidates.resize(bad - 1);
  }
  fb.set_outcome(v1::FeatureBisectReport::FOUND);
  for (const std::string& name : ordered(required)) fb.add_culprits(name);
  return fb;
}

}  // namespace

StatusOr<v1::ReplayReport> ReplayCapsule(const v1::Capsule& c, const ModelRegistry& registry,
                                         const ReplayOptions& options) {
  CAPSULE_ASSIGN_OR_RETURN(v1::ReplayReport report, ReplayRepeated(c, registry, options));
  if (options.bisect_features) {
    CAPSULE_ASSIGN_OR_RETURN(*report.mutable_features(),
                             BisectFeatures(c, registry, options, report));
  }
  return report;
}

namespace {

// The parity stage, when asked for or the capsule was captured during generation: prefill and
// chunk from the capsule's generation section unless the options set them.
Status MaybeRunParity(const v1::Capsule& c, Model& model, const LayerBatch& eval,
                      const ReplayOptions& options, v1::ReplayReport& report) {
  if (!options.parity && !c.has_generation()) return Status::Ok();
  if (!options.parity && dynamic_cast<Decodable*>(&model) == nullptr) {
    report.add_warnings(
        "the capsule records a generation step, but the model has no incremental decoder: "
        "parity not checked");
    return Status::Ok();
  }
  if (options.progress) options.progress("parity: whole sequence against cached decode");
  ParityOptions parity = options.parity_options;
  if (parity.prefill == 0) parity.prefill = c.generation().prompt_length();
  if (parity.chunk == 0) parity.chunk = c.generation().prefill_chunk();
  auto* decodable = dynamic_cast<Decodable*>(&model);
  if (!parity.adapter_merge && c.generation().adapter_merged() && decodable != nullptr) {
    for (size_t i = 0; i < decodable->Decoder().size(); ++i) {
      if (!decodable->Decoder().Adapters(i).empty()) parity.adapter_merge = at::kFloat;
    }
  }
  CAPSULE_ASSIGN_OR_RETURN(*report.mutable_parity(), RunParity(model, eval, parity));
  internal::AddGenerationSettingChecks(c, eval.input_ids, report.mutable_parity());
  return Status::Ok();
}

StatusOr<v1::ReplayReport> ReplayOnce(const v1::Capsule& c, const ModelRegistry& registry,
                                      const ReplayOptions& options) {
  // An extract holds one layer, not a step: it has its own, single-layer replay.
  if (IsLayerExtract(c)) return ReplayExtract(c, registry, options);
  v1::ReplayReport report;
  if (c.model().registry_name().empty()) {
    return InvalidArgumentError("the capsule names no model (model.registry_name is empty)");
  }
  std::vector<std::string> warnings;
  CAPSULE_RETURN_IF_ERROR(internal::PinEnvironment(c, options.force, &warnings));
  for (const std::string& w : warnings) report.add_warnings(w);
  report.set_intra_op_threads(at::get_num_threads());
  // A model observed through module hooks is one layer here; the capsule names the module.
  const std::string& first = c.numerics().first_anomalous_layer();
  const auto& layers = c.model().layers();
  if (!first.empty() && std::find(layers.begin(), layers.end(), first) == layers.end()) {
    report.set_captured_first_module(first);
  }
  // The weights before the model: reading and hashing them costs what they weigh, while the
  // model's config may ask for far more, and a mismatch refuses the replay either way.
  if (options.progress) options.progress("reading the weights");
  CAPSULE_ASSIGN_OR_RETURN(const Weights weights, ReadWeights(c, options, report));
  if (options.progress) options.progress("rebuilding " + c.model().registry_name());
  CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                           registry.Create({c.model().registry_name(), c.model().config_json()}));
  // Switches other than the trainer's make another computation: the captured value is then no
  // measure of reproduction, only the comparisons are.
  bool switches_changed = false;
  if (options.features) {
    const std::vector<std::string> before = model->EnabledFeatures();
    CAPSULE_RETURN_IF_ERROR(model->SetEnabledFeatures(*options.features));
    switches_changed = std::set<std::string>(before.begin(), before.end()) !=
                       std::set<std::string>(options.features->begin(), options.features->end());
  }
  CAPSULE_RETURN_IF_ERROR(LoadWeights(c, options, weights, *model, report));
  ApplyFrozen(c, *model);
  CAPSULE_ASSIGN_OR_RETURN(LayerBatch batch, LoadBatch(c));
  batch.training = !c.data().eval_mode();  // the trainer's mode, for the fidelity run

  const PathKind trainer_path =
      c.model().trainer_path() == v1::REFERENCE ? PathKind::kReference : PathKind::kOptimized;
  LayerSequence& opt = model->Path(PathKind::kOptimized);
  LayerSequence& ref = model->Path(PathKind::kReference);
  if (opt.size() != ref.size() || opt.size() == 0) {
    return InvalidArgumentError("the model's paths have different layer counts");
  }

  // 1. Fidelity: the captured path, the captured RNG, batch and threads.
  if (options.progress) options.progress("fidelity run");
  CAPSULE_RETURN_IF_ERROR(RestoreRng(c));
  {
    CAPSULE_ASSIGN_OR_RETURN(ProbeResult run, ProbeStep(model->Path(trainer_path), batch, {}));
    internal::JudgeFidelity(c, run, report);
    if (switches_changed) {
      report.set_fidelity(v1::NOT_CHECKED);
      report.set_fidelity_detail(
          "optimization switches changed for this replay (" + JoinNames(*options.features) +
          " on): the captured value is another computation's; " + report.fidelity_detail());
    }
    report.set_optimized_loss(run.loss_value);
  }

  // 2. Reference run (also the source of each layer's reference input and upstream gradient).
  // Comparisons run with training off: dropout masks differ between paths by construction, and
  // what is compared here is the arithmetic.
  if (options.progress) options.progress("reference run");
  CAPSULE_RETURN_IF_ERROR(RestoreRng(c));
  CAPSULE_ASSIGN_OR_RETURN(ReferenceRun ref_run, RunReference(ref, batch, /*backward=*/true));
  report.set_reference_loss(ref_run.loss);
  report.set_reference_anomalous(ReferenceShowsAnomaly(c, ref_run));
  LayerBatch eval = batch;
  eval.training = false;
  CAPSULE_RETURN_IF_ERROR(RestoreRng(c));
  CAPSULE_ASSIGN_OR_RETURN(ReferenceRun ref_eval, RunReference(ref, eval, options.backward));

  // 3. Triage before the numerics, in the order a user debugs: data, then objective. Both judge
  // the batch against the FP64 reference path's logits and loss (replay/internal/triage.h).
  {
    internal::TriageInput triage;
    triage.capsule = &c;
    triage.batch = &eval;
    const size_t n = ref.size();
    if (n >= 2 && !ref_eval.outputs[n - 2].empty()) triage.logits = ref_eval.outputs[n - 2][0];
    if (n >= 2 && !ref_run.outputs[n - 2].empty()) triage.step_logits = ref_run.outputs[n - 2][0];
    triage.model_loss = ref_eval.loss;
    triage.optimized_loss = report.optimized_loss();
    if (options.progress) options.progress("data and objective stages");
    triage.parameter_grads = &ref_run.parameter_grads;
    *report.add_stages() = internal::RunDataStage(triage);
    *report.add_stages() = internal::RunObjectiveStage(triage);
    *report.add_stages() = internal::RunGradientsStage(triage);
    *report.add_stages() = internal::RunOptimizerStage(c, ref_run.grad_norm);
  }

  // 4. Numerics: layerwise.
  if (options.forward)
    CAPSULE_RETURN_IF_ERROR(CompareForward(*model, ref_eval, eval, options, report));
  if (options.backward) {
    CAPSULE_RETURN_IF_ERROR(CompareBackward(*model, ref_eval, eval, options, report));
  }
  if (report.layers_size() == 0 && options.bisect == BisectMode::kNone) {
    return InternalError("no layer could be compared; the replay proves nothing");
  }

  // 5. Bisect.
  if (options.bisect != BisectMode::kNone) {
    CAPSULE_RETURN_IF_ERROR(RunBisect(*model, ref_eval, eval, options, report));
    if (options.backward) {
      CAPSULE_RETURN_IF_ERROR(RunBackwardBisect(*model, ref_eval, eval, options, report));
    }
  }

  // 6. Parity of the incremental decode (a generation step, or asked for).
  CAPSULE_RETURN_IF_ERROR(MaybeRunParity(c, *model, eval, options, report));
  // 7. Diagnosis.
  internal::Diagnose(report);
  return report;
}

}  // namespace

}  // namespace capsule
