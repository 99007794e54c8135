// Tests of the reduction arithmetic: internal::reduce_sources (element-wise
// reduction of several buffers, the core of every all-reduce) and
// internal::reduce_axes / normalize_axes (reduction along axes).
#include "core/reduce_kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/axis_reduce.h"
#include "core/half_bits.h"
#include "distribute/tensor.h"

namespace distribute {
namespace {

using internal::reduce_sources;

template <class T>
constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// A value of T from an exact number (halves through float).
template <class T>
T make(double v) {
  if constexpr (is_half_v<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// Modular conversion of an integer (C++20 defines it) or exact conversion.
template <class T>
T wrap(std::int64_t v) {
  if constexpr (is_half_v<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
double as_double(T v) {
  if constexpr (is_half_v<T>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
std::string show(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(static_cast<long long>(v));
  } else {
    return std::to_string(as_double(v));
  }
}

// Reduces `srcs` (each the same length) and returns the result.
template <class T>
std::vector<T> reduce(const std::vector<std::vector<T>>& srcs, ReduceOp op, std::int64_t mean_divisor = 0) {
  std::vector<const void*> ptrs;
  for (const auto& s : srcs) ptrs.push_back(s.data());
  std::vector<T> dst(srcs.empty() ? 0 : srcs[0].size());
  reduce_sources(dst.data(), ptrs, dst.size(), dtype_of<T>(), op, mean_divisor);
  return dst;
}

// bool vectors are packed; reduce through std::uint8_t-sized bool arrays.
std::vector<bool> reduce_bools(const std::vector<std::vector<bool>>& srcs, ReduceOp op, std::int64_t divisor = 0) {
  std::vector<std::unique_ptr<bool[]>> bufs;
  std::vector<const void*> ptrs;
  const std::size_t count = srcs[0].size();
  for (const auto& s : srcs) {
    bufs.emplace_back(new bool[count]);
    for (std::size_t i = 0; i < count; ++i) bufs.back()[i] = s[i];
    ptrs.push_back(bufs.back().get());
  }
  std::unique_ptr<bool[]> dst(new bool[count]);
  reduce_sources(dst.get(), ptrs, count, DType::kBool, op, divisor);
  return std::vector<bool>(dst.get(), dst.get() + count);
}

// ---- the matrix: every dtype x op x 1..8 sources x several counts --------------

// Source values, chosen per dtype so that every value and every sum is exact:
//   SUM, MEAN, MIN, MAX: source r holds b + ((r + i) % n) * k at index i, with
//     b = i % M. Each index sees the multipliers 0..n-1 once, in an order that
//     moves with i, so  sum = n*b + k*n(n-1)/2,  min = b,  max = b + (n-1)k.
//   PRODUCT: source r holds 2 if bit r of i is set, else 1, so the product is
//     2^popcount(i & (2^n - 1)) (up to 256, which wraps for 8-bit integers).
//   bool: source r holds bit r of i, so OR = (i & mask) != 0 and AND = (i & mask) == mask.
struct Scale {
  std::int64_t m;
  std::int64_t k;
};

template <class T>
Scale scale_for() {
  if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>)
    return {16, 13};
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return {1000, 1000};  // sums pass 32767: they wrap
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return {1000, 1000000};
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return {1000, 1000000000000};
  else if constexpr (std::is_same_v<T, float16>)
    return {64, 16};  // all sums <= 2048
  else if constexpr (std::is_same_v<T, bfloat16>)
    return {16, 4};  // all sums <= 256
  else
    return {1000, 1000};
}

using MatrixParam = std::tuple<DType, ReduceOp>;

constexpr int kCounts[] = {0, 1, 7, 256, 257, 1000};

// A plain array of T (std::vector<bool> is packed and has no data()).
template <class T>
struct Buffer {
  explicit Buffer(std::size_t n) : data(new T[n]()) {}
  std::unique_ptr<T[]> data;
};

class ReduceSourcesMatrixTest : public ::testing::TestWithParam<MatrixParam> {
 protected:
  template <class T>
  void run(int n, std::size_t count) {
    const auto [dtype, op] = GetParam();
    const std::uint32_t mask = (1u << n) - 1u;
    const Scale sc = scale_for<T>();

    std::vector<Buffer<T>> srcs;
    for (int r = 0; r < n; ++r) srcs.emplace_back(count);
    Buffer<T> want(count);
    for (std::size_t i = 0; i < count; ++i) {
      const auto ii = static_cast<std::int64_t>(i);
      const std::uint32_t bits = static_cast<std::uint32_t>(i) & mask;
      if constexpr (std::is_same_v<T, bool>) {
        for (int r = 0; r < n; ++r) srcs[static_cast<std::size_t>(r)].data[i] = ((i >> r) & 1u) != 0;
        const bool any = bits != 0;
        const bool all = bits == mask;
        want.data[i] = (op == ReduceOp::kSum || op == ReduceOp::kMax) ? any : all;
      } else if (op == ReduceOp::kProduct) {
        for (int r = 0; r < n; ++r) srcs[static_cast<std::size_t>(r)].data[i] = make<T>(((i >> r) & 1u) ? 2 : 1);
        want.data[i] = wrap<T>(std::int64_t{1} << std::popcount(bits));
      } else {
        const std::int64_t b = ii % sc.m;
        for (int r = 0; r < n; ++r) {
          srcs[static_cast<std::size_t>(r)].data[i] = wrap<T>(b + ((r + ii) % n) * sc.k);
        }
        const std::int64_t sum = n * b + sc.k * n * (n - 1) / 2;
        switch (op) {
          case ReduceOp::kSum: want.data[i] = wrap<T>(sum); break;
          case ReduceOp::kMin: want.data[i] = wrap<T>(b); break;
          case ReduceOp::kMax: want.data[i] = wrap<T>(b + (n - 1) * sc.k); break;
          case ReduceOp::kMean:
            if constexpr (std::is_integral_v<T>) {
              want.data[i] = wrap<T>(sum / n);  // exact mean, truncated
            } else if constexpr (std::is_same_v<T, double>) {
              want.data[i] = static_cast<double>(sum) / n;
            } else {
              // float32 arithmetic, rounded once to T.
              want.data[i] = make<T>(static_cast<float>(sum) / static_cast<float>(n));
            }
            break;
          default: break;
        }
      }
    }

    std::vector<const void*> ptrs;
    for (const auto& s : srcs) ptrs.push_back(s.data.get());
    // One sentinel past the end must survive.
    Buffer<T> dst(count + 1);
    for (std::size_t i = 0; i <= count; ++i) dst.data[i] = make<T>(7);
    reduce_sources(dst.data.get(), ptrs, count, dtype, op);
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(same_bits(dst.data[i], want.data[i]))
          << "index " << i << ": got " << show(dst.data[i]) << ", want " << show(want.data[i]);
    }
    EXPECT_TRUE(same_bits(dst.data[count], make<T>(7))) << "wrote past count";
  }
};

// One test per dtype and op (each a separate process under ctest), looping
// over 1..8 sources and the element counts.
TEST_P(ReduceSourcesMatrixTest, MatchesClosedForm) {
  for (int n = 1; n <= 8; ++n) {
    for (int count : kCounts) {
      SCOPED_TRACE(std::to_string(n) + " sources, " + std::to_string(count) + " elements");
      visit_dtype(std::get<0>(GetParam()), [&](auto tag) { run<decltype(tag)>(n, static_cast<std::size_t>(count)); });
      if (HasFailure()) return;
    }
  }
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [dtype, op] = info.param;
  return std::string(to_string(dtype)) + "_" + std::string(to_string(op));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesOpsSources, ReduceSourcesMatrixTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllReduceOps)),
                         matrix_name);

// ---- integers ------------------------------------------------------------------

TEST(ReduceSourcesTest, IntegerSumWrapsAround) {
  constexpr auto i32max = std::numeric_limits<std::int32_t>::max();
  constexpr auto i64max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(reduce<std::int32_t>({{i32max, 5}, {1, -6}}, ReduceOp::kSum),
            (std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), -1}));
  EXPECT_EQ(reduce<std::int64_t>({{i64max}, {1}}, ReduceOp::kSum),
            std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()});
  EXPECT_EQ(reduce<std::int64_t>({{i64max}, {i64max}, {2}}, ReduceOp::kSum), std::vector<std::int64_t>{0});
  EXPECT_EQ(reduce<std::uint8_t>({{200}, {100}}, ReduceOp::kSum), std::vector<std::uint8_t>{44});
  EXPECT_EQ(reduce<std::int8_t>({{-128}, {-1}}, ReduceOp::kSum), std::vector<std::int8_t>{127});
  EXPECT_EQ(reduce<std::int16_t>({{30000}, {30000}, {30000}}, ReduceOp::kSum),
            std::vector<std::int16_t>{static_cast<std::int16_t>(90000 - 131072)});
}

