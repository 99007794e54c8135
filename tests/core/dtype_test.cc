// Tests of dtype.h: sizes, names, classification, and the two 16-bit float
// conversions (IEEE binary16 and bfloat16).
#include "distribute/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace distribute {
namespace {

float bits_to_float(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t float_to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// The value of a binary16 bit pattern, computed independently of the library:
// (-1)^s * 2^(e-15) * 1.m for normals, (-1)^s * 2^-24 * m for subnormals.
double half_value(std::uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 0x1f) {
    v = mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return sign ? -v : v;
}

// ---- size_of / to_string / is_floating / is_integer --------------------------

struct DTypeFacts {
  DType dtype;
  std::size_t size;
  const char* name;
  bool floating;
  bool integer;
};

class DTypeFactsTest : public ::testing::TestWithParam<DTypeFacts> {};

TEST_P(DTypeFactsTest, SizeNameAndClassification) {
  const DTypeFacts& f = GetParam();
  EXPECT_EQ(size_of(f.dtype), f.size);
  EXPECT_EQ(to_string(f.dtype), f.name);
  EXPECT_EQ(is_floating(f.dtype), f.floating);
  EXPECT_EQ(is_integer(f.dtype), f.integer);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, DTypeFactsTest,
                         ::testing::Values(DTypeFacts{DType::kBool, 1, "bool", false, false},
                                           DTypeFacts{DType::kInt8, 1, "int8", false, true},
                                           DTypeFacts{DType::kUInt8, 1, "uint8", false, true},
                                           DTypeFacts{DType::kInt16, 2, "int16", false, true},
                                           DTypeFacts{DType::kInt32, 4, "int32", false, true},
                                           DTypeFacts{DType::kInt64, 8, "int64", false, true},
                                           DTypeFacts{DType::kFloat16, 2, "float16", true, false},
                                           DTypeFacts{DType::kBFloat16, 2, "bfloat16", true, false},
                                           DTypeFacts{DType::kFloat32, 4, "float32", true, false},
                                           DTypeFacts{DType::kFloat64, 8, "float64", true, false}),
                         [](const ::testing::TestParamInfo<DTypeFacts>& p) { return std::string(p.param.name); });

TEST(DTypeTest, AllDTypesListsEveryEnumeratorOnce) {
  std::vector<DType> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  ASSERT_EQ(all.size(), 10u);
  for (std::size_t i = 0; i < all.size(); ++i) EXPECT_EQ(static_cast<int>(all[i]), static_cast<int>(i));
}

TEST(DTypeTest, StorageTypesHaveTheDTypeSize) {
  for (DType d : kAllDTypes) {
    const std::size_t storage = visit_dtype(d, [](auto tag) { return sizeof(tag); });
    EXPECT_EQ(storage, size_of(d)) << to_string(d);
  }
}

TEST(DTypeTest, DTypeOfMapsCppTypes) {
  static_assert(dtype_of<bool>() == DType::kBool);
  static_assert(dtype_of<std::int8_t>() == DType::kInt8);
  static_assert(dtype_of<std::uint8_t>() == DType::kUInt8);
  static_assert(dtype_of<std::int16_t>() == DType::kInt16);
  static_assert(dtype_of<int>() == DType::kInt32);
  static_assert(dtype_of<std::int64_t>() == DType::kInt64);
  static_assert(dtype_of<long long>() == DType::kInt64);
  static_assert(dtype_of<const float>() == DType::kFloat32);
  static_assert(dtype_of<double>() == DType::kFloat64);
  static_assert(dtype_of<float16>() == DType::kFloat16);
  static_assert(dtype_of<bfloat16>() == DType::kBFloat16);
  for (DType d : kAllDTypes) {
    const DType back = visit_dtype(d, [](auto tag) { return dtype_of<decltype(tag)>(); });
    EXPECT_EQ(back, d) << to_string(d);
  }
}

// ---- float16 -------------------------------------------------------------------

TEST(Float16Test, ToFloatIsExactForEveryBitPattern) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = float16::to_float(bits);
    if (half_is_nan(bits)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), half_value(bits)) << "bits 0x" << std::hex << h;
    EXPECT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
  }
}

TEST(Float16Test, RoundTripsEveryNonNaNBitPattern) {
  int checked = 0;
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (half_is_nan(bits)) continue;
    ASSERT_EQ(float16::from_float(float16::to_float(bits)), bits) << "bits 0x" << std::hex << h;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 1023);  // every pattern but the 2046 NaNs
}

