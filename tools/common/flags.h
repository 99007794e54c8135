// Command-line flag values for the tools (distribute-train, distribute-soak):
// a bad value is a UsageError that names the flag, never a crash. And the
// numbers they print: 1,234,567.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace distribute::tools {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A whole number >= min.
inline std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty()) throw UsageError(flag + " needs a whole number, got '" + text + "'");
  if (v < min) throw UsageError(flag + " must be >= " + std::to_string(min) + ", got " + text);
  return v;
}

// A finite number > 0.
inline double parse_positive(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !(v > 0) || !std::isfinite(v)) {
    throw UsageError(flag + " needs a number > 0, got '" + text + "'");
  }
  return v;
}

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

}  // namespace distribute::tools
