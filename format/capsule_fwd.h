// Forward declarations of the generated capsule.v1.Capsule message and of the other messages and
// enums public headers name, so they can name them without including the generated
// proto/capsule.pb.h. Include "capsule/proto/capsule.pb.h" to use them.
#ifndef CAPSULE_FORMAT_CAPSULE_FWD_H_
#define CAPSULE_FORMAT_CAPSULE_FWD_H_

namespace capsule::v1 {
class Capsule;
class Derivation;
enum Trust : int;  // protobuf declares its enums with int as the underlying type
}  // namespace capsule::v1

#endif  // CAPSULE_FORMAT_CAPSULE_FWD_H_
