// Where TensorFlow hangs or corrupts, distribute raises the same clear error on
// every replica, and the strategy runs again afterwards.
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "testing/scoped_env.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

using Clock = std::chrono::steady_clock;

struct Outcome {
  std::string type;  // "" when the replica returned normally
  std::string message;
};

// Runs body on every replica of s, recording what each replica threw; returns
// the outcomes and what run() itself threw.
std::pair<std::vector<Outcome>, Outcome> run_and_record(Strategy& s, const std::function<void(ReplicaContext&)>& body) {
  std::vector<Outcome> outcomes(static_cast<std::size_t>(s.num_replicas_in_sync()));
  Outcome from_run;
  try {
    s.run([&](ReplicaContext& ctx) {
      auto& o = outcomes[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
      try {
        body(ctx);
      } catch (const Error& e) {
        o = {std::string(to_string(e.code())), e.what()};
        throw;
      } catch (const std::exception& e) {
        o = {"std::exception", e.what()};
        throw;
      }
    });
  } catch (const Error& e) {
    from_run = {std::string(to_string(e.code())), e.what()};
  } catch (const std::exception& e) {
    from_run = {"std::exception", e.what()};
  }
  return {outcomes, from_run};
}

void expect_usable(Strategy& s) {
  auto r = s.run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(1)); });
  for (const auto& t : r.values()) EXPECT_EQ(t, constant(s.num_replicas_in_sync()));
}

TEST(FailureTest, ReplicaThrowsWhileOthersWaitWithoutTimeout) {
  for (int n : {2, 3, 4, 7}) {
    auto s = std::make_unique<MirroredStrategy>(testing::cpu_devices(n));  // no timeout at all
    Clock::time_point thrown_at;
    std::mutex mu;
    std::vector<Clock::time_point> released(static_cast<std::size_t>(n));
    auto [outcomes, from_run] = run_and_record(*s, [&](ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      if (id == n - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the others block first
        {
          std::lock_guard<std::mutex> lock(mu);
          thrown_at = Clock::now();
        }
        throw std::out_of_range("index 7 past the end");
      }
      try {
        ctx.all_reduce(ReduceOp::kSum, constant(1.f));
      } catch (...) {
        released[static_cast<std::size_t>(id)] = Clock::now();
        throw;
      }
    });
    EXPECT_EQ(from_run.type, "std::exception");  // run rethrows the original exception
    EXPECT_EQ(from_run.message, "index 7 past the end");
    for (int r = 0; r + 1 < n; ++r) {
      const auto& o = outcomes[static_cast<std::size_t>(r)];
      EXPECT_EQ(o.type, "AbortedError") << "replica " << r;
      EXPECT_NE(
          o.message.find("Replica " + std::to_string(n - 1) + " failed with std::out_of_range: index 7 past the end"),
          std::string::npos)
          << o.message;
      EXPECT_LT(released[static_cast<std::size_t>(r)] - thrown_at, std::chrono::milliseconds(100)) << "replica " << r;
    }
    expect_usable(*s);
  }
}

TEST(FailureTest, ReplicaThrowsTypedErrorAfterACollective) {
  auto s = testing::mirrored(3);
  auto [outcomes, from_run] = run_and_record(*s, [](ReplicaContext& ctx) {
    ctx.all_reduce(ReduceOp::kSum, constant(1));
    if (ctx.replica_id_in_sync_group() == 1) throw InvalidArgumentError("bad batch");
    ctx.all_gather(constant({1}), 0);
  });
  EXPECT_EQ(from_run.type, "InvalidArgumentError");
  EXPECT_EQ(from_run.message, "bad batch");
  EXPECT_EQ(outcomes[0].type, "AbortedError");
  EXPECT_NE(outcomes[0].message.find("Replica 1 failed with InvalidArgumentError: bad batch"), std::string::npos);
  EXPECT_EQ(outcomes[2].message, outcomes[0].message);
  expect_usable(*s);
}