TEST(ReduceSourcesTest, IntegerProductWrapsAround) {
  EXPECT_EQ(reduce<std::int32_t>({{65536, 65536}, {65536, 32768}}, ReduceOp::kProduct),
            (std::vector<std::int32_t>{0, std::numeric_limits<std::int32_t>::min()}));
  EXPECT_EQ(reduce<std::int8_t>({{-128}, {-1}}, ReduceOp::kProduct), std::vector<std::int8_t>{-128});
  EXPECT_EQ(reduce<std::int64_t>({{std::numeric_limits<std::int64_t>::min()}, {-1}}, ReduceOp::kProduct),
            std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()});
  EXPECT_EQ(reduce<std::uint8_t>({{16}, {17}}, ReduceOp::kProduct), std::vector<std::uint8_t>{16});
  EXPECT_EQ(reduce<std::int16_t>({{-300}, {300}}, ReduceOp::kProduct),
            std::vector<std::int16_t>{static_cast<std::int16_t>(-90000 + 131072 - 65536)});
  EXPECT_EQ(reduce<std::int32_t>({{-3}, {4}, {-5}}, ReduceOp::kProduct), std::vector<std::int32_t>{60});
}

TEST(ReduceSourcesTest, IntegerMeanTruncatesTowardZero) {
  EXPECT_EQ(reduce<std::int32_t>({{-3, 3, -7, 7}, {0, 0, 0, 0}}, ReduceOp::kMean),
            (std::vector<std::int32_t>{-1, 1, -3, 3}));  // -1.5 -> -1 (not floor's -2)
  EXPECT_EQ(reduce<std::int32_t>({{-7}, {0}, {0}}, ReduceOp::kMean), std::vector<std::int32_t>{-2});
  EXPECT_EQ(reduce<std::int8_t>({{-128}, {-128}, {-127}}, ReduceOp::kMean), std::vector<std::int8_t>{-127});
  EXPECT_EQ(reduce<std::int16_t>({{-5}, {0}, {0}, {0}}, ReduceOp::kMean), std::vector<std::int16_t>{-1});
  EXPECT_EQ(reduce<std::int64_t>({{-9}, {-1}, {3}, {0}}, ReduceOp::kMean), std::vector<std::int64_t>{-1});
}

