#include "samples/tiny_gpt/tiny_gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "samples/tiny_gpt/internal/attention.h"
#include "samples/tiny_gpt/internal/block.h"
#include "samples/tiny_gpt/ops.h"

namespace capsule::tiny_gpt {

namespace {

at::Tensor AsDouble(const at::Tensor& t) { return t.to(at::kDouble); }

void CheckSingleInput(const TensorList& inputs, const std::string& layer) {
  TORCH_CHECK(inputs.size() == 1 && inputs[0].defined(), "tiny_gpt ", layer,
              ": expects exactly one input tensor, got ", inputs.size());
}

void CheckTokenIds(const at::Tensor& ids, const TinyGptConfig& config) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong,
              "tiny_gpt embed: input_ids must be int64 [batch, seq], got ", ids.scalar_type(), " ",
              ids.sizes());
  TORCH_CHECK(ids.size(1) <= config.seq_len, "tiny_gpt embed: sequence of ", ids.size(1),
              " tokens exceeds seq_len ", config.seq_len);
}

// Dropout masks are drawn in FP32 from the default CPU generator in the same order by both paths,
// so restoring the generator state before each path gives both the same masks.
at::Tensor Dropout(const at::Tensor& x, double p, const LayerBatch& batch) {
  if (!batch.training || p <= 0.0) return x;
  const at::Tensor keep = at::empty(x.sizes(), x.options().dtype(at::kFloat)).bernoulli_(1.0 - p);
  return x * keep.to(x.scalar_type()) / (1.0 - p);
}

// The embedding's positional term: the first T rows of the learned table, or with pad_mask the
// rows of the batch's position ids; none with rope (the blocks rotate q and k instead, and the
// model has no table).
at::Tensor AddPositions(const at::Tensor& tokens, const at::Tensor& table, const TinyGptConfig& c,
                        const LayerBatch& batch) {
  if (c.rope) return tokens;
  const int64_t t = tokens.size(1);
  if (!c.pad_mask || !batch.attention_mask.defined()) return tokens + table.slice(0, 0, t);
  return tokens +
         at::embedding(table, internal::PositionIds(batch.attention_mask, tokens.size(0), 0, t));
}

// A block's attention over a whole sequence before the softmax: the cache's form of k and v
// ([B, H_kv, T, dh], k rotated), v widened to the query heads, the scores with padded keys hidden,
// and the position ids (undefined when neither rope nor pad_mask reads them).
struct SequenceAttention {
  at::Tensor k, v, v_heads, scores, positions;
};

SequenceAttention AttentionScores(const at::Tensor& projected, const TinyGptConfig& c,
                                  const LayerBatch& batch) {
  internal::Qkv p = internal::SplitQkv(projected, c);
  const at::Tensor mask = c.pad_mask ? batch.attention_mask : at::Tensor();
  SequenceAttention out;
  if (c.rope || mask.defined()) {
    out.positions = internal::PositionIds(mask, projected.size(0), 0, projected.size(1));
  }
  if (c.rope) {
    p.q = internal::Rope(p.q, out.positions, c);
    p.k = internal::Rope(p.k, out.positions, c);
  }
  out.k = p.k;
  out.v = p.v;
  out.v_heads = internal::ExpandKv(p.v, c.n_heads);
  out.scores = at::matmul(p.q, internal::ExpandKv(p.k, c.n_heads).transpose(-2, -1));
  if (mask.defined()) out.scores = internal::HidePaddedKeys(out.scores, mask);
  return out;
}

