// The JSON the command line prints: protobuf's JSON mapping over a message (the report, the
// capsule diff, the run analysis).
//
// Field names are the .proto's, and every field is printed, defaults included, except proto3
// `optional` fields that are unset and absent messages: a reader finds a key whatever its value,
// and an absent key means "none". Non-finite doubles are "NaN", "Infinity", "-Infinity"; 64-bit
// integers are strings; '<' and '>' are escaped, so the text can sit inside an HTML page.
//
// Thread safety: pure function; thread-safe.
#ifndef CAPSULE_PROTO_JSON_H_
#define CAPSULE_PROTO_JSON_H_

#include <string>

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace capsule {

// One line of JSON, with a trailing newline.
std::string PrintJson(const google::protobuf::Message& message);

}  // namespace capsule

#endif  // CAPSULE_PROTO_JSON_H_
