#include "comm/threads/local_group.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "testing/scoped_env.h"
#include "testing/threads.h"

namespace distribute::internal {
namespace {

using distribute::testing::message_of;
using distribute::testing::run_threads;

CollectiveCall call(std::string_view op, std::uint64_t seq, double timeout = 10) {
  CollectiveCall c;
  c.op = op;
  c.sequence = seq;
  c.timeout_seconds = timeout;
  return c;
}

TEST(LocalGroupTest, EveryMemberSeesEveryEntryInMemberOrder) {
  for (int n : {1, 2, 3, 4, 7}) {
    LocalGroup group(n);
    auto errors = run_threads(n, [&](int r) {
      for (int round = 0; round < 50; ++round) {
        const auto& entries = group.arrive(r, {.payload = std::to_string(r * 1000 + round)}, call("test", 1));
        ASSERT_EQ(entries.size(), static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q)
          EXPECT_EQ(entries[static_cast<std::size_t>(q)].payload, std::to_string(q * 1000 + round));
      }
    });
    for (auto& e : errors) EXPECT_FALSE(e) << message_of(e);
  }
}

// An object passed with an entry (a merge_fn's result, a copy job) is let go
// once the round after it has completed, arrive() or release(), so that the
// tensors it holds go back to the cache before the next step allocates.
TEST(LocalGroupTest, AnEntrysObjectIsLetGoOnceTheNextRoundHasCompleted) {
  for (const bool release : {false, true}) {
    LocalGroup group(3);
    auto object = std::make_shared<int>(7);
    const std::weak_ptr<int> watch = object;
    std::atomic<bool> alive_after_first{false};
    auto errors = run_threads(3, [&](int r) {
      const auto& entries = group.arrive(r, {.object = r == 0 ? std::move(object) : nullptr}, call("test", 1));
      // Readable through this round: the next one has not begun.
      EXPECT_EQ(*std::static_pointer_cast<int>(entries[0].object), 7);
      if (r == 0) alive_after_first = !watch.expired();
      release ? group.release(r, call("test", 1)) : static_cast<void>(group.arrive(r, {}, call("test", 2)));
      // Every member has passed the next round: member 0 let go of its object.
      if (r == 0) {
        EXPECT_TRUE(watch.expired());
      }
    });
    for (auto& e : errors) EXPECT_FALSE(e) << message_of(e);
    EXPECT_TRUE(alive_after_first);
    EXPECT_TRUE(watch.expired());
  }
}

// arrive_making: the member whose arrival completes the round makes the
// object, once, after every member has arrived; every member gets that one
// object; the group lets go of it once a later counted round completes.
TEST(LocalGroupTest, ArriveMakingMakesOneObjectAfterEveryArrival) {
  struct Context {
    std::atomic<int> arrived{0};
    std::atomic<int> calls{0};
    std::atomic<int> arrived_when_made{-1};
    int value = 0;
  };
  const LocalGroup::Maker make = [](const void* c) noexcept -> std::shared_ptr<void> {
    auto& ctx = *static_cast<Context*>(const_cast<void*>(c));
    ctx.calls.fetch_add(1);
    ctx.arrived_when_made = ctx.arrived.load();
    return std::make_shared<int>(ctx.value);
  };
  for (int n : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE(std::to_string(n) + " members");
    LocalGroup group(n);
    for (const bool release_next : {false, true}) {
      Context ctx;
      ctx.value = 40 + n;
      std::vector<const void*> got(static_cast<std::size_t>(n));
      std::weak_ptr<void> watch;
      auto errors = run_threads(n, [&](int r) {
        std::shared_ptr<void> made;
        ctx.arrived.fetch_add(1);
        group.arrive_making(r, {}, call("test", 1), make, &ctx, made);
        ASSERT_TRUE(made);
        EXPECT_EQ(*std::static_pointer_cast<int>(made), 40 + n);
        got[static_cast<std::size_t>(r)] = made.get();
        if (r == 0) watch = made;
        made.reset();
        // The next counted round lets the group's own hold go.
        release_next ? group.release(r, call("test", 1)) : static_cast<void>(group.arrive(r, {}, call("test", 2)));
      });
      for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
      EXPECT_EQ(ctx.calls.load(), 1);
      EXPECT_EQ(ctx.arrived_when_made.load(), n);
      for (const void* p : got) EXPECT_EQ(p, got[0]);
      EXPECT_TRUE(watch.expired());
    }
  }
}

// A maker's failure (null) reaches every member alike; a tag mismatch
// leaves `made` empty on every member, and the group goes on.
TEST(LocalGroupTest, ArriveMakingHandsANullOrAMismatchToEveryMember) {
  LocalGroup group(3);
  const LocalGroup::Maker fail = [](const void*) noexcept -> std::shared_ptr<void> { return nullptr; };
  auto errors = run_threads(3, [&](int r) {
    std::shared_ptr<void> made = std::make_shared<int>(1);
    group.arrive_making(r, {}, call("test", 1), fail, nullptr, made);
    EXPECT_FALSE(made);
  });
  for (auto& e : errors) EXPECT_FALSE(e) << message_of(e);
  std::atomic<int> makes{0};
  const LocalGroup::Maker make = [](const void* count) noexcept -> std::shared_ptr<void> {
    static_cast<std::atomic<int>*>(const_cast<void*>(count))->fetch_add(1);
    return std::make_shared<int>(2);
  };
  auto mismatched = run_threads(3, [&](int r) {
    const auto sentinel = std::make_shared<int>(-1);
    std::shared_ptr<void> made = sentinel;
    CollectiveCall c = call("test", 2);
    c.signature_tag = r == 1 ? 0x10 : 0x20;
    try {
      group.arrive_making(r, {.tag = c.signature_tag}, c, make, &makes, made);
    } catch (const SignatureMismatch&) {
      EXPECT_EQ(made, sentinel);  // left as it was
      throw;
    }
  });
  for (auto& e : mismatched) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
  }
  EXPECT_EQ(makes.load(), 0);  // nothing is made for a round that fails
  auto again = run_threads(3, [&](int r) { group.arrive(r, {}, call("test", 3)); });
  for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
}

// A member that is done can never arrive: the others leave arrive_making
// with the error, nothing is made, and after reset() the group makes again.
TEST(LocalGroupTest, ArriveMakingFailsAtOnceOnAMemberThatIsDone) {
  LocalGroup group(3);
  std::atomic<int> makes{0};
  const LocalGroup::Maker make = [](const void* count) noexcept -> std::shared_ptr<void> {
    static_cast<std::atomic<int>*>(const_cast<void*>(count))->fetch_add(1);
    return std::make_shared<int>(3);
  };
  group.mark_done(2);
  auto errors = run_threads(2, [&](int r) {
    std::shared_ptr<void> made;
    group.arrive_making(r, {}, call("all_gather", 1), make, &makes, made);
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), FailedPreconditionError);
  }
  EXPECT_EQ(makes.load(), 0);
  group.reset();
  auto again = run_threads(3, [&](int r) {
    std::shared_ptr<void> made;
    group.arrive_making(r, {}, call("all_gather", 1), make, &makes, made);
    ASSERT_TRUE(made);
    EXPECT_EQ(*std::static_pointer_cast<int>(made), 3);
  });
  for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
  EXPECT_EQ(makes.load(), 1);
}