TEST(ReduceSourcesTest, IntegerMeanDoesNotOverflow) {
  constexpr auto i64max = std::numeric_limits<std::int64_t>::max();
  constexpr auto i64min = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(reduce<std::int64_t>({{i64max}, {i64max - 2}}, ReduceOp::kMean), std::vector<std::int64_t>{i64max - 1});
  EXPECT_EQ(reduce<std::int64_t>({{i64min}, {i64min + 1}}, ReduceOp::kMean), std::vector<std::int64_t>{i64min + 1});
  EXPECT_EQ(reduce<std::int64_t>({{i64min}, {i64min}, {i64min}}, ReduceOp::kMean), std::vector<std::int64_t>{i64min});
  EXPECT_EQ(reduce<std::int64_t>(std::vector<std::vector<std::int64_t>>(8, {i64max}), ReduceOp::kMean),
            std::vector<std::int64_t>{i64max});
  EXPECT_EQ(reduce<std::int64_t>({{i64max}, {i64min}}, ReduceOp::kMean), std::vector<std::int64_t>{0});
  EXPECT_EQ(reduce<std::int8_t>({{127}, {127}}, ReduceOp::kMean), std::vector<std::int8_t>{127});
  EXPECT_EQ(reduce<std::int8_t>({{127}, {126}}, ReduceOp::kMean), std::vector<std::int8_t>{126});
  EXPECT_EQ(reduce<std::int8_t>({{-128}, {-128}}, ReduceOp::kMean), std::vector<std::int8_t>{-128});
  EXPECT_EQ(reduce<std::uint8_t>({{255}, {255}, {254}}, ReduceOp::kMean), std::vector<std::uint8_t>{254});
  EXPECT_EQ(
      reduce<std::int32_t>({{std::numeric_limits<std::int32_t>::max()}, {std::numeric_limits<std::int32_t>::max()}},
                           ReduceOp::kMean),
      std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::max()});
}

TEST(ReduceSourcesTest, IntegerMinMaxIncludeNegatives) {
  EXPECT_EQ(reduce<std::int64_t>({{5, -1}, {-3, 4}, {0, std::numeric_limits<std::int64_t>::min()}}, ReduceOp::kMin),
            (std::vector<std::int64_t>{-3, std::numeric_limits<std::int64_t>::min()}));
  EXPECT_EQ(reduce<std::int8_t>({{-5, -128}, {-3, -127}}, ReduceOp::kMax), (std::vector<std::int8_t>{-3, -127}));
  EXPECT_EQ(reduce<std::uint8_t>({{200, 1}, {100, 255}}, ReduceOp::kMin), (std::vector<std::uint8_t>{100, 1}));
}

// ---- floats ----------------------------------------------------------------------

