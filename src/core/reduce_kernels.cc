#include "core/reduce_kernels.h"

#include <algorithm>
#include <type_traits>

#include "core/kernel_clones.h"
#include "core/reduce_arith.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define DISTRIBUTE_F16C 1
#endif

namespace distribute::internal {
namespace {

constexpr std::size_t kBlock = 256;

#ifdef DISTRIBUTE_F16C
// float16 through the CPU's conversion instructions (F16C, on every x86 CPU
// with AVX2), 8 values at a time: the conversion on bits in load() and
// store() is a loop and branches that do not vectorise (float16 all_reduce
// ran at 1.2 GB/s where float32 ran at 43). The same bits: half to float is
// exact both ways, and float to half rounds to nearest even, overflows to
// infinity and keeps subnormals, as store() does; only a NaN differs (the
// instruction keeps its payload), so NaNs are rewritten as store() writes
// them.
bool have_f16c() {
  // (F16C from CPUID itself: clang 14's __builtin_cpu_supports does not know it.)
  static const bool have = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return have;
}

__attribute__((target("avx2,f16c"))) void halves_to_floats(const float16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = load<float>(src[i]);
}

__attribute__((target("avx2,f16c"))) void floats_to_halves(const float* src, float16* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      for (std::size_t j = i; j < i + 8; ++j) dst[j] = store<float16>(src[j]);
    }
  }
  for (; i < n; ++i) dst[i] = store<float16>(src[i]);
}

// reduce_blocks for float16 (accumulated in float) with those conversions:
// the same order of combination, so the same bits.
template <class Combine, class Finish>
void reduce_halves(float16* dst_base, std::span<const void* const> srcs, std::size_t count, Combine combine,
                   Finish finish) {
  float acc[kBlock];
  float next[kBlock];
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t n = std::min(kBlock, count - base);
    halves_to_floats(static_cast<const float16*>(srcs[0]) + base, acc, n);
    for (std::size_t j = 1; j < srcs.size(); ++j) {
      halves_to_floats(static_cast<const float16*>(srcs[j]) + base, next, n);
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], next[i]);
    }
    for (std::size_t i = 0; i < n; ++i) acc[i] = finish(acc[i]);
    floats_to_halves(acc, dst_base + base, n);
  }
}
#endif

// dst[i] = finish(combine(...combine(s0[i], s1[i])..., s[k-1][i])), a block at
// a time: the first two sources are combined in one pass, later ones folded in
// from L1, and with two sources the result goes straight to dst. Every
// element is read from all sources before dst[i] is written, so dst may alias
// any source.
template <class T, class A, class Combine, class Finish>
void reduce_blocks(T* dst_base, std::span<const void* const> srcs, std::size_t count, Combine combine, Finish finish) {
#ifdef DISTRIBUTE_F16C
  if constexpr (std::is_same_v<T, float16> && std::is_same_v<A, float>) {
    if (have_f16c()) {
      reduce_halves(dst_base, srcs, count, combine, finish);
      return;
    }
  }
#endif
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