// Mean cross-entropy over the positions that have a target: labels != -100 and, when given,
// loss_mask != 0. With labels_shifted == false, labels (and loss_mask) are aligned with the inputs
// and position i predicts labels[i + 1].
// With `sum` (the loss-sum fault) the token sum is returned instead of the mean.
at::Tensor MeanCrossEntropy(const at::Tensor& logits, const LayerBatch& batch, bool sum = false) {
  TORCH_CHECK(batch.labels.defined() && batch.labels.dim() == 2,
              "tiny_gpt loss: labels must be int64 [batch, seq]");
  at::Tensor scores = logits;
  at::Tensor labels = batch.labels;
  at::Tensor mask = batch.loss_mask;
  if (!batch.labels_shifted) {
    const int64_t t = logits.size(1);
    scores = logits.slice(1, 0, t - 1);
    labels = labels.slice(1, 1, t);
    if (mask.defined()) mask = mask.slice(1, 1, t);
  }
  at::Tensor valid = labels.ne(-100);
  if (mask.defined()) valid = valid.logical_and(mask.ne(0));
  const at::Tensor targets = labels.masked_fill(valid.logical_not(), 0).unsqueeze(-1);
  const at::Tensor picked = at::log_softmax(scores, -1).gather(-1, targets).squeeze(-1);
  const at::Tensor weight = valid.to(scores.scalar_type());
  if (sum) return -(picked * weight).sum();
  return -(picked * weight).sum() / weight.sum().clamp_min(1.0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// REFERENCE: FP64, plain ATen ops, written to be read against a textbook.

class TinyGpt::ReferencePath : public LayerSequence {
 public:
  explicit ReferencePath(TinyGpt* model) : m_(*model) {}

  size_t size() const override { return static_cast<size_t>(m_.config_.num_layers()); }
  std::string name(size_t i) const override { return m_.config_.layer_name(i); }
  at::ScalarType compute_dtype() const override { return at::kDouble; }
  std::vector<NamedTensor> LayerParameters(size_t i) const override {
    return m_.layer_params_.at(i);
  }

  TensorList Forward(size_t i, const TensorList& inputs, const LayerBatch& batch) override {
    const TinyGptConfig& c = m_.config_;
    const int64_t layer = static_cast<int64_t>(i);
    TORCH_CHECK(layer < c.num_layers(), "tiny_gpt: no layer ", i, " (model has ", c.num_layers(),
                ")");
    CheckSingleInput(inputs, c.layer_name(layer));
    if (layer == 0) {
      CheckTokenIds(inputs[0], c);
      const at::Tensor table = c.rope ? at::Tensor() : AsDouble(m_.pos_embedding_);
      const at::Tensor x =
          AddPositions(at::embedding(AsDouble(m_.tok_embedding_), inputs[0]), table, c, batch);
      return {Dropout(x, c.dropout, batch)};
    }
    const at::Tensor x = inputs[0].to(at::kDouble);
    if (layer <= c.n_layers) return {RunBlock(m_.blocks_[layer - 1], layer, x, batch)};
    if (layer == c.n_layers + 1) {
      return {ReferenceLayerNorm(x, AsDouble(m_.ln_f_weight_), AsDouble(m_.ln_f_bias_),
                                 c.layer_norm_eps)};
    }
    if (layer == c.n_layers + 2) return {at::matmul(x, AsDouble(m_.lm_head_weight_).t())};
    return {MeanCrossEntropy(x, batch, m_.ObjectiveFaultActive(FaultKind::kLossSum))};
  }

 private:
  at::Tensor RunBlock(const TinyGpt::Block& p, int64_t layer, const at::Tensor& x,
                      const LayerBatch& batch) {
    const TinyGptConfig& c = m_.config_;
    const double head_scale = 1.0 / std::sqrt(static_cast<double>(c.d_model / c.n_heads));
    const double gain =
        m_.FaultActive(FaultKind::kSoftmaxOverflow, layer) ? kOverflowLogitGain : 1.0;

    const at::Tensor h =
        ReferenceLayerNorm(x, AsDouble(p.ln1_w), AsDouble(p.ln1_b), c.layer_norm_eps);
    const SequenceAttention a = Scores(p, h, batch);
    const at::Tensor attn =
        at::matmul(ReferenceCausalSoftmax(a.scores, head_scale * gain), a.v_heads);
    const at::Tensor y =
        x + Dropout(internal::AdaptedLinear(internal::MergeHeads(attn), p.proj_w, p.proj_b,
                                            p.lora_a, p.lora_b, c.lora_scale()),
                    c.dropout, batch);

    const at::Tensor h2 =
        ReferenceLayerNorm(y, AsDouble(p.ln2_w), AsDouble(p.ln2_b), c.layer_norm_eps);
    const at::Tensor mlp =
        at::linear(ReferenceGelu(at::linear(h2, AsDouble(p.fc1_w), AsDouble(p.fc1_b))),
                   AsDouble(p.fc2_w), AsDouble(p.fc2_b));
    const bool cut = m_.FaultActive(FaultKind::kDisconnected, layer);
    return y + Dropout(cut ? mlp.detach() : mlp, c.dropout, batch);
  }

 public:
  // What layer i caches when the whole sequence runs at once, and the block's attention weights
  // (IncrementalDecoder::ReferenceTrace), in eval mode.
  std::vector<NamedTensor> Trace(size_t i, const TensorList& inputs, const LayerBatch& batch) {
    const TinyGptConfig& c = m_.config_;
    const int64_t layer = static_cast<int64_t>(i);
    CheckSingleInput(inputs, c.layer_name(layer));
    const at::Tensor mask = c.pad_mask ? batch.attention_mask : at::Tensor();
    if (layer == 0) {
      return {{"pos", internal::PositionIds(mask, inputs[0].size(0), 0, inputs[0].size(1))}};
    }
    if (layer > c.n_layers) return {};
    const TinyGpt::Block& p = m_.blocks_[layer - 1];
    const at::Tensor x = inputs[0].to(at::kDouble);
    const at::Tensor h =
        ReferenceLayerNorm(x, AsDouble(p.ln1_w), AsDouble(p.ln1_b), c.layer_norm_eps);
    const SequenceAttention a = Scores(p, h, batch);
    const double head_scale = 1.0 / std::sqrt(static_cast<double>(c.d_model / c.n_heads));
    const at::Tensor positions =
        a.positions.defined() ? a.positions : internal::PositionIds(mask, x.size(0), 0, x.size(1));
    return {{"pos", positions},
            {"k", a.k},
            {"v", a.v},
            {"attn", ReferenceCausalSoftmax(a.scores, head_scale)}};
  }

 private:
  SequenceAttention Scores(const TinyGpt::Block& p, const at::Tensor& h, const LayerBatch& batch) {
    return AttentionScores(at::linear(h, AsDouble(p.qkv_w), AsDouble(p.qkv_b)), m_.config_, batch);
  }

  TinyGpt& m_;
};

// ---------------------------------------------------------------------------------------------
// OPTIMIZED: FP32, fused kernels for layer norm, causal softmax and GELU. Faults enter here as
// KernelDefects of the named layer's kernels.

class TinyGpt::OptimizedPath : public LayerSequence {
 public:
  explicit OptimizedPath(TinyGpt* model) : m_(*model) {}

  size_t size() const override { return static_cast<size_t>(m_.config_.num_layers()); }
  std::string name(size_t i) const override { return m_.config_.layer_name(i); }
  at::ScalarType compute_dtype() const override { return at::kFloat; }
  std::vector<NamedTensor> LayerParameters(size_t i) const override {
    return m_.layer_params_.at(i);
  }

  TensorList Forward(size_t i, const TensorList& inputs, const LayerBatch& batch) override {
    const TinyGptConfig& c = m_.config_;
    const int64_t layer = static_cast<int64_t>(i);
    TORCH_CHECK(layer < c.num_layers(), "tiny_gpt: no layer ", i, " (model has ", c.num_layers(),
                ")");
    CheckSingleInput(inputs, c.layer_name(layer));
    // A transient fault is consumed here, once, whichever layer it names.
    const bool poison = m_.FaultFires(FaultKind::kNan, layer) ||
                        m_.FaultFires(FaultKind::kTransient, layer) ||
                        m_.FaultActive(FaultKind::kStepOnOverflow, layer);
    const bool wrong_eps = m_.FaultActive(FaultKind::kEps, layer);
    const double eps = wrong_eps ? kFaultyLayerNormEps : c.layer_norm_eps;

    if (layer == 0) {
      CheckTokenIds(inputs[0], c);
      const at::Tensor x = Dropout(
          AddPositions(at::embedding(m_.tok_embedding_, inputs[0]), m_.pos_embedding_, c, batch),
          c.dropout, batch);
      return {poison ? WriteNanAtFirst(x) : x};
    }
    const at::Tensor x = inputs[0].to(at::kFloat);
    if (layer <= c.n_layers) return {RunBlock(m_.blocks_[layer - 1], layer, x, eps, poison, batch)};
    if (layer == c.n_layers + 1) {
      KernelDefects defects;
      defects.write_nan = poison;
      return {LayerNorm(x, m_.ln_f_weight_, m_.ln_f_bias_, eps, defects)};
    }
    const at::Tensor out =
        layer == c.n_layers + 2
            ? at::matmul(x, m_.lm_head_weight_.t())
            : MeanCrossEntropy(x, batch, m_.ObjectiveFaultActive(FaultKind::kLossSum));
    return {poison ? WriteNanAtFirst(out) : out};
  }

 private:
  // Each fused kernel behind its switch: off, the plain ATen composition in FP32 runs, with the
  // config's epsilon and without the kernel's defects (the faults tied to the switch).
  at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                       const KernelDefects& defects) {
    if (m_.fused_layer_norm_) return FusedLayerNorm(x, w, b, eps, defects);
    return ReferenceLayerNorm(x, w, b, m_.config_.layer_norm_eps);
  }
  at::Tensor Softmax(const at::Tensor& scores, double scale, const KernelDefects& defects) {
    if (m_.fused_softmax_) return FusedCausalSoftmax(scores, scale, defects);
    return ReferenceCausalSoftmax(scores, scale);
  }
  at::Tensor Gelu(const at::Tensor& x, const KernelDefects& defects) {
    if (m_.fused_gelu_) return FusedGelu(x, defects);
    return ReferenceGelu(x);
  }

  at::Tensor RunBlock(const TinyGpt::Block& p, int64_t layer, const at::Tensor& x, double eps,
                      bool poison, const LayerBatch& batch) {
    const TinyGptConfig& c = m_.config_;
    const double head_scale = 1.0 / std::sqrt(static_cast<double>(c.d_model / c.n_heads));
    const bool overflow = m_.FaultActive(FaultKind::kSoftmaxOverflow, layer);
    const double gain = overflow ? kOverflowLogitGain : 1.0;
    KernelDefects softmax_defects;
    softmax_defects.drop_tail = m_.FaultActive(FaultKind::kTailBlock, layer);
    softmax_defects.skip_max = overflow;
    KernelDefects gelu_defects;
    gelu_defects.write_nan = poison;
    gelu_defects.wrong_grad = m_.FaultActive(FaultKind::kGeluGrad, layer);

    const at::Tensor h = LayerNorm(x, p.ln1_w, p.ln1_b, eps, {});
    const SequenceAttention a = AttentionScores(at::linear(h, p.qkv_w, p.qkv_b), c, batch);
    const at::Tensor attn =
        at::matmul(Softmax(a.scores, head_scale * gain, softmax_defects), a.v_heads);
    const at::Tensor y =
        x + Dropout(internal::AdaptedLinear(internal::MergeHeads(attn), p.proj_w, p.proj_b,
                                            p.lora_a, p.lora_b, c.lora_scale()),
                    c.dropout, batch);

    const at::Tensor h2 = LayerNorm(y, p.ln2_w, p.ln2_b, eps, {});
    const at::Tensor mlp =
        at::linear(Gelu(at::linear(h2, p.fc1_w, p.fc1_b), gelu_defects), p.fc2_w, p.fc2_b);
    const bool cut = m_.FaultActive(FaultKind::kDisconnected, layer);
    return y + Dropout(cut ? mlp.detach() : mlp, c.dropout, batch);
  }

  TinyGpt& m_;
};

// ---------------------------------------------------------------------------------------------

StatusOr<std::unique_ptr<TinyGpt>> TinyGpt::Create(const TinyGptConfig& config) {
  CAPSULE_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<TinyGpt>(new TinyGpt(config));
}

StatusOr<std::unique_ptr<TinyGpt>> TinyGpt::FromSpec(const ModelSpecInfo& spec) {
  if (spec.registry_name != kRegistryName) {
    return InvalidArgumentError("tiny_gpt: model spec names '" + spec.registry_name + "', not '" +
                                kRegistryName + "'");
  }
  StatusOr<SpecConfig> json = SpecConfig::Parse(spec.config_json);
  if (!json.ok())
    return InvalidArgumentError("tiny_gpt config: " + std::string(json.status().message()));
  CAPSULE_ASSIGN_OR_RETURN(TinyGptConfig config, TinyGptConfig::FromSpecConfig(*json));
  CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<TinyGpt> model, Create(config));
  CAPSULE_ASSIGN_OR_RETURN(model->step_, json->GetInt("step", model->step_));
  CAPSULE_ASSIGN_OR_RETURN(model->transient_armed_,
                           json->GetBool("fault_armed", model->transient_armed_));
  if (json->Has("disabled_features")) {
    CAPSULE_ASSIGN_OR_RETURN(std::string off, json->GetString("disabled_features"));
    std::set<std::string> disabled;
    for (size_t start = 0; start < off.size();) {
      const size_t comma = std::min(off.find(',', start), off.size());
      disabled.insert(off.substr(start, comma - start));
      start = comma + 1;
    }
    std::vector<std::string> enabled;
    for (const std::string& name : model->FeatureSwitches()) {
      if (disabled.erase(name) == 0) enabled.push_back(name);
    }
    if (!disabled.empty()) {
      return InvalidArgumentError("tiny_gpt: disabled_features names unknown switch '" +
                                  *disabled.begin() + "'");
    }
    CAPSULE_RETURN_IF_ERROR(model->SetEnabledFeatures(enabled));
  }
  return model;
}

