#include "capsule/base/strings.h"

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

std::string FormatUnixMicrosUtc(int64_t unix_micros) {
  const std::time_t secs = static_cast<std::time_t>(unix_micros / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace capsule
