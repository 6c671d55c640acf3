// Escaping shared by the report and diff renderers. Not installed.
//
// Every string a renderer takes from a capsule is untrusted input, so each output format has one
// escape function here and the renderers call it on every such string (JSON is escaped by
// protobuf's JSON mapping, internal/json.h).
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_REPORT_INTERNAL_TEXT_H_
#define CAPSULE_REPORT_INTERNAL_TEXT_H_

#include <string>
#include <string_view>

namespace capsule::internal {

// &, <, >, " and ' as entities: safe in HTML text and in quoted attribute values.
std::string HtmlEscape(std::string_view s);
// Safe in Markdown text and table cells: HTML entities for <, >, &; backslash before Markdown
// punctuation and |; line breaks as spaces.
std::string MarkdownEscape(std::string_view s);
// The part after the last '/'.
std::string BaseName(std::string_view path);

}  // namespace capsule::internal

#endif  // CAPSULE_REPORT_INTERNAL_TEXT_H_