TinyGpt::TinyGpt(const TinyGptConfig& config) : config_(config) {
  const TinyGptConfig& c = config_;
  const int64_t d = c.d_model;
  const int64_t hidden = c.mlp_mult * d;
  // GPT-2's initialisation: N(0, 0.02) weights, zero biases, unit layer-norm gains, and the
  // projections into the residual stream shrunk by sqrt(2 * n_layers) so its variance does not
  // grow with depth. A private generator keeps the weights a function of the seed alone.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(c.seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * std::max<int64_t>(1, c.n_layers));
  auto normal = [&](at::IntArrayRef shape, double std) {
    return at::empty(shape, at::kFloat).normal_(0.0, std, gen).requires_grad_(true);
  };
  auto zeros = [](at::IntArrayRef shape) {
    return at::zeros(shape, at::kFloat).requires_grad_(true);
  };
  auto ones = [](at::IntArrayRef shape) {
    return at::ones(shape, at::kFloat).requires_grad_(true);
  };

  layer_params_.resize(c.num_layers());
  auto add = [&](int64_t layer, const std::string& name, const at::Tensor& t) {
    named_.emplace_back(name, t);
    layer_params_[layer].emplace_back(name, t);
  };

  tok_embedding_ = normal({c.vocab_size, d}, 0.02);
  add(0, "embed.tok", tok_embedding_);
  // With rope the blocks rotate q and k instead: a learned table would be a parameter the loss
  // never reaches.
  if (!c.rope) {
    pos_embedding_ = normal({c.seq_len, d}, 0.02);
    add(0, "embed.pos", pos_embedding_);
  }

  blocks_.resize(c.n_layers);
  for (int64_t b = 0; b < c.n_layers; ++b) {
    Block& p = blocks_[b];
    p.ln1_w = ones({d});
    p.ln1_b = zeros({d});
    const int64_t qkv_rows = d + 2 * c.kv_heads() * (d / c.n_heads);
    p.qkv_w = normal({qkv_rows, d}, 0.02);
    p.qkv_b = zeros({qkv_rows});
    p.proj_w = normal({d, d}, residual_std);
    p.proj_b = zeros({d});
    p.ln2_w = ones({d});
    p.ln2_b = zeros({d});
    p.fc1_w = normal({hidden, d}, 0.02);
    p.fc1_b = zeros({hidden});
    p.fc2_w = normal({d, hidden}, residual_std);
    p.fc2_b = zeros({d});
    const std::string prefix = "blocks." + std::to_string(b) + ".";
    const int64_t layer = b + 1;
    add(layer, prefix + "ln1.weight", p.ln1_w);
    add(layer, prefix + "ln1.bias", p.ln1_b);
    add(layer, prefix + "attn.qkv.weight", p.qkv_w);
    add(layer, prefix + "attn.qkv.bias", p.qkv_b);
    add(layer, prefix + "attn.proj.weight", p.proj_w);
    add(layer, prefix + "attn.proj.bias", p.proj_b);
    add(layer, prefix + "ln2.weight", p.ln2_w);
    add(layer, prefix + "ln2.bias", p.ln2_b);
    add(layer, prefix + "mlp.fc1.weight", p.fc1_w);
    add(layer, prefix + "mlp.fc1.bias", p.fc1_b);
    add(layer, prefix + "mlp.fc2.weight", p.fc2_w);
    add(layer, prefix + "mlp.fc2.bias", p.fc2_b);
  }

  InitAdapters();

  ln_f_weight_ = ones({d});
  ln_f_bias_ = zeros({d});
  add(c.n_layers + 1, "ln_f.weight", ln_f_weight_);
  add(c.n_layers + 1, "ln_f.bias", ln_f_bias_);
  lm_head_weight_ = normal({c.vocab_size, d}, 0.02);
  add(c.n_layers + 2, "lm_head.weight", lm_head_weight_);

  reference_ = std::make_unique<ReferencePath>(this);
  optimized_ = std::make_unique<OptimizedPath>(this);
  decoder_ = MakeDecodePath();
}

