#include "capsule/replay/extract.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <map>
#include <set>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/version.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/internal/capsule_inputs.h"
#include "capsule/snapshot/internal/environment.h"
#include "capsule/snapshot/internal/tensor_codec.h"

namespace capsule {
namespace {

using internal::CastTo;
using internal::FillComparison;
using internal::FindTensor;
using internal::FromTorch;

// Layerwise comparisons run with training off (replayer.cc): dropout masks differ by path.
StatusOr<LayerBatch> LoadEvalBatch(const v1::Capsule& c) {
  CAPSULE_ASSIGN_OR_RETURN(LayerBatch b, internal::LoadBatchTensors(c));
  b.training = false;
  return b;
}

StatusOr<size_t> LayerIndex(LayerSequence& seq, const std::string& layer) {
  for (size_t i = 0; i < seq.size(); ++i) {
    if (seq.name(i) == layer) return i;
  }
  std::string names;
  for (size_t i = 0; i < seq.size(); ++i) names += (i ? ", " : "") + seq.name(i);
  return InvalidArgumentError("the model has no layer \"" + layer + "\" (layers: " + names + ")");
}

// "NAME/input.K" -> K, or -1.
int InputSlot(const std::string& blob_name, const std::string& prefix) {
  if (blob_name.rfind(prefix, 0) != 0) return -1;
  try {
    return std::stoi(blob_name.substr(prefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

// The blobs of `role` for `layer` named PREFIX<k>, as a list ordered by k.
StatusOr<TensorList> LayerTensors(const v1::Capsule& c, v1::TensorRole role,
                                  const std::string& layer, const std::string& prefix) {
  std::map<int, at::Tensor> by_slot;
  for (const auto& t : c.tensors()) {
    if (t.role() != role || t.layer() != layer) continue;
    const int k = InputSlot(t.name(), prefix);
    if (k < 0) continue;
    CAPSULE_ASSIGN_OR_RETURN(by_slot[k], TensorFromBlob(t));
  }
  TensorList out;
  for (auto& [k, t] : by_slot) {
    if (k != static_cast<int>(out.size())) out.resize(k);
    out.push_back(t);
  }
  return out;
}

bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

// The extract's capsule without tensors: the full capsule's context, the layer's statistics and a
// model spec naming the layer alone.
v1::Capsule ExtractContext(const v1::Capsule& full, const ExtractOptions& options, size_t index) {
  v1::Capsule out;
  out.set_writer_version(CapsuleVersion());
  out.set_created_unix_micros(full.created_unix_micros());
  out.set_run_name(full.run_name());
  *out.mutable_trigger() = full.trigger();
  *out.mutable_step() = full.step();
  *out.mutable_identity() = full.identity();
  *out.mutable_placement() = full.placement();
  *out.mutable_environment() = full.environment();
  *out.mutable_redaction() = full.redaction();
  *out.mutable_annotations() = full.annotations();
  (*out.mutable_annotations())[kExtractLayerKey] = options.layer;
  (*out.mutable_annotations())[kExtractIndexKey] = std::to_string(index);
  (*out.mutable_annotations())[kExtractSourceKey] = options.source_sha256;

  v1::Numerics& num = *out.mutable_numerics();
  num.set_intra_op_threads(full.numerics().intra_op_threads());
  num.set_path(full.numerics().path());
  num.set_first_anomalous_index(-1);
  for (const auto& l : full.numerics().layers()) {
    if (l.name() == options.layer) *num.add_layers() = l;
  }
  if (full.numerics().first_anomalous_layer() == options.layer) {
    num.set_first_anomalous_layer(options.layer);
    num.set_first_anomalous_index(full.numerics().first_anomalous_index());
    num.set_first_anomalous_phase(full.numerics().first_anomalous_phase());
    num.set_anomaly_reason(full.numerics().anomaly_reason());
  }

  v1::ModelSpec& spec = *out.mutable_model();
  spec.set_registry_name(full.model().registry_name());
  spec.set_config_json(full.model().config_json());
  spec.set_trainer_path(full.model().trainer_path());
  spec.set_weight_policy(v1::WEIGHTS_ANOMALOUS_LAYER);
  spec.add_layers(options.layer);

  return out;
}

// The layer's reference input `x`, what the capture saw at it, its own parameters (`own`) and
// buffers, and the data tensors it may read (the labels only for the last layer).
Status AddLayerTensors(const v1::Capsule& full, const ExtractOptions& options, const TensorList& x,
                       const std::set<std::string>& own, bool is_last, v1::Capsule* out) {
  for (size_t k = 0; k < x.size(); ++k) {
    if (!x[k].defined()) continue;
    v1::TensorBlob* blob = out->add_tensors();
    CAPSULE_RETURN_IF_ERROR(
        TensorToBlob(options.layer + "/input." + std::to_string(k), x[k], blob));
    blob->set_role(v1::LAYER_INPUT);
    blob->set_layer(options.layer);
  }
  // What the capture saw on the optimized path at this layer (the first anomalous layer only):
  // replay runs the layer on it again to judge fidelity.
  for (const auto& t : full.tensors()) {
    if (t.layer() != options.layer) continue;
    if (t.role() == v1::LAYER_INPUT) {
      v1::TensorBlob* blob = out->add_tensors();
      *blob = t;
      blob->set_name(options.layer + "/optimized_input." +
                     t.name().substr(t.name().rfind('.') + 1));
      blob->set_role(v1::OTHER);
    } else if (t.role() == v1::OPTIMIZED_OUTPUT || t.role() == v1::REFERENCE_OUTPUT) {
      *out->add_tensors() = t;
    }
  }
  for (const auto& t : full.tensors()) {
    const bool own_parameter = t.role() == v1::PARAMETER && own.count(t.name()) != 0;
    const bool own_buffer = t.role() == v1::BUFFER && t.layer() == options.layer;
    if (!own_parameter && !own_buffer) continue;
    v1::TensorBlob* blob = out->add_tensors();
    *blob = t;
    blob->set_layer(options.layer);
  }
  // Masks are small and any layer may read them; labels are token ids, kept for the loss only.
  v1::DataBatch& data = *out->mutable_data();
  data.set_labels_shifted(full.data().labels_shifted());
  for (const char* name : {"attention_mask", "loss_mask", "labels"}) {
    if (std::string(name) == "labels" && !is_last) continue;
    if (const v1::TensorBlob* t = FindTensor(full, name)) {
      *out->add_tensors() = *t;
      data.add_tensor_names(name);
    }
  }
  return Status::Ok();
}

}  // namespace

bool IsLayerExtract(const v1::Capsule& capsule) {
  return capsule.annotations().count(kExtractLayerKey) > 0;
}

StatusOr<v1::Capsule> ExtractLayer(const v1::Capsule& full, const ModelRegistry& registry,
                                   const ExtractOptions& options) {
  if (IsLayerExtract(full)) {
    return InvalidArgumentError("the capsule is already an extract of layer " +
                                full.annotations().at(kExtractLayerKey));
  }
  if (full.model().registry_name().empty()) {
    return InvalidArgumentError("the capsule names no model (model.registry_name is empty)");
  }
  if (full.model().weight_policy() != v1::WEIGHTS_ALL) {
    return FailedPreconditionError(
        "extract computes the layer's reference input from the model's weights, and the capsule "
        "does not embed them all (weight policy " +
        v1::WeightPolicy_Name(full.model().weight_policy()) + "); record with weight policy ALL");
  }
  std::vector<std::string> warnings;
  CAPSULE_RETURN_IF_ERROR(internal::PinEnvironment(full, /*force=*/false, &warnings));
  // The weights before the model, as replay does: they cost what they weigh, the config may ask
  // for far more.
  CAPSULE_ASSIGN_OR_RETURN(std::vector<NamedTensor> params, internal::ParameterTensors(full));
  CAPSULE_ASSIGN_OR_RETURN(const std::string differs,
                           internal::ModelHashMismatch(full, params, "the capsule"));
  if (!differs.empty()) {
    return FailedPreconditionError(differs + "; these are another model's weights");
  }
  CAPSULE_ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      registry.Create({full.model().registry_name(), full.model().config_json()}));
  Status s = model->LoadParameters(params);
  if (!s.ok()) return s.WithContext("cannot load the capsule's weights");
  CAPSULE_RETURN_IF_ERROR(internal::LoadCapsuleBuffers(full, *model));
  LayerSequence& ref = model->Path(PathKind::kReference);
  CAPSULE_ASSIGN_OR_RETURN(const size_t index, LayerIndex(ref, options.layer));
  CAPSULE_ASSIGN_OR_RETURN(LayerBatch batch, LoadEvalBatch(full));
  CAPSULE_RETURN_IF_ERROR(internal::RequireInputIds(full, batch));

  // The reference path up to the layer, as the full replay's reference run computes it.
  TensorList x = FirstLayerInput(ref, batch);
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < index; ++i) x = ref.Forward(i, x, batch);
  } catch (const c10::Error& e) {
    return FromTorch(e, "reference path up to " + options.layer);
  }

  v1::Capsule out = ExtractContext(full, options, index);
  std::set<std::string> own;
  for (const NamedTensor& p : ref.LayerParameters(index)) own.insert(p.first);
  CAPSULE_RETURN_IF_ERROR(AddLayerTensors(full, options, x, own, index + 1 == ref.size(), &out));
  return out;
}

StatusOr<v1::ReplayReport> ReplayExtract(const v1::Capsule& c, const ModelRegistry& registry,
                                         const ReplayOptions& options) {
  v1::ReplayReport report;
  const std::string layer = c.annotations().at(kExtractLayerKey);
  std::vector<std::string> warnings;
  CAPSULE_RETURN_IF_ERROR(internal::PinEnvironment(c, options.force, &warnings));
  for (const auto& w : warnings) report.add_warnings(w);
  report.set_intra_op_threads(at::get_num_threads());
  if (options.progress) options.progress("rebuilding " + c.model().registry_name());
  CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                           registry.Create({c.model().registry_name(), c.model().config_json()}));
  // LoadParameters wants every parameter: the model's own initial values stand in for the layers
  // the extract does not hold, which this replay never runs.
  CAPSULE_ASSIGN_OR_RETURN(std::vector<NamedTensor> params, internal::ParameterTensors(c));
  const std::map<std::string, at::Tensor> embedded(params.begin(), params.end());
  std::vector<NamedTensor> merged;
  for (const NamedTensor& p : model->NamedParameters()) {
    auto it = embedded.find(p.first);
    merged.emplace_back(p.first, it != embedded.end() ? it->second : p.second.detach().clone());
  }
  Status s = model->LoadParameters(merged);
  if (!s.ok()) return s.WithContext("cannot load the extract's parameters");
  CAPSULE_RETURN_IF_ERROR(internal::LoadCapsuleBuffers(c, *model));

