// Whole numbers of environment settings (byte counts and the like).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <optional>

namespace distribute::internal {

// Decimal digits only (no sign, space or suffix) whose value fits a size_t;
// nullopt for anything else, the empty text included.
inline std::optional<std::size_t> parse_whole_number(const char* text) {
  if (text == nullptr || text[0] < '0' || text[0] > '9') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || errno != 0 || value > std::numeric_limits<std::size_t>::max()) return std::nullopt;
  return static_cast<std::size_t>(value);
}

}  // namespace distribute::internal
