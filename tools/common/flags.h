// Command-line flag values for the tools (distribute-train, distribute-bench,
// distribute-demo, distribute-soak): a bad value is a UsageError that names
// the flag and what it takes, never a crash, and a number is range-checked
// before it is narrowed (4294967297 epochs are refused, not one). And the
// numbers they print: 1,234,567.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace distribute::tools {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Digits grouped by thousands: "1,234,567", "-1,234".
inline std::string grouped(std::int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -(v + 1) + std::uint64_t{1} : static_cast<std::uint64_t>(v));
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

// A whole number from `min` to `max`, in decimal digits (a leading '-' where
// `min` < 0): no space, sign '+', fraction, exponent or suffix.
inline std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min,
                              std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, v);
  const std::string range = max == std::numeric_limits<std::int64_t>::max()
                                ? ">= " + std::to_string(min)
                                : "from " + std::to_string(min) + " to " + std::to_string(max);
  if (text.empty() || at != end || (error != std::errc() && error != std::errc::result_out_of_range)) {
    throw UsageError(flag + " needs a whole number " + range + ", got '" + text + "'");
  }
  if (error == std::errc::result_out_of_range || v < min || v > max) {
    throw UsageError(flag + " must be " + range + ", got " + text);
  }
  return v;
}

// parse_int for an int field: from `min` to INT_MAX (or `max`).
inline int parse_int32(const std::string& flag, const std::string& text, int min,
                       int max = std::numeric_limits<int>::max()) {
  return static_cast<int>(parse_int(flag, text, min, max));
}

// A finite number > 0 (decimal, as from_chars reads it: no space, sign or hex).
inline double parse_positive(const std::string& flag, const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, v);
  if (text.empty() || at != end || error != std::errc() || !(v > 0) || !std::isfinite(v)) {
    throw UsageError(flag + " needs a finite number > 0, got '" + text + "'");
  }
  return v;
}

// A byte count: a decimal number with an optional K, M or G suffix (powers
// of 1024), "64M", "1.5K", "8"; at most `max` bytes, whole.
inline std::uint64_t parse_bytes(const std::string& flag, const std::string& text,
                                 std::uint64_t max = std::numeric_limits<std::int64_t>::max()) {
  std::string digits = text;
  double scale = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k': scale = 1024.0; break;
      case 'M':
      case 'm': scale = 1024.0 * 1024; break;
      case 'G':
      case 'g': scale = 1024.0 * 1024 * 1024; break;
      default: break;
    }
    if (scale != 1) digits.pop_back();
  }
  double v = 0;
  const char* end = digits.data() + digits.size();
  const auto [at, error] = std::from_chars(digits.data(), end, v);
  if (digits.empty() || at != end || error != std::errc() || !(v >= 0) || !std::isfinite(v)) {
    throw UsageError(flag + " needs a number of bytes (digits, with K, M or G for 1024, 1024^2, 1024^3), got '" + text +
                     "'");
  }
  const double bytes = v * scale;
  if (bytes > static_cast<double>(max)) {
    char said[32];
    std::snprintf(said, sizeof said, "%.4g", bytes);
    throw UsageError(flag + " " + text + " is " + said + " bytes, more than the " +
                     grouped(static_cast<std::int64_t>(max)) + " allowed");
  }
  if (bytes != std::floor(bytes)) throw UsageError(flag + " " + text + " is not a whole number of bytes");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace distribute::tools
