#include "samples/tiny_gpt/tiny_gpt_config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

namespace capsule::tiny_gpt {
namespace {

constexpr char kBlockPrefix[] = "blocks.";

bool IsBlock(std::string_view layer) { return layer.rfind(kBlockPrefix, 0) == 0; }

Status ConfigError(const std::string& message) {
  return InvalidArgumentError("tiny_gpt config: " + message);
}

}  // namespace

std::string TinyGptConfig::layer_name(int64_t i) const {
  if (i == 0) return "embed";
  if (i >= 1 && i <= n_layers) return kBlockPrefix + std::to_string(i - 1);
  if (i == n_layers + 1) return "ln_f";
  if (i == n_layers + 2) return "lm_head";
  if (i == n_layers + 3) return "loss";
  return "";
}

int64_t TinyGptConfig::layer_index(std::string_view name) const {
  if (name == "embed") return 0;
  if (name == "ln_f") return n_layers + 1;
  if (name == "lm_head") return n_layers + 2;
  if (name == "loss") return n_layers + 3;
  if (!IsBlock(name)) return -1;
  const std::string digits(name.substr(sizeof(kBlockPrefix) - 1));
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos ||
      (digits.size() > 1 && digits[0] == '0')) {
    return -1;
  }
  const int64_t block = std::strtoll(digits.c_str(), nullptr, 10);
  return block < n_layers ? block + 1 : -1;
}

Status TinyGptConfig::Validate() const {
  if (vocab_size < 1) return ConfigError("vocab_size must be >= 1");
  if (d_model < 1 || n_heads < 1 || d_model % n_heads != 0) {
    return ConfigError("d_model (" + std::to_string(d_model) +
                       ") must be a positive multiple of n_heads (" + std::to_string(n_heads) +
                       ")");
  }
  if (n_layers < 0) return ConfigError("n_layers must be >= 0");
  if (seq_len < 1) return ConfigError("seq_len must be >= 1");
  if (mlp_mult < 1) return ConfigError("mlp_mult must be >= 1");
  if (!(dropout >= 0.0 && dropout < 1.0)) return ConfigError("dropout must be in [0, 1)");
  if (!(layer_norm_eps > 0.0)) return ConfigError("layer_norm_eps must be > 0");
  if (fault.from_step < 0) return ConfigError("fault_from_step must be >= 0");
  CAPSULE_RETURN_IF_ERROR(ValidateInference());

  const std::string& layer = fault.layer;
  const std::string kind = FaultKindName(fault.kind);
  switch (fault.kind) {
    case FaultKind::kNone:
    case FaultKind::kBadData:
    case FaultKind::kLossSum:
    case FaultKind::kLabelsUnshifted:
    case FaultKind::kBadBatch:
    case FaultKind::kPadInLoss:
    case FaultKind::kAccumScale:
    case FaultKind::kDecayOnNorm:
    case FaultKind::kClipBeforeUnscale:
      return Status::Ok();
    case FaultKind::kNan:
    case FaultKind::kTransient:
    case FaultKind::kStepOnOverflow:
    case FaultKind::kFrozenUpdated:
      if (layer_index(layer) < 0) {
        return ConfigError("fault " + kind + " names unknown layer '" + layer +
                           "' (use embed, blocks.0-" + std::to_string(n_layers - 1) +
                           ", ln_f, lm_head or loss)");
      }
      return Status::Ok();
    case FaultKind::kSoftmaxOverflow:
    case FaultKind::kTailBlock:
    case FaultKind::kDisconnected:
    case FaultKind::kGeluGrad:
      if (!IsBlock(layer) || layer_index(layer) < 0) {
        return ConfigError("fault " + kind + " needs a block layer (blocks.0-" +
                           std::to_string(n_layers - 1) + "), got '" + layer + "'");
      }
      return Status::Ok();
    case FaultKind::kMaskOffset:
    case FaultKind::kRopeDecode:
    case FaultKind::kRerotatedKey:
    case FaultKind::kGqaDecodeMap:
    case FaultKind::kDropoutInEval:
    case FaultKind::kLeftPadPositions:
    case FaultKind::kBf16Merge:
    case FaultKind::kMergeTwice:
      return ValidateDecodeFault();
    case FaultKind::kEps:
      if (layer != "ln_f" && (!IsBlock(layer) || layer_index(layer) < 0)) {
        return ConfigError("fault eps needs a layer with a layer norm (blocks.N or ln_f), got '" +
                           layer + "'");
      }
      return Status::Ok();
  }
  return ConfigError("unknown fault kind");
}

