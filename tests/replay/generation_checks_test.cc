// The generation section's recorded settings (replay/internal/generation_checks.h): each check
// fires on a hand-built capsule that breaks it, and adds nothing on the near miss or when a side
// of its comparison was not recorded.
#include "capsule/replay/internal/generation_checks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/report/parity_text.h"

namespace capsule::internal {
namespace {

const std::string kHashA(64, 'a');
const std::string kHashB(64, 'b');

v1::Capsule WithFiles(const std::string& tokenizer, const std::string& tmpl) {
  v1::Capsule c;
  v1::FileIdentity* t = c.mutable_identity()->add_files();
  t->set_role("tokenizer");
  t->set_sha256(tokenizer);
  v1::FileIdentity* p = c.mutable_identity()->add_files();
  p->set_role("chat_template");
  p->set_sha256(tmpl);
  c.mutable_generation()->set_prompt_length(3);
  return c;
}

const v1::ParityFinding* Find(const v1::ParityReport& r, const std::string& check) {
  for (const v1::ParityFinding& f : r.findings()) {
    if (f.check() == check) return &f;
  }
  return nullptr;
}

TEST(GenerationChecks, ATokenizerOrTemplateOtherThanTrainingsIsNamed) {
  v1::Capsule c = WithFiles(kHashA, kHashA);
  c.mutable_generation()->set_tokenizer_sha256(kHashB);  // inference's tokenizer differs
  c.mutable_generation()->set_template_sha256(kHashA);   // its template is training's
  v1::ParityReport r;
  AddGenerationSettingChecks(c, at::Tensor(), &r);
  ASSERT_NE(Find(r, "tokenizer.training_vs_inference"), nullptr);
  EXPECT_TRUE(Find(r, "tokenizer.training_vs_inference")->failed());
  EXPECT_EQ(Find(r, "template.training_vs_inference"), nullptr);  // the same template
  // No adapter recorded on either side: nothing to compare, no finding.
  EXPECT_EQ(Find(r, "adapter.training_vs_inference"), nullptr);
  const std::string text = ParitySentence(r);
  EXPECT_NE(text.find("tokenizer.training_vs_inference"), std::string::npos) << text;
  EXPECT_NE(text.find("not the one the training run recorded"), std::string::npos) << text;
}

TEST(GenerationChecks, AnAdapterOtherThanTheRecordedOneIsNamed) {
  v1::Capsule c = WithFiles(kHashA, kHashA);
  v1::FileIdentity* a = c.mutable_identity()->add_files();
  a->set_role("adapter");
  a->set_sha256(kHashA);
  c.mutable_generation()->set_adapter_sha256(kHashB);
  v1::ParityReport r;
  AddGenerationSettingChecks(c, at::Tensor(), &r);
  ASSERT_NE(Find(r, "adapter.training_vs_inference"), nullptr);
  EXPECT_TRUE(Find(r, "adapter.training_vs_inference")->failed());
}

TEST(GenerationChecks, AStopTokenFollowedByMoreTokensIsNamedAtItsPosition) {
  v1::Capsule c = WithFiles("", "");
  c.mutable_generation()->mutable_sampling()->add_stop_tokens(7);
  // Prompt 3 tokens (one holds 7: prompts may), then generated 4, 7, 5: the stop at 4 was ignored.
  const at::Tensor ids = at::tensor({1, 7, 2, 4, 7, 5}, at::kLong).reshape({1, 6});
  v1::ParityReport r;
  AddGenerationSettingChecks(c, ids, &r);
  const v1::ParityFinding* f = Find(r, "stop_token.ignored");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->failed());
  EXPECT_EQ(f->position(), 4);
  EXPECT_EQ(f->value(), 7);
  const std::string text = ParitySentence(r);
  EXPECT_NE(text.find("stop token 7 generated at position 4"), std::string::npos) << text;

  // The near miss: the stop is the last token generated.
  v1::ParityReport ok;
  AddGenerationSettingChecks(c, at::tensor({1, 7, 2, 4, 5, 7}, at::kLong).reshape({1, 6}), &ok);
  EXPECT_EQ(Find(ok, "stop_token.ignored"), nullptr);
}

TEST(GenerationChecks, AQuantisedCacheNeedsItsScaleAndAFloatCacheHasNone) {
  const struct {
    const char* dtype;
    double scale;
    bool failed;
  } cases[] = {{"int8", 0, true},
               {"int8", 0.02, false},
               {"float8_e4m3fn", -1, true},
               {"bfloat16", 0, false},
               {"float32", 0.5, true}};
  for (const auto& k : cases) {
    v1::Capsule c = WithFiles("", "");
    c.mutable_generation()->mutable_cache()->set_dtype(k.dtype);
    c.mutable_generation()->mutable_cache()->set_quant_scale(k.scale);
    v1::ParityReport r;
    AddGenerationSettingChecks(c, at::Tensor(), &r);
    const v1::ParityFinding* f = Find(r, "cache.quant_scale");
    EXPECT_EQ(f != nullptr, k.failed) << k.dtype << " " << k.scale;
    if (f != nullptr) {
      EXPECT_TRUE(f->failed());
    }
  }
}

TEST(GenerationChecks, NothingRecordedNothingAdded) {
  v1::Capsule c;
  v1::ParityReport r;
  AddGenerationSettingChecks(c, at::Tensor(), &r);  // no generation section
  c.mutable_generation()->set_prompt_length(2);
  AddGenerationSettingChecks(c, at::tensor({1, 2, 3}, at::kLong).reshape({1, 3}), &r);
  EXPECT_EQ(r.findings_size(), 0);
}

}  // namespace
}  // namespace capsule::internal
