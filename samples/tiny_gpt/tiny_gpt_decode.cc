// TinyGpt's incremental decoder: the OPTIMIZED path's FP32 kernels over a key/value cache, in eval
// mode. Each block caches the position ids, the rotated keys and the values of every token it has
// seen ([B, H_kv, past, dh]); a step's queries attend to the cache and to themselves, the causal
// mask shifted by the cache's length. The decode faults of faults.h switch on in steps after the
// first (past > 0), where a whole-sequence forward never goes. The blocks' adapters run as the
// training paths run them, or merged into the weight (MergeAdapters), where the merge faults live.
#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "samples/tiny_gpt/internal/attention.h"
#include "samples/tiny_gpt/internal/block.h"
#include "samples/tiny_gpt/ops.h"
#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule::tiny_gpt {

class TinyGpt::DecodePath : public IncrementalDecoder {
 public:
  explicit DecodePath(TinyGpt* model) : m_(*model) {}

  size_t size() const override { return static_cast<size_t>(m_.config_.num_layers() - 1); }
  std::string name(size_t i) const override { return m_.config_.layer_name(i); }
  at::ScalarType compute_dtype() const override { return at::kFloat; }

  void ResetCache() override { cache_.assign(size(), {}); }

  TensorList ForwardStep(size_t i, const TensorList& inputs, const DecodeStep& step) override {
    const TinyGptConfig& c = m_.config_;
    const int64_t layer = static_cast<int64_t>(i);
    TORCH_CHECK(i < size(), "tiny_gpt decoder: no layer ", i, " (it has ", size(), ")");
    TORCH_CHECK(inputs.size() == 1 && inputs[0].defined(), "tiny_gpt decoder ", c.layer_name(layer),
                ": expects exactly one input tensor");
    if (cache_.size() != size()) ResetCache();
    LayerCache& cache = cache_[i];
    TORCH_CHECK(cache.length == step.past, "tiny_gpt decoder ", c.layer_name(layer),
                ": cache holds ", cache.length, " positions, the step says ", step.past);
    cache.length += step.input_ids.size(1);
    if (layer == 0) return {Embed(inputs[0], step, cache)};
    const at::Tensor x = inputs[0].to(at::kFloat);
    if (layer <= c.n_layers) return {Block(m_.blocks_[layer - 1], layer, x, step, cache)};
    if (layer == c.n_layers + 1) {
      return {FusedLayerNorm(x, m_.ln_f_weight_, m_.ln_f_bias_, c.layer_norm_eps)};
    }
    return {at::matmul(x, m_.lm_head_weight_.t())};
  }

  std::vector<NamedTensor> Cache(size_t i) const override {
    if (i >= cache_.size() || !cache_[i].pos.defined()) return {};
    const LayerCache& c = cache_[i];
    if (!c.k.defined()) return {{"pos", c.pos}};
    return {{"pos", c.pos}, {"k", c.k}, {"v", c.v}};
  }

  std::vector<NamedTensor> Probe(size_t i) const override {
    if (i >= cache_.size() || !cache_[i].attn.defined()) return {};
    return {{"attn", cache_[i].attn}};
  }

  std::vector<NamedTensor> ReferenceTrace(size_t i, const TensorList& inputs,
                                          const LayerBatch& batch) override {
    return m_.ReferenceTrace(i, inputs, batch);
  }

  std::vector<LowRankAdapter> Adapters(size_t i) const override {
    const int64_t layer = static_cast<int64_t>(i);
    if (layer < 1 || layer > m_.config_.n_layers) return {};
    const TinyGpt::Block& p = m_.blocks_[layer - 1];
    if (!p.lora_a.defined()) return {};
    LowRankAdapter a;
    a.weight = m_.config_.layer_name(layer) + ".attn.proj.weight";
    a.base = p.proj_w.detach();
    a.a = p.lora_a;
    a.b = p.lora_b;
    a.scale = m_.config_.lora_scale();
    if (static_cast<size_t>(layer - 1) < merged_.size()) a.merged = merged_[layer - 1];
    return {a};
  }