// Every replica raises the same error, before any data moves.
void expect_collective_error(int n, const std::function<void(ReplicaContext&)>& body, const std::string& type,
                             const std::string& fragment) {
  auto s = testing::mirrored(n);
  auto [outcomes, from_run] = run_and_record(*s, body);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(outcomes[static_cast<std::size_t>(r)].type, type) << "replica " << r;
    EXPECT_EQ(outcomes[static_cast<std::size_t>(r)].message, outcomes[0].message) << "replica " << r;
  }
  EXPECT_NE(outcomes[0].message.find(fragment), std::string::npos) << outcomes[0].message;
  EXPECT_EQ(from_run.message, outcomes[0].message);
  expect_usable(*s);
}

TEST(FailureTest, DifferentCollectives) {
  expect_collective_error(
      3,
      [](ReplicaContext& ctx) {
        if (ctx.replica_id_in_sync_group() == 1) {
          ctx.all_gather(constant({1.f}), 0);
        } else {
          ctx.all_reduce(ReduceOp::kSum, constant({1.f}));
        }
      },
      "FailedPreconditionError",
      "Collective mismatch: the replicas called different collectives (replicas 0, 2: all_reduce #1; replica 1: "
      "all_gather #1)");
}

TEST(FailureTest, DifferentOrder) {
  expect_collective_error(
      2,
      [](ReplicaContext& ctx) {
        if (ctx.replica_id_in_sync_group() == 0) {
          ctx.all_reduce(ReduceOp::kSum, constant(1));
          ctx.all_gather(constant({1}), 0);
        } else {
          ctx.all_gather(constant({1}), 0);
          ctx.all_reduce(ReduceOp::kSum, constant(1));
        }
      },
      "FailedPreconditionError", "Collective mismatch");
}

TEST(FailureTest, DifferentDtypes) {
  expect_collective_error(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_reduce(ReduceOp::kSum, ctx.replica_id_in_sync_group() == 0 ? constant(1) : constant(1.f));
      },
      "InvalidArgumentError", "all_reduce #1: the value has different dtypes on different replicas");
}

TEST(FailureTest, DifferentShapes) {
  expect_collective_error(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_reduce(ReduceOp::kSum, ctx.replica_id_in_sync_group() == 0 ? constant({1, 2}) : constant({1, 2, 3}));
      },
      "InvalidArgumentError", "has different shapes on different replicas (replica 0: (2,); replica 1: (3,))");
}

// The one-Tensor overload (hashed in place) against the nest overload: the
// same detailed error on every replica as two nest calls would give.
TEST(FailureTest, DifferentShapesAcrossTheTensorAndNestOverloads) {
  expect_collective_error(
      3,
      [](ReplicaContext& ctx) {
        const int id = ctx.replica_id_in_sync_group();
        const Tensor x = id == 1 ? constant({1, 2, 3}) : constant({1, 2});
        if (id == 0) {
          ctx.all_reduce(ReduceOp::kSum, x);
        } else {
          ctx.all_reduce(ReduceOp::kSum, Nest<Tensor>(x));
        }
      },
      "InvalidArgumentError", "has different shapes on different replicas (replicas 0, 2: (2,); replica 1: (3,))");
}

TEST(FailureTest, DifferentStructures) {
  using N = Nest<Tensor>;
  expect_collective_error(
      2,
      [](ReplicaContext& ctx) {
        N v = ctx.replica_id_in_sync_group() == 0 ? N::dict({{"a", constant(1)}}) : N::dict({{"b", constant(1)}});
        ctx.all_reduce(ReduceOp::kSum, v);
      },
      "InvalidArgumentError", "different structure (replica 0: {'a': *}; replica 1: {'b': *})");
}

// In a large nest, the message also says where the structures first differ.
TEST(FailureTest, DifferentNestedStructuresNameTheFirstDifference) {
  using N = Nest<Tensor>;
  expect_collective_error(
      3,
      [](ReplicaContext& ctx) {
        const bool odd = ctx.replica_id_in_sync_group() == 2;
        N inner = odd ? N::dict({{"y", constant(1)}}) : N::dict({{"x", constant(1)}});
        ctx.all_reduce(ReduceOp::kSum, N::dict({{"a", N::list({N(constant(1)), inner})}, {"b", N(constant(1))}}));
      },
      "InvalidArgumentError", "They first differ in value['a'][1]: replica 0 has {'x': *}, replica 2 has {'y': *}.");
  expect_collective_error(
      2,
      [](ReplicaContext& ctx) {
        const Tensor row = fill(DType::kInt32, Shape{1}, 1);
        std::vector<N> items(static_cast<std::size_t>(2 + ctx.replica_id_in_sync_group()), N(row));
        ctx.all_gather(N::dict({{"a", N(row)}, {"b", N::tuple(std::move(items))}}), 0);
      },
      "InvalidArgumentError", "They first differ in value['b']: replica 0 has (*, *), replica 1 has (*, *, *).");
}

