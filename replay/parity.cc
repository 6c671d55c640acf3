#include "capsule/replay/parity.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capsule/model/decoder.h"
#include "capsule/proto/parity.pb.h"

namespace capsule {
namespace {

struct Step {
  int64_t start = 0;
  int64_t length = 0;
};

std::vector<Step> Schedule(int64_t t, int64_t prefill, int64_t chunk) {
  std::vector<Step> steps;
  for (int64_t s = 0; s < prefill; s += chunk) steps.push_back({s, std::min(chunk, prefill - s)});
  for (int64_t s = prefill; s < t; ++s) steps.push_back({s, 1});
  return steps;
}

// Each layer's whole-sequence input and output on the REFERENCE path, in eval mode.
struct ReferenceRun {
  std::vector<TensorList> inputs;
  std::vector<at::Tensor> outputs;
};

ReferenceRun RunReference(LayerSequence& ref, const LayerBatch& eval, size_t layers) {
  ReferenceRun run;
  TensorList x = FirstLayerInput(ref, eval);
  for (size_t i = 0; i < layers; ++i) {
    run.inputs.push_back(x);
    x = ref.Forward(i, PrivateCopy(x), eval);
    run.outputs.push_back(x.at(0));
  }
  return run;
}

// One layer of the decoder over the whole schedule, fed the reference input of that layer.
struct LayerDecode {
  at::Tensor output;  // [B, T, ...]
  std::vector<NamedTensor> cache;
  std::vector<at::Tensor> attn;  // per step, [B, H, T_step, start + T_step]
};

DecodeStep MakeStep(const LayerBatch& batch, const Step& s) {
  DecodeStep step;
  step.input_ids = batch.input_ids.slice(1, s.start, s.start + s.length);
  if (batch.attention_mask.defined()) {
    step.attention_mask = batch.attention_mask.slice(1, 0, s.start + s.length);
  }
  step.past = s.start;
  return step;
}

std::vector<LayerDecode> RunDecoder(IncrementalDecoder& dec, const ReferenceRun& ref,
                                    const LayerBatch& batch, const std::vector<Step>& steps) {
  dec.ResetCache();
  std::vector<LayerDecode> out(dec.size());
  for (size_t i = 0; i < dec.size(); ++i) {
    const at::Tensor& input = ref.inputs[i].at(0);
    TensorList pieces;
    for (const Step& s : steps) {
      const DecodeStep step = MakeStep(batch, s);
      at::Tensor x = i == 0 ? step.input_ids : input.slice(1, s.start, s.start + s.length);
      if (x.is_floating_point()) x = x.to(dec.compute_dtype());
      pieces.push_back(dec.ForwardStep(i, {x}, step).at(0));
      for (const auto& [name, value] : dec.Probe(i)) {
        if (name == "attn") out[i].attn.push_back(value);
      }
    }
    out[i].output = at::cat(pieces, 1);
    out[i].cache = dec.Cache(i);
  }
  return out;
}

// Two runs from different random states, the default generator restored after.
std::pair<std::vector<LayerDecode>, std::vector<LayerDecode>> RunDecoderTwice(
    IncrementalDecoder& dec, const ReferenceRun& ref, const LayerBatch& batch,
    const std::vector<Step>& steps) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor saved = gen.get_state();
  gen.set_current_seed(1);
  std::vector<LayerDecode> first = RunDecoder(dec, ref, batch, steps);
  gen.set_current_seed(2);
  std::vector<LayerDecode> second = RunDecoder(dec, ref, batch, steps);
  gen.set_state(saved);
  return {std::move(first), std::move(second)};
}

// A [B, T, ...] pair (position along `dim`) compared one position at a time.
struct PositionErrors {
  std::vector<double> ratio, abs_err;
  std::optional<int64_t> first;
  double candidate_value = 0, reference_value = 0;  // worst element at `first`
  bool support_differs = false;
};

void RecordWorstElement(const at::Tensor& c, const at::Tensor& r, const Tolerance& tol,
                        PositionErrors& e) {
  const at::Tensor cd = c.to(at::kDouble).flatten();
  const at::Tensor rd = r.to(at::kDouble).flatten();
  const at::Tensor diff = (cd - rd).abs().nan_to_num(std::numeric_limits<double>::infinity());
  const int64_t worst = diff.argmax().item<int64_t>();
  e.candidate_value = cd[worst].item<double>();
  e.reference_value = rd[worst].item<double>();
  const at::Tensor fails = diff.gt(tol.atol + tol.rtol * rd.abs());
  e.support_differs = fails.logical_and(cd.eq(0).logical_or(rd.eq(0))).any().item<bool>();
}

StatusOr<PositionErrors> ComparePositions(const at::Tensor& candidate, const at::Tensor& reference,
                                          int64_t dim, const std::string& layer,
                                          const CompareOptions& options) {
  PositionErrors e;
  for (int64_t p = 0; p < reference.size(dim); ++p) {
    const at::Tensor c = candidate.select(dim, p);
    const at::Tensor r = reference.select(dim, p);
    CAPSULE_ASSIGN_OR_RETURN(TensorComparison cmp, CompareTensors(c, r, layer, options));
    e.ratio.push_back(cmp.nonfinite_mismatch > 0 ? std::numeric_limits<double>::infinity()
                                                 : cmp.worst_ratio);
    e.abs_err.push_back(cmp.max_abs_err);
    if (cmp.diverged && !e.first) {
      e.first = p;
      RecordWorstElement(c, r, cmp.tolerance_used, e);
    }
  }
  return e;
}

double MaxOf(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

// The attention weights of every step, zero-padded to T keys and stacked by query position:
// [B, H, T, T], comparable row by row with the reference's.
at::Tensor StackAttention(const std::vector<at::Tensor>& attn, const std::vector<Step>& steps,
                          int64_t t) {
  TensorList rows;
  for (size_t s = 0; s < attn.size() && s < steps.size(); ++s) {
    rows.push_back(at::constant_pad_nd(attn[s], {0, t - attn[s].size(-1)}));
  }
  return at::cat(rows, 2);
}

const at::Tensor* Find(const std::vector<NamedTensor>& tensors, const std::string& name) {
  for (const auto& [n, value] : tensors) {
    if (n == name) return &value;
  }
  return nullptr;
}

// The decoder's cached tensors and attention weights of layer i against the reference trace.
Status CompareTensorsOfLayer(IncrementalDecoder& dec, size_t i, const ReferenceRun& ref,
                             const LayerBatch& eval, const LayerDecode& decoded,
                             const std::vector<Step>& steps, const ParityOptions& options,
                             v1::ParityReport& report) {
  const std::vector<NamedTensor> trace = dec.ReferenceTrace(i, ref.inputs[i], eval);
  std::vector<NamedTensor> candidate = decoded.cache;
  if (!decoded.attn.empty()) {
    candidate.emplace_back("attn", StackAttention(decoded.attn, steps, eval.input_ids.size(1)));
  }
  for (const auto& [name, value] : candidate) {
    const at::Tensor* reference = Find(trace, name);
    if (reference == nullptr) continue;
    CompareOptions exact = options.compare;
    if (name == "pos") exact.tolerance = Tolerance{0, 0};
    const int64_t dim = name == "pos" ? 1 : 2;
    CAPSULE_ASSIGN_OR_RETURN(PositionErrors e,
                             ComparePositions(value, *reference, dim, dec.name(i), exact));
    v1::ParityTensor* t = report.add_tensors();
    t->set_layer_index(static_cast<int32_t>(i));
    t->set_layer(dec.name(i));
    t->set_tensor(name);
    if (e.first) t->set_first_divergent_position(*e.first);
    t->set_max_abs_err(MaxOf(e.abs_err));
    t->set_candidate_value(e.candidate_value);
    t->set_reference_value(e.reference_value);
    t->set_support_differs(e.support_differs);
    t->set_heads(value.dim() == 4 ? value.size(1) : 0);
  }
  return Status::Ok();
}

// Layer outputs position by position; fills layers, positions and the first divergence.
Status CompareOutputs(IncrementalDecoder& dec, const ReferenceRun& ref,
                      const std::vector<LayerDecode>& decoded, const ParityOptions& options,
                      int64_t prefill, v1::ParityReport& report) {
  const int64_t t = ref.outputs.at(0).size(1);
  for (int64_t p = 0; p < t; ++p) {
    v1::ParityPosition* pos = report.add_positions();
    pos->set_position(p);
    pos->set_decoded(p >= prefill);
  }
  for (size_t i = 0; i < dec.size(); ++i) {
    CAPSULE_ASSIGN_OR_RETURN(PositionErrors e, ComparePositions(decoded[i].output, ref.outputs[i],
                                                                1, dec.name(i), options.compare));
    v1::ParityLayer* layer = report.add_layers();
    layer->set_index(static_cast<int32_t>(i));
    layer->set_name(dec.name(i));
    if (e.first) layer->set_first_divergent_position(*e.first);
    layer->set_max_abs_err(MaxOf(e.abs_err));
    layer->set_worst_ratio(MaxOf(e.ratio));
    for (int64_t p = 0; p < t; ++p) {
      v1::ParityPosition* pos = report.mutable_positions(static_cast<int>(p));
      if (e.ratio[p] > pos->worst_ratio() || pos->worst_layer().empty()) {
        pos->set_worst_ratio(e.ratio[p]);
        pos->set_worst_layer(dec.name(i));
        pos->set_max_abs_err(e.abs_err[p]);
      }
      if (e.ratio[p] > 1) pos->set_diverged(true);
    }
    const bool earlier = e.first && (!report.has_first_divergent_position() ||
                                     *e.first < report.first_divergent_position());
    if (earlier) {
      report.set_diverged(true);
      report.set_first_divergent_position(*e.first);
      report.set_first_divergent_layer(dec.name(i));
      report.set_first_divergent_layer_index(static_cast<int32_t>(i));
      report.set_max_abs_err(e.abs_err[*e.first]);
      report.set_worst_ratio(e.ratio[*e.first]);
      report.set_candidate_value(e.candidate_value);
      report.set_reference_value(e.reference_value);
    }
  }
  return Status::Ok();
}

// The largest difference between the two runs' outputs of layer i (0: bitwise the same).
double RunSpread(const LayerDecode& a, const LayerDecode& b) {
  if (at::equal(a.output, b.output)) return 0;
  const at::Tensor d = (a.output.to(at::kDouble) - b.output.to(at::kDouble)).abs();
  return d.nan_to_num(std::numeric_limits<double>::infinity()).max().item<double>();
}

const v1::ParityTensor* TensorOf(const v1::ParityReport& r, int32_t layer, const char* name) {
  for (const v1::ParityTensor& t : r.tensors()) {
    if (t.layer_index() == layer && t.tensor() == name) return &t;
  }
  return nullptr;
}

bool Differs(const v1::ParityTensor* t) {
  return t != nullptr && t->has_first_divergent_position();
}

// The cached tensor that departs first: position ids of this layer or one before it, then the
// layer's keys and values, the earliest position winning (ties in that order).
void NameFirstCachedTensor(v1::ParityReport& r) {
  const int32_t layer = r.first_divergent_layer_index();
  std::vector<const v1::ParityTensor*> order;
  for (int32_t i = 0; i <= layer; ++i) order.push_back(TensorOf(r, i, "pos"));
  order.push_back(TensorOf(r, layer, "k"));
  order.push_back(TensorOf(r, layer, "v"));
  const v1::ParityTensor* first = nullptr;
  for (const v1::ParityTensor* t : order) {
    if (!Differs(t)) continue;
    if (first == nullptr || t->first_divergent_position() < first->first_divergent_position()) {
      first = t;
    }
  }
  if (first == nullptr) return;
  r.set_first_cached_tensor(first->tensor());
  r.set_first_cached_layer(first->layer());
  r.set_first_cached_position(first->first_divergent_position());
}

void AddParityFinding(v1::ParityReport& r, const char* check, bool failed,
                      const v1::ParityTensor* t, double value, double threshold) {
  v1::ParityFinding* f = r.add_findings();
  f->set_check(check);
  f->set_failed(failed);
  f->set_layer(t != nullptr ? t->layer() : r.first_divergent_layer());
  f->set_position(t != nullptr && t->has_first_divergent_position() ? t->first_divergent_position()
                                                                    : r.first_divergent_position());
  if (t != nullptr) f->set_tensor(t->tensor());
  f->set_value(value);
  f->set_threshold(threshold);
}

// A delta_ratio from here on is a delta counted twice (or more), not a rounded one.
constexpr double kMergedTwiceRatio = 1.5;

void AddAdapterFinding(v1::ParityReport& r, const char* check, bool failed,
                       const v1::ParityAdapter& a, int64_t position, double value,
                       double threshold) {
  v1::ParityFinding* f = r.add_findings();
  f->set_check(check);
  f->set_failed(failed);
  f->set_layer(a.layer());
  f->set_position(position);
  f->set_tensor(a.weight());
  f->set_value(value);
  f->set_threshold(threshold);
}

// The adapter checks of one merged weight, in order; true when one failed. Value: the delta
// ratio, then the error in units of the merge dtype's epsilon. With only_failures a check that
// passes adds no finding.
bool CheckAdapter(v1::ParityReport& r, const v1::ParityAdapter& a, int64_t position,
                  bool only_failures) {
  const bool twice = a.delta_ratio() >= kMergedTwiceRatio;
  if (twice || !only_failures) {
    AddAdapterFinding(r, kCheckAdapterMergedTwice, twice, a, position, a.delta_ratio(),
                      kMergedTwiceRatio);
  }
  if (twice) return true;
  const bool rounded = !(a.rounding_eps() <= a.rounding_bound());
  if (rounded || !only_failures) {
    AddAdapterFinding(r, kCheckAdapterRounding, rounded, a, position, a.rounding_eps(),
                      a.rounding_bound());
  }
  return rounded;
}

// The checks, in order, at the first divergence; the first that fails names the cause and ends
// the list. Value: the tensor's first divergent position (its cache slot), or for eval.dropout
// the spread between the two runs; threshold: the bound that position or spread is held to.
void RunChecks(v1::ParityReport& r, double spread) {
  const int32_t layer = r.first_divergent_layer_index();
  const int64_t at = r.first_divergent_position();
  for (const v1::ParityAdapter& a : r.adapters()) {
    if (a.layer_index() == layer && CheckAdapter(r, a, at, /*only_failures=*/false)) return;
  }
  AddParityFinding(r, kCheckEvalDropout, spread > 0, nullptr, spread, 0);
  if (spread > 0) return;
  for (int32_t i = 0; i <= layer; ++i) {
    const v1::ParityTensor* pos = TensorOf(r, i, "pos");
    if (!Differs(pos)) continue;
    AddParityFinding(r, kCheckPositionIds, true, pos, pos->max_abs_err(), 0);
    return;
  }
  const v1::ParityTensor* k = TensorOf(r, layer, "k");
  const bool old_keys = Differs(k) && k->first_divergent_position() < at;
  AddParityFinding(r, kCheckRerotatedKey, old_keys, k,
                   Differs(k) ? k->first_divergent_position() : at, static_cast<double>(at));
  if (old_keys) return;
  AddParityFinding(r, kCheckRopePosition, Differs(k), k, k != nullptr ? k->max_abs_err() : 0, 0);
  if (Differs(k)) return;
  const v1::ParityTensor* v = TensorOf(r, layer, "v");
  AddParityFinding(r, kCheckCachedValue, Differs(v), v, v != nullptr ? v->max_abs_err() : 0, 0);
  if (Differs(v)) return;
  const v1::ParityTensor* attn = TensorOf(r, layer, "attn");
  const bool support = Differs(attn) && attn->support_differs();
  AddParityFinding(r, kCheckMaskOffset, support, attn, support ? 1 : 0, 0);
  if (support) return;
  if (Differs(attn)) {
    const bool grouped = k != nullptr && k->heads() > 0 && k->heads() < attn->heads();
    AddParityFinding(r, grouped ? kCheckKvHeadMap : kCheckAttentionScores, true, attn,
                     attn->max_abs_err(), 0);
    return;
  }
  AddParityFinding(r, kCheckLayerOutput, true, nullptr, r.worst_ratio(), 1);
}

double Epsilon(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return std::numeric_limits<double>::epsilon();
    case at::kFloat:
      return std::numeric_limits<float>::epsilon();
    case at::kBFloat16:
      return 0.0078125;  // 2^-7: 8 significand bits
    case at::kHalf:
      return 0.0009765625;  // 2^-10
    default:
      return 0;
  }
}

// Every merged weight of the decoder, measured (adapter mode).
Status MeasureAdapters(IncrementalDecoder& dec, at::ScalarType dtype, v1::ParityReport& report) {
  report.set_adapter_merge_dtype(c10::toString(dtype));
  for (size_t i = 0; i < dec.size(); ++i) {
    for (const LowRankAdapter& adapter : dec.Adapters(i)) {
      CAPSULE_ASSIGN_OR_RETURN(AdapterMergeError e, MeasureAdapterMerge(adapter, dtype));
      v1::ParityAdapter* a = report.add_adapters();
      a->set_layer_index(static_cast<int32_t>(i));
      a->set_layer(dec.name(i));
      a->set_weight(adapter.weight);
      a->set_rank(adapter.a.size(0));
      a->set_scale(adapter.scale);
      a->set_delta_ratio(e.delta_ratio);
      a->set_max_abs_err(e.max_abs_err);
      a->set_rounding_eps(e.rounding_eps);
      a->set_eps(e.eps);
      a->set_rounding_bound(e.bound);
    }
  }
  return Status::Ok();
}

// Merges the decoder's adapters for the run and applies them at run time again after it.
class MergedAdapters {
 public:
  MergedAdapters(IncrementalDecoder& dec, std::optional<at::ScalarType> dtype)
      : dec_(dec), on_(dtype.has_value()) {
    if (on_) dec_.MergeAdapters(dtype);
  }
  ~MergedAdapters() {
    try {
      if (on_) dec_.MergeAdapters(std::nullopt);
    } catch (const c10::Error&) {  // NOLINT(bugprone-empty-catch): nothing to restore then
    }
  }
  MergedAdapters(const MergedAdapters&) = delete;
  MergedAdapters& operator=(const MergedAdapters&) = delete;