Status TinyGptConfig::ValidateInference() const {
  if (n_kv_heads < 0 || n_heads % kv_heads() != 0) {
    return ConfigError("n_kv_heads (" + std::to_string(n_kv_heads) + ") must divide n_heads (" +
                       std::to_string(n_heads) + "); 0 means n_heads");
  }
  if (rope && (d_model / n_heads) % 2 != 0) {
    return ConfigError("rope needs an even head width, got " + std::to_string(d_model / n_heads));
  }
  if (!(rope_base > 1.0)) return ConfigError("rope_base must be > 1");
  if (!(rope_scale > 0.0)) return ConfigError("rope_scale must be > 0");
  if (lora_rank < 0 || lora_rank > d_model) {
    return ConfigError("lora_rank must be in 0..d_model (" + std::to_string(d_model) + ")");
  }
  if (!std::isfinite(lora_alpha)) return ConfigError("lora_alpha must be finite");
  return Status::Ok();
}

// The decode faults live in the incremental decoder; each needs the option whose code it breaks.
Status TinyGptConfig::ValidateDecodeFault() const {
  const std::string kind = FaultKindName(fault.kind);
  if (fault.kind == FaultKind::kLeftPadPositions) {
    return pad_mask ? Status::Ok() : ConfigError("fault " + kind + " needs pad_mask");
  }
  if (!IsBlock(fault.layer) || layer_index(fault.layer) < 0) {
    return ConfigError("fault " + kind + " needs a block layer (blocks.0-" +
                       std::to_string(n_layers - 1) + "), got '" + fault.layer + "'");
  }
  const bool rope_fault =
      fault.kind == FaultKind::kRopeDecode || fault.kind == FaultKind::kRerotatedKey;
  if (rope_fault && !rope) return ConfigError("fault " + kind + " needs rope");
  if (fault.kind == FaultKind::kGqaDecodeMap && kv_heads() == n_heads) {
    return ConfigError("fault " + kind + " needs n_kv_heads < n_heads");
  }
  if (fault.kind == FaultKind::kDropoutInEval && !(dropout > 0.0)) {
    return ConfigError("fault " + kind + " needs dropout > 0");
  }
  const bool merge_fault =
      fault.kind == FaultKind::kBf16Merge || fault.kind == FaultKind::kMergeTwice;
  if (merge_fault && lora_rank == 0) return ConfigError("fault " + kind + " needs lora_rank > 0");
  return Status::Ok();
}

SpecConfig TinyGptConfig::ToSpecConfig() const {
  SpecConfig c;
  c.Set("vocab_size", vocab_size)
      .Set("d_model", d_model)
      .Set("n_heads", n_heads)
      .Set("n_layers", n_layers)
      .Set("seq_len", seq_len)
      .Set("mlp_mult", mlp_mult)
      .Set("dropout", dropout)
      .Set("layer_norm_eps", layer_norm_eps)
      .Set("seed", seed)
      .Set("fault", std::string(FaultKindName(fault.kind)))
      .Set("fault_layer", fault.layer)
      .Set("fault_from_step", fault.from_step);
  // The inference options only when set, so that a config without them reads as before.
  const TinyGptConfig defaults;
  if (rope) c.Set("rope", rope);
  if (rope_base != defaults.rope_base) c.Set("rope_base", rope_base);
  if (rope_scale != defaults.rope_scale) c.Set("rope_scale", rope_scale);
  if (n_kv_heads != defaults.n_kv_heads) c.Set("n_kv_heads", n_kv_heads);
  if (pad_mask) c.Set("pad_mask", pad_mask);
  if (lora_rank != defaults.lora_rank) c.Set("lora_rank", lora_rank);
  if (lora_alpha != defaults.lora_alpha) c.Set("lora_alpha", lora_alpha);
  if (lora_seed != defaults.lora_seed) c.Set("lora_seed", lora_seed);
  return c;
}

