// ReplicaPool: every replica's task runs on its own thread, and a pool that
// cannot start all its threads fails cleanly.
#include "runtime/replica_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distribute/distribute.h"

namespace distribute::internal {
namespace {

TEST(ReplicaPoolTest, RunsEveryReplicaOnItsOwnThreadStepAfterStep) {
  ReplicaPool pool(4);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::thread::id> ids(4);
    pool.run([&](int r) { ids[static_cast<std::size_t>(r)] = std::this_thread::get_id(); });
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    for (int a = 0; a < 4; ++a) {
      for (int b = a + 1; b < 4; ++b) EXPECT_NE(ids[static_cast<std::size_t>(a)], ids[static_cast<std::size_t>(b)]);
    }
  }
}

// A pool whose third thread cannot start stops and joins the two it
// started and raises the system's error (before, the half-made pool's
// threads were destroyed unjoined, which ends the process). The next pool
// works, and so does a strategy.
TEST(ReplicaPoolTest, APoolThatCannotStartAllItsThreadsFailsCleanly) {
  fail_thread_starts_for_testing(2);
  try {
    ReplicaPool pool(4);
    ADD_FAILURE() << "a pool of 4 started with 2 threads";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("could not start a replica thread"), std::string::npos) << e.what();
  }
  fail_thread_starts_for_testing(-1);
  ReplicaPool pool(4);
  std::atomic<int> ran{0};
  pool.run([&](int) { ++ran; });
  EXPECT_EQ(ran.load(), 4);
  // Through a strategy: its creation raises the error, and nothing is left running.
  fail_thread_starts_for_testing(0);
  EXPECT_THROW(MirroredStrategy({"CPU:0", "CPU:1"}), std::system_error);
  fail_thread_starts_for_testing(-1);
  MirroredStrategy s({"CPU:0", "CPU:1"});
  EXPECT_EQ(s.run([](ReplicaContext& ctx) { return ctx.replica_id_in_sync_group(); }).values(),
            (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace distribute::internal
