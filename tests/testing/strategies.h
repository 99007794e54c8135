// Test helpers for runtime tests: strategies with a collective timeout, so a
// bug that would hang fails the test with DeadlineExceededError instead.
#pragma once

#include <distribute/distribute.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "testing/errors.h"

namespace distribute::testing {

inline constexpr std::chrono::seconds kTestTimeout{20};

inline std::vector<std::string> cpu_devices(int n) {
  std::vector<std::string> devices;
  for (int i = 0; i < n; ++i) devices.push_back("CPU:" + std::to_string(i));
  return devices;
}

inline std::unique_ptr<MirroredStrategy> mirrored(int n, CommunicationOptions options = {}) {
  if (!options.timeout) options.timeout = kTestTimeout;
  return std::make_unique<MirroredStrategy>(cpu_devices(n), options);
}

// Replica counts every multi-replica behaviour is checked with.
inline const std::vector<int> kReplicaCounts = {1, 2, 3, 4, 7};

// Runs `f` expecting it to throw E; returns the message.
template <class E, class F>
std::string expect_throw(F&& f) {
  return error_message<E>(std::forward<F>(f));
}

}  // namespace distribute::testing