std::string TinyGptConfig::ToJson() const { return ToSpecConfig().ToJson(); }

StatusOr<TinyGptConfig> TinyGptConfig::FromJson(std::string_view json) {
  StatusOr<SpecConfig> parsed = SpecConfig::Parse(json);
  if (!parsed.ok()) return ConfigError(std::string(parsed.status().message()));
  return FromSpecConfig(*parsed);
}

StatusOr<TinyGptConfig> TinyGptConfig::FromSpecConfig(const SpecConfig& s) {
  static const std::set<std::string> kKnown = {
      "vocab_size",  "d_model",         "n_heads",        "n_layers",    "seq_len",
      "mlp_mult",    "dropout",         "layer_norm_eps", "seed",        "fault",
      "fault_layer", "fault_from_step", "step",           "fault_armed", "disabled_features",
      "rope",        "rope_base",       "rope_scale",     "n_kv_heads",  "pad_mask",
      "lora_rank",   "lora_alpha",      "lora_seed"};
  for (const std::string& key : s.Keys()) {
    if (kKnown.count(key) == 0) return ConfigError("unknown key \"" + key + "\"");
  }
  // Absent keys keep the defaults; a value of the wrong type is refused.
  TinyGptConfig c;
  const Status read = [&]() -> Status {
    CAPSULE_ASSIGN_OR_RETURN(c.vocab_size, s.GetInt("vocab_size", c.vocab_size));
    CAPSULE_ASSIGN_OR_RETURN(c.d_model, s.GetInt("d_model", c.d_model));
    CAPSULE_ASSIGN_OR_RETURN(c.n_heads, s.GetInt("n_heads", c.n_heads));
    CAPSULE_ASSIGN_OR_RETURN(c.n_layers, s.GetInt("n_layers", c.n_layers));
    CAPSULE_ASSIGN_OR_RETURN(c.seq_len, s.GetInt("seq_len", c.seq_len));
    CAPSULE_ASSIGN_OR_RETURN(c.mlp_mult, s.GetInt("mlp_mult", c.mlp_mult));
    CAPSULE_ASSIGN_OR_RETURN(c.dropout, s.GetDouble("dropout", c.dropout));
    CAPSULE_ASSIGN_OR_RETURN(c.layer_norm_eps, s.GetDouble("layer_norm_eps", c.layer_norm_eps));
    CAPSULE_ASSIGN_OR_RETURN(c.seed, s.GetUint("seed", c.seed));
    std::string kind_name = "none";
    if (s.Has("fault")) {
      CAPSULE_ASSIGN_OR_RETURN(kind_name, s.GetString("fault"));
    }
    CAPSULE_ASSIGN_OR_RETURN(c.fault.kind, ParseFaultKind(kind_name));
    if (s.Has("fault_layer")) {
      CAPSULE_ASSIGN_OR_RETURN(c.fault.layer, s.GetString("fault_layer"));
    }
    CAPSULE_ASSIGN_OR_RETURN(c.fault.from_step, s.GetInt("fault_from_step", c.fault.from_step));
    CAPSULE_ASSIGN_OR_RETURN(c.rope, s.GetBool("rope", c.rope));
    CAPSULE_ASSIGN_OR_RETURN(c.rope_base, s.GetDouble("rope_base", c.rope_base));
    CAPSULE_ASSIGN_OR_RETURN(c.rope_scale, s.GetDouble("rope_scale", c.rope_scale));
    CAPSULE_ASSIGN_OR_RETURN(c.n_kv_heads, s.GetInt("n_kv_heads", c.n_kv_heads));
    CAPSULE_ASSIGN_OR_RETURN(c.pad_mask, s.GetBool("pad_mask", c.pad_mask));
    CAPSULE_ASSIGN_OR_RETURN(c.lora_rank, s.GetInt("lora_rank", c.lora_rank));
    CAPSULE_ASSIGN_OR_RETURN(c.lora_alpha, s.GetDouble("lora_alpha", c.lora_alpha));
    CAPSULE_ASSIGN_OR_RETURN(c.lora_seed, s.GetUint("lora_seed", c.lora_seed));
    return Status::Ok();
  }();
  if (!read.ok()) return ConfigError(std::string(read.message()));
  CAPSULE_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace capsule::tiny_gpt
