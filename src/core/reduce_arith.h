// The arithmetic of a reduction, per dtype and op, for host and device code:
// the CPU kernels (reduce_kernels.cc) and the GPU kernels
// (cuda/reduce_kernels.cu) combine values with these, in the same order, so
// that their results are the same bits (docs/semantics.md, "Reduction
// arithmetic").
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/half_bits.h"
#include "core/host_device.h"
#include "distribute/dtype.h"

namespace distribute::internal {

// Exact sums of int64 values for MEAN (a GCC/Clang extension, hence __extension__).
__extension__ typedef __int128 int128;

template <class T>
constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

template <class T, class = void>
struct SumType {
  using type = std::conditional_t<is_half_v<T>, float, T>;
};
template <class T>
struct SumType<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  using type = std::make_unsigned_t<T>;
};

// The type in which values of T are combined for `op`.
template <class T>
struct Accumulator {
  // Integers wrap: the unsigned type of the same width gives the same bits
  // as two's complement wrap-around, with no undefined behaviour, at full
  // vector width.
  using sum = typename SumType<T>::type;
  using mean = std::conditional_t<is_half_v<T>, float,
                                  std::conditional_t<std::is_same_v<T, std::int64_t>, int128,
                                                     std::conditional_t<std::is_integral_v<T>, std::int64_t, T>>>;
};

DIST_HOST_DEVICE inline float float_of_bits(std::uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
DIST_HOST_DEVICE inline std::uint32_t bits_of_float(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  return x;
}

// A value of T as the accumulator type A (16-bit floats: exactly, as float).
template <class A, class T>
DIST_HOST_DEVICE A load(const T& v) {
  if constexpr (std::is_same_v<T, float16>) {
    return float_of_bits(half_to_float_bits(v.bits));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return float_of_bits(std::uint32_t{v.bits} << 16);
  } else {
    return static_cast<A>(v);
  }
}

// An accumulator back as T (16-bit floats: rounded once, to nearest even).
template <class T, class A>
DIST_HOST_DEVICE T store(A a) {
  if constexpr (std::is_same_v<T, float16>) {
    T t;
    t.bits = half_from_float_bits(bits_of_float(static_cast<float>(a)));
    return t;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    T t;
    t.bits = bfloat16_from_float_bits(bits_of_float(static_cast<float>(a)));
    return t;
  } else {
    return static_cast<T>(a);  // integers: modular (C++20), which is the wrap-around we promise
  }
}

// MIN and MAX propagate NaN (a != a: NaN, in host and device code alike).
template <class A>
DIST_HOST_DEVICE A nan_min(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a || b != b) return std::numeric_limits<A>::quiet_NaN();
  }
  return b < a ? b : a;
}
template <class A>
DIST_HOST_DEVICE A nan_max(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a || b != b) return std::numeric_limits<A>::quiet_NaN();
  }
  return a < b ? b : a;
}

// The combining steps, by op, in the accumulator type A.
struct Same {
  template <class A>
  DIST_HOST_DEVICE A operator()(A a) const {
    return a;
  }
};
struct AnyOf {
  DIST_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};
struct AllOf {
  DIST_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};
struct CountTrue {
  DIST_HOST_DEVICE std::int64_t operator()(std::int64_t a, std::int64_t b) const { return a + b; }
};
// trunc(count_true / divisor) is 1 only if count_true >= divisor.
struct BoolMeanOf {
  std::int64_t divisor;
  DIST_HOST_DEVICE bool operator()(std::int64_t c) const { return c / divisor != 0; }
};
template <class A>
struct Add {
  DIST_HOST_DEVICE A operator()(A a, A b) const { return static_cast<A>(a + b); }
};
template <class A>
struct Multiply {
  // Widen to at least unsigned int first: uint16 * uint16 would promote to int and overflow.
  DIST_HOST_DEVICE A operator()(A a, A b) const {
    return static_cast<A>(static_cast<std::common_type_t<A, unsigned>>(a) * b);
  }
};
template <class A>
struct Min {
  DIST_HOST_DEVICE A operator()(A a, A b) const { return nan_min(a, b); }
};
template <class A>
struct Max {
  DIST_HOST_DEVICE A operator()(A a, A b) const { return nan_max(a, b); }
};
template <class A>
struct DivideBy {
  A divisor;
  DIST_HOST_DEVICE A operator()(A a) const { return static_cast<A>(a / divisor); }
};

}  // namespace distribute::internal
