// The plain reference that backend tests compare every all_reduce with: rank
// r holds x_r[i] = (i % 5) + r (bool: (i + r) % 3 != 0); the expected value
// is combined in double (exact for these small integers) and then given the
// dtype's documented rule (wrap, truncating integer MEAN, bool as AND/OR).
#pragma once

#include <distribute/distribute.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace distribute::testing {

inline double input_value(DType dtype, int rank, std::size_t i) {
  if (dtype == DType::kBool) return (i + static_cast<std::size_t>(rank)) % 3 != 0 ? 1 : 0;
  return static_cast<double>(i % 5) + rank;
}

template <class T>
T to_dtype(double v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::int64_t>(v));  // modular for out-of-range values
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
T expected_value(ReduceOp op, int n, std::size_t i, DType dtype) {
  double acc = input_value(dtype, 0, i);
  for (int r = 1; r < n; ++r) {
    const double x = input_value(dtype, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: acc += x; break;
      case ReduceOp::kProduct: acc *= x; break;
      case ReduceOp::kMin: acc = std::min(acc, x); break;
      case ReduceOp::kMax: acc = std::max(acc, x); break;
    }
  }
  if constexpr (std::is_same_v<T, bool>) {
    return op == ReduceOp::kMean ? std::trunc(acc / n) != 0 : acc != 0;
  } else if constexpr (std::is_integral_v<T>) {
    return to_dtype<T>(op == ReduceOp::kMean ? std::trunc(acc / n) : acc);
  } else {
    return to_dtype<T>(op == ReduceOp::kMean ? acc / n : acc);
  }
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace distribute::testing
