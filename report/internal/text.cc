#include "capsule/report/internal/text.h"

#include <cctype>

namespace capsule::internal {

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
