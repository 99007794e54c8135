#include "core/reduce_kernels.h"

#include <algorithm>
#include <type_traits>

#include "core/kernel_clones.h"
#include "core/reduce_arith.h"

namespace distribute::internal {
namespace {

constexpr std::size_t kBlock = 256;

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
  if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
      reduce_blocks<T, bool>(dst, srcs, count, AnyOf{}, Same{});
    } else if (op == ReduceOp::kMean && divisor != static_cast<std::int64_t>(srcs.size())) {
      reduce_blocks<T, std::int64_t>(dst, srcs, count, CountTrue{}, BoolMeanOf{divisor});
    } else {
      reduce_blocks<T, bool>(dst, srcs, count, AllOf{}, Same{});
    }
    return;
  } else {
    using Sum = typename Accumulator<T>::sum;
    using Mean = typename Accumulator<T>::mean;
    switch (op) {
      case ReduceOp::kSum: reduce_blocks<T, Sum>(dst, srcs, count, Add<Sum>{}, Same{}); return;
      case ReduceOp::kProduct: reduce_blocks<T, Sum>(dst, srcs, count, Multiply<Sum>{}, Same{}); return;
      case ReduceOp::kMin: reduce_blocks<T, Mean>(dst, srcs, count, Min<Mean>{}, Same{}); return;
      case ReduceOp::kMax: reduce_blocks<T, Mean>(dst, srcs, count, Max<Mean>{}, Same{}); return;
      case ReduceOp::kMean:
        reduce_blocks<T, Mean>(dst, srcs, count, Add<Mean>{}, DivideBy<Mean>{static_cast<Mean>(divisor)});
        return;
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
