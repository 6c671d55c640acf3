// What `capsule inspect` prints: a capsule's envelope and content in a few lines for a terminal.
// Every string from the capsule, and the file name, goes through PrintableShort
// (base/internal/printable.h): cut to 256 bytes and with every control character escaped, so a
// capsule can neither forge a line (such as the signature's) nor run on for megabytes; lists show
// their first 32 entries and count the rest.
//
//   std::cout << capsule::RenderInspectSummary(path, decoded);
//
// Thread safety: pure function; thread-safe.
#ifndef CAPSULE_REPORT_INSPECT_TEXT_H_
#define CAPSULE_REPORT_INSPECT_TEXT_H_

#include <string>

#include "capsule/format/capsule_reader.h"

namespace capsule {

std::string RenderInspectSummary(const std::string& file, const DecodedCapsule& decoded);

}  // namespace capsule

#endif  // CAPSULE_REPORT_INSPECT_TEXT_H_
