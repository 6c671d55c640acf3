// base/strings.h: the text forms of numbers and times that people read.
#include "capsule/base/strings.h"

#include <gtest/gtest.h>

namespace capsule {
namespace {

TEST(FormatUnixMicrosUtcTest, IsRfc3339InUtcWithWholeSeconds) {
  EXPECT_EQ(FormatUnixMicrosUtc(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatUnixMicrosUtc(1780000000000000), "2026-05-28T20:26:40Z");
  // Microseconds are cut, not rounded: 0.999999 s is still second 0.
  EXPECT_EQ(FormatUnixMicrosUtc(999999), "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatUnixMicrosUtc(1700000001000000), "2023-11-14T22:13:21Z");
}

}  // namespace
}  // namespace capsule
