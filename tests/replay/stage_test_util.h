// What the triage stage tests share: a right-padded language-model batch, and the lookups of a
// stage's findings by check name.
#ifndef CAPSULE_TESTS_REPLAY_STAGE_TEST_UTIL_H_
#define CAPSULE_TESTS_REPLAY_STAGE_TEST_UTIL_H_

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "capsule/model/layer_sequence.h"
#include "capsule/proto/replay_report.pb.h"

namespace capsule::stage_test {

inline constexpr int64_t kVocab = 32;
inline constexpr int64_t kPad = 0;

// Right-padded sequences of random tokens in [1, kVocab): `lengths[b]` real tokens, then the pad
// id. Labels are the next input (declared shifted): -100 after the last real token, and at padded
// positions the pad id (or -100 with `ignore_pad`), with the loss mask 0 at both.
inline LayerBatch PaddedBatch(const std::vector<int64_t>& lengths, int64_t seq, uint64_t seed,
                              bool ignore_pad = false) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  const int64_t n = static_cast<int64_t>(lengths.size());
  LayerBatch b;
  b.input_ids = at::randint(1, kVocab, {n, seq + 1}, g, at::kLong);
  b.attention_mask = at::ones({n, seq}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    b.input_ids[i].slice(0, lengths[i]).fill_(kPad);
    b.attention_mask[i].slice(0, lengths[i]).fill_(0);
  }
  b.labels = b.input_ids.slice(1, 1, seq + 1).clone();
  b.input_ids = b.input_ids.slice(1, 0, seq).contiguous();
  b.loss_mask = b.attention_mask.clone();
  // The last real token has no next token in the sample: no target.
  for (int64_t i = 0; i < n; ++i) {
    if (lengths[i] > 0) b.loss_mask[i][lengths[i] - 1] = 0;
  }
  b.labels.masked_fill_(b.loss_mask.eq(0), ignore_pad ? -100 : kPad);
  b.labels.masked_fill_(b.loss_mask.eq(0).logical_and(b.attention_mask.ne(0)), -100);
  b.labels_shifted = true;
  b.training = false;
  return b;
}

// Every finding of `check` in `r`, in the stage's order.
inline std::vector<const v1::Finding*> FindAll(const v1::StageReport& r, const std::string& check) {
  std::vector<const v1::Finding*> out;
  for (const v1::Finding& f : r.findings()) {
    if (f.check() == check) out.push_back(&f);
  }
  return out;
}

// The first finding of `check`; null when there is none.
inline const v1::Finding* Find(const v1::StageReport& r, const std::string& check) {
  const auto all = FindAll(r, check);
  return all.empty() ? nullptr : all.front();
}

// The check names of the failed findings, in order.
inline std::vector<std::string> FailedChecks(const v1::StageReport& r) {
  std::vector<std::string> out;
  for (const v1::Finding& f : r.findings()) {
    if (f.failed()) out.push_back(f.check());
  }
  return out;
}

}  // namespace capsule::stage_test

#endif  // CAPSULE_TESTS_REPLAY_STAGE_TEST_UTIL_H_
