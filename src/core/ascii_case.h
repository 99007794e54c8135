// Case conversion of names users spell in any case (device types, ReduceOp
// and implementation names): ASCII letters only, whatever the C locale.
#pragma once

#include <string>
#include <string_view>

namespace distribute::internal {

inline std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace distribute::internal
