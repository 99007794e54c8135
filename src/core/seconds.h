// Durations in seconds: settings parsed strictly, and timeouts turned into
// deadlines that never overflow the clock.
#pragma once

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

namespace distribute::internal {

// Past this many seconds (about 31 years) a wait is a wait for ever: the
// clock's nanoseconds (int64) hold about 292 years from its epoch, and a
// longer timeout would wrap into the past (it did: 1e10 s timed out at once).
inline constexpr double kForeverSeconds = 1e9;

// The point `seconds` after `start`; time_point::max() ("never") for 0, for
// infinity and for anything from kForeverSeconds on. Callers have refused
// NaN and negative values; they mean "never" here too.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::steady_clock::time_point start,
                                                            double seconds) {
  using Clock = std::chrono::steady_clock;
  if (!(seconds > 0) || !(seconds < kForeverSeconds)) return Clock::time_point::max();
  return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// A number of seconds >= 0 written as a decimal ("30", "0.5", "1e3") or as
// "inf" / "infinity"; nullopt for anything else: no sign, space, hex or
// suffix, and no NaN.
inline std::optional<double> parse_seconds(const char* text) noexcept {
  if (text == nullptr || *text == '\0' || *text == '-') return std::nullopt;
  const char* end = text + std::strlen(text);
  double value = 0;
  const auto [at, error] = std::from_chars(text, end, value, std::chars_format::general);
  if (error != std::errc() || at != end || std::isnan(value) || value < 0) return std::nullopt;
  return value;
}

}  // namespace distribute::internal