TinyGpt::~TinyGpt() = default;

// A trained adapter's B is not zero (only a fresh one's is): A ~ N(0, 1/d), B ~ N(0, 0.05^2), so
// the delta is of the order of the weight it adapts. A generator of its own keeps the model's
// weights what they are without an adapter.
void TinyGpt::InitAdapters() {
  const TinyGptConfig& c = config_;
  if (c.lora_rank == 0) return;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(c.lora_seed);
  const double a_std = 1.0 / std::sqrt(static_cast<double>(c.d_model));
  for (Block& p : blocks_) {
    p.lora_a = at::empty({c.lora_rank, c.d_model}, at::kFloat).normal_(0.0, a_std, gen);
    p.lora_b = at::empty({c.d_model, c.lora_rank}, at::kFloat).normal_(0.0, 0.05, gen);
  }
}

std::vector<NamedTensor> TinyGpt::ReferenceTrace(size_t i, const TensorList& inputs,
                                                 const LayerBatch& batch) {
  return reference_->Trace(i, inputs, batch);
}

LayerSequence& TinyGpt::Path(PathKind kind) {
  if (kind == PathKind::kReference) return *reference_;
  return *optimized_;
}

std::vector<NamedTensor> TinyGpt::NamedParameters() const { return named_; }

std::vector<at::Tensor> TinyGpt::parameters() const {
  std::vector<at::Tensor> out;
  out.reserve(named_.size());
  for (const auto& [name, tensor] : named_) out.push_back(tensor);
  return out;
}