// Every float16 value, alone and with a few others under every op, gives the
// bits of the conversions on bits (core/half_bits.h): the kernels convert
// float16 with the CPU's instructions where it has them (F16C), which must
// round, overflow, keep subnormals and write NaNs as those do.
TEST(ReduceSourcesTest, Float16MatchesTheConversionsOnBitsForEveryValue) {
  auto to_float = [](std::uint16_t h) { return std::bit_cast<float>(internal::half_to_float_bits(h)); };
  auto to_half = [](float f) { return internal::half_from_float_bits(std::bit_cast<std::uint32_t>(f)); };
  std::vector<float16> every(65536 + 5);  // + 5: a tail past the vectors of 8
  for (std::size_t i = 0; i < every.size(); ++i) every[i].bits = static_cast<std::uint16_t>(i);
  std::vector<float16> out(every.size());
  for (const std::uint16_t other :
       {0x3c00, 0xc100, 0x2e66, 0x0001, 0x8200, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x0400, 0x1800, 0xd3ff}) {
    std::vector<float16> second(every.size());
    for (float16& h : second) h.bits = other;
    const float b = to_float(other);
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kMean}) {
      const void* srcs[] = {every.data(), second.data()};
      reduce_sources(out.data(), srcs, every.size(), DType::kFloat16, op);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < every.size() && wrong < 5; ++i) {
        const float a = to_float(every[i].bits);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        const float r = op == ReduceOp::kSum       ? a + b
                        : op == ReduceOp::kProduct ? a * b
                        : op == ReduceOp::kMean    ? (a + b) / 2.f
                        : a != a || b != b         ? nan
                        : op == ReduceOp::kMin     ? (b < a ? b : a)
                                                   : (a < b ? b : a);
        // Two NaNs: which one an addition or a product keeps (its sign) is
        // the compiler's choice of operand order, so any NaN will do.
        const bool two_nans = a != a && b != b;
        const bool is_nan = (out[i].bits & 0x7c00) == 0x7c00 && (out[i].bits & 0x3ff) != 0;
        if (two_nans ? !is_nan : out[i].bits != to_half(r)) {
          ++wrong;
          ADD_FAILURE() << to_string(op) << " of 0x" << std::hex << every[i].bits << " and 0x" << other << ": 0x"
                        << out[i].bits << ", want 0x" << to_half(r);
        }
      }
    }
  }
  // Alone (a copy: MEAN of one source by 1, and by 3).
  for (const std::int64_t divisor : {1, 3}) {
    const void* srcs[] = {every.data()};
    reduce_sources(out.data(), srcs, every.size(), DType::kFloat16, ReduceOp::kMean, divisor);
    for (std::size_t i = 0; i < every.size(); ++i) {
      ASSERT_EQ(out[i].bits, to_half(to_float(every[i].bits) / static_cast<float>(divisor)))
          << "0x" << std::hex << every[i].bits << " / " << divisor;
    }
  }
}

// 2048 + 1 + 1 in float16 arithmetic is 2048 (2049 ties to even at each step);
// accumulated in float32 it is 2050, which float16 represents.
TEST(ReduceSourcesTest, Float16AccumulatesInFloat32) {
  const float16 big(2048.f), one(1.f);
  float16 naive = big;
  for (int k = 0; k < 2; ++k) naive = float16(static_cast<float>(naive) + static_cast<float>(one));
  ASSERT_EQ(static_cast<float>(naive), 2048.f) << "16-bit accumulation would lose the ones";
  auto got = reduce<float16>({{big}, {one}, {one}}, ReduceOp::kSum);
  EXPECT_EQ(static_cast<float>(got[0]), 2050.f);
  // MEAN: 60000 + 60000 overflows float16 (max 65504) but not float32.
  got = reduce<float16>({{float16(60000.f)}, {float16(60000.f)}}, ReduceOp::kMean);
  EXPECT_EQ(static_cast<float>(got[0]), 60000.f);
  // MEAN rounds once: (1 + 2 + 2) / 3 in float32, then to float16.
  got = reduce<float16>({{float16(1.f)}, {float16(2.f)}, {float16(2.f)}}, ReduceOp::kMean);
  EXPECT_EQ(got[0].bits, float16(5.f / 3.f).bits);
  // PRODUCT too: 256 * 256 overflows float16 (inf) but not float32, so the
  // final * 1/256 brings it back to 256.
  got = reduce<float16>({{float16(256.f)}, {float16(256.f)}, {float16(1.f / 256.f)}}, ReduceOp::kProduct);
  EXPECT_EQ(static_cast<float>(got[0]), 256.f);
}

