// GenerationInfo: how an incremental decode ran the batch a capsule holds, for a capture made
// during generation or for a parity check (capsule.v1.Generation). The batch itself (StepBatch)
// carries the tokens, the prompt followed by the tokens generated so far, and the attention mask;
// this says where the prompt ends, how the prefill was chunked and what the decode loop was set
// to. With it, `capsule replay` runs its parity mode (replay/parity.h): the whole sequence
// against prefill + cached decode.
//
//   capsule::GenerationInfo g;
//   g.prompt_length = prompt.size(1);
//   g.sampling.temperature = 0.7;
//   CAPSULE_RETURN_IF_ERROR(monitor.SetGeneration(g));
//   monitor.BeginStep(step, cursor, batch);   // input_ids = prompt + generated
//   monitor.CaptureNow("parity check");
//
// Thread safety: a value type.
#ifndef CAPSULE_CAPTURE_GENERATION_H_
#define CAPSULE_CAPTURE_GENERATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capsule/base/status.h"

namespace capsule {

struct SamplingInfo {
  double temperature = 0;  // 0: greedy
  int32_t top_k = 0;       // 0: off
  double top_p = 0;        // 0 or 1: off
  uint64_t seed = 0;
  std::vector<int64_t> stop_tokens;
};

struct KvCacheInfo {
  std::string layout;  // e.g. "batch,kv_heads,position,head_dim"
  std::string dtype;   // "float32", "bfloat16", "int8"
  bool post_rotation_keys = false;
  double quant_scale = 0;  // 0: not quantised
};

struct GenerationInfo {
  int64_t prompt_length = 0;  // 0: not recorded (replay prefills half the sequence)
  int64_t prefill_chunk = 0;  // 0: the whole prompt in one step
  SamplingInfo sampling;
  KvCacheInfo cache;
  bool adapter_merged = false;
  std::string adapter_name;
  int64_t adapter_rank = 0;  // 0: not recorded
  double adapter_alpha = 0;  // the delta is adapter_alpha / adapter_rank * B @ A
  std::string adapter_sha256;
  std::string tokenizer_sha256;  // empty or 64 lowercase hex
  std::string template_sha256;

  // kInvalidArgument naming the first field out of the range capsule.proto gives it.
  Status Validate() const;
};

}  // namespace capsule

#endif  // CAPSULE_CAPTURE_GENERATION_H_