ModelSpecInfo TinyGpt::Spec() const {
  SpecConfig json = config_.ToSpecConfig();
  json.Set("step", step_).Set("fault_armed", transient_armed_);
  const std::vector<std::string> on = EnabledFeatures();
  std::string off;
  for (const std::string& name : FeatureSwitches()) {
    if (std::find(on.begin(), on.end(), name) != on.end()) continue;
    off += (off.empty() ? "" : ",") + name;
  }
  // Only when a switch is off, so that the specs of every earlier capsule stay as they were.
  if (!off.empty()) json.Set("disabled_features", off);
  return {kRegistryName, json.ToJson()};
}

std::vector<std::string> TinyGpt::FeatureSwitches() const {
  return {"fused_layer_norm", "fused_softmax", "fused_gelu"};
}

std::vector<std::string> TinyGpt::EnabledFeatures() const {
  std::vector<std::string> on;
  if (fused_layer_norm_) on.emplace_back("fused_layer_norm");
  if (fused_softmax_) on.emplace_back("fused_softmax");
  if (fused_gelu_) on.emplace_back("fused_gelu");
  return on;
}

Status TinyGpt::SetEnabledFeatures(const std::vector<std::string>& enabled) {
  bool norm = false, softmax = false, gelu = false;
  for (const std::string& name : enabled) {
    if (name == "fused_layer_norm") {
      norm = true;
    } else if (name == "fused_softmax") {
      softmax = true;
    } else if (name == "fused_gelu") {
      gelu = true;
    } else {
      return InvalidArgumentError("tiny_gpt: no optimization switch '" + name +
                                  "' (fused_layer_norm, fused_softmax, fused_gelu)");
    }
  }
  fused_layer_norm_ = norm;
  fused_softmax_ = softmax;
  fused_gelu_ = gelu;
  return Status::Ok();
}

