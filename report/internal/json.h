// The report library's JSON: one line of the project's JSON mapping (format/json.h) with a
// trailing newline. Not installed.
//
// Thread safety: pure function; thread-safe.
#ifndef CAPSULE_REPORT_INTERNAL_JSON_H_
#define CAPSULE_REPORT_INTERNAL_JSON_H_

#include <string>

#include "capsule/format/json.h"

namespace capsule::internal {

// One line of JSON, with a trailing newline.
inline std::string PrintJson(const google::protobuf::Message& message) {
  return MessageToJson(message) + "\n";
}

}  // namespace capsule::internal

#endif  // CAPSULE_REPORT_INTERNAL_JSON_H_
