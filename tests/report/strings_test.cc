// base/strings.h: the text forms of numbers and times that people read.
#include "capsule/base/strings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace capsule {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The replay table (3 digits), reports and diffs (6) and fidelity (9) print these: the strings are
// the ones printf gave before there was one formatter, so golden outputs stay the same bytes.
TEST(FormatSignificantTest, IsPrintfGWithTheGivenDigits) {
  EXPECT_EQ(FormatSignificant(4.08e-07, 3), "4.08e-07");
  EXPECT_EQ(FormatSignificant(0.0065, 3), "0.0065");
  EXPECT_EQ(FormatSignificant(0.00201234, 3), "0.00201");
  EXPECT_EQ(FormatSignificant(4.37123, 3), "4.37");
  EXPECT_EQ(FormatSignificant(0, 3), "0");
  EXPECT_EQ(FormatSignificant(1.0, 6), "1");
  EXPECT_EQ(FormatSignificant(5.5790123, 6), "5.57901");
  EXPECT_EQ(FormatSignificant(1e-06, 6), "1e-06");
  EXPECT_EQ(FormatSignificant(123456789.0, 6), "1.23457e+08");
  EXPECT_EQ(FormatSignificant(-2.5, 6), "-2.5");
  EXPECT_EQ(FormatSignificant(0.1, 9), "0.1");
  EXPECT_EQ(FormatSignificant(0.1 + 0.2, 17), "0.30000000000000004");
}

TEST(FormatSignificantTest, NonFiniteValuesHaveOneSpellingEach) {
  EXPECT_EQ(FormatSignificant(std::nan(""), 3), "nan");
  // printf writes a NaN with the sign bit set as "-nan": not here.
  EXPECT_EQ(FormatSignificant(-std::nan(""), 6), "nan");
  EXPECT_EQ(FormatSignificant(kInf, 6), "inf");
  EXPECT_EQ(FormatSignificant(-kInf, 9), "-inf");
}

TEST(FormatFixedTest, IsPrintfFWithTheGivenDecimals) {
  EXPECT_EQ(FormatFixed(12.345, 1), "12.3");
  EXPECT_EQ(FormatFixed(224, 1), "224.0");
  EXPECT_EQ(FormatFixed(-0.04, 1), "-0.0");
  EXPECT_EQ(FormatFixed(0.5, 0), "0");  // round half to even, as printf does
  EXPECT_EQ(FormatFixed(1e300, 1).size(), 303u);
  EXPECT_EQ(FormatFixed(std::nan(""), 1), "nan");
  EXPECT_EQ(FormatFixed(-kInf, 1), "-inf");
}

TEST(FormatUnixMicrosUtcTest, IsRfc3339InUtcWithWholeSeconds) {
  EXPECT_EQ(FormatUnixMicrosUtc(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatUnixMicrosUtc(1780000000000000), "2026-05-28T20:26:40Z");
  // Microseconds are cut, not rounded: 0.999999 s is still second 0.
  EXPECT_EQ(FormatUnixMicrosUtc(999999), "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatUnixMicrosUtc(1700000001000000), "2023-11-14T22:13:21Z");
}

}  // namespace
}  // namespace capsule