TEST(FailureTest, DifferentReduceOps) {
  expect_collective_error(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_reduce(ctx.replica_id_in_sync_group() == 0 ? ReduceOp::kSum : ReduceOp::kMean, constant(1.f));
      },
      "InvalidArgumentError", "different reduce op (replica 0: SUM; replica 1: MEAN)");
}

// A replica keeps its last one-Tensor all_reduce's and all_gather's tag, less
// the sequence, from call to call (a CallMemo; all_gather's layout too).
// After calls that agreed, a change of any part of what it is keyed on, or an
// invalid option (not in the key: its verdict is a bit of the tag), on one
// replica alone is still seen, with the error a first call would raise. A
// valid change on every replica gives, call after call, the results the same
// calls give on a fresh strategy.
TEST(FailureTest, AChangeAfterAgreeingCallsIsStillSeen) {
  const Tensor floats = constant({1.f, 2.f});
  const Tensor floats_2x3 = fill(DType::kFloat32, Shape{2, 3}, 1);
  const CommunicationOptions bad_timeout{.timeout = std::chrono::duration<double>(-1)};
  struct Case {
    std::string name;
    std::function<Tensor(ReplicaContext&, bool changed)> call;
    std::string fragment;
    bool change_is_valid = true;
  };
  const std::vector<Case> cases = {
      {"all_reduce dtype",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_reduce(ReduceOp::kSum, changed ? constant({1, 2}) : floats);
       },
       "different dtypes"},
      {"all_reduce length",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_reduce(ReduceOp::kSum, changed ? constant({1.f, 2.f, 3.f}) : floats);
       },
       "replica 0: (2,); replica 1: (3,)"},
      {"all_reduce rank",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_reduce(ReduceOp::kSum, changed ? fill(DType::kFloat32, Shape{2, 1}, 1) : floats);
       },
       "replica 0: (2,); replica 1: (2, 1)"},
      {"all_reduce op",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_reduce(changed ? ReduceOp::kMax : ReduceOp::kSum, floats);
       },
       "different reduce op (replica 0: SUM; replica 1: MAX)"},
      {"all_reduce bytes_per_pack",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_reduce(ReduceOp::kSum, floats, {.bytes_per_pack = changed ? 4096 : 0});
       },
       "bytes_per_pack"},
      {"all_reduce bad option",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_reduce(ReduceOp::kSum, floats, changed ? bad_timeout : CommunicationOptions{});
       },
       "all_reduce #4 on replica 1: Argument `timeout` must be a number of seconds >= 0", false},
      {"all_gather axis",
       [&](ReplicaContext& ctx, bool changed) { return ctx.all_gather(floats_2x3, changed ? 1 : 0); }, "axis"},
      {"all_gather shape",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_gather(changed ? fill(DType::kFloat32, Shape{2, 4}, 1) : floats_2x3, 0);
       },
       "(2, 4)"},
      {"all_gather dtype",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_gather(changed ? fill(DType::kInt32, Shape{2, 3}, 1) : floats_2x3, 0);
       },
       "different dtypes"},
      {"all_gather bad option",
       [&](ReplicaContext& ctx, bool changed) {
         return ctx.all_gather(floats_2x3, 0, changed ? bad_timeout : CommunicationOptions{});
       },
       "all_gather #4 on replica 1: Argument `timeout` must be a number of seconds >= 0", false},
  };
  const std::vector<bool> steps = {false, false, true, true, false};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_collective_error(
        2,
        [&](ReplicaContext& ctx) {
          for (int i = 0; i < 3; ++i) c.call(ctx, false);
          c.call(ctx, ctx.replica_id_in_sync_group() == 1);
        },
        "InvalidArgumentError", c.fragment);
    if (!c.change_is_valid) continue;
    auto s = testing::mirrored(2);
    auto warm = s->run([&](ReplicaContext& ctx) {
      std::vector<Tensor> results;
      for (bool changed : steps) results.push_back(c.call(ctx, changed));
      return results;
    });
    for (std::size_t k = 0; k < steps.size(); ++k) {
      auto cold = testing::mirrored(2)->run([&](ReplicaContext& ctx) { return c.call(ctx, steps[k]); });
      for (std::size_t r = 0; r < 2; ++r) EXPECT_EQ(warm[r][k], cold[r]) << "step " << k << ", replica " << r;
    }
  }
}