// Members 0 and 1 of a group of 3 call `arrive(rank)`, which waits for
// member 2; 20 ms after both have begun, member 2 aborts the group. Returns
// what each raised.
std::vector<std::exception_ptr> abort_while_two_wait(LocalGroup& group, const std::function<void(int)>& arrive) {
  std::atomic<int> waiting{0};
  std::thread aborter([&] {
    while (waiting.load() < 2) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    group.abort(ErrorCode::kAborted, "replica 2 failed", 2);
  });
  auto errors = run_threads(2, [&](int r) {
    ++waiting;
    arrive(r);
  });
  aborter.join();
  return errors;
}

// Sets DISTRIBUTE_SPIN_MICROSECONDS (read when a LocalGroup is made) for
// its lifetime.
struct ScopedSpin : distribute::testing::ScopedEnv {
  explicit ScopedSpin(const char* value) : ScopedEnv("DISTRIBUTE_SPIN_MICROSECONDS", value) {}
};

// A small round's bytes, as a number.
std::uint64_t small_value(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Small rounds (each member's bytes in the lines that announce it) among
// ordinary and release rounds: every member sees every member's bytes of its
// round, members leaving small rounds early never upset the counting of the
// others, and (a spin of 0) a member asleep in a round of either kind is
// woken by the last arrival.
TEST(LocalGroupTest, SmallRoundsAmongOrdinaryOnesSeeEveryMembersBytes) {
  for (const char* spin : {"1000", "0"}) {
    const ScopedSpin scoped(spin);
    for (int n : {1, 2, 3, 5}) {
      LocalGroup group(n);
      const auto start = std::chrono::steady_clock::now();
      auto errors = run_threads(n, [&](int r) {
        for (std::uint64_t round = 0; round < 300; ++round) {
          const std::uint64_t mine = static_cast<std::uint64_t>(r) * 1000000 + round;
          if (round % 3 == 2) {
            const auto& entries = group.arrive(r, {.payload = std::to_string(mine)}, call("test", round));
            for (int q = 0; q < n; ++q) {
              EXPECT_EQ(entries[static_cast<std::size_t>(q)].payload, std::to_string(q * 1000000 + round));
            }
            if (round % 2 == 0) group.release(r, call("test", round));
          } else {
            const auto data = group.arrive_small(r, &mine, sizeof mine, call("test", round));
            ASSERT_EQ(data.size(), static_cast<std::size_t>(n));
            for (int q = 0; q < n; ++q) {
              EXPECT_EQ(small_value(data[static_cast<std::size_t>(q)]),
                        static_cast<std::uint64_t>(q) * 1000000 + round);
            }
          }
        }
      });
      for (auto& e : errors) EXPECT_FALSE(e) << "spin " << spin << ", " << n << " members: " << message_of(e);
      // A lost wake-up would end only at a round's 10 s timeout.
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "spin " << spin << ", " << n;
    }
  }
}

// A small round carries up to kSmallBytes per member in a block of cache
// lines: every byte of every member's block arrives, whatever its length
// (one line, a line and one byte, the whole block), round after round, the
// lengths differing between members, spinning or asleep.
TEST(LocalGroupTest, SmallRoundsCarryEveryByteOfTheirBlock) {
  constexpr std::size_t kMax = LocalGroup::kSmallBytes;
  const std::size_t lengths[] = {0, 1, 48, 49, 112, 113, kMax - 1, kMax};
  const auto byte_of = [](int member, std::uint64_t round, std::size_t i) {
    return static_cast<std::byte>((static_cast<std::size_t>(member) * 131 + round * 17 + i * 7) & 0xff);
  };
  for (const char* spin : {"1000", "0"}) {
    const ScopedSpin scoped(spin);
    for (int n : {1, 2, 3, 5}) {
      LocalGroup group(n);
      auto errors = run_threads(n, [&](int r) {
        std::vector<std::byte> mine(kMax);
        for (std::uint64_t round = 0; round < 64; ++round) {
          // Member q sends lengths[(round + q) % 8] bytes.
          const std::size_t length = lengths[(round + static_cast<std::uint64_t>(r)) % std::size(lengths)];
          for (std::size_t i = 0; i < length; ++i) mine[i] = byte_of(r, round, i);
          const auto data = group.arrive_small(r, mine.data(), length, call("test", round + 1));
          ASSERT_EQ(data.size(), static_cast<std::size_t>(n));
          for (int q = 0; q < n; ++q) {
            const std::size_t theirs = lengths[(round + static_cast<std::uint64_t>(q)) % std::size(lengths)];
            for (std::size_t i = 0; i < theirs; ++i) {
              ASSERT_EQ(data[static_cast<std::size_t>(q)][i], byte_of(q, round, i))
                  << "member " << r << " reading member " << q << ", round " << round << ", byte " << i << " of "
                  << theirs;
            }
          }
        }
      });
      for (auto& e : errors) EXPECT_FALSE(e) << "spin " << spin << ", " << n << " members: " << message_of(e);
    }
  }
}

// Tags are checked as in an ordinary round: any difference (or bit 0) is a
// SignatureMismatch on every member, and the group stays usable.
TEST(LocalGroupTest, SmallRoundsWithDifferentTagsMismatchOnEveryMember) {
  LocalGroup group(3);
  auto errors = run_threads(3, [&](int r) {
    CollectiveCall c = call("all_reduce", 1);
    c.signature_tag = r == 1 ? 6 : 4;
    const std::uint64_t mine = 1;
    group.arrive_small(r, &mine, sizeof mine, c);
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
  }
  auto again = run_threads(3, [&](int r) {
    const std::uint64_t mine = static_cast<std::uint64_t>(r);
    const auto data = group.arrive_small(r, &mine, sizeof mine, call("all_reduce", 2));
    EXPECT_EQ(small_value(data[2]), 2u);
  });
  for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
}

// A member in a small round meeting one in an ordinary round (two different
// collectives, even untagged): both throw SignatureMismatch, the ordinary one
// once the small ones have joined its round, asleep or not, and the next
// rounds go on.
TEST(LocalGroupTest, ASmallRoundMeetingAnOrdinaryOneMismatchesOnBoth) {
  for (const char* spin : {"1000", "0"}) {
    const ScopedSpin scoped(spin);
    for (const int n : {2, 3}) {
      for (const bool ordinary_first : {false, true}) {
        for (const std::uint64_t tag : {std::uint64_t{0}, std::uint64_t{4}}) {
          SCOPED_TRACE(std::string("spin ") + spin + ", " + std::to_string(n) + " members, ordinary " +
                       (ordinary_first ? "first" : "last") + ", tag " + std::to_string(tag));
          LocalGroup group(n);
          CollectiveCall c = call("all_reduce", 1);
          c.signature_tag = tag;
          const auto start = std::chrono::steady_clock::now();
          // The last member to come is in the ordinary round, or the only one
          // that is not; the others wait for it (asleep with spin 0).
          auto errors = run_threads(n, [&](int r) {
            const bool last = r == n - 1;
            if (last) std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (last != ordinary_first) {
              group.arrive(r, {.tag = tag}, c);
            } else {
              const std::uint64_t mine = 1;
              group.arrive_small(r, &mine, sizeof mine, c);
            }
          });
          // At once, not at the 10 s timeout: an arrival of either kind wakes the sleepers.
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
          for (auto& e : errors) {
            ASSERT_TRUE(e);
            EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
          }
          auto again = run_threads(n, [&](int r) {
            const auto& entries = group.arrive(r, {.payload = std::to_string(r)}, call("explain", 1));
            EXPECT_EQ(entries[1].payload, "1");
            const std::uint64_t mine = static_cast<std::uint64_t>(r) + 10;
            EXPECT_EQ(small_value(group.arrive_small(r, &mine, sizeof mine, call("barrier", 2))[0]), 10u);
          });
          for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
        }
      }
    }
  }
}

// A small round fails as an ordinary one does: a member that is done at
// once, a timeout naming who did not come, an abort on every waiter.
TEST(LocalGroupTest, SmallRoundsFailAsOrdinaryOnesDo) {
  {
    LocalGroup group(2);
    group.mark_done(1);
    EXPECT_THROW(group.arrive_small(0, nullptr, 0, call("barrier", 3, 0)), FailedPreconditionError);
  }
  {
    LocalGroup group(3);
    auto errors = run_threads(2, [&](int r) { group.arrive_small(r, nullptr, 0, call("barrier", 4, 0.05)); });
    for (auto& e : errors) {
      ASSERT_TRUE(e);
      EXPECT_THROW(std::rethrow_exception(e), DeadlineExceededError);
      EXPECT_NE(message_of(e).find("barrier #4 timed out"), std::string::npos) << message_of(e);
      EXPECT_NE(message_of(e).find("replica(s) 2 did not arrive"), std::string::npos) << message_of(e);
    }
    EXPECT_THROW(group.arrive_small(2, nullptr, 0, call("barrier", 4)), DeadlineExceededError);
  }
  {
    LocalGroup group(3);
    const std::uint64_t junk = ~std::uint64_t{0};
    auto errors =
        abort_while_two_wait(group, [&](int r) { group.arrive_small(r, &junk, sizeof junk, call("barrier", 1, 0)); });
    for (auto& e : errors) {
      ASSERT_TRUE(e);
      EXPECT_EQ(message_of(e), "replica 2 failed");
    }
    // After reset(), rounds count from 0 again: the lines members 0 and 1
    // left in the failed round (round 0's parity) must not pass for the new
    // round 0's. Member 2 comes first, so that it would meet them.
    group.reset();
    auto again = run_threads(3, [&](int r) {
      if (r != 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (std::uint64_t round = 0; round < 4; ++round) {
        const std::uint64_t mine = static_cast<std::uint64_t>(r) * 100 + round + 1;
        const auto data = group.arrive_small(r, &mine, sizeof mine, call("all_reduce", round + 1));
        for (int q = 0; q < 3; ++q) EXPECT_EQ(small_value(data[static_cast<std::size_t>(q)]), q * 100 + round + 1);
      }
    });
    for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
  }
  LocalGroup group(1);
  std::byte too_many[LocalGroup::kSmallBytes + 1] = {};
  EXPECT_THROW(group.arrive_small(0, too_many, sizeof too_many, call("barrier", 1)), InternalError);
}

// A member that completes a small round and is done at once (it returned
// from its replica function) was here: the others, asleep in that round,
// must see its line, not take it for a member that never came.
TEST(LocalGroupTest, AMemberDoneRightAfterASmallRoundWasThere) {
  const ScopedSpin scoped("0");  // the waiter sleeps, and looks for members that are done
  for (int i = 0; i < 300; ++i) {
    LocalGroup group(2);
    auto errors = run_threads(2, [&](int r) {
      group.arrive_small(r, nullptr, 0, call("barrier", 1));
      if (r == 1) group.mark_done(1);
    });
    for (auto& e : errors) ASSERT_FALSE(e) << "iteration " << i << ": " << message_of(e);
  }
}

TEST(LocalGroupTest, AbortWakesEveryWaiterWithTheSameError) {
  LocalGroup group(3);
  const auto start = std::chrono::steady_clock::now();
  auto errors = abort_while_two_wait(group, [&](int r) { group.arrive(r, {}, call("all_reduce", 1, 0)); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2000));
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), AbortedError);
    EXPECT_EQ(message_of(e), "replica 2 failed");
  }
  EXPECT_EQ(group.abort_origin(), 2);
  // A failed group stays failed until reset, and hands out no inline area
  // (a member that withdrew may still be read from through its last one).
  EXPECT_THROW(group.arrive(2, {}, call("all_reduce", 1)), AbortedError);
  EXPECT_THROW(group.inline_area(0), AbortedError);
  group.reset();
  EXPECT_EQ(group.abort_origin(), -1);
  auto again = run_threads(3, [&](int r) { group.arrive(r, {}, call("barrier", 1)); });
  for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
}

TEST(LocalGroupTest, TimeoutNamesTheMissingMembers) {
  LocalGroup group(3);
  auto errors = run_threads(2, [&](int r) { group.arrive(r, {}, call("all_gather", 4, 0.05)); });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), DeadlineExceededError);
    EXPECT_NE(message_of(e).find("all_gather #4 timed out"), std::string::npos) << message_of(e);
    EXPECT_NE(message_of(e).find("replica(s) 2 did not arrive"), std::string::npos) << message_of(e);
  }
  // The late member gets the same error when it finally arrives.
  try {
    group.arrive(2, {}, call("all_gather", 4));
    FAIL() << "expected DeadlineExceededError";
  } catch (const DeadlineExceededError& e) {
    EXPECT_EQ(std::string(e.what()), message_of(errors[0]));
  }
}

