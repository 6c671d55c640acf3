// The project's one JSON printer: protobuf's JSON mapping of a message, configured once, so that
// every command and report prints JSON the same way.
//
// Field names are the .proto's, and every field is printed, defaults included, except proto3
// `optional` fields that are unset and absent messages: a reader finds a key whatever its value,
// and an absent key means "none". Non-finite doubles are "NaN", "Infinity", "-Infinity"; 64-bit
// integers are strings; '<' and '>' are escaped, so the text can sit inside an HTML page. The one
// choice a caller makes is for a record shown as it was written (`capsule inspect --json`): there
// a field at its default was not recorded, and is left out.
//
//   std::cout << MessageToJson(report) << "\n";
//   std::cout << MessageToJson(capsule, JsonDefaults::kOmitted) << "\n";
//
// Thread safety: pure function; thread-safe.
#ifndef CAPSULE_FORMAT_JSON_H_
#define CAPSULE_FORMAT_JSON_H_

#include <string>

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace capsule {

enum class JsonDefaults {
  kPrinted,  // every field, defaults included: what reports and command results print
  kOmitted,  // fields at their default left out: a record shown as it was written
};

// One line of JSON, without a trailing newline.
std::string MessageToJson(const google::protobuf::Message& message,
                          JsonDefaults defaults = JsonDefaults::kPrinted);

// `message`'s object with one more member before its own: `name`, holding `first` (printed with
// every field). For a record whose JSON readers already know, shown with what surrounds it
// (`capsule inspect --json`: the capsule, with its envelope first).
std::string MessageToJsonWithFirst(const std::string& name, const google::protobuf::Message& first,
                                   const google::protobuf::Message& message,
                                   JsonDefaults defaults = JsonDefaults::kPrinted);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_JSON_H_
