#include "capsule/base/internal/printable.h"

#include <cstdint>
#include <cstdio>

namespace capsule {
namespace {

// Decodes one UTF-8 character at the start of `s` (non-empty). Returns its length in bytes and
// sets *cp, or returns 0 when the first byte does not start a valid, shortest-form character.
size_t DecodeUtf8(std::string_view s, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  uint32_t min;
  uint32_t value;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80, value = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800, value = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, value = b0 & 0x07;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return 0;
    value = (value << 6) | (b & 0x3F);
  }
  if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
  *cp = value;
  return len;
}

bool IsBidiOrSeparator(uint32_t cp) {
  return cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 || cp == 0x2029;
}

// Appends the escape for code point `cp` when it needs one; returns false when it is shown as is.
bool AppendEscape(uint32_t cp, LineBreaks breaks, std::string* out) {
  char buf[16];
  if (cp < 0x20 || cp == 0x7F) {
    if (breaks == LineBreaks::kKeep && (cp == '\n' || cp == '\t')) return false;
    if (out == nullptr) return true;
    switch (cp) {
      case '\n':
        *out += "\\n";
        return true;
      case '\r':
        *out += "\\r";
        return true;
      case '\t':
        *out += "\\t";
        return true;
      default:
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
        *out += buf;
        return true;
    }
  }
  if ((cp >= 0x80 && cp <= 0x9F) || IsBidiOrSeparator(cp)) {
    if (out == nullptr) return true;
    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
    *out += buf;
    return true;
  }
  return false;
}

// The one walk over `text`: valid characters are kept unless escape(cp, out) appended an escape
// for them; every byte that is not part of valid UTF-8 becomes "\xNN".
template <typename Escape>
std::string Rewrite(std::string_view text, Escape escape) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(text.substr(i), &cp);
    if (len == 0) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(text[i]));
      out += buf;
      ++i;
      continue;
    }
    if (!escape(cp, &out)) out.append(text.data() + i, len);
    i += len;
  }
  return out;
}

// True when Rewrite(text, escape) would change nothing; needs_escape(cp) says whether it would
// escape `cp`.
template <typename NeedsEscape>
bool Unchanged(std::string_view text, NeedsEscape needs_escape) {
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(text.substr(i), &cp);
    if (len == 0 || needs_escape(cp)) return false;
    i += len;
  }
  return true;
}

}  // namespace

std::string Printable(std::string_view text, LineBreaks breaks) {
  return Rewrite(text,
                 [breaks](uint32_t cp, std::string* out) { return AppendEscape(cp, breaks, out); });
}

bool IsUtf8(std::string_view text) {
  return Unchanged(text, [](uint32_t) { return false; });
}

std::string EscapeInvalidUtf8(std::string_view text) {
  return Rewrite(text, [](uint32_t, std::string*) { return false; });
}

bool IsPrintable(std::string_view text, LineBreaks breaks) {
  return Unchanged(text, [breaks](uint32_t cp) { return AppendEscape(cp, breaks, nullptr); });
}

std::string PrintableShort(std::string_view text, size_t max_bytes) {
  const std::string_view head = TruncateUtf8(text, max_bytes);
  std::string out = Printable(head);
  if (head.size() < text.size()) {
    out += " \u2026 (" + std::to_string(text.size() - head.size()) + " more bytes)";
  }
  return out;
}

size_t CompleteUtf8Prefix(std::string_view text) {
  // Look back at most 3 bytes for the lead byte of an unfinished sequence.
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(text[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for its lead
    size_t need = 0;
    if ((b & 0xE0) == 0xC0) {
      need = 2;
    } else if ((b & 0xF0) == 0xE0) {
      need = 3;
    } else if ((b & 0xF8) == 0xF0) {
      need = 4;
    }
    return need > back ? n - back : n;
  }
  return n;
}

std::string_view TruncateUtf8(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  // Step back over continuation bytes to the start of the character that straddles the cut.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut);
}

}  // namespace capsule