TEST(LocalGroupTest, MemberThatIsDoneFailsTheRoundAtOnce) {
  LocalGroup group(2);
  group.mark_done(1);
  const auto start = std::chrono::steady_clock::now();
  try {
    group.arrive(0, {}, call("all_reduce", 3, 0));
    FAIL() << "expected FailedPreconditionError";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce #3 can never complete: replica(s) 1 returned"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

// The caller's words for a count mismatch come in the call (merge_call's
// are TensorFlow's); the group knows no op by name.
TEST(LocalGroupTest, CountMismatchWordsComeFromTheCall) {
  LocalGroup group(2);
  group.mark_done(0);
  CollectiveCall worded = call("merge_call", 2, 0);
  worded.count_mismatch = "Some replicas made a different number of replica_context().merge_call() calls";
  try {
    group.arrive(1, {}, worded);
    FAIL() << "expected FailedPreconditionError";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("Some replicas made a different number of replica_context().merge_call() "
                                         "calls: replica(s) 0 returned from the replica function while replica(s) 1 "
                                         "wait in merge_call #2."),
              std::string::npos)
        << e.what();
  }
  LocalGroup plain(2);
  plain.mark_done(0);
  try {
    plain.arrive(1, {}, call("merge_call", 2, 0));
    FAIL() << "expected FailedPreconditionError";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("merge_call #2 can never complete: replica(s) 0 returned"), std::string::npos)
        << e.what();
  }
}

