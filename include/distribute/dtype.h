// File: dtype.h
//
// Element types of a Tensor, with TensorFlow's names, and the two 16-bit float
// storage types (IEEE half and bfloat16) that C++20 does not have.
//
//   DType t = dtype_of<float>();          // DType::kFloat32
//   size_of(DType::kBFloat16);            // 2
//   to_string(DType::kInt32);             // "int32"
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace distribute {

enum class DType : std::uint8_t {
  kBool,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

inline constexpr DType kAllDTypes[] = {DType::kBool,    DType::kInt8,   DType::kUInt8,   DType::kInt16,
                                       DType::kInt32,   DType::kInt64,  DType::kFloat16, DType::kBFloat16,
                                       DType::kFloat32, DType::kFloat64};

// IEEE 754 binary16, stored as its bits. Converts through float.
struct float16 {
  std::uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static std::uint16_t from_float(float f);
  static float to_float(std::uint16_t h);
};

// bfloat16: the top 16 bits of a float32, rounded to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(from_float(f)) {}
  explicit operator float() const {
    std::uint32_t u = std::uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static std::uint16_t from_float(float f);
};

std::size_t size_of(DType dtype);
// TensorFlow's name: "int32", "float32", "bool", "bfloat16", ...
std::string_view to_string(DType dtype);
bool is_floating(DType dtype);
bool is_integer(DType dtype);  // bool is neither integer nor floating

template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>)
    return DType::kBool;
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return DType::kInt8;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return DType::kUInt8;
  else if constexpr (std::is_same_v<U, std::int16_t>)
    return DType::kInt16;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return DType::kInt32;
  else if constexpr (std::is_same_v<U, std::int64_t> || std::is_same_v<U, long long>)
    return DType::kInt64;
  else if constexpr (std::is_same_v<U, float16>)
    return DType::kFloat16;
  else if constexpr (std::is_same_v<U, bfloat16>)
    return DType::kBFloat16;
  else if constexpr (std::is_same_v<U, float>)
    return DType::kFloat32;
  else if constexpr (std::is_same_v<U, double>)
    return DType::kFloat64;
  else
    static_assert(sizeof(T) == 0, "no distribute::DType for this C++ type");
}

// Calls f(T{}) with the C++ storage type of `dtype`.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBool: return f(bool{});
    case DType::kInt8: return f(std::int8_t{});
    case DType::kUInt8: return f(std::uint8_t{});
    case DType::kInt16: return f(std::int16_t{});
    case DType::kInt32: return f(std::int32_t{});
    case DType::kInt64: return f(std::int64_t{});
    case DType::kFloat16: return f(float16{});
    case DType::kBFloat16: return f(bfloat16{});
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
  }
  return f(float{});  // unreachable for valid enumerators
}

}  // namespace distribute
