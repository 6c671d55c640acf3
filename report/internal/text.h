// Escaping shared by the report and diff renderers. Not installed.
//
// Every string a renderer takes from a capsule is untrusted input, so each output format has one
// escape function here and the renderers call it on every such string (JSON is escaped by
// the project's JSON printer, format/json.h; a shell word by ShellQuote, base/internal/shell.h).
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_REPORT_INTERNAL_TEXT_H_
#define CAPSULE_REPORT_INTERNAL_TEXT_H_

#include <string>
#include <string_view>

namespace capsule::internal {

// Printable(s, LineBreaks::kKeep) (base/internal/printable.h), then &, <, >, " and ' as entities:
// safe in HTML text and in quoted attribute values, with no control or bidirectional character left
// to reorder what the page shows.
std::string HtmlEscape(std::string_view s);
// Printable(s) (one line), then safe in Markdown text and table cells: HTML entities for <, >, &;
// backslash before Markdown punctuation and |; and nothing GitHub would turn into a link or a
// notification: "@name" and "user@host" become "@&#8203;name", "https://" becomes
// "https:&#8203;//" and "www." becomes "www&#8203;." (a zero-width space breaks the pattern and
// shows nothing).
std::string MarkdownEscape(std::string_view s);
// The part after the last '/'.
std::string BaseName(std::string_view path);

}  // namespace capsule::internal

#endif  // CAPSULE_REPORT_INTERNAL_TEXT_H_