  LayerSequence& ref = model->Path(PathKind::kReference);
  LayerSequence& opt = model->Path(PathKind::kOptimized);
  CAPSULE_ASSIGN_OR_RETURN(const size_t i, LayerIndex(opt, layer));
  for (const NamedTensor& p : opt.LayerParameters(i)) {
    if (embedded.count(p.first) == 0) {
      return InvalidArgumentError("the extract lacks parameter " + p.first + " of layer " + layer);
    }
  }
  CAPSULE_ASSIGN_OR_RETURN(LayerBatch batch, LoadEvalBatch(c));
  CAPSULE_ASSIGN_OR_RETURN(TensorList inputs,
                           LayerTensors(c, v1::LAYER_INPUT, layer, layer + "/input."));
  if (inputs.empty()) return InvalidArgumentError("the extract holds no input of layer " + layer);
  if (i == 0 && !batch.ModelInput().defined()) {
    // Layer 0's recorded input is the batch's: token ids, or a model's own inputs.
    (inputs.at(0).is_floating_point() ? batch.inputs : batch.input_ids) = inputs.at(0);
  }

  if (options.progress) options.progress("layer " + layer);
  TensorList ref_out, opt_out;
  try {
    at::NoGradGuard no_grad;
    ref_out = ref.Forward(i, CastTo(inputs, ref.compute_dtype()), batch);
    opt_out = opt.Forward(i, CastTo(inputs, opt.compute_dtype()), batch);
  } catch (const c10::Error& e) {
    return FromTorch(e, "layer " + layer);
  }
  const size_t n = opt.size();
  const at::Tensor& reference = ref_out.at(0);
  CAPSULE_ASSIGN_OR_RETURN(TensorComparison cmp,
                           CompareTensors(opt_out.at(0), reference, layer, options.compare,
                                          /*logits=*/i + 2 == n && reference.dim() >= 2));
  v1::LayerComparison& lc = *report.add_layers();
  lc.set_index(static_cast<int>(i));
  lc.set_name(layer);
  lc.set_phase(v1::FORWARD);
  lc.set_tensor("output");
  FillComparison(cmp, &lc);

