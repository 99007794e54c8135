#include "distribute/dtype.h"

#include <cstring>

#include "core/half_bits.h"

namespace distribute {

// The conversions are core/half_bits.h's, which the GPU kernels share.
std::uint16_t float16::from_float(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  return internal::half_from_float_bits(x);
}

float float16::to_float(std::uint16_t h) {
  const std::uint32_t x = internal::half_to_float_bits(h);
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

std::uint16_t bfloat16::from_float(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  return internal::bfloat16_from_float_bits(x);
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8: return 1;
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64:
    case DType::kFloat64: return 8;
  }
  return 0;
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "unknown";
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 || dtype == DType::kFloat64;
}

bool is_integer(DType dtype) {
  return dtype == DType::kInt8 || dtype == DType::kUInt8 || dtype == DType::kInt16 || dtype == DType::kInt32 ||
         dtype == DType::kInt64;
}

}  // namespace distribute
