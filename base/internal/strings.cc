#include "capsule/base/internal/strings.h"

#include <cmath>
#include <cstdio>
#include <ctime>

namespace capsule {
namespace {

const char* NonFinite(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return nullptr;
}

}  // namespace

std::string FormatSignificant(double v, int digits) {
  if (const char* text = NonFinite(v)) return text;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return buf;
}

std::string FormatFixed(double v, int decimals) {
  if (const char* text = NonFinite(v)) return text;
  // %f of a large value is long: 1e300 needs 301 digits before the point.
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string FormatCount(int64_t n) {
  // Through uint64_t, so that INT64_MIN has a magnitude.
  const bool negative = n < 0;
  uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
  std::string digits;
  int in_group = 0;
  do {
    if (in_group == 3) {
      digits += ',';
      in_group = 0;
    }
    digits += static_cast<char>('0' + magnitude % 10);
    magnitude /= 10;
    ++in_group;
  } while (magnitude != 0);
  if (negative) digits += '-';
  return std::string(digits.rbegin(), digits.rend());
}

std::string HumanBytes(uint64_t bytes) {
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  } else if (bytes < 1024ull * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  }
  return buf;
}

std::string FormatUnixMicrosUtc(int64_t unix_micros) {
  const std::time_t secs = static_cast<std::time_t>(unix_micros / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace capsule
