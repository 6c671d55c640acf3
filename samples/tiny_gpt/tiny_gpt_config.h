// TinyGptConfig: everything needed to construct a tiny_gpt model, as a value and as JSON.
//
// The JSON form is the construction config a capsule stores in its model spec; replay hands it back
// to the model registry, which rebuilds the same architecture, initial weights (from `seed`) and
// injected fault. It is a flat object of numbers and strings so that a person can read and edit it,
// written and read through SpecConfig (protobuf's JSON mapping), keys sorted.
//
//   TinyGptConfig config;
//   config.n_layers = 6;
//   std::string json = config.ToJson();   // {"d_model":64,"dropout":0,...}
//   CAPSULE_ASSIGN_OR_RETURN(TinyGptConfig same, TinyGptConfig::FromJson(json));
//
// Thread safety: a value type.
#ifndef CAPSULE_SAMPLES_TINY_GPT_TINY_GPT_CONFIG_H_
#define CAPSULE_SAMPLES_TINY_GPT_TINY_GPT_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "capsule/base/status.h"
#include "capsule/model/spec_config.h"
#include "samples/tiny_gpt/faults.h"

namespace capsule::tiny_gpt {

struct TinyGptConfig {
  int64_t vocab_size = 256;  // byte-level tokens; every id must be < vocab_size
  int64_t d_model = 64;      // width of the residual stream; divisible by n_heads
  int64_t n_heads = 4;
  int64_t n_layers = 4;  // transformer blocks
  int64_t seq_len = 32;  // maximum context (size of the positional table)
  int64_t mlp_mult = 4;  // MLP hidden width = mlp_mult * d_model
  double dropout = 0.0;  // residual and embedding dropout while LayerBatch::training
  double layer_norm_eps = 1e-5;
  uint64_t seed = 0;  // initial weights; JSON keeps it exact up to 2^64 - 1
  FaultSpec fault;    // injected fault (kind none by default)
  // Inference options, all off by default (ToJson writes them only when set):
  bool rope = false;  // rotary position embeddings on q and k instead of the learned table
  double rope_base = 10000.0;
  double rope_scale = 1.0;  // linear position interpolation: angles use position / rope_scale
  int64_t n_kv_heads = 0;   // key/value heads (grouped-query attention); 0: n_heads
  // Reads LayerBatch::attention_mask (and DecodeStep's): padded keys are hidden and position ids
  // count real tokens only, so a left-padded prompt sees the positions an unpadded one does.
  bool pad_mask = false;
  // A low-rank adapter on every block's attention output projection (attn.proj): the blocks
  // compute with W + (lora_alpha / lora_rank) * B @ A, A [rank, d] and B [d, rank] drawn from
  // lora_seed. It is an artifact of its own (TinyGpt::AdapterSha256), not a trained parameter;
  // the decoder can merge it into the weight (IncrementalDecoder::MergeAdapters). 0: none.
  int64_t lora_rank = 0;
  double lora_alpha = 8.0;
  uint64_t lora_seed = 0;

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  double lora_scale() const { return lora_rank > 0 ? lora_alpha / lora_rank : 0.0; }

  // kInvalidArgument when a field is out of range or the fault names a layer the model lacks or
  // where that kind has no effect.
  Status Validate() const;

  SpecConfig ToSpecConfig() const;
  std::string ToJson() const;  // ToSpecConfig().ToJson()

  // Reads what ToJson writes. Absent fields keep their defaults, so configs written before a field
  // existed still load; unknown keys are refused (a misspelt key would otherwise be ignored
  // silently). Also accepts the runtime keys TinyGpt::Spec adds ("step", "fault_armed"), which are
  // read by TinyGpt::FromSpec.
  static StatusOr<TinyGptConfig> FromJson(std::string_view json);
  static StatusOr<TinyGptConfig> FromSpecConfig(const SpecConfig& config);

  // Layers in execution order: "embed", "blocks.0" ... "blocks.{n_layers-1}", "ln_f", "lm_head",
  // "loss".
  int64_t num_layers() const { return n_layers + 4; }
  std::string layer_name(int64_t i) const;
  // The index of a layer name, or -1.
  int64_t layer_index(std::string_view name) const;

 private:
  Status ValidateInference() const;
  Status ValidateDecodeFault() const;
};

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_TINY_GPT_CONFIG_H_
