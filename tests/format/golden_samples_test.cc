// The golden samples in samples/golden: each file listed in EXPECTED decodes to exactly the status
// code written next to it, with the default ReadOptions trusting the TEST-ONLY public key.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "capsule/base/file_util.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

struct GoldenCase {
  std::string file;
  std::string expected;
};

std::vector<GoldenCase> LoadExpected() {
  std::vector<GoldenCase> cases;
  std::ifstream in(std::string(CAPSULE_SOURCE_DIR) + "/samples/golden/EXPECTED");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    GoldenCase c;
    words >> c.file >> c.expected;
    cases.push_back(c);
  }
  return cases;
}

class GoldenSampleTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenSampleTest, DecodesToTheExpectedCode) {
  const std::string dir = std::string(CAPSULE_SOURCE_DIR) + "/samples";
  auto pub = LoadPublicKeyFile(dir + "/keys/test-only.pub");
  ASSERT_TRUE(pub.ok()) << pub.status();
  ReadOptions options;
  options.trusted_keys.push_back(*pub);
  auto decoded = ReadCapsuleFile(dir + "/golden/" + GetParam().file, options);
  const std::string got(decoded.ok() ? "OK" : StatusCodeName(decoded.status().code()));
  EXPECT_EQ(got, GetParam().expected) << (decoded.ok() ? "" : decoded.status().message());
  if (decoded.ok()) {
    EXPECT_EQ(decoded->envelope.signature, SignatureState::kVerified);
    EXPECT_NE(decoded->capsule->trigger().kind(), v1::TRIGGER_KIND_UNSPECIFIED);
  }
}

TEST(GoldenSamples, ExpectedListsEveryKind) {
  const auto cases = LoadExpected();
  ASSERT_GE(cases.size(), 10u);
  std::set<std::string> codes;
  for (const auto& c : cases) codes.insert(c.expected);
  for (const char* code : {"OK", "INVALID_ARGUMENT", "OUT_OF_RANGE", "UNIMPLEMENTED", "DATA_LOSS",
                           "UNAUTHENTICATED", "RESOURCE_EXHAUSTED"}) {
    EXPECT_TRUE(codes.count(code)) << code;
  }
}

INSTANTIATE_TEST_SUITE_P(Samples, GoldenSampleTest, ::testing::ValuesIn(LoadExpected()),
                         [](const ::testing::TestParamInfo<GoldenCase>& info) {
                           std::string name = info.param.file;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace capsule
