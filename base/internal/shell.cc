#include "capsule/base/internal/shell.h"

#include <algorithm>
#include <cctype>

namespace capsule {

std::string ShellQuote(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-' ||
           ch == '+' || ch == '/';
  });
  if (plain) return s;
  std::string out = "'";
  for (const char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

}  // namespace capsule
