#include "core/elementwise.h"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace distribute::internal {
namespace {

template <class T>
constexpr bool kHalf = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

template <class T, class Op>
void combine_into(const Tensor& dst, const Tensor& src, Op op) {
  T* d = static_cast<T*>(dst.mutable_raw_data());
  const T* s = static_cast<const T*>(src.raw_data());
  const auto n = static_cast<std::size_t>(dst.num_elements());
  if constexpr (kHalf<T>) {
    for (std::size_t i = 0; i < n; ++i) d[i] = T(op(static_cast<float>(d[i]), static_cast<float>(s[i])));
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // Wrap like TensorFlow's int kernels, without signed-overflow UB.
    using U = std::make_unsigned_t<T>;
    for (std::size_t i = 0; i < n; ++i) {
      d[i] = static_cast<T>(static_cast<U>(op(static_cast<U>(d[i]), static_cast<U>(s[i]))));
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) d[i] = op(d[i], s[i]);
  }
}

template <class Op>
void combine(const Tensor& dst, const Tensor& src, Op op) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw InvalidArgumentError("arithmetic on a bool tensor");
    } else {
      combine_into<T>(dst, src, op);
    }
  });
}

}  // namespace

void add_into(const Tensor& dst, const Tensor& src) {
  combine(dst, src, [](auto a, auto b) { return static_cast<decltype(a)>(a + b); });
}

void sub_into(const Tensor& dst, const Tensor& src) {
  combine(dst, src, [](auto a, auto b) { return static_cast<decltype(a)>(a - b); });
}

Tensor divided(const Tensor& t, std::int64_t divisor) {
  Tensor out = Tensor::uninitialized(t.dtype(), t.shape(), t.device());
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(t.raw_data());
    T* d = static_cast<T*>(out.mutable_raw_data());
    for (std::int64_t i = 0; i < t.num_elements(); ++i) {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        // Exactly, truncating toward zero: through double, an int64 near its
        // limit rounds to 2^63, whose conversion back is undefined.
        if constexpr (std::is_signed_v<T>) {
          d[i] = static_cast<T>(static_cast<std::int64_t>(s[i]) / divisor);
        } else {
          d[i] = static_cast<T>(static_cast<std::uint64_t>(s[i]) / static_cast<std::uint64_t>(divisor));
        }
      } else {
        const double q = static_cast<double>(static_cast<std::conditional_t<kHalf<T>, float, T>>(s[i])) /
                         static_cast<double>(divisor);
        if constexpr (kHalf<T>) {
          d[i] = T(static_cast<float>(q));
        } else {
          d[i] = static_cast<T>(q);
        }
      }
    }
  });
  return out;
}

}  // namespace distribute::internal
