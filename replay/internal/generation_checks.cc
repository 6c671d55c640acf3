#include "capsule/replay/internal/generation_checks.h"

#include <ATen/ATen.h>

#include <set>
#include <string>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/parity.pb.h"

namespace capsule::internal {
namespace {

// The SHA-256 the training run recorded for its file of `role` (Identity.files); "" when none.
std::string TrainingSha256(const v1::Capsule& c, const std::string& role) {
  for (const v1::FileIdentity& f : c.identity().files()) {
    if (f.role() == role && !f.sha256().empty()) return f.sha256();
  }
  return "";
}

// A failed check's finding (a setting that holds adds none, as a clean decode adds none).
v1::ParityFinding* Fail(v1::ParityReport* r, const std::string& check, const std::string& read) {
  v1::ParityFinding* f = r->add_findings();
  f->set_check(check);
  f->set_failed(true);
  f->set_tensor(read);
  return f;
}

// The generation step's tokenizer, template and adapter are the files the training run hashed.
void CheckSameFiles(const v1::Capsule& c, v1::ParityReport* r) {
  const v1::Generation& g = c.generation();
  const struct {
    const char* check;
    const char* role;
    const std::string& inference;
  } pairs[] = {
      {"tokenizer.training_vs_inference", "tokenizer", g.tokenizer_sha256()},
      {"template.training_vs_inference", "chat_template", g.template_sha256()},
      {"adapter.training_vs_inference", "adapter", g.adapter_sha256()},
  };
  for (const auto& p : pairs) {
    const std::string training = TrainingSha256(c, p.role);
    if (!training.empty() && !p.inference.empty() && training != p.inference) {
      Fail(r, p.check, p.role);
    }
  }
}

// A generated token that is a stop token, followed by more generated tokens: the stop was not
// honoured (or the stop list is not the one the model was trained to end with).
void CheckStopTokens(const v1::Capsule& c, const at::Tensor& input_ids, v1::ParityReport* r) {
  const v1::Generation& g = c.generation();
  const int64_t prompt = g.prompt_length();
  if (!input_ids.defined() || input_ids.dim() != 2 || prompt <= 0 ||
      g.sampling().stop_tokens().empty()) {
    return;
  }
  const std::set<int64_t> stops(g.sampling().stop_tokens().begin(),
                                g.sampling().stop_tokens().end());
  const at::Tensor ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t rows = ids.size(0), seq = ids.size(1);
  const int64_t* data = ids.data_ptr<int64_t>();
  int64_t first = -1, token = 0;
  // The last generated token may be the stop itself; one before it may not.
  for (int64_t pos = prompt; pos + 1 < seq; ++pos) {
    for (int64_t row = 0; row < rows && first < 0; ++row) {
      if (stops.count(data[row * seq + pos]) != 0) first = pos, token = data[row * seq + pos];
    }
    if (first >= 0) break;
  }
  if (first < 0) return;
  v1::ParityFinding* f = Fail(r, "stop_token.ignored", "input_ids");
  f->set_position(first);
  f->set_value(static_cast<double>(token));
  f->set_threshold(static_cast<double>(prompt));
}

// A quantised cache (an integer or 8-bit float dtype) needs its scale; a float cache has none.
void CheckCacheScale(const v1::Capsule& c, v1::ParityReport* r) {
  const v1::KvCache& k = c.generation().cache();
  if (k.dtype().empty()) return;
  static const std::set<std::string> kQuantised = {"int8",          "uint8",       "int4",
                                                   "float8_e4m3fn", "float8_e5m2", "fp8"};
  const bool quantised = kQuantised.count(k.dtype()) != 0;
  const bool failed = quantised ? !(k.quant_scale() > 0) : k.quant_scale() != 0;
  if (failed) Fail(r, "cache.quant_scale", k.dtype())->set_value(k.quant_scale());
}

}  // namespace

void AddGenerationSettingChecks(const v1::Capsule& capsule, const at::Tensor& input_ids,
                                v1::ParityReport* report) {
  if (!capsule.has_generation()) return;
  CheckSameFiles(capsule, report);
  CheckStopTokens(capsule, input_ids, report);
  CheckCacheScale(capsule, report);
}

}  // namespace capsule::internal
