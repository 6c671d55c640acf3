#include "capsule/capture/generation.h"

#include <cmath>

#include "capsule/base/internal/sha256.h"

namespace capsule {
namespace {

bool IsSha256HexOrEmpty(const std::string& s) { return s.empty() || IsSha256Hex(s); }

}  // namespace

Status GenerationInfo::Validate() const {
  if (prompt_length < 0 || prefill_chunk < 0) {
    return InvalidArgumentError("generation: prompt_length and prefill_chunk must be >= 0");
  }
  if (!(std::isfinite(sampling.temperature) && sampling.temperature >= 0) || sampling.top_k < 0 ||
      !(sampling.top_p >= 0 && sampling.top_p <= 1)) {
    return InvalidArgumentError(
        "generation: temperature must be finite and >= 0, top_k >= 0 and top_p in [0, 1]");
  }
  if (!(std::isfinite(cache.quant_scale) && cache.quant_scale >= 0)) {
    return InvalidArgumentError("generation: cache quant_scale must be finite and >= 0");
  }
  if (!IsSha256HexOrEmpty(tokenizer_sha256) || !IsSha256HexOrEmpty(template_sha256) ||
      !IsSha256HexOrEmpty(adapter_sha256)) {
    return InvalidArgumentError(
        "generation: tokenizer, template and adapter hashes must be empty or 64 lowercase hex "
        "characters");
  }
  if (adapter_rank < 0 || !std::isfinite(adapter_alpha)) {
    return InvalidArgumentError("generation: adapter_rank must be >= 0 and adapter_alpha finite");
  }
  return Status::Ok();
}

}  // namespace capsule
