// Whole numbers of environment settings (byte counts, microseconds).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include "distribute/errors.h"

namespace distribute::internal {

// Decimal digits only (no sign, space or suffix) whose value is at most
// `max`; nullopt for anything else, the empty text included. Leaves errno as
// it was (it is read on allocation paths).
inline std::optional<std::size_t> parse_whole_number(
    const char* text, std::size_t max = std::numeric_limits<std::size_t>::max()) noexcept {
  if (text == nullptr || text[0] < '0' || text[0] > '9') return std::nullopt;
  const int saved_errno = errno;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  const bool fits = *end == '\0' && errno == 0 && value <= max;
  errno = saved_errno;
  if (!fits) return std::nullopt;
  return static_cast<std::size_t>(value);
}

// The setting `name` as a whole number up to `max`: nullopt when it is unset
// or empty; an InvalidArgumentError naming it and its text when it holds
// anything else ("NAME='text' is not <what>", and the largest value allowed
// where `max` is below the largest size_t).
inline std::optional<std::size_t> env_whole_number(const char* name, const char* what,
                                                   std::size_t max = std::numeric_limits<std::size_t>::max()) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::optional<std::size_t> value = parse_whole_number(text, max);
  if (!value) {
    std::string message = std::string(name) + "='" + text + "' is not " + what;
    if (max < std::numeric_limits<std::size_t>::max()) message += " up to " + std::to_string(max);
    throw InvalidArgumentError(message);
  }
  return value;
}

}  // namespace distribute::internal
