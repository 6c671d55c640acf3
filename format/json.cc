#include "capsule/format/json.h"

#include <google/protobuf/message.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

namespace capsule {

std::string MessageToJson(const google::protobuf::Message& message, JsonDefaults defaults) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = defaults == JsonDefaults::kPrinted;
  std::string json;
  // The mapping fails only on an Any whose type it cannot resolve; the schema holds none.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

std::string MessageToJsonWithFirst(const std::string& name, const google::protobuf::Message& first,
                                   const google::protobuf::Message& message,
                                   JsonDefaults defaults) {
  google::protobuf::Value key;  // the name as a JSON string, escaped by the same printer
  key.set_string_value(name);
  const std::string body = MessageToJson(message, defaults);  // "{...}" or "{}"
  return "{" + MessageToJson(key) + ":" + MessageToJson(first) +
         (body.size() > 2 ? "," + body.substr(1) : "}");
}

}  // namespace capsule