std::optional<LayerInputSpec> TinyGpt::LayerInputs(size_t i) const {
  const int64_t layer = static_cast<int64_t>(i);
  if (layer < 1 || layer > config_.n_layers) return std::nullopt;
  LayerInputSpec spec;
  spec.batch_dim = 0;
  spec.length_dim = 1;
  spec.max_length = config_.seq_len;
  spec.tile = kKernelTile;
  spec.max_abs = 1e4;
  return spec;
}

Status TinyGpt::SetFault(const FaultSpec& fault) {
  TinyGptConfig candidate = config_;
  candidate.fault = fault;
  CAPSULE_RETURN_IF_ERROR(candidate.Validate());
  config_.fault = fault;
  transient_armed_ = true;
  return Status::Ok();
}

bool TinyGpt::FaultActive(FaultKind kind, int64_t layer) {
  const FaultSpec& f = config_.fault;
  if (f.kind != kind || kind == FaultKind::kNone || kind == FaultKind::kBadData ||
      kind == FaultKind::kBadBatch) {
    return false;
  }
  if (config_.layer_index(f.layer) != layer) return false;
  if (kind == FaultKind::kTransient) return transient_armed_ && step_ == f.from_step;
  if (kind == FaultKind::kStepOnOverflow) return step_ == f.from_step;
  return step_ >= f.from_step;
}

bool TinyGpt::ObjectiveFaultActive(FaultKind kind) const {
  return config_.fault.kind == kind && step_ >= config_.fault.from_step;
}

bool TinyGpt::FaultFires(FaultKind kind, int64_t layer) {
  const bool active = FaultActive(kind, layer);
  if (active && kind == FaultKind::kTransient) transient_armed_ = false;
  return active;
}

}  // namespace capsule::tiny_gpt