TEST(Float16Test, NaNStaysNaN) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (!half_is_nan(bits)) continue;
    ASSERT_TRUE(half_is_nan(float16::from_float(float16::to_float(bits)))) << std::hex << h;
  }
  // NaNs whose payload lives only in the low float bits (dropped by the shift) stay NaN.
  for (std::uint32_t u : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu, 0x7f801fffu}) {
    const std::uint16_t h = float16::from_float(bits_to_float(u));
    EXPECT_TRUE(half_is_nan(h)) << std::hex << u << " -> " << h;
    EXPECT_EQ((h & 0x8000u) != 0, (u & 0x80000000u) != 0) << std::hex << u;
  }
  EXPECT_TRUE(std::isnan(static_cast<float>(float16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Float16Test, KnownValues) {
  EXPECT_EQ(float16(0.0f).bits, 0x0000);
  EXPECT_EQ(float16(-0.0f).bits, 0x8000);
  EXPECT_EQ(float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float16(-2.0f).bits, 0xc000);
  EXPECT_EQ(float16(0.5f).bits, 0x3800);
  EXPECT_EQ(float16(65504.0f).bits, 0x7bff);               // largest finite half
  EXPECT_EQ(float16(std::ldexp(1.0f, -14)).bits, 0x0400);  // smallest normal
  EXPECT_EQ(float16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float16(0.1f).bits, 0x2e66);
  EXPECT_EQ(float16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_EQ(float16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_EQ(static_cast<float>(float16(3.0f)), 3.0f);
}

TEST(Float16Test, OverflowGoesToInfinity) {
  // 65520 is halfway between 65504 (odd mantissa) and 65536 (not finite): ties to even -> inf.
  EXPECT_EQ(float16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(float16(-65520.0f).bits, 0xfc00);
  EXPECT_EQ(float16(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
  EXPECT_EQ(float16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(float16(70000.0f).bits, 0x7c00);
  EXPECT_EQ(float16(1e30f).bits, 0x7c00);
  EXPECT_EQ(float16(-std::numeric_limits<float>::max()).bits, 0xfc00);
}

TEST(Float16Test, SubnormalsAndUnderflow) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest subnormal half
  EXPECT_EQ(float16(tiny * 3).bits, 0x0003);
  EXPECT_EQ(float16(-tiny * 1023).bits, 0x83ff);  // largest subnormal
  EXPECT_EQ(float16(tiny * 0.5f).bits, 0x0000);   // halfway to 0: ties to even (0)
  EXPECT_EQ(float16(-tiny * 0.5f).bits, 0x8000);  // keeps the sign
  EXPECT_EQ(float16(std::nextafter(tiny * 0.5f, 1.0f)).bits, 0x0001);
  EXPECT_EQ(float16(tiny * 1.5f).bits, 0x0002);  // 1.5 ulp: ties to even (2)
  EXPECT_EQ(float16(tiny * 2.5f).bits, 0x0002);  // 2.5 ulp: ties to even (2)
  EXPECT_EQ(float16(tiny * 2.25f).bits, 0x0002);
  EXPECT_EQ(float16(tiny * 2.75f).bits, 0x0003);
  EXPECT_EQ(float16(tiny * 1023.5f).bits, 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(float16(std::ldexp(1.0f, -30)).bits, 0x0000);
  EXPECT_EQ(float16(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
}

// Every float exactly halfway between two adjacent halves rounds to the even one;
// one float ulp either side rounds to the nearer one.
TEST(Float16Test, RoundsToNearestEvenAtEveryMidpoint) {
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {  // positive finite pairs (h, h + 1)
    const double lo = half_value(static_cast<std::uint16_t>(h));
    const double hi = half_value(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoint not exact in float";
    const std::uint16_t even = (h & 1u) ? static_cast<std::uint16_t>(h + 1) : static_cast<std::uint16_t>(h);
    ASSERT_EQ(float16::from_float(mid), even) << "midpoint after 0x" << std::hex << h;
    ASSERT_EQ(float16::from_float(-mid), static_cast<std::uint16_t>(even | 0x8000u)) << std::hex << h;
    ASSERT_EQ(float16::from_float(std::nextafter(mid, 0.0f)), h) << "below midpoint after 0x" << std::hex << h;
    ASSERT_EQ(float16::from_float(std::nextafter(mid, 1e9f)), h + 1) << "above midpoint after 0x" << std::hex << h;
  }
}

// A sweep over float bit patterns (every 4099th, covering all exponents),
// checked against a nearest-value search over all finite halves.
TEST(Float16Test, FromFloatPicksTheNearestHalf) {
  std::vector<double> halves;  // positive finite half values, ascending
  for (std::uint32_t h = 0; h <= 0x7bff; ++h) halves.push_back(half_value(static_cast<std::uint16_t>(h)));
  for (std::uint64_t u = 0; u < 0x7f800000ull; u += 4099) {
    const float f = bits_to_float(static_cast<std::uint32_t>(u));
    const double x = f;
    const std::uint16_t got = float16::from_float(f);
    if (x >= 65520.0) {
      ASSERT_EQ(got, 0x7c00) << x;
      continue;
    }
    const auto it = std::lower_bound(halves.begin(), halves.end(), x);
    const auto hi = static_cast<std::size_t>(it - halves.begin());
    std::uint16_t want;
    if (hi < halves.size() && halves[hi] == x) {
      want = static_cast<std::uint16_t>(hi);
    } else {
      const std::size_t lo = hi - 1;
      const double dlo = x - halves[lo];
      const double dhi = hi < halves.size() ? halves[hi] - x : std::numeric_limits<double>::infinity();
      if (dlo < dhi)
        want = static_cast<std::uint16_t>(lo);
      else if (dhi < dlo)
        want = static_cast<std::uint16_t>(hi);
      else
        want = static_cast<std::uint16_t>((lo & 1u) ? hi : lo);
    }
    ASSERT_EQ(got, want) << "float bits 0x" << std::hex << u << " (" << x << ")";
    ASSERT_EQ(float16::from_float(-f), static_cast<std::uint16_t>(want | 0x8000u)) << std::hex << u;
  }
}

// ---- bfloat16 ------------------------------------------------------------------

TEST(BFloat16Test, KnownValues) {
  EXPECT_EQ(bfloat16(0.0f).bits, 0x0000);
  EXPECT_EQ(bfloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bfloat16(-2.0f).bits, 0xc000);
  EXPECT_EQ(bfloat16(0.1f).bits, 0x3dcd);  // 0x3dcccccd rounds up
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(bfloat16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_EQ(static_cast<float>(bfloat16(3.0f)), 3.0f);
}

TEST(BFloat16Test, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_EQ(bfloat16(bits_to_float(0x3f808001u)).bits, 0x3f81);  // just above halfway
  EXPECT_EQ(bfloat16(bits_to_float(0x3f807fffu)).bits, 0x3f80);  // just below halfway
  EXPECT_EQ(bfloat16(bits_to_float(0xbf818000u)).bits, 0xbf82);  // negative tie, odd -> up in magnitude
  // Subnormals round like everything else.
  EXPECT_EQ(bfloat16(bits_to_float(0x00008000u)).bits, 0x0000);
  EXPECT_EQ(bfloat16(bits_to_float(0x00018000u)).bits, 0x0002);
  EXPECT_EQ(bfloat16(bits_to_float(0x00010000u)).bits, 0x0001);
}

TEST(BFloat16Test, SweepMatchesNearestEven) {
  for (std::uint64_t u = 0; u < 0x7f800000ull; u += 997) {
    const auto x = static_cast<std::uint32_t>(u);
    const std::uint16_t got = bfloat16::from_float(bits_to_float(x));
    const std::uint32_t lo = x >> 16;
    const std::uint32_t rest = x & 0xffffu;
    std::uint32_t want = lo;
    if (rest > 0x8000u || (rest == 0x8000u && (lo & 1u))) ++want;
    ASSERT_EQ(got, want) << std::hex << x;
    ASSERT_EQ(bfloat16::from_float(bits_to_float(x | 0x80000000u)), want | 0x8000u) << std::hex << x;
  }
}

TEST(BFloat16Test, OverflowGoesToInfinity) {
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(bfloat16(-std::numeric_limits<float>::max()).bits, 0xff80);
  EXPECT_EQ(bfloat16(bits_to_float(0x7f7f8000u)).bits, 0x7f80);  // tie, odd -> up to inf
  EXPECT_EQ(bfloat16(bits_to_float(0x7f7f7fffu)).bits, 0x7f7f);  // largest finite bfloat16
}

TEST(BFloat16Test, NaNStaysNaN) {
  for (std::uint32_t u : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu, 0xffffffffu}) {
    const std::uint16_t b = bfloat16::from_float(bits_to_float(u));
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << u << " -> " << b;
    EXPECT_EQ((b & 0x8000u) != 0, (u & 0x80000000u) != 0) << std::hex << u;
    EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(bits_to_float(u)))));
  }
}

TEST(BFloat16Test, RoundTripsEveryNonNaNBitPattern) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    bfloat16 v;
    v.bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(v);
    EXPECT_EQ(float_to_bits(f), b << 16);
    if (bf16_is_nan(v.bits)) {
      ASSERT_TRUE(std::isnan(f));
      ASSERT_TRUE(bf16_is_nan(bfloat16::from_float(f))) << std::hex << b;
    } else {
      ASSERT_EQ(bfloat16::from_float(f), b) << std::hex << b;
    }
  }
}

}  // namespace
}  // namespace distribute
