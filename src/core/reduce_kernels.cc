#include "core/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/kernel_clones.h"

namespace distribute::internal {
namespace {

constexpr std::size_t kBlock = 256;

// Exact sums of int64 values for MEAN (a GCC/Clang extension, hence __extension__).
__extension__ typedef __int128 int128;  // elements reduced per pass over the sources

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

template <class A, class T>
A load(const T& v) {
  if constexpr (is_half_v<T>) {
    return static_cast<float>(v);
  } else {
    return static_cast<A>(v);
  }
}

template <class T, class A>
T store(A a) {
  if constexpr (is_half_v<T>) {
    return T(static_cast<float>(a));
  } else {
    return static_cast<T>(a);  // integers: modular (C++20), which is the wrap-around we promise
  }
}

template <class A>
A nan_min(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
  }
  return b < a ? b : a;
}
template <class A>
A nan_max(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
  }
  return a < b ? b : a;
}

// dst[i] = finish(combine(...combine(s0[i], s1[i])..., s[k-1][i])), a block at
// a time: the first two sources are combined in one pass, later ones folded in
// from L1, and with two sources the result goes straight to dst. Every
// element is read from all sources before dst[i] is written, so dst may alias
// any source.
template <class T, class A, class Combine, class Finish>
void reduce_blocks(T* dst_base, std::span<const void* const> srcs, std::size_t count, Combine combine, Finish finish) {
  const std::size_t k = srcs.size();
  if (k == 1) {
    const T* s0 = static_cast<const T*>(srcs[0]);
    for (std::size_t i = 0; i < count; ++i) dst_base[i] = store<T>(finish(load<A>(s0[i])));
    return;
  }
  A acc[kBlock];
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t n = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    const T* s1 = static_cast<const T*>(srcs[1]) + base;
    T* dst = dst_base + base;
    if (k == 2) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(load<A>(s0[i]), load<A>(s1[i]));
      for (std::size_t i = 0; i < n; ++i) dst[i] = store<T>(finish(acc[i]));
      continue;
    }
    for (std::size_t i = 0; i < n; ++i) acc[i] = combine(load<A>(s0[i]), load<A>(s1[i]));
    for (std::size_t j = 2; j < k; ++j) {
      const T* sj = static_cast<const T*>(srcs[j]) + base;
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], load<A>(sj[i]));
    }
    for (std::size_t i = 0; i < n; ++i) dst[i] = store<T>(finish(acc[i]));
  }
}

template <class T>
void reduce_typed(T* dst, std::span<const void* const> srcs, std::size_t count, ReduceOp op, std::int64_t divisor) {
  auto same = [](auto a) { return a; };
  if constexpr (std::is_same_v<T, bool>) {
    auto any = [](bool a, bool b) { return a || b; };
    auto all = [](bool a, bool b) { return a && b; };
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
      reduce_blocks<T, bool>(dst, srcs, count, any, same);
    } else if (op == ReduceOp::kMean && divisor != static_cast<std::int64_t>(srcs.size())) {
      // trunc(count_true / divisor) is 1 only if count_true >= divisor.
      std::int64_t d = divisor;
      auto count_true = [](std::int64_t a, std::int64_t b) { return a + b; };
      reduce_blocks<T, std::int64_t>(dst, srcs, count, count_true, [d](std::int64_t c) { return c / d != 0; });
    } else {
      reduce_blocks<T, bool>(dst, srcs, count, all, same);
    }
    return;
  } else {
    using Sum = typename Accumulator<T>::sum;
    using Mean = typename Accumulator<T>::mean;
    switch (op) {
      case ReduceOp::kSum:
        reduce_blocks<T, Sum>(
            dst, srcs, count, [](Sum a, Sum b) { return static_cast<Sum>(a + b); }, same);
        return;
      case ReduceOp::kProduct:
        // Widen to at least unsigned int first: uint16 * uint16 would promote to int and overflow.
        reduce_blocks<T, Sum>(
            dst, srcs, count,
            [](Sum a, Sum b) { return static_cast<Sum>(static_cast<std::common_type_t<Sum, unsigned>>(a) * b); }, same);
        return;
      case ReduceOp::kMin:
        reduce_blocks<T, Mean>(
            dst, srcs, count, [](Mean a, Mean b) { return nan_min(a, b); }, same);
        return;
      case ReduceOp::kMax:
        reduce_blocks<T, Mean>(
            dst, srcs, count, [](Mean a, Mean b) { return nan_max(a, b); }, same);
        return;
      case ReduceOp::kMean: {
        const Mean d = static_cast<Mean>(divisor);
        reduce_blocks<T, Mean>(
            dst, srcs, count, [](Mean a, Mean b) { return static_cast<Mean>(a + b); },
            [d](Mean a) { return static_cast<Mean>(a / d); });
        return;
      }
    }
  }
}

}  // namespace

// One copy per instruction set, chosen at load time (core/kernel_clones.h).
DISTRIBUTE_KERNEL_CLONES
void reduce_sources(void* dst, std::span<const void* const> srcs, std::size_t count, DType dtype, ReduceOp op,
                    std::int64_t mean_divisor) {
  if (count == 0 || srcs.empty()) return;
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : static_cast<std::int64_t>(srcs.size());
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_typed<T>(static_cast<T*>(dst), srcs, count, op, divisor);
  });
}

}  // namespace distribute::internal
