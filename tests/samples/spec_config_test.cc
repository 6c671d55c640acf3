// model/spec_config.h: a model's construction config written and read back through protobuf's
// JSON mapping.
#include "capsule/model/spec_config.h"

#include <gtest/gtest.h>

namespace capsule {
namespace {

TEST(SpecConfigTest, RoundTripsEveryTypeWithSortedKeys) {
  SpecConfig c;
  c.Set("hidden", 64).Set("lr", 3e-4).Set("act", "relu \"quoted\"").Set("bias", true);
  const std::string json = c.ToJson();
  EXPECT_EQ(json, R"({"act":"relu \"quoted\"","bias":true,"hidden":64,"lr":0.0003})");
  auto back = SpecConfig::Parse(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back->GetInt("hidden"), 64);
  EXPECT_DOUBLE_EQ(*back->GetDouble("lr"), 3e-4);
  EXPECT_EQ(*back->GetString("act"), "relu \"quoted\"");
  EXPECT_TRUE(*back->GetBool("bias"));
  EXPECT_EQ(back->ToJson(), json);
}

TEST(SpecConfigTest, MissingWrongTypeAndDefaults) {
  auto c = SpecConfig::Parse(R"({"layers": 2.5, "name": "x"})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->GetInt("hidden").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*c->GetInt("hidden", 32), 32);
  EXPECT_EQ(c->GetInt("layers").status().code(), StatusCode::kInvalidArgument);  // not integral
  EXPECT_EQ(c->GetInt("name", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SpecConfig::Parse("[1, 2]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SpecConfig::Parse("{").status().code(), StatusCode::kInvalidArgument);
}

TEST(SpecConfigTest, UnsignedValuesStayExactAndKeysAreListed) {
  SpecConfig c;
  c.Set("small", uint64_t{7}).Set("huge", uint64_t{18446744073709551615ull});
  // A number while a double holds it exactly; protobuf's decimal string for 64-bit values above.
  EXPECT_EQ(c.ToJson(), R"({"huge":"18446744073709551615","small":7})");
  auto back = SpecConfig::Parse(c.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back->GetUint("huge"), 18446744073709551615ull);
  EXPECT_EQ(*back->GetUint("small"), 7u);
  EXPECT_EQ(*back->GetUint("absent", 3), 3u);
  EXPECT_EQ(back->Keys(), (std::vector<std::string>{"huge", "small"}));
  auto bad = SpecConfig::Parse(R"({"n": -1, "s": "1e3", "t": "", "u": 2.5})");
  ASSERT_TRUE(bad.ok());
  for (const char* key : {"n", "s", "t", "u"}) {
    EXPECT_EQ(bad->GetUint(key).status().code(), StatusCode::kInvalidArgument) << key;
  }
}

}  // namespace
}  // namespace capsule