  void MergeAdapters(std::optional<at::ScalarType> dtype) override {
    merged_.clear();
    if (!dtype) return;
    for (int64_t layer = 1; layer <= m_.config_.n_layers; ++layer) {
      merged_.push_back(Merge(layer, *dtype));
    }
  }

 private:
  struct LayerCache {
    int64_t length = 0;  // positions seen, by every layer (cached or not)
    at::Tensor pos;      // int64 [B, past]
    at::Tensor k, v;     // [B, H_kv, past, dh]; k rotated when rope is on
    at::Tensor attn;     // the last step's attention weights [B, H, T, past + T]
  };

  static at::Tensor Append(const at::Tensor& cached, const at::Tensor& fresh, int64_t dim) {
    return cached.defined() ? at::cat({cached, fresh}, dim) : fresh;
  }

  // The new tokens' position ids. left-pad-positions: steps after the first count from the
  // cache's length, padding included.
  at::Tensor Positions(const DecodeStep& step) const {
    const TinyGptConfig& c = m_.config_;
    const int64_t b = step.input_ids.size(0);
    const int64_t t = step.input_ids.size(1);
    const bool forgets_padding =
        step.past > 0 && m_.ObjectiveFaultActive(FaultKind::kLeftPadPositions);
    const at::Tensor mask = c.pad_mask && !forgets_padding ? step.attention_mask : at::Tensor();
    return internal::PositionIds(mask, b, step.past, t);
  }