 private:
  IncrementalDecoder& dec_;
  bool on_;
};

bool HasAdapters(const IncrementalDecoder& dec) {
  for (size_t i = 0; i < dec.size(); ++i) {
    if (!dec.Adapters(i).empty()) return true;
  }
  return false;
}

Status RunParityChecked(Model& model, IncrementalDecoder& dec, const LayerBatch& batch,
                        const ParityOptions& given, v1::ParityReport& report) {
  // In adapter mode the merge dtype's tolerance, unless one is given.
  ParityOptions options = given;
  if (options.adapter_merge && !options.compare.tolerance) {
    options.compare.tolerance = DefaultTolerance(*options.adapter_merge);
  }
  const at::ScalarType judged = options.adapter_merge.value_or(dec.compute_dtype());
  const int64_t t = batch.input_ids.size(1);
  const int64_t prefill = options.prefill > 0 ? options.prefill : std::max<int64_t>(1, t / 2);
  const int64_t chunk = options.chunk > 0 ? std::min(options.chunk, prefill) : prefill;
  const std::vector<Step> steps = Schedule(t, prefill, chunk);
  v1::ParitySchedule* s = report.mutable_schedule();
  s->set_sequence_length(t);
  s->set_prefill(prefill);
  s->set_chunk(chunk);
  s->set_steps(static_cast<int64_t>(steps.size()));
  const Tolerance tol = ResolveTolerance(options.compare, "", judged);
  report.mutable_tolerance()->set_dtype(c10::toString(judged));
  report.mutable_tolerance()->set_atol(tol.atol);
  report.mutable_tolerance()->set_rtol(tol.rtol);
  report.set_first_divergent_layer_index(-1);

  at::NoGradGuard no_grad;
  LayerBatch eval = batch;
  eval.training = false;
  const ReferenceRun ref = RunReference(model.Path(PathKind::kReference), eval, dec.size());
  const MergedAdapters merged(dec, options.adapter_merge);
  if (options.adapter_merge) {
    CAPSULE_RETURN_IF_ERROR(MeasureAdapters(dec, *options.adapter_merge, report));
  }
  const auto [first, second] = RunDecoderTwice(dec, ref, eval, steps);
  CAPSULE_RETURN_IF_ERROR(CompareOutputs(dec, ref, first, options, prefill, report));
  for (size_t i = 0; i < dec.size(); ++i) {
    CAPSULE_RETURN_IF_ERROR(
        CompareTensorsOfLayer(dec, i, ref, eval, first[i], steps, options, report));
  }
  double spread = 0;
  for (size_t i = 0; i < dec.size(); ++i) spread = std::max(spread, RunSpread(first[i], second[i]));
  report.set_nondeterministic(spread > 0);
  if (!report.diverged()) {
    // A merged weight can be wrong within the tolerance of a coarse dtype.
    for (const v1::ParityAdapter& a : report.adapters()) CheckAdapter(report, a, 0, true);
    return Status::Ok();
  }
  NameFirstCachedTensor(report);
  const int32_t layer = report.first_divergent_layer_index();
  RunChecks(report, RunSpread(first[layer], second[layer]));
  return Status::Ok();
}

}  // namespace