  // Fidelity: the optimized layer on the captured optimized input gives the captured output.
  report.set_trigger(c.trigger().kind());
  report.set_captured_value(c.trigger().observed());
  CAPSULE_ASSIGN_OR_RETURN(TensorList captured_in,
                           LayerTensors(c, v1::OTHER, layer, layer + "/optimized_input."));
  const v1::TensorBlob* captured_out = nullptr;
  for (const auto& t : c.tensors()) {
    if (t.role() == v1::OPTIMIZED_OUTPUT && t.layer() == layer) captured_out = &t;
  }
  if (captured_out != nullptr && !captured_in.empty()) {
    CAPSULE_ASSIGN_OR_RETURN(at::Tensor want, TensorFromBlob(*captured_out));
    TensorList again;
    try {
      at::NoGradGuard no_grad;
      again = opt.Forward(i, captured_in, batch);
    } catch (const c10::Error& e) {
      return FromTorch(e, "layer " + layer + " on its captured input");
    }
    const bool exact = BitwiseEqual(again.at(0), want);
    report.set_fidelity(exact ? v1::REPRODUCED_EXACT : v1::REPRODUCED_APPROX);
    report.set_fidelity_detail(
        layer + " output on its captured input: " +
        (exact ? "bitwise equal to the capture" : "differs from the capture"));
  } else {
    report.set_fidelity(v1::NOT_CHECKED);
    report.set_fidelity_detail("the extract holds no captured output of " + layer +
                               " (captured for the first anomalous layer only); not judged");
  }

  report.set_extract_layer(layer);
  if (cmp.diverged) {
    report.set_diagnosis(v1::NUMERICS);
    report.set_first_divergent_layer(layer);
    report.set_first_divergent_phase(v1::FORWARD);
    report.set_first_divergent_source(v1::LAYERWISE);
  } else {
    report.set_diagnosis(v1::NO_DIVERGENCE);
  }
  return report;
}

}  // namespace capsule