TEST(FailureTest, InvalidOptionsOnOneReplica) {
  expect_collective_error(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_reduce(ReduceOp::kSum, constant(1.f), {.bytes_per_pack = ctx.replica_id_in_sync_group() == 1 ? -5 : 0});
      },
      "InvalidArgumentError", "all_reduce #1 on replica 1: Argument `bytes_per_pack` must be >=0, Received -5.");
}

TEST(FailureTest, SkippedCollectiveRaisesAtOnce) {
  for (int n : {2, 4}) {
    auto s = std::make_unique<MirroredStrategy>(testing::cpu_devices(n));  // no timeout
    const auto start = Clock::now();
    auto [outcomes, from_run] = run_and_record(*s, [](ReplicaContext& ctx) {
      ctx.all_reduce(ReduceOp::kSum, constant(1));
      if (ctx.replica_id_in_sync_group() == 0) return;  // skips the second collective
      ctx.all_reduce(ReduceOp::kSum, constant(1));
    });
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(outcomes[0].type, "");
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(outcomes[static_cast<std::size_t>(r)].type, "FailedPreconditionError");
      EXPECT_NE(
          outcomes[static_cast<std::size_t>(r)].message.find(
              "all_reduce #2 can never complete: replica(s) 0 returned from the replica function without calling it"),
          std::string::npos)
          << outcomes[static_cast<std::size_t>(r)].message;
    }
    EXPECT_EQ(from_run.type, "FailedPreconditionError");
    expect_usable(*s);
  }
}

