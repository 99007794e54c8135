// float32 <-> IEEE binary16 and bfloat16, on bits, for host and device code:
// what float16 and bfloat16 (dtype.h) convert with, and what the GPU kernels
// use, so that both round alike (to nearest even; overflow to infinity;
// gradual underflow; NaN stays a quiet NaN with its sign, payload dropped).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace distribute::internal {

// `x`: the bits of a float32.
DIST_HOST_DEVICE inline std::uint16_t half_from_float_bits(std::uint32_t x) {
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half of the smallest subnormal
    const int exp = static_cast<int>(abs >> 23);
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - exp;  // positions to drop, in [14, 24]
    const std::uint32_t half_mant = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    std::uint32_t r = half_mant;
    if (rest > halfway || (rest == halfway && (half_mant & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  // normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to nearest even
  std::uint32_t h = ((abs - 0x38000000u) >> 13);
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

// The bits of the float32 that half `h` is (exactly).
DIST_HOST_DEVICE inline std::uint32_t half_to_float_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return sign;
    // Subnormal, mant * 2^-24: shift the leading 1 up to bit 10; each shift
    // takes one from the float's exponent (2^-14 for a mantissa of 1.x).
    std::uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    return sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  if (exp == 0x1f) return sign | 0x7f800000u | (mant << 13);
  return sign | ((exp + 112u) << 23) | (mant << 13);
}

// `x`: the bits of a float32; rounds to nearest even, NaN stays quiet.
DIST_HOST_DEVICE inline std::uint16_t bfloat16_from_float_bits(std::uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<std::uint16_t>(x >> 16);
}

}  // namespace distribute::internal
