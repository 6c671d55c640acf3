// The parameters of one tiny_gpt block, shared by the files that run blocks (tiny_gpt.cc and the
// incremental decoder, tiny_gpt_decode.cc).
//
// Thread safety: a plain struct of the model's tensors.
#ifndef CAPSULE_SAMPLES_TINY_GPT_INTERNAL_BLOCK_H_
#define CAPSULE_SAMPLES_TINY_GPT_INTERNAL_BLOCK_H_

#include <ATen/Tensor.h>

#include "samples/tiny_gpt/tiny_gpt.h"

namespace capsule::tiny_gpt {

struct TinyGpt::Block {
  at::Tensor ln1_w, ln1_b;
  at::Tensor qkv_w, qkv_b;    // [d + 2 kv, d], [d + 2 kv]: rows are q, then k, then v (kv =
                              // n_kv_heads * d / n_heads: d without grouped-query attention)
  at::Tensor proj_w, proj_b;  // [d, d], [d]
  // proj's low-rank adapter (TinyGptConfig::lora_rank): [rank, d], [d, rank]; undefined without.
  at::Tensor lora_a, lora_b;
  at::Tensor ln2_w, ln2_b;
  at::Tensor fc1_w, fc1_b;  // [mlp_mult*d, d]
  at::Tensor fc2_w, fc2_b;  // [d, mlp_mult*d]
};

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_INTERNAL_BLOCK_H_