TEST(FailureTest, MissingReplicaTimesOutNamingIt) {
  auto s = testing::mirrored(3, {.timeout = std::chrono::milliseconds(100)});
  const auto start = Clock::now();
  auto [outcomes, from_run] = run_and_record(*s, [](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    ctx.all_reduce(ReduceOp::kSum, constant(1));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(outcomes[static_cast<std::size_t>(r)].type, "DeadlineExceededError") << "replica " << r;
    EXPECT_EQ(outcomes[static_cast<std::size_t>(r)].message, outcomes[0].message);
  }
  EXPECT_NE(outcomes[0].message.find("all_reduce #1 timed out after 0.1 s: replica(s) 2 did not arrive"),
            std::string::npos)
      << outcomes[0].message;
  EXPECT_EQ(from_run.type, "DeadlineExceededError");
  expect_usable(*s);
}

TEST(FailureTest, PerCallTimeoutOverridesTheStrategyDefault) {
  auto s = std::make_unique<MirroredStrategy>(testing::cpu_devices(2));
  auto [outcomes, from_run] = run_and_record(*s, [](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    ctx.all_gather(constant({1}), 0, {.timeout = std::chrono::milliseconds(50)});
  });
  EXPECT_EQ(outcomes[0].type, "DeadlineExceededError");
  EXPECT_EQ(from_run.type, "DeadlineExceededError");
}

TEST(FailureTest, TimeoutFromEnvironmentAndStallWarning) {
  ASSERT_EQ(setenv("DISTRIBUTE_COLLECTIVE_TIMEOUT", "0.3", 1), 0);
  ASSERT_EQ(setenv("DISTRIBUTE_STALL_WARNING_SECONDS", "0.05", 1), 0);
  auto s = std::make_unique<MirroredStrategy>(testing::cpu_devices(2));
  unsetenv("DISTRIBUTE_COLLECTIVE_TIMEOUT");
  unsetenv("DISTRIBUTE_STALL_WARNING_SECONDS");
  ASSERT_TRUE(s->communication_options().timeout.has_value());
  EXPECT_DOUBLE_EQ(s->communication_options().timeout->count(), 0.3);
  ::testing::internal::CaptureStderr();
  auto [outcomes, from_run] = run_and_record(*s, [](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    ctx.all_reduce(ReduceOp::kSum, constant(1));
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: all_reduce #1 has waited"), std::string::npos) << err;
  EXPECT_NE(err.find("replica(s) 1 have not joined it"), std::string::npos) << err;
  EXPECT_EQ(outcomes[0].type, "DeadlineExceededError");
  EXPECT_NE(outcomes[0].message.find("replica(s) 1 did not arrive"), std::string::npos);
}

// Any timeout from 0 up to infinity is a timeout (infinity, and anything
// past the clock's range, waits for ever): 1e10 s and inf used to overflow
// the deadline into the past and time out at once, and so did a huge
// stall-warning period (it warned at once).
TEST(FailureTest, HugeAndInfiniteTimeoutsWaitInsteadOfFailingAtOnce) {
  for (const double seconds : {1e10, 9.3e9, 1e300, std::numeric_limits<double>::infinity()}) {
    auto s = testing::mirrored(2, {.timeout = std::chrono::duration<double>(seconds)});
    const testing::ScopedEnv stall("DISTRIBUTE_STALL_WARNING_SECONDS", "1e12");
    ::testing::internal::CaptureStderr();
    auto r = s->run([](ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return ctx.all_reduce(ReduceOp::kSum, constant(1));
    });
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << seconds;
    EXPECT_EQ(r[0], constant(2)) << seconds;
  }
  for (const char* text : {"inf", "infinity", "1e10", "1e400"}) {
    const testing::ScopedEnv env("DISTRIBUTE_COLLECTIVE_TIMEOUT", text);
    auto s = testing::mirrored(2);
    auto r = s->run([](ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return ctx.all_reduce(ReduceOp::kSum, constant(1));
    });
    EXPECT_EQ(r[1], constant(2)) << text;
  }
}

TEST(FailureTest, ANaNTimeoutIsRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto msg = testing::expect_throw<InvalidArgumentError>(
      [&] { MirroredStrategy s({"CPU:0"}, {.timeout = std::chrono::duration<double>(nan)}); });
  EXPECT_NE(msg.find("Argument `timeout` must be a number of seconds >= 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Received nan"), std::string::npos) << msg;
  auto s = testing::mirrored(2);
  auto [outcomes, from_run] = run_and_record(*s, [&](ReplicaContext& ctx) {
    ctx.all_reduce(ReduceOp::kSum, constant(1), {.timeout = std::chrono::duration<double>(nan)});
  });
  EXPECT_EQ(from_run.type, "InvalidArgumentError");
  EXPECT_NE(from_run.message.find("Received nan"), std::string::npos) << from_run.message;
  const auto per_replica = s->run([](ReplicaContext&) { return constant(1.f); });
  EXPECT_THROW(s->extended().reduce_to(ReduceOp::kSum, per_replica, Destinations("CPU:0"),
                                       {.timeout = std::chrono::duration<double>(nan)}),
               InvalidArgumentError);
  EXPECT_THROW(s->extended().batch_reduce_to(ReduceOp::kSum, {{per_replica, Destinations("CPU:0")}},
                                             {.timeout = std::chrono::duration<double>(-1)}),
               InvalidArgumentError);
}

// Settings are read strictly: what strtod would take (space before, a hex
// number, a NaN) is refused with the setting's name and text.
TEST(FailureTest, TimeoutSettingsAreParsedStrictly) {
  for (const char* text : {" 5", "5 ", "0x10", "+5", "-0", "nan", "5s", "1,5", ""}) {
    const testing::ScopedEnv env("DISTRIBUTE_COLLECTIVE_TIMEOUT", text);
    if (*text == '\0') {  // empty: unset
      EXPECT_NO_THROW(MirroredStrategy({"CPU:0"}));
      continue;
    }
    const std::string msg = testing::expect_throw<InvalidArgumentError>([] { MirroredStrategy s({"CPU:0"}); });
    EXPECT_NE(msg.find("DISTRIBUTE_COLLECTIVE_TIMEOUT='" + std::string(text) + "' is not a number of seconds >= 0"),
              std::string::npos)
        << msg;
  }
  for (const char* text : {"0", "0.25", "5", "1e3", "inf"}) {
    const testing::ScopedEnv env("DISTRIBUTE_STALL_WARNING_SECONDS", text);
    EXPECT_NO_THROW(MirroredStrategy({"CPU:0"})) << text;
  }
  const testing::ScopedEnv env("DISTRIBUTE_STALL_WARNING_SECONDS", "0x10");
  EXPECT_THROW(MirroredStrategy({"CPU:0"}), InvalidArgumentError);
}

TEST(FailureTest, BadEnvironmentValueIsAClearError) {
  std::string msg;
  {
    const testing::ScopedEnv env("DISTRIBUTE_COLLECTIVE_TIMEOUT", "soon");
    msg = testing::expect_throw<InvalidArgumentError>([] { MirroredStrategy s({"CPU:0"}); });
  }
  EXPECT_NE(msg.find("DISTRIBUTE_COLLECTIVE_TIMEOUT='soon'"), std::string::npos) << msg;

  // Read when a strategy is created, not at its first run; and settings
  // read later (the spin, when the replicas' group is made; the storage
  // cache's limit, at the process's first allocation) are checked then too.
  // The default strategy, made on first use, checks none of them.
  for (const auto& [name, text, says] :
       {std::tuple{"DISTRIBUTE_STREAM_ALL_REDUCE_BYTES", "32M", "is not a whole number of bytes (0: never stream)"},
        std::tuple{"DISTRIBUTE_SPIN_MICROSECONDS", "1e3", "is not a whole number of microseconds up to 2147483647"},
        std::tuple{"DISTRIBUTE_SPIN_MICROSECONDS", "2147483648", "is not a whole number of microseconds up to"},
        std::tuple{"DISTRIBUTE_STORAGE_CACHE_BYTES", "2G", "is not a whole number of bytes"},
        std::tuple{"DISTRIBUTE_ONE_ROUND_READ_BYTES", "4K", "is not a whole number of bytes"}}) {
    const testing::ScopedEnv env(name, text);
    msg = testing::expect_throw<InvalidArgumentError>([] { MirroredStrategy s({"CPU:0", "CPU:1"}); });
    EXPECT_NE(msg.find(std::string(name) + "='" + text + "' " + says), std::string::npos) << msg;
    EXPECT_NO_THROW(get_strategy());
  }
}

TEST(FailureTest, ManyFailingRunsInARowLeaveNothingBehind) {
  auto s = testing::mirrored(4);
  for (int k = 0; k < 50; ++k) {
    EXPECT_THROW(s->run([k](ReplicaContext& ctx) {
      ctx.all_reduce(ReduceOp::kSum, constant(1));
      if (ctx.replica_id_in_sync_group() == k % 4) throw std::runtime_error("x");
      ctx.all_reduce(ReduceOp::kSum, constant(1));
    }),
                 std::runtime_error);
  }
  expect_usable(*s);
}

// pthread_exit inside a replica function ends that replica's thread; the
// process goes on (the forced unwind used to be caught and not rethrown,
// which ends the process): the others are aborted, run raises
// FailedPreconditionError naming the replica, and the next run works on a
// thread started in the ended one's place.
TEST(FailureTest, AReplicaThatCallsPthreadExitEndsOnlyItsPart) {
  auto s = testing::mirrored(3);
  auto [outcomes, from_run] = run_and_record(*s, [](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) pthread_exit(nullptr);
    ctx.all_reduce(ReduceOp::kSum, constant(1));
  });
  EXPECT_EQ(from_run.type, "FailedPreconditionError");
  EXPECT_NE(from_run.message.find("Replica 1 called pthread_exit"), std::string::npos) << from_run.message;
  EXPECT_EQ(outcomes[0].type, "AbortedError");
  EXPECT_NE(outcomes[0].message.find("Replica 1 ended its thread (pthread_exit)"), std::string::npos)
      << outcomes[0].message;
  expect_usable(*s);
  expect_usable(*s);
}

// Replica 0 runs on the caller's thread: pthread_exit there ends the
// caller's thread, once the other replicas have returned.
TEST(FailureTest, PthreadExitOnTheCallersThreadEndsItAfterTheOthers) {
  auto s = testing::mirrored(2);
  std::atomic<bool> after_run{false};
  std::string other;
  std::thread caller([&] {
    s->run([&](ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 0) pthread_exit(nullptr);
      try {
        ctx.all_reduce(ReduceOp::kSum, constant(1));
      } catch (const AbortedError& e) {
        other = e.message();
        throw;
      }
    });
    after_run = true;  // never reached: the thread ends inside run
  });
  caller.join();
  EXPECT_FALSE(after_run.load());
  EXPECT_NE(other.find("Replica 0 ended its thread (pthread_exit)"), std::string::npos) << other;
  expect_usable(*s);
}

// run from a thread that a replica started and waits for: that run holds
// every replica, so the new run can never start. The strategy's timeout
// bounds the wait with an error that says why (it waited for ever).
TEST(FailureTest, ARunFromAThreadAReplicaWaitsForIsBoundedByTheTimeout) {
  auto s = testing::mirrored(2, {.timeout = std::chrono::duration<double>(0.3)});
  std::string msg;
  double seconds = 0;
  s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() != 0) return;
    std::thread helper([&] {
      const auto start = Clock::now();
      msg = testing::expect_throw<DeadlineExceededError>([&] { s->run([] {}); });
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
    });
    helper.join();
  });
  EXPECT_NE(msg.find("waits for another run of it, in progress on another thread"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a thread that a replica started cannot run the same strategy"), std::string::npos) << msg;
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 5.0);
  // Runs from two threads still take turns.
  std::thread other([&] { expect_usable(*s); });
  expect_usable(*s);
  other.join();
}