StatusOr<AdapterMergeError> MeasureAdapterMerge(const LowRankAdapter& adapter,
                                                at::ScalarType dtype) {
  const at::Tensor& w = adapter.base;
  const at::Tensor& a = adapter.a;
  const at::Tensor& b = adapter.b;
  const bool fits = w.defined() && a.defined() && b.defined() && w.dim() == 2 && a.dim() == 2 &&
                    b.dim() == 2 && a.size(1) == w.size(1) && b.size(0) == w.size(0) &&
                    b.size(1) == a.size(0);
  if (!fits) {
    return InvalidArgumentError("adapter on " + adapter.weight +
                                ": needs base [out, in], a [rank, in] and b [out, rank]");
  }
  if (!adapter.merged.defined() || adapter.merged.sizes() != w.sizes()) {
    return InvalidArgumentError("adapter on " + adapter.weight +
                                ": no merged weight of the base's shape");
  }
  if (Epsilon(dtype) == 0) {
    return InvalidArgumentError(std::string("adapter merge dtype must be floating, got ") +
                                c10::toString(dtype));
  }
  at::NoGradGuard no_grad;
  const at::Tensor base = w.detach().to(at::kDouble);
  const at::Tensor ad = a.detach().to(at::kDouble);
  const at::Tensor bd = b.detach().to(at::kDouble);
  const at::Tensor delta = adapter.scale * at::matmul(bd, ad);
  const at::Tensor merged = adapter.merged.detach().to(at::kDouble);
  const at::Tensor err =
      (merged - (base + delta)).abs().nan_to_num(std::numeric_limits<double>::infinity());
  const at::Tensor magnitude =
      base.abs() + std::abs(adapter.scale) * at::matmul(bd.abs(), ad.abs());
  AdapterMergeError e;
  const double norm2 = (delta * delta).sum().item<double>();
  e.delta_ratio = norm2 > 0 ? ((merged - base) * delta).sum().item<double>() / norm2 : 0;
  e.max_abs_err = err.max().item<double>();
  e.eps = Epsilon(dtype);
  e.rounding_eps =
      (err / (e.eps * magnitude + std::numeric_limits<double>::min())).max().item<double>();
  e.bound = static_cast<double>(a.size(0) + 2);
  return e;
}

