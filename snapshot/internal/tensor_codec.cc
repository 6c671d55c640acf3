#include "capsule/snapshot/internal/tensor_codec.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/dtype.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {

int DTypeFromScalarType(at::ScalarType type) {
  switch (type) {
    case at::kDouble:
      return v1::FLOAT64;
    case at::kFloat:
      return v1::FLOAT32;
    case at::kBFloat16:
      return v1::BFLOAT16;
    case at::kHalf:
      return v1::FLOAT16;
    case at::kLong:
      return v1::INT64;
    case at::kInt:
      return v1::INT32;
    case at::kShort:
      return v1::INT16;
    case at::kChar:
      return v1::INT8;
    case at::kByte:
      return v1::UINT8;
    case at::kBool:
      return v1::BOOL;
    default:
      return v1::DTYPE_UNSPECIFIED;
  }
}

StatusOr<at::ScalarType> ScalarTypeFromDType(int dtype) {
  switch (dtype) {
    case v1::FLOAT64:
      return at::kDouble;
    case v1::FLOAT32:
      return at::kFloat;
    case v1::BFLOAT16:
      return at::kBFloat16;
    case v1::FLOAT16:
      return at::kHalf;
    case v1::INT64:
      return at::kLong;
    case v1::INT32:
      return at::kInt;
    case v1::INT16:
      return at::kShort;
    case v1::INT8:
      return at::kChar;
    case v1::UINT8:
      return at::kByte;
    case v1::BOOL:
      return at::kBool;
    default:
      return InvalidArgumentError("unsupported tensor dtype " + std::to_string(dtype));
  }
}

void FillTensorMeta(const at::Tensor& t, v1::TensorMeta* meta) {
  meta->Clear();
  if (!t.defined()) return;
  meta->set_dtype(static_cast<v1::DType>(DTypeFromScalarType(t.scalar_type())));
  for (int64_t d : t.sizes()) meta->add_shape(d);
  if (t.layout() == at::kStrided) {
    for (int64_t s : t.strides()) meta->add_strides(s);
    meta->set_storage_offset(t.storage_offset());
  }
  meta->set_device(t.device().str());
  meta->set_requires_grad(t.requires_grad());
}

StatusOr<at::Tensor> TensorToBlobHeld(const std::string& name, const at::Tensor& t,
                                      v1::TensorBlob* blob) {
  try {
    if (!t.defined()) return InvalidArgumentError("tensor " + name + " is undefined");
    if (DTypeFromScalarType(t.scalar_type()) == v1::DTYPE_UNSPECIFIED) {
      return InvalidArgumentError("tensor " + name + " has unsupported dtype " +
                                  std::string(c10::toString(t.scalar_type())));
    }
    blob->Clear();
    blob->set_name(name);
    FillTensorMeta(t, blob->mutable_meta());
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    CAPSULE_ASSIGN_OR_RETURN(std::string sha256, Sha256Hex(TensorBytes(c)));
    blob->set_sha256(sha256);  // little-endian hosts only
    return c;
  } catch (const c10::Error& e) {
    return InternalError("cannot read tensor " + name + ": " + e.what_without_backtrace());
  }
}

std::string_view TensorBytes(const at::Tensor& contiguous_cpu) {
  const size_t bytes = static_cast<size_t>(contiguous_cpu.numel()) * contiguous_cpu.element_size();
  if (bytes == 0) return {};
  return std::string_view(static_cast<const char*>(contiguous_cpu.data_ptr()), bytes);
}

Status TensorToBlob(const std::string& name, const at::Tensor& t, v1::TensorBlob* blob) {
  CAPSULE_ASSIGN_OR_RETURN(const at::Tensor c, TensorToBlobHeld(name, t, blob));
  const std::string_view bytes = TensorBytes(c);
  blob->set_data(bytes.data(), bytes.size());
  return Status::Ok();
}

StatusOr<at::Tensor> TensorFromBlob(const v1::TensorBlob& blob) {
  CAPSULE_ASSIGN_OR_RETURN(at::ScalarType type, ScalarTypeFromDType(blob.meta().dtype()));
  std::vector<int64_t> shape(blob.meta().shape().begin(), blob.meta().shape().end());
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const size_t expected = static_cast<size_t>(numel) * DTypeElementSize(blob.meta().dtype());
  if (blob.data().size() != expected) {
    return InvalidArgumentError("tensor " + blob.name() + " holds " +
                                std::to_string(blob.data().size()) + " bytes, expected " +
                                std::to_string(expected));
  }
  try {
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    if (expected > 0) std::memcpy(t.data_ptr(), blob.data().data(), expected);
    return t;
  } catch (const c10::Error& e) {
    return InternalError("cannot rebuild tensor " + blob.name() + ": " +
                         e.what_without_backtrace());
  }
}

}  // namespace capsule