  at::Tensor Embed(const at::Tensor& ids, const DecodeStep& step, LayerCache& cache) {
    const TinyGptConfig& c = m_.config_;
    TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong,
                "tiny_gpt decoder embed: input_ids must be int64 [batch, T], got ", ids.sizes());
    TORCH_CHECK(step.past + ids.size(1) <= c.seq_len, "tiny_gpt decoder: position ",
                step.past + ids.size(1) - 1, " is beyond seq_len ", c.seq_len);
    const at::Tensor pos = Positions(step);
    cache.pos = Append(cache.pos, pos, 1);
    const at::Tensor tokens = at::embedding(m_.tok_embedding_, ids);
    if (c.rope) return tokens;
    return tokens + at::embedding(m_.pos_embedding_, pos);
  }

  // The keys and values the step attends to, after the new ones are cached.
  std::pair<at::Tensor, at::Tensor> CacheKeys(int64_t layer, const internal::Qkv& p,
                                              const at::Tensor& pos, bool later,
                                              LayerCache& cache) {
    const TinyGptConfig& c = m_.config_;
    at::Tensor k = p.k;
    if (c.rope && m_.FaultActive(FaultKind::kRerotatedKey, layer) && later) {
      // The cache already holds rotated keys; rotating all of it again turns the old ones twice.
      cache.k = internal::Rope(Append(cache.k, k, 2), Append(cache.pos, pos, 1), c);
    } else {
      if (c.rope) k = internal::Rope(k, RotaryPositions(layer, pos, later), c);
      cache.k = Append(cache.k, k, 2);
    }
    cache.v = Append(cache.v, p.v, 2);
    cache.pos = Append(cache.pos, pos, 1);
    const bool modulo = m_.FaultActive(FaultKind::kGqaDecodeMap, layer) && later;
    return {internal::ExpandKv(cache.k, c.n_heads, modulo),
            internal::ExpandKv(cache.v, c.n_heads, modulo)};
  }

  // rope-decode-position: steps after the first rotate by the position within the step.
  at::Tensor RotaryPositions(int64_t layer, const at::Tensor& pos, bool later) const {
    if (!(later && m_.FaultActive(FaultKind::kRopeDecode, layer))) return pos;
    return at::arange(pos.size(1), at::kLong).unsqueeze(0).expand_as(pos);
  }

  at::Tensor Block(const TinyGpt::Block& p, int64_t layer, const at::Tensor& x,
                   const DecodeStep& step, LayerCache& cache) {
    const TinyGptConfig& c = m_.config_;
    const bool later = step.past > 0;
    const double head_scale = 1.0 / std::sqrt(static_cast<double>(c.d_model / c.n_heads));
    const at::Tensor pos = Positions(step);
    const at::Tensor h = FusedLayerNorm(x, p.ln1_w, p.ln1_b, c.layer_norm_eps);
    internal::Qkv parts = internal::SplitQkv(at::linear(h, p.qkv_w, p.qkv_b), c);
    if (c.rope) parts.q = internal::Rope(parts.q, RotaryPositions(layer, pos, later), c);
    const auto [k, v] = CacheKeys(layer, parts, pos, later, cache);

    at::Tensor scores = at::matmul(parts.q, k.transpose(-2, -1));
    if (c.pad_mask && step.attention_mask.defined()) {
      scores = internal::HidePaddedKeys(scores, step.attention_mask);
    }
    // mask-offset: the causal mask of a step that starts at position 0.
    const int64_t offset = m_.FaultActive(FaultKind::kMaskOffset, layer) ? 0 : step.past;
    cache.attn = internal::OffsetCausalSoftmax(scores, head_scale, offset);
    const at::Tensor attn = Project(layer, p, internal::MergeHeads(at::matmul(cache.attn, v)));
    const bool dropout = later && m_.FaultActive(FaultKind::kDropoutInEval, layer);
    const at::Tensor y = x + (dropout ? EvalDropout(attn) : attn);
    const at::Tensor h2 = FusedLayerNorm(y, p.ln2_w, p.ln2_b, c.layer_norm_eps);
    return y + at::linear(FusedGelu(at::linear(h2, p.fc1_w, p.fc1_b)), p.fc2_w, p.fc2_b);
  }

  // The residual dropout the dropout-in-eval fault leaves on.
  at::Tensor EvalDropout(const at::Tensor& x) const {
    const double p = m_.config_.dropout;
    return x * at::empty_like(x).bernoulli_(1.0 - p) / (1.0 - p);
  }

  // W + scale * B @ A, computed and stored in `dtype`. bf16-merge: in bfloat16, whatever the
  // dtype asked for; merge-twice: the delta added a second time.
  at::Tensor Merge(int64_t layer, at::ScalarType dtype) {
    const TinyGpt::Block& p = m_.blocks_[layer - 1];
    if (!p.lora_a.defined()) return {};
    at::NoGradGuard no_grad;
    const at::ScalarType in = m_.FaultActive(FaultKind::kBf16Merge, layer) ? at::kBFloat16 : dtype;
    const at::Tensor delta = (at::matmul(p.lora_b, p.lora_a) * m_.config_.lora_scale()).to(in);
    at::Tensor w = p.proj_w.detach().to(in) + delta;
    if (m_.FaultActive(FaultKind::kMergeTwice, layer)) w = w + delta;
    return w.to(dtype);
  }

  // The attention output projection: the merged weight once MergeAdapters ran, else the adapter
  // applied at run time (FP32).
  at::Tensor Project(int64_t layer, const TinyGpt::Block& p, const at::Tensor& x) const {
    const size_t b = static_cast<size_t>(layer - 1);
    if (b < merged_.size() && merged_[b].defined()) {
      return at::linear(x, merged_[b].to(x.scalar_type()), p.proj_b);
    }
    return internal::AdaptedLinear(x, p.proj_w, p.proj_b, p.lora_a, p.lora_b,
                                   m_.config_.lora_scale());
  }

  TinyGpt& m_;
  std::vector<LayerCache> cache_;
  std::vector<at::Tensor> merged_;  // per block, while merged (MergeAdapters)
};

std::unique_ptr<IncrementalDecoder> TinyGpt::MakeDecodePath() {
  return std::make_unique<DecodePath>(this);
}

IncrementalDecoder& TinyGpt::Decoder() { return *decoder_; }

}  // namespace capsule::tiny_gpt
