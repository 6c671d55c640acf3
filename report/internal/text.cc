#include "capsule/report/internal/text.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace capsule::internal {

std::string JsonNumber(double v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  char buf[64];
  // Shortest round-trip form: the same bytes on every platform, so JSON output is golden-testable.
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        // '<' and '>' too, so the JSON can be embedded in an HTML page without ending a tag.
        if (c < 0x20 || c == 0x7f || c == '<' || c == '>' || c == '&') {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string MarkdownEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto word = [&s](size_t i) {
    return i < s.size() && std::isalnum(static_cast<unsigned char>(s[i]));
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    // GFM never reads an underscore inside a word as emphasis: keep NON_FINITE_LOSS readable.
    if (ch == '_' && i > 0 && word(i - 1) && word(i + 1)) {
      out += ch;
      continue;
    }
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\n':
      case '\r':
        out += ' ';
        break;
      case '\\':
      case '`':
      case '*':
      case '_':
      case '[':
      case ']':
      case '|':
      case '#':
        out += '\\';
        out += ch;
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string BaseName(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

}  // namespace capsule::internal