TEST(LocalGroupTest, StallWarningNamesTheMissingMember) {
  LocalGroup group(2);
  ::testing::internal::CaptureStderr();
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    group.arrive(1, {}, call("all_reduce", 1));
  });
  CollectiveCall c = call("all_reduce", 1);
  c.stall_warning_seconds = 0.02;
  group.arrive(0, {}, c);
  late.join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("all_reduce #1 has waited"), std::string::npos) << err;
  EXPECT_NE(err.find("replica(s) 1 have not joined it"), std::string::npos) << err;
}

// A member still copying into the others' buffers after the data round.
void copy_slowly(std::atomic<bool>& copied, int milliseconds) {
  std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
  copied = true;
}

// The last round of a collective waits for every member, however long it
// copies and whatever the call's timeout: a member that left would free
// buffers that the late one still writes into.
TEST(LocalGroupTest, ReleaseRoundWaitsForAMemberStillCopyingPastTheTimeout) {
  LocalGroup group(2);
  std::atomic<bool> copied{false};
  auto errors = run_threads(2, [&](int r) {
    group.arrive(r, {}, call("all_reduce", 1, 0.05));
    if (r == 1) copy_slowly(copied, 200);
    group.release(r, call("all_reduce", 1, 0.05));
    EXPECT_TRUE(copied.load()) << "member " << r << " left the release round early";
  });
  for (auto& e : errors) EXPECT_FALSE(e) << message_of(e);
  // Nothing failed: the next round works.
  auto again = run_threads(2, [&](int r) { group.arrive(r, {}, call("barrier", 2)); });
  for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
}

