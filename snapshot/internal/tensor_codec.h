// Tensors in and out of capsules: TensorMeta (dtype, shape, strides, storage offset, device) and
// TensorBlob (meta + contiguous little-endian bytes + SHA-256), the capsule's two tensor records.
//
// Capture describes every layer output with a TensorMeta and embeds the tensors replay needs as
// TensorBlobs; replay turns blobs back into CPU tensors. Round trips are bit-exact.
//
//   v1::TensorBlob blob;
//   CAPSULE_RETURN_IF_ERROR(capsule::TensorToBlob("blocks.2/input.0", x, &blob));
//   CAPSULE_ASSIGN_OR_RETURN(at::Tensor y, capsule::TensorFromBlob(blob));   // equal(x, y)
//
// Thread safety: thread-safe.
#ifndef CAPSULE_SNAPSHOT_INTERNAL_TENSOR_CODEC_H_
#define CAPSULE_SNAPSHOT_INTERNAL_TENSOR_CODEC_H_

#include <ATen/Tensor.h>

#include <string>
#include <string_view>

#include "capsule/base/status.h"

namespace capsule::v1 {
class TensorMeta;
class TensorBlob;
}  // namespace capsule::v1

namespace capsule {

// capsule.v1.DType value for a scalar type; 0 (unspecified) when it has none.
int DTypeFromScalarType(at::ScalarType type);
// kInvalidArgument for DTYPE_UNSPECIFIED or an unknown value.
StatusOr<at::ScalarType> ScalarTypeFromDType(int dtype);

void FillTensorMeta(const at::Tensor& t, v1::TensorMeta* meta);

// Copies `t` (any device, any strides) as contiguous CPU bytes into `blob`, with meta and sha256.
Status TensorToBlob(const std::string& name, const at::Tensor& t, v1::TensorBlob* blob);

// The same blob without copying the bytes: fills name, meta and sha256, leaves data empty and
// returns the contiguous CPU tensor whose bytes the data is (`t` itself, no copy, when it is
// contiguous on the CPU; a host copy otherwise). A writer given TensorBytes of it
// (WriteOptions::tensor_data) writes the blob TensorToBlob makes, while it is held unchanged.
StatusOr<at::Tensor> TensorToBlobHeld(const std::string& name, const at::Tensor& t,
                                      v1::TensorBlob* blob);
// The bytes of a contiguous CPU tensor.
std::string_view TensorBytes(const at::Tensor& contiguous_cpu);

// A new contiguous CPU tensor with the blob's dtype, shape and bytes (requires_grad false).
StatusOr<at::Tensor> TensorFromBlob(const v1::TensorBlob& blob);

}  // namespace capsule

#endif  // CAPSULE_SNAPSHOT_INTERNAL_TENSOR_CODEC_H_
