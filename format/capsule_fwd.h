// Forward declaration of the generated capsule.v1.Capsule message, so public headers can name it
// without including the generated proto/capsule.pb.h. Include "capsule/proto/capsule.pb.h" to use
// it.
#ifndef CAPSULE_FORMAT_CAPSULE_FWD_H_
#define CAPSULE_FORMAT_CAPSULE_FWD_H_

namespace capsule::v1 {
class Capsule;
}  // namespace capsule::v1

#endif  // CAPSULE_FORMAT_CAPSULE_FWD_H_
