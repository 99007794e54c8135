// The hang watchdog's own check (tests/testing/hang_watchdog.h). The test
// below hangs on purpose, so it is disabled: ctest `hang_watchdog_dumps_replicas`
// runs it with a 2 s limit and checks that the report names every replica's
// thread and shows where each one waits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "testing/strategies.h"

namespace distribute {
namespace {

// Where each replica hangs: the frame the report must show.
[[gnu::noinline]] void wait_forever_in_replica(const std::atomic<bool>& never) {
  while (!never.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

TEST(HangWatchdogTest, DISABLED_ReplicasThatNeverReturnAreDumped) {
  auto strategy = testing::mirrored(3);
  std::atomic<bool> never{false};
  strategy->run([&] { wait_forever_in_replica(never); });
  ADD_FAILURE() << "the replicas returned";
}

}  // namespace
}  // namespace distribute