TEST(ReduceSourcesTest, BFloat16AccumulatesInFloat32) {
  const bfloat16 big(256.f), one(1.f);
  bfloat16 naive = big;
  for (int k = 0; k < 2; ++k) naive = bfloat16(static_cast<float>(naive) + static_cast<float>(one));
  ASSERT_EQ(static_cast<float>(naive), 256.f) << "16-bit accumulation would lose the ones";
  auto got = reduce<bfloat16>({{big}, {one}, {one}}, ReduceOp::kSum);
  EXPECT_EQ(static_cast<float>(got[0]), 258.f);
  // MEAN: 259 / 4 = 64.75, a tie between 64.5 and 65 in bfloat16: 65 (even).
  // Accumulating in bfloat16 would give 256 / 4 = 64.
  got = reduce<bfloat16>({{big}, {one}, {one}, {one}}, ReduceOp::kMean);
  EXPECT_EQ(got[0].bits, bfloat16(259.f / 4.f).bits);
  EXPECT_EQ(static_cast<float>(got[0]), 65.f);
}

TEST(ReduceSourcesTest, FloatSumCombinesInSourceOrder) {
  // (1e8 + 1) - 1e8 is 0 in float32; (1e8 - 1e8) + 1 is 1.
  EXPECT_EQ(reduce<float>({{1e8f}, {1.f}, {-1e8f}}, ReduceOp::kSum), std::vector<float>{0.f});
  EXPECT_EQ(reduce<float>({{1e8f}, {-1e8f}, {1.f}}, ReduceOp::kSum), std::vector<float>{1.f});
  EXPECT_EQ(reduce<double>({{1e17}, {1.0}, {-1e17}}, ReduceOp::kSum), std::vector<double>{0.0});
}

TEST(ReduceSourcesTest, FloatMeanDividesTheSum) {
  EXPECT_EQ(reduce<float>({{1.f}, {2.f}}, ReduceOp::kMean), std::vector<float>{1.5f});
  EXPECT_EQ(reduce<float>({{1.f}, {1.f}, {2.f}}, ReduceOp::kMean), std::vector<float>{4.f / 3.f});
  EXPECT_EQ(reduce<double>({{-1.0}, {2.0}, {2.0}}, ReduceOp::kMean), std::vector<double>{1.0});
}

template <class T>
void expect_min_max_propagate_nan() {
  const T nan = make<T>(std::numeric_limits<double>::quiet_NaN());
  const T one = make<T>(1), zero = make<T>(0);
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    for (const auto& srcs : std::vector<std::vector<std::vector<T>>>{
             {{nan}, {one}}, {{one}, {nan}}, {{one}, {nan}, {zero}}, {{zero}, {one}, {nan}}, {{nan}, {nan}}}) {
      const auto got = reduce<T>(srcs, op);
      EXPECT_TRUE(std::isnan(as_double(got[0]))) << to_string(dtype_of<T>()) << " " << to_string(op) << " of "
                                                 << srcs.size() << " sources gave " << as_double(got[0]);
    }
    EXPECT_FALSE(std::isnan(as_double(reduce<T>({{one}, {zero}}, op)[0])));
  }
  EXPECT_EQ(as_double(reduce<T>({{make<T>(-2)}, {make<T>(3)}, {make<T>(-1)}}, ReduceOp::kMin)[0]), -2.0);
  EXPECT_EQ(as_double(reduce<T>({{make<T>(-2)}, {make<T>(3)}, {make<T>(-1)}}, ReduceOp::kMax)[0]), 3.0);
  EXPECT_EQ(as_double(reduce<T>({{make<T>(-std::numeric_limits<double>::infinity())}, {one}}, ReduceOp::kMin)[0]),
            -std::numeric_limits<double>::infinity());
}

TEST(ReduceSourcesTest, MinMaxPropagateNaN) {
  expect_min_max_propagate_nan<float>();
  expect_min_max_propagate_nan<double>();
  expect_min_max_propagate_nan<float16>();
  expect_min_max_propagate_nan<bfloat16>();
}

// ---- bool ----------------------------------------------------------------------

TEST(ReduceSourcesTest, BoolRules) {
  const std::vector<std::vector<bool>> srcs{{false, true, false, true}, {false, false, true, true}};
  const std::vector<bool> any{false, true, true, true};
  const std::vector<bool> all{false, false, false, true};
  EXPECT_EQ(reduce_bools(srcs, ReduceOp::kSum), any);
  EXPECT_EQ(reduce_bools(srcs, ReduceOp::kMax), any);
  EXPECT_EQ(reduce_bools(srcs, ReduceOp::kMin), all);
  EXPECT_EQ(reduce_bools(srcs, ReduceOp::kProduct), all);
  EXPECT_EQ(reduce_bools(srcs, ReduceOp::kMean), all);
  EXPECT_EQ(reduce_bools({{true, false}}, ReduceOp::kMean), (std::vector<bool>{true, false}));
}

