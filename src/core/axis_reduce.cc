#include "core/axis_reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace distribute::internal {

DType accumulator_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return DType::kFloat32;
    case DType::kFloat32:
    case DType::kFloat64: return dtype;
    default: return DType::kInt64;
  }
}

std::vector<int> normalize_axes(const std::vector<int>& axes, int rank) {
  std::vector<int> out;
  for (int a : axes) {
    if (a < -rank || a >= rank) {
      throw InvalidArgumentError("`axis` = " + std::to_string(a) + " out of range for `value` with rank " +
                                 std::to_string(rank));
    }
    const int n = a < 0 ? a + rank : a;
    if (std::find(out.begin(), out.end(), n) != out.end()) {
      throw InvalidArgumentError("`axis` = " + std::to_string(a) + " repeats an axis already given");
    }
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// The identity of op for values of `dtype`, in the accumulator type A: MIN of
// nothing is the dtype's largest value (+inf for floats), MAX its smallest.
template <class A>
A identity(ReduceOp op, DType dtype) {
  switch (op) {
    case ReduceOp::kProduct: return A(1);
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const bool min = op == ReduceOp::kMin;
      return visit_dtype(dtype, [&](auto tag) -> A {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, bool>) {
          return A(min ? 1 : 0);
        } else if constexpr (std::is_integral_v<T>) {
          return static_cast<A>(min ? std::numeric_limits<T>::max() : std::numeric_limits<T>::lowest());
        } else {
          return min ? std::numeric_limits<A>::infinity() : -std::numeric_limits<A>::infinity();
        }
      });
    }
    default: return A(0);
  }
}

template <class A>
A combine(A a, A b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kProduct:
      if constexpr (std::is_integral_v<A>) {
        return static_cast<A>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
      } else {
        return a * b;
      }
    case ReduceOp::kMin:
      if constexpr (std::is_floating_point_v<A>) {
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
      }
      return std::min(a, b);
    case ReduceOp::kMax:
      if constexpr (std::is_floating_point_v<A>) {
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
      }
      return std::max(a, b);
    default:
      if constexpr (std::is_integral_v<A>) {
        return static_cast<A>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
      } else {
        return a + b;
      }
  }
}
}  // namespace

Tensor reduce_axes(const Tensor& t, const std::vector<int>& axes, ReduceOp op) {
  const DType acc = accumulator_dtype(t.dtype());
  const Tensor in = cast(t, acc);
  std::vector<std::int64_t> out_dims;
  std::vector<char> reduced(static_cast<std::size_t>(t.rank()), 0);
  for (int a : axes) reduced[static_cast<std::size_t>(a)] = 1;
  for (int d = 0; d < t.rank(); ++d) {
    if (!reduced[static_cast<std::size_t>(d)]) out_dims.push_back(t.shape()[d]);
  }
  Tensor out = Tensor::uninitialized(acc, Shape(out_dims), t.device());
  visit_dtype(acc, [&](auto tag) {
    using A = decltype(tag);
    if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double> || std::is_same_v<A, std::int64_t>) {
      A* o = reinterpret_cast<A*>(out.mutable_raw_data());
      std::fill(o, o + out.num_elements(), identity<A>(op, t.dtype()));
      const A* x = reinterpret_cast<const A*>(in.raw_data());
      const int rank = t.rank();
      std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
      for (std::int64_t i = 0; i < in.num_elements(); ++i) {
        std::int64_t oi = 0;
        for (int d = 0; d < rank; ++d) {
          if (!reduced[static_cast<std::size_t>(d)]) oi = oi * t.shape()[d] + index[static_cast<std::size_t>(d)];
        }
        o[oi] = combine(o[oi], x[i], op);
        for (int d = rank - 1; d >= 0; --d) {  // advance the row-major index
          if (++index[static_cast<std::size_t>(d)] < t.shape()[d]) break;
          index[static_cast<std::size_t>(d)] = 0;
        }
      }
    }
  });
  return out;
}

}  // namespace distribute::internal
