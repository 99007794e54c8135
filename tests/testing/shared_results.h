// Test helpers for results the replicas of a process share (all_reduce,
// all_gather): the read-only refusal, and storage taken in a steady loop.
#pragma once

#include <distribute/distribute.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "core/storage.h"
#include "testing/strategies.h"

namespace distribute::testing {

// Whether a write into `t` is refused with the read-only error naming
// `described` (its dtype and shape, e.g. "float32 (6000,)") and `device`;
// a failure that names the message otherwise.
inline bool refuses_writes(const Tensor& t, const std::string& described, const std::string& device) {
  const std::string message = expect_throw<FailedPreconditionError>([&] { static_cast<void>(t.mutable_raw_data()); });
  if (message.find("Tensor " + described + " on " + device + " is read-only") != std::string::npos) return true;
  ADD_FAILURE() << message;
  return false;
}

// Runs `step` 30 times on every replica of `s`, each time after letting go
// of the last result, as a training step does; returns the fresh storage
// blocks taken after the first step (0: the storage came back every time).
// `check` gets the last result.
inline std::uint64_t fresh_blocks_after_the_first_step(Strategy& s, const std::function<Tensor(ReplicaContext&)>& step,
                                                       const std::function<void(const Tensor&)>& check) {
  std::atomic<std::uint64_t> fresh_after_first{0}, fresh_at_end{0};
  s.run([&](ReplicaContext& ctx) {
    Tensor out;
    for (int i = 0; i < 30; ++i) {
      out = Tensor();
      out = step(ctx);
      if (i == 0) {
        ctx.merge_call([&](Strategy&) { fresh_after_first = internal::storage_stats().fresh_blocks; });
      }
    }
    ctx.merge_call([&](Strategy&) { fresh_at_end = internal::storage_stats().fresh_blocks; });
    check(out);
    return out;
  });
  return fresh_at_end.load() - fresh_after_first.load();
}

}  // namespace distribute::testing
