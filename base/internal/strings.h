// Text forms of numbers and times for people: messages, tables, reports.
//
// Every place that shows a number or a timestamp to a person calls one of these, so the same
// quantity reads the same in the replay table, a report and a diff. Machine-readable output (JSON)
// goes through protobuf's JSON mapping instead.
//
//   capsule::FormatSignificant(0.000123456, 3);       // "0.000123"
//   capsule::FormatSignificant(NAN, 6);               // "nan"
//   capsule::FormatFixed(12.345, 1);                  // "12.3"
//   capsule::FormatUnixMicrosUtc(1780000000000000);   // "2026-05-28T20:26:40Z"
//   capsule::FormatCount(19999872);                   // "19,999,872"
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_BASE_INTERNAL_STRINGS_H_
#define CAPSULE_BASE_INTERNAL_STRINGS_H_

#include <cstdint>
#include <string>

namespace capsule {

// printf's %.<digits>g, except that every NaN is "nan" (never "-nan") and infinities are "inf" and
// "-inf". 6 digits where people read a value (reports, diffs, messages), 3 in the replay table,
// 9 where bits matter (fidelity).
std::string FormatSignificant(double v, int digits);

// printf's %.<decimals>f, non-finite values as in FormatSignificant. For coordinates (SVG).
std::string FormatFixed(double v, int decimals);

// An integer with thousands separators: "19,999,872", "-1,024", "7".
std::string FormatCount(int64_t n);

// A size in binary units for people: "512 B", "1.5 KiB", "300.0 MiB", "2.00 GiB".
std::string HumanBytes(uint64_t bytes);

// RFC 3339 in UTC with whole seconds ("2026-05-28T20:26:40Z"), from microseconds since the epoch;
// the microseconds are truncated.
std::string FormatUnixMicrosUtc(int64_t unix_micros);

}  // namespace capsule

#endif  // CAPSULE_BASE_INTERNAL_STRINGS_H_
