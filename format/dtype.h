// DType helpers: element sizes and names of capsule.v1.DType values.
//
// The dtype enum travels as a plain int here so that callers need not include the generated
// protobuf header (snapshot/ and report/ both print and size tensors from their metadata).
//
//   int bytes = capsule::DTypeElementSize(meta.dtype());   // 4 for FLOAT32, 0 if unknown
//   std::string name = capsule::DTypeName(meta.dtype());   // "float32"
//   capsule::CanonicalDTypeName("Float");                  // "float32" (LibTorch's name)
//
// Thread safety: thread-safe (pure functions).
#ifndef CAPSULE_FORMAT_DTYPE_H_
#define CAPSULE_FORMAT_DTYPE_H_

#include <string>
#include <string_view>

namespace capsule {

// Bytes per element of a capsule.v1.DType value; 0 for DTYPE_UNSPECIFIED or an unknown value.
int DTypeElementSize(int dtype);
// "float32", "bfloat16", ...; "unspecified" for 0, "unknown(99)" for a value capsule.proto does
// not define.
std::string DTypeName(int dtype);

// The capsule's spelling of a dtype named in text (TensorDigest.dtype, Collective.dtype): the
// DTypeName of the type, for that name itself ("float32") and for LibTorch's name of the same
// type ("Float"), which capsules written by capsule 0.1.0 hold in TensorDigest.dtype. Empty for
// any other name.
std::string CanonicalDTypeName(std::string_view name);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_DTYPE_H_