// ---- mean_divisor ------------------------------------------------------------------

TEST(ReduceSourcesTest, MeanDivisor) {
  EXPECT_EQ(reduce<std::int32_t>({{4, -4}, {6, -6}}, ReduceOp::kMean, 4), (std::vector<std::int32_t>{2, -2}));
  EXPECT_EQ(reduce<float>({{4.f}, {6.f}}, ReduceOp::kMean, 4), std::vector<float>{2.5f});
  EXPECT_EQ(reduce<double>({{3.0}}, ReduceOp::kMean, 2), std::vector<double>{1.5});
  EXPECT_EQ(
      reduce<std::int64_t>({{std::numeric_limits<std::int64_t>::max()}, {std::numeric_limits<std::int64_t>::max()}},
                           ReduceOp::kMean, 4),
      std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::max() / 2});
  EXPECT_EQ(static_cast<float>(reduce<float16>({{float16(3.f)}}, ReduceOp::kMean, 4)[0]), 0.75f);
  // divisor 0 (or negative) means the number of sources
  EXPECT_EQ(reduce<float>({{4.f}, {6.f}}, ReduceOp::kMean, 0), std::vector<float>{5.f});
  EXPECT_EQ(reduce<float>({{4.f}, {6.f}}, ReduceOp::kMean, -3), std::vector<float>{5.f});
  // other ops ignore it
  EXPECT_EQ(reduce<float>({{4.f}, {6.f}}, ReduceOp::kSum, 4), std::vector<float>{10.f});
  EXPECT_EQ(reduce<std::int32_t>({{4}, {6}}, ReduceOp::kMax, 4), std::vector<std::int32_t>{6});
  // bool: trunc(count_true / divisor) != 0
  const std::vector<std::vector<bool>> three{
      {true, true, false, true}, {true, false, false, true}, {false, false, false, true}};
  EXPECT_EQ(reduce_bools(three, ReduceOp::kMean, 2), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(reduce_bools(three, ReduceOp::kMean, 1), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(reduce_bools(three, ReduceOp::kMean, 3), (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(reduce_bools(three, ReduceOp::kMean, 4), (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(reduce_bools(three, ReduceOp::kSum, 4), (std::vector<bool>{true, true, false, true}));
}

// ---- aliasing and edge cases -------------------------------------------------------

TEST(ReduceSourcesTest, DstMayAliasASource) {
  const std::size_t count = 1000;  // several blocks
  for (std::size_t alias : {std::size_t{0}, std::size_t{2}}) {
    for (ReduceOp op : kAllReduceOps) {
      std::vector<std::vector<std::int64_t>> srcs(3, std::vector<std::int64_t>(count));
      for (std::size_t r = 0; r < 3; ++r) {
        for (std::size_t i = 0; i < count; ++i) srcs[r][i] = static_cast<std::int64_t>(i * (r + 1)) - 500;
      }
      const std::vector<std::int64_t> want = reduce<std::int64_t>(srcs, op);
      std::vector<const void*> ptrs{srcs[0].data(), srcs[1].data(), srcs[2].data()};
      reduce_sources(srcs[alias].data(), ptrs, count, DType::kInt64, op);
      EXPECT_EQ(srcs[alias], want) << "alias " << alias << " op " << to_string(op);
    }
  }
  std::vector<float> a{1.f, 2.f, 3.f}, b{10.f, 20.f, 30.f};
  std::vector<const void*> ptrs{a.data(), b.data()};
  reduce_sources(a.data(), ptrs, a.size(), DType::kFloat32, ReduceOp::kMean);
  EXPECT_EQ(a, (std::vector<float>{5.5f, 11.f, 16.5f}));
}

TEST(ReduceSourcesTest, NothingWrittenForNoElementsOrNoSources) {
  std::vector<float> src{1.f}, dst{-1.f};
  std::vector<const void*> ptrs{src.data()};
  reduce_sources(dst.data(), ptrs, 0, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(dst[0], -1.f);
  reduce_sources(dst.data(), std::span<const void* const>(), 1, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(dst[0], -1.f);
}

TEST(ReduceSourcesTest, SingleSourceIsACopyForEveryOp) {
  const std::vector<double> src{-1.5, 0.0, 2.25};
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(reduce<double>({src}, op), src) << to_string(op);
}

// ---- normalize_axes / reduce_axes ---------------------------------------------------

TEST(NormalizeAxesTest, NormalisesAndSorts) {
  using internal::normalize_axes;
  EXPECT_EQ(normalize_axes({-1, 0}, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(normalize_axes({2, -3}, 3), (std::vector<int>{0, 2}));
  EXPECT_EQ(normalize_axes({}, 3), std::vector<int>{});
  EXPECT_EQ(normalize_axes({}, 0), std::vector<int>{});
  EXPECT_EQ(normalize_axes({-4}, 4), std::vector<int>{0});
}

TEST(NormalizeAxesTest, RejectsBadAndRepeatedAxes) {
  using internal::normalize_axes;
  try {
    normalize_axes({3}, 2);
    ADD_FAILURE() << "accepted axis 3 for rank 2";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("`axis` = 3 out of range for `value` with rank 2"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(normalize_axes({2}, 2), InvalidArgumentError);
  EXPECT_THROW(normalize_axes({-3}, 2), InvalidArgumentError);
  EXPECT_THROW(normalize_axes({0}, 0), InvalidArgumentError);
  try {
    normalize_axes({1, -1}, 2);
    ADD_FAILURE() << "accepted a repeated axis";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("repeats"), std::string::npos) << e.what();
  }
  EXPECT_THROW(normalize_axes({0, 0}, 1), InvalidArgumentError);
}

TEST(ReduceAxesTest, AccumulatorDTypes) {
  using internal::accumulator_dtype;
  EXPECT_EQ(accumulator_dtype(DType::kBool), DType::kInt64);
  EXPECT_EQ(accumulator_dtype(DType::kInt8), DType::kInt64);
  EXPECT_EQ(accumulator_dtype(DType::kUInt8), DType::kInt64);
  EXPECT_EQ(accumulator_dtype(DType::kInt32), DType::kInt64);
  EXPECT_EQ(accumulator_dtype(DType::kInt64), DType::kInt64);
  EXPECT_EQ(accumulator_dtype(DType::kFloat16), DType::kFloat32);
  EXPECT_EQ(accumulator_dtype(DType::kBFloat16), DType::kFloat32);
  EXPECT_EQ(accumulator_dtype(DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(accumulator_dtype(DType::kFloat64), DType::kFloat64);
}

Tensor i64(std::initializer_list<std::int64_t> v) { return constant(v); }

TEST(ReduceAxesTest, SumAlongAxes) {
  using internal::reduce_axes;
  const Tensor t = constant({{0, 1, 2}, {3, 4, 5}});
  EXPECT_EQ(reduce_axes(t, {0}, ReduceOp::kSum), i64({3, 5, 7}));
  EXPECT_EQ(reduce_axes(t, {1}, ReduceOp::kSum), i64({3, 12}));
  const Tensor all = reduce_axes(t, {0, 1}, ReduceOp::kSum);
  EXPECT_EQ(all.shape(), Shape{});
  EXPECT_EQ(all.scalar<std::int64_t>(), 15);
  EXPECT_EQ(reduce_axes(t, {}, ReduceOp::kSum), cast(t, DType::kInt64));
  EXPECT_EQ(reduce_axes(t, {1}, ReduceOp::kMean), i64({3, 12}));  // MEAN sums; the caller divides
}

TEST(ReduceAxesTest, MiddleAxisOfRank3) {
  using internal::reduce_axes;
  const Tensor t = iota(DType::kFloat64, Shape{2, 3, 4});
  const Tensor r = reduce_axes(t, {1}, ReduceOp::kSum);
  ASSERT_EQ(r.shape(), (Shape{2, 4}));
  for (std::int64_t a = 0; a < 2; ++a) {
    for (std::int64_t c = 0; c < 4; ++c) {
      // sum over b of 12a + 4b + c = 36a + 12 + 3c
      EXPECT_EQ(r.at<double>({a, c}), static_cast<double>(36 * a + 12 + 3 * c)) << a << "," << c;
    }
  }
  const Tensor outer = reduce_axes(t, {0, 2}, ReduceOp::kMax);
  EXPECT_EQ(outer, constant({15.0, 19.0, 23.0}));
}

TEST(ReduceAxesTest, MinMaxProduct) {
  using internal::reduce_axes;
  const Tensor t = constant({{3, -1, 4}, {1, -5, 9}});
  EXPECT_EQ(reduce_axes(t, {0}, ReduceOp::kMin), i64({1, -5, 4}));
  EXPECT_EQ(reduce_axes(t, {1}, ReduceOp::kMax), i64({4, 9}));
  EXPECT_EQ(reduce_axes(t, {0}, ReduceOp::kProduct), i64({3, 5, 36}));
  EXPECT_EQ(reduce_axes(t, {0, 1}, ReduceOp::kProduct).scalar<std::int64_t>(), 540);
  // int8 values accumulate in int64: no wrap at 8 bits.
  EXPECT_EQ(reduce_axes(constant(std::vector<std::int8_t>{100, 100, 100}, Shape{3}), {0}, ReduceOp::kProduct)
                .scalar<std::int64_t>(),
            1000000);
  // int64 products wrap.
  EXPECT_EQ(reduce_axes(i64({std::int64_t{1} << 62, 4}), {0}, ReduceOp::kProduct).scalar<std::int64_t>(), 0);
}

TEST(ReduceAxesTest, HalfAndBoolInputs) {
  using internal::reduce_axes;
  const Tensor h = cast(constant({2048.f, 1.f, 1.f}), DType::kFloat16);
  const Tensor s = reduce_axes(h, {0}, ReduceOp::kSum);
  EXPECT_EQ(s.dtype(), DType::kFloat32);
  EXPECT_EQ(s.scalar<float>(), 2050.f);
  const Tensor b = constant({{true, false}, {true, true}, {false, false}});
  const Tensor count = reduce_axes(b, {0}, ReduceOp::kSum);
  EXPECT_EQ(count, i64({2, 1}));
  EXPECT_EQ(reduce_axes(b, {1}, ReduceOp::kMin), i64({0, 1, 0}));
}

TEST(ReduceAxesTest, EmptyReductionsGiveTheIdentity) {
  using internal::reduce_axes;
  const Tensor f = constant(std::vector<float>{}, Shape{0, 3});
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(reduce_axes(f, {0}, ReduceOp::kSum), constant({0.f, 0.f, 0.f}));
  EXPECT_EQ(reduce_axes(f, {0}, ReduceOp::kProduct), constant({1.f, 1.f, 1.f}));
  EXPECT_EQ(reduce_axes(f, {0}, ReduceOp::kMin), constant({inf, inf, inf}));
  EXPECT_EQ(reduce_axes(f, {0}, ReduceOp::kMax), constant({-inf, -inf, -inf}));
  EXPECT_EQ(reduce_axes(f, {1}, ReduceOp::kSum).shape(), Shape{0});
  // Integers: the input dtype's largest / smallest value (as tf.reduce_min/max), held in int64.
  const Tensor i = constant(std::vector<int>{}, Shape{2, 0});
  EXPECT_EQ(reduce_axes(i, {1}, ReduceOp::kMin),
            i64({std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::max()}));
  EXPECT_EQ(reduce_axes(i, {1}, ReduceOp::kMax),
            i64({std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::min()}));
  EXPECT_EQ(reduce_axes(i, {0, 1}, ReduceOp::kSum).scalar<std::int64_t>(), 0);
  EXPECT_EQ(reduce_axes(i, {0, 1}, ReduceOp::kProduct).scalar<std::int64_t>(), 1);
  const Tensor i8 = constant(std::vector<std::int8_t>{}, Shape{0});
  EXPECT_EQ(reduce_axes(i8, {0}, ReduceOp::kMin).scalar<std::int64_t>(), 127);
  EXPECT_EQ(reduce_axes(i8, {0}, ReduceOp::kMax).scalar<std::int64_t>(), -128);
  const Tensor l = constant(std::vector<std::int64_t>{}, Shape{0});
  EXPECT_EQ(reduce_axes(l, {0}, ReduceOp::kMin).scalar<std::int64_t>(), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(reduce_axes(l, {0}, ReduceOp::kMax).scalar<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
  const Tensor b = constant(std::vector<bool>{}, Shape{0});
  EXPECT_EQ(reduce_axes(b, {0}, ReduceOp::kMin).scalar<std::int64_t>(), 1);  // all() of nothing
  EXPECT_EQ(reduce_axes(b, {0}, ReduceOp::kMax).scalar<std::int64_t>(), 0);  // any() of nothing
  const Tensor h = constant(std::vector<float16>{}, Shape{0});
  EXPECT_EQ(reduce_axes(h, {0}, ReduceOp::kMin).scalar<float>(), inf);
}

TEST(ReduceAxesTest, MinMaxPropagateNaN) {
  using internal::reduce_axes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor t = constant({{1.f, nan}, {nan, 2.f}, {0.f, 5.f}});
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    const Tensor r = reduce_axes(t, {0}, op);
    EXPECT_TRUE(std::isnan(r.at<float>({0}))) << to_string(op);
    EXPECT_TRUE(std::isnan(r.at<float>({1}))) << to_string(op);
    const Tensor rows = reduce_axes(t, {1}, op);
    EXPECT_TRUE(std::isnan(rows.at<float>({0})));
    EXPECT_TRUE(std::isnan(rows.at<float>({1})));
    EXPECT_FALSE(std::isnan(rows.at<float>({2})));
  }
}

}  // namespace
}  // namespace distribute
