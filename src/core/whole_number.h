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
// `max`; nullopt for anything else, the empty text included.
inline std::optional<std::size_t> parse_whole_number(const char* text,
                                                     std::size_t max = std::numeric_limits<std::size_t>::max()) {
  if (text == nullptr || text[0] < '0' || text[0] > '9') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || errno != 0 || value > max) return std::nullopt;
  return static_cast<std::size_t>(value);
}

// The setting `name` as a whole number up to `max`: nullopt when it is unset
// or empty; an InvalidArgumentError naming it and its text when it holds
// anything else ("NAME='text' is not <what>").
inline std::optional<std::size_t> env_whole_number(const char* name, const char* what,
                                                   std::size_t max = std::numeric_limits<std::size_t>::max()) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::optional<std::size_t> value = parse_whole_number(text, max);
  if (!value) throw InvalidArgumentError(std::string(name) + "='" + text + "' is not " + what);
  return value;
}

}  // namespace distribute::internal