StatusOr<v1::ParityReport> RunParity(Model& model, const LayerBatch& batch,
                                     const ParityOptions& options) {
  auto* decodable = dynamic_cast<Decodable*>(&model);
  if (decodable == nullptr) {
    return InvalidArgumentError("parity: the model has no incremental decoder");
  }
  const at::Tensor& ids = batch.input_ids;
  if (!ids.defined() || ids.dim() != 2 || ids.size(1) < 1) {
    return InvalidArgumentError("parity: the batch needs input_ids [batch, T] with T >= 1");
  }
  const int64_t t = ids.size(1);
  if (options.prefill < 0 || options.prefill > t || options.chunk < 0) {
    return InvalidArgumentError("parity: prefill must be in 0.." + std::to_string(t) +
                                " and chunk >= 0, got prefill " + std::to_string(options.prefill) +
                                ", chunk " + std::to_string(options.chunk));
  }
  if (options.adapter_merge && !at::isFloatingType(*options.adapter_merge)) {
    return InvalidArgumentError(
        std::string("parity: the adapter merge dtype must be floating, got ") +
        c10::toString(*options.adapter_merge));
  }
  if (options.adapter_merge && !HasAdapters(decodable->Decoder())) {
    return InvalidArgumentError("parity: adapter merge asked for, but the model has no adapter");
  }
  v1::ParityReport report;
  try {
    CAPSULE_RETURN_IF_ERROR(RunParityChecked(model, decodable->Decoder(), batch, options, report));
  } catch (const c10::Error& e) {
    return InternalError(std::string("parity: ") + e.what_without_backtrace());
  }
  return report;
}

}  // namespace capsule