// An abort during the copies does not cut the release round short; it is
// raised by the next round.
TEST(LocalGroupTest, AbortDuringTheCopiesIsRaisedByTheNextRound) {
  LocalGroup group(3);
  std::atomic<bool> copied{false};
  auto errors = run_threads(3, [&](int r) {
    group.arrive(r, {}, call("broadcast", 1));
    if (r == 0) group.abort(ErrorCode::kAborted, "stop", 0);
    if (r == 2) copy_slowly(copied, 100);
    try {
      group.release(r, call("broadcast", 1));
    } catch (...) {
      ADD_FAILURE() << "member " << r << " raised in the release round";
      throw;
    }
    EXPECT_TRUE(copied.load()) << "member " << r << " left the release round early";
    group.arrive(r, {}, call("barrier", 2));
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), AbortedError);
  }
}

// A member that returned from its replica function cannot come to the
// release round; the others raise once everyone else is there.
TEST(LocalGroupTest, ReleaseRoundFailsOnAMemberThatIsDoneOnceTheOthersAreHere) {
  LocalGroup group(3);
  std::atomic<bool> copied{false};
  auto errors = run_threads(3, [&](int r) {
    group.arrive(r, {}, call("all_gather", 7));
    if (r == 2) {
      group.mark_done(2);  // (cannot happen in the library: it shows the wait's limit)
      return;
    }
    if (r == 1) copy_slowly(copied, 100);
    try {
      group.release(r, call("all_gather", 7));
    } catch (...) {
      EXPECT_TRUE(copied.load()) << "member " << r << " left the release round early";
      throw;
    }
  });
  EXPECT_FALSE(errors[2]);
  for (int r : {0, 1}) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]);
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), FailedPreconditionError);
    EXPECT_NE(message_of(errors[static_cast<std::size_t>(r)])
                  .find("all_gather #7 can never complete: replica(s) 2 returned from the replica function before "
                        "the end of it"),
              std::string::npos)
        << message_of(errors[static_cast<std::size_t>(r)]);
  }
}

}  // namespace

