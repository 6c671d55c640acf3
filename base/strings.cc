#include "capsule/base/strings.h"

#include <ctime>

namespace capsule {

std::string FormatUnixMicrosUtc(int64_t unix_micros) {
  const std::time_t secs = static_cast<std::time_t>(unix_micros / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace capsule
