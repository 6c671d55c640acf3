#include "capsule/report/internal/text.h"

#include <algorithm>
#include <cctype>

#include "capsule/base/internal/printable.h"

namespace capsule::internal {

std::string HtmlEscape(std::string_view text) {
  const std::string s = Printable(text, LineBreaks::kKeep);
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

std::string MarkdownEscape(std::string_view text) {
  const std::string s = Printable(text);
  constexpr const char* kZeroWidthSpace = "&#8203;";
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
    // Mentions and e-mail autolinks: "@" followed by anything.
    if (ch == '@') {
      out += '@';
      out += kZeroWidthSpace;
      continue;
    }
    // URL autolinks: any "scheme://", and "www.".
    if (ch == ':' && s.compare(i, 3, "://") == 0) {
      out += ':';
      out += kZeroWidthSpace;
      continue;
    }
    if ((ch == 'w' || ch == 'W') && i + 3 < s.size() && (i == 0 || !word(i - 1)) &&
        std::tolower(static_cast<unsigned char>(s[i + 1])) == 'w' &&
        std::tolower(static_cast<unsigned char>(s[i + 2])) == 'w' && s[i + 3] == '.') {
      out.append(s, i, 3);
      out += kZeroWidthSpace;
      i += 2;
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
