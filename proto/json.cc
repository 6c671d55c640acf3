#include "capsule/proto/json.h"

#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>

namespace capsule {

std::string PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // The mapping fails only on an Any whose type it cannot resolve; these messages hold none.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json + "\n";
}

}  // namespace capsule
