#include "capsule/format/json.h"

#include <gtest/gtest.h>

#include <cmath>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/report.pb.h"

namespace capsule {
namespace {

TEST(JsonTest, PrintsOneLineWithTheProtoFieldNamesAndEveryDefault) {
  v1::InputTrust trust;
  trust.set_file("a.capsule");
  trust.set_signature(v1::TRUST_UNSIGNED);
  const std::string json = MessageToJson(trust);
  EXPECT_EQ(json.find('\n'), std::string::npos) << json;
  EXPECT_EQ(json.find(": "), std::string::npos) << "no whitespace between key and value: " << json;
  EXPECT_NE(json.find("\"file\":\"a.capsule\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"signer_key_id\":\"\""), std::string::npos) << json;  // not signerKeyId
  EXPECT_NE(json.find("\"trusted\":false"), std::string::npos) << json;
  EXPECT_EQ(json.find("untrusted_source"), std::string::npos) << "absent message: " << json;
}

TEST(JsonTest, ARecordShownAsWrittenLeavesDefaultsOut) {
  v1::Capsule c;
  c.set_run_name("golden");
  EXPECT_EQ(MessageToJson(c, JsonDefaults::kOmitted), "{\"run_name\":\"golden\"}");
  EXPECT_NE(MessageToJson(c).find("\"writer_version\":\"\""), std::string::npos);
}

TEST(JsonTest, SixtyFourBitIntegersAreStringsAndNonFiniteNumbersNamed) {
  v1::Capsule c;
  c.set_created_unix_micros(1780000000000000);
  c.mutable_trigger()->set_observed(std::nan(""));
  const std::string json = MessageToJson(c, JsonDefaults::kOmitted);
  EXPECT_NE(json.find("\"created_unix_micros\":\"1780000000000000\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"observed\":\"NaN\""), std::string::npos) << json;
}

}  // namespace
}  // namespace capsule