// The race withdraw() closes, step by step: member 0 has passed arrive()'s
// check of the group's failure and published its entry, but not yet counted
// its arrival, when an abort fails the group and member 1, waiting, leaves.
// Counting member 0 must not complete the round (it would then go on with
// member 1's buffers, which member 1 has left): it waits, and raises the
// abort too.
class LocalGroupRaceTest : public ::testing::Test {
 protected:
  static std::uint64_t publish(LocalGroup& g, int member, const CollectiveCall& c) {
    return g.publish_arrival(member, {}, c);
  }
  static void count(LocalGroup& g, int member, std::uint64_t round, const CollectiveCall& c) {
    g.count_arrival(member, round, c, LocalGroup::RoundKind::kOrdinary);
  }
};

TEST_F(LocalGroupRaceTest, AMemberThatLeftOnAnAbortCannotBeCountedIntoACompleteRound) {
  LocalGroup group(2);
  const CollectiveCall c = call("all_reduce", 1, 0);
  std::atomic<bool> waiting{false};
  std::exception_ptr waiter_error;
  std::thread waiter([&] {
    try {
      waiting = true;
      group.arrive(1, {}, c);
    } catch (...) {
      waiter_error = std::current_exception();
    }
  });
  while (!waiting.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // member 1 is in its wait
  const std::uint64_t round = publish(group, 0, c);            // past arrive()'s failure check
  group.abort(ErrorCode::kAborted, "stop", 1);
  waiter.join();  // member 1 has left the round
  ASSERT_TRUE(waiter_error);
  EXPECT_THROW(std::rethrow_exception(waiter_error), AbortedError);
  EXPECT_THROW(count(group, 0, round, c), AbortedError);
}

namespace {

TEST(LocalGroupTest, RejectsNonPositiveSize) { EXPECT_THROW(LocalGroup(0), InvalidArgumentError); }

}  // namespace
}  // namespace distribute::internal
