// DType helpers: element sizes and names of capsule.v1.DType values.
//
// The dtype enum travels as a plain int here so that callers need not include the generated
// protobuf header (probe/ and report/ both print and size tensors from their metadata).
//
//   int bytes = capsule::DTypeElementSize(meta.dtype());   // 4 for FLOAT32, 0 if unknown
//   std::string name = capsule::DTypeName(meta.dtype());   // "float32"
//
// Thread safety: thread-safe (pure functions).
#ifndef CAPSULE_FORMAT_DTYPE_H_
#define CAPSULE_FORMAT_DTYPE_H_

#include <string>

namespace capsule {

// Bytes per element of a capsule.v1.DType value; 0 for DTYPE_UNSPECIFIED or an unknown value.
int DTypeElementSize(int dtype);
// "float32", "bfloat16", ...; "unspecified" for 0, "unknown(99)" for a value capsule.proto does
// not define.
std::string DTypeName(int dtype);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_DTYPE_H_
