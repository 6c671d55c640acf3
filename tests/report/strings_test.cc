// base/internal/strings.h and base/internal/printable.h: the text forms of numbers and times that
// people read, and how untrusted text is made safe to show.
#include "capsule/base/internal/strings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "capsule/base/internal/printable.h"

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

TEST(PrintableTest, OrdinaryTextIsUnchanged) {
  for (const std::string s :
       {"", "run-7 blocks.3 ok", "caf\u00e9 \u65e5\u672c \U0001F600", "C:\\path\\x1b is text"}) {
    EXPECT_EQ(Printable(s), s);
    EXPECT_TRUE(IsPrintable(s)) << s;
  }
}

TEST(PrintableTest, ControlsAreEscapedVisibly) {
  // The forged signature line of a hostile run name: cursor up, carriage return, erase line.
  EXPECT_EQ(Printable("\x1b[1A\r\x1b[2K  signature: verified"),
            "\\x1b[1A\\r\\x1b[2K  signature: verified");
  EXPECT_EQ(Printable(std::string("a\0b\x07\x7f", 5)), "a\\x00b\\x07\\x7f");
  EXPECT_EQ(Printable("a\nb\tc"), "a\\nb\\tc");
  EXPECT_EQ(Printable("a\nb\tc\r", LineBreaks::kKeep), "a\nb\tc\\r");
  // OSC 8 hyperlink and window title.
  EXPECT_EQ(Printable("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
}

TEST(PrintableTest, C1AndBidiControlsAreEscaped) {
  EXPECT_EQ(Printable("\u009b2J"), "\\u009b2J");  // C1 CSI, as UTF-8
  EXPECT_EQ(Printable("abc\u202Etxt.exe"), "abc\\u202etxt.exe");
  for (const char* bidi : {"\u061C", "\u200E", "\u200F", "\u202A", "\u202B", "\u202C", "\u202D",
                           "\u2066", "\u2067", "\u2068", "\u2069", "\u2028"}) {
    EXPECT_FALSE(IsPrintable(bidi)) << bidi;
    EXPECT_EQ(Printable(bidi).rfind("\\u", 0), 0u) << Printable(bidi);
  }
}

TEST(PrintableTest, BytesThatAreNotUtf8AreEscapedOneByOne) {
  EXPECT_EQ(Printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(Printable("ok\xe2\x80"), "ok\\xe2\\x80");       // cut short
}

TEST(PrintableTest, ShortTextSaysHowMuchWasCut) {
  EXPECT_EQ(PrintableShort("abc", 10), "abc");
  EXPECT_EQ(PrintableShort(std::string(300, 'x'), 256),
            std::string(256, 'x') + " \u2026 (44 more bytes)");
  // Never inside a character: "é" is two bytes.
  EXPECT_EQ(PrintableShort("a\u00e9", 2), "a \u2026 (2 more bytes)");
}

TEST(PrintableTest, CompleteUtf8PrefixStopsBeforeAnUnfinishedCharacter) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xe2\x80"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xe2\x80\xae"), 5u);
  EXPECT_EQ(CompleteUtf8Prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("\xff"), 1u);  // not a lead byte: nothing to wait for
}

TEST(FormatCountTest, GroupsThousands) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(19999872), "19,999,872");
  EXPECT_EQ(FormatCount(-1024), "-1,024");
  EXPECT_EQ(FormatCount(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

}  // namespace
}  // namespace capsule
