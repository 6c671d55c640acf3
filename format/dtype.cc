#include "capsule/format/dtype.h"

#include <utility>

#include "capsule/proto/capsule.pb.h"

namespace capsule {

int DTypeElementSize(int dtype) {
  switch (dtype) {
    case v1::FLOAT64:
    case v1::INT64:
      return 8;
    case v1::FLOAT32:
    case v1::INT32:
      return 4;
    case v1::BFLOAT16:
    case v1::FLOAT16:
    case v1::INT16:
      return 2;
    case v1::INT8:
    case v1::UINT8:
    case v1::BOOL:
      return 1;
    default:
      return 0;
  }
}

std::string DTypeName(int dtype) {
  switch (dtype) {
    case v1::FLOAT64:
      return "float64";
    case v1::FLOAT32:
      return "float32";
    case v1::BFLOAT16:
      return "bfloat16";
    case v1::FLOAT16:
      return "float16";
    case v1::INT64:
      return "int64";
    case v1::INT32:
      return "int32";
    case v1::INT16:
      return "int16";
    case v1::INT8:
      return "int8";
    case v1::UINT8:
      return "uint8";
    case v1::BOOL:
      return "bool";
    case v1::DTYPE_UNSPECIFIED:
      return "unspecified";
    default:
      return "unknown(" + std::to_string(dtype) + ")";
  }
}

std::string CanonicalDTypeName(std::string_view name) {
  // LibTorch's c10::toString of the ScalarType that each DType value stands for.
  static constexpr std::pair<std::string_view, int> kTorchNames[] = {
      {"Double", v1::FLOAT64}, {"Float", v1::FLOAT32}, {"BFloat16", v1::BFLOAT16},
      {"Half", v1::FLOAT16},   {"Long", v1::INT64},    {"Int", v1::INT32},
      {"Short", v1::INT16},    {"Char", v1::INT8},     {"Byte", v1::UINT8},
      {"Bool", v1::BOOL}};
  for (const auto& [torch_name, dtype] : kTorchNames) {
    if (name == torch_name || name == DTypeName(dtype)) return DTypeName(dtype);
  }
  return "";
}

}  // namespace capsule
