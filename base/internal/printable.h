// Text that is safe to show: how every string from a capsule or a path reaches a person.
//
// A capsule may come from a stranger, and so may a file name. Before such text reaches a terminal
// or a plain-text or Markdown report it goes through Printable, which leaves ordinary text (any
// valid UTF-8 outside the ranges below) as it is and spells everything that could move the
// cursor, change colours, set a window title, ring a bell or reorder what is displayed as a
// visible escape:
//
//   C0 controls and DEL       "\x1b", "\x07", "\x7f"; "\n", "\r" and "\t" by name
//   C1 controls (U+0080-009F) "\u009b"
//   bidirectional controls    "\u202e" (U+061C, U+200E-200F, U+202A-202E, U+2066-2069)
//   line/paragraph separators "\u2028", "\u2029"
//   bytes that are not UTF-8  "\xff" (one escape per byte)
//
//   capsule::Printable("run\x1b[2K");                         // "run\\x1b[2K"
//   capsule::Printable("a\nb", capsule::LineBreaks::kKeep);   // "a\nb"
//
// The CLI also routes all of its standard output and error through the same function
// (cli/printable_stream.h), so a message that forgets to call it still cannot reach the terminal
// raw; that filter keeps line breaks, so a line made of several pieces, any of them from a
// capsule, is written through PrintableLine (base/internal/printable_line.h).
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_BASE_INTERNAL_PRINTABLE_H_
#define CAPSULE_BASE_INTERNAL_PRINTABLE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace capsule {

enum class LineBreaks {
  kEscape,  // "\n" and "\t" are escaped too: the text stays on one line (names, messages)
  kKeep,    // "\n" and "\t" pass (whole documents our own code laid out)
};

std::string Printable(std::string_view text, LineBreaks breaks = LineBreaks::kEscape);

// True when `text` is RFC 3629 UTF-8 (no overlong forms, surrogates or code points above
// U+10FFFF): what proto3 demands of a string field.
bool IsUtf8(std::string_view text);

// `text` with each byte that is not part of valid UTF-8 spelled "\xff"; valid text, controls
// included, is kept as is. How the writer keeps a string field it was given as bytes.
std::string EscapeInvalidUtf8(std::string_view text);

// True when Printable(text, breaks) == text.
bool IsPrintable(std::string_view text, LineBreaks breaks = LineBreaks::kEscape);

// What a one-line field shows by default: long enough for any real name, path or message.
inline constexpr size_t kShortTextBytes = 256;

// Printable(text) of at most `max_bytes` bytes of `text` (cut at a character boundary), followed
// by " … (N more bytes)" when anything was cut: how a name or message from a capsule is shown.
std::string PrintableShort(std::string_view text, size_t max_bytes = kShortTextBytes);

// The length of the longest prefix of `text` that does not end inside a UTF-8 sequence that the
// bytes after it could still complete: where a stream may cut text it has only part of.
size_t CompleteUtf8Prefix(std::string_view text);

// `text` cut to at most `max_bytes` bytes at a UTF-8 character boundary (never inside a
// character), with no marker added.
std::string_view TruncateUtf8(std::string_view text, size_t max_bytes);

}  // namespace capsule

#endif  // CAPSULE_BASE_INTERNAL_PRINTABLE_H_