// cancel_run from another thread ends a run whose replicas wait in a
// collective (one never arrives until told), with CancelledError on every
// replica; the strategy runs again afterwards.
TEST(FailureTest, CancelRunFromAnotherThreadEndsTheRunWithCancelledError) {
  auto s = testing::mirrored(2, {.timeout = std::chrono::duration<double>(30)});
  EXPECT_FALSE(s->cancel_run("nothing runs"));
  std::atomic<bool> waiting{false};
  std::atomic<bool> cancelled{false};
  std::thread canceller([&] {
    while (!waiting.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // replica 0 is in its all_reduce by now
    cancelled = s->cancel_run("interrupted by the test");
  });
  const auto start = Clock::now();
  auto [outcomes, from_run] = run_and_record(*s, [&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) {
      waiting = true;
      while (!cancelled.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ctx.all_reduce(ReduceOp::kSum, constant(1.f));
  });
  canceller.join();
  EXPECT_TRUE(cancelled.load());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  EXPECT_EQ(from_run.type, "CancelledError") << from_run.message;
  EXPECT_NE(from_run.message.find("Cancelled: interrupted by the test"), std::string::npos) << from_run.message;
  for (const Outcome& o : outcomes) EXPECT_EQ(o.type, "CancelledError") << o.message;
  expect_usable(*s);
}

// A tensor that cannot be allocated is ResourceExhaustedError naming its
// bytes, dtype and shape (it was a bare std::bad_alloc).
TEST(FailureTest, AnAllocationThatFailsNamesBytesAndShape) {
  const std::int64_t elements = (std::int64_t{1} << 62) + 1;
  const auto msg = testing::expect_throw<ResourceExhaustedError>(
      [&] { Tensor::uninitialized(DType::kUInt8, Shape{elements}, "CPU:0"); });
  EXPECT_NE(msg.find("4,611,686,018,427,387,905 bytes (4.0 EiB)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("uint8 of shape (4611686018427387905,)"), std::string::npos) << msg;
  EXPECT_THROW(Tensor(DType::kUInt8, Shape{elements}), ResourceExhaustedError);
}

}  // namespace
}  // namespace distribute
