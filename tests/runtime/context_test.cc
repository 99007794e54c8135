// TensorFlow's context truth table (spec section 2.1) in every mode.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "testing/strategies.h"

namespace distribute {
namespace {

struct Observed {
  bool has_replica_context;
  bool cross;
  Strategy* cross_strategy;
  Strategy* strategy;
  bool has;
};

Observed observe() {
  return {get_replica_context() != nullptr, in_cross_replica_context(), get_cross_replica_context(), &get_strategy(),
          has_strategy()};
}

void expect_default_state() {
  const Observed o = observe();
  EXPECT_TRUE(o.has_replica_context);
  EXPECT_FALSE(o.cross);
  EXPECT_EQ(o.cross_strategy, nullptr);
  EXPECT_EQ(o.strategy, &default_strategy());
  EXPECT_FALSE(o.has);
  EXPECT_EQ(get_replica_context()->replica_id_in_sync_group(), 0);
  EXPECT_EQ(get_replica_context()->num_replicas_in_sync(), 1);
}

TEST(ContextTest, DefaultState) { expect_default_state(); }

TEST(ContextTest, InsideScope) {
  auto s = testing::mirrored(2);
  {
    auto scope = s->scope();
    const Observed o = observe();
    EXPECT_FALSE(o.has_replica_context);
    EXPECT_TRUE(o.cross);
    EXPECT_EQ(o.cross_strategy, s.get());
    EXPECT_EQ(o.strategy, s.get());
    EXPECT_TRUE(o.has);
    {
      auto again = s->scope();  // nests by counting
      EXPECT_EQ(get_cross_replica_context(), s.get());
    }
    EXPECT_EQ(get_cross_replica_context(), s.get());
  }
  expect_default_state();
}

TEST(ContextTest, InsideRunOnEveryReplica) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    auto seen = s->run([&](ReplicaContext& ctx) {
      const Observed o = observe();
      EXPECT_TRUE(o.has_replica_context);
      EXPECT_EQ(get_replica_context(), &ctx);
      EXPECT_FALSE(o.cross);
      EXPECT_EQ(o.cross_strategy, nullptr);
      EXPECT_EQ(o.strategy, s.get());
      EXPECT_TRUE(o.has);
      EXPECT_EQ(ctx.num_replicas_in_sync(), n);
      EXPECT_EQ(&ctx.strategy(), s.get());
      EXPECT_EQ(ctx.devices(),
                std::vector<std::string>{s->devices()[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]});
      return ctx.replica_id_in_sync_group();
    });
    std::vector<int> want(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) want[static_cast<std::size_t>(i)] = i;
    EXPECT_EQ(seen.values(), want);
    expect_default_state();
  }
}

TEST(ContextTest, InsideMergeFn) {
  auto s = testing::mirrored(2);
  s->run([&] {
    get_replica_context()->merge_call([&](Strategy& strategy) {
      const Observed o = observe();
      EXPECT_FALSE(o.has_replica_context);
      EXPECT_TRUE(o.cross);
      EXPECT_EQ(o.cross_strategy, &strategy);
      EXPECT_EQ(o.strategy, s.get());
      EXPECT_TRUE(o.has);
    });
  });
}

TEST(ContextTest, DefaultStrategyMergeFn) {
  get_replica_context()->merge_call([](Strategy& strategy) {
    EXPECT_EQ(&strategy, &default_strategy());
    EXPECT_EQ(get_replica_context(), nullptr);
    EXPECT_EQ(get_cross_replica_context(), &default_strategy());
    EXPECT_TRUE(in_cross_replica_context());
    EXPECT_EQ(&get_strategy(), &default_strategy());
    EXPECT_FALSE(has_strategy());
  });
  expect_default_state();
}

TEST(ContextTest, DefaultStrategyRunAndScope) {
  auto r = default_strategy().run([] {
    EXPECT_NE(get_replica_context(), nullptr);
    EXPECT_FALSE(has_strategy());
    return get_replica_context()->replica_id_in_sync_group();
  });
  EXPECT_EQ(r.values(), std::vector<int>{0});
  {
    auto scope = default_strategy().scope();  // mostly a no-op
    expect_default_state();
  }
}

TEST(ContextTest, ReplicaFunctionMayTakeNoArguments) {
  auto s = testing::mirrored(3);
  auto r = s->run([] { return get_replica_context()->replica_id_in_sync_group() * 2; });
  EXPECT_EQ(r.values(), (std::vector<int>{0, 2, 4}));
}

TEST(ContextTest, ScopeErrors) {
  auto a = testing::mirrored(2);
  auto b = testing::mirrored(2);
  auto scope = a->scope();
  auto mixing = testing::expect_throw<FailedPreconditionError>([&] { auto inner = b->scope(); });
  EXPECT_NE(mixing.find("Mixing different tf.distribute.Strategy objects"), std::string::npos) << mixing;
  auto nesting = testing::expect_throw<FailedPreconditionError>([&] { auto inner = default_strategy().scope(); });
  EXPECT_NE(nesting.find("Must not nest tf.distribute.Strategy scopes."), std::string::npos) << nesting;
}

TEST(ContextTest, ScopeInsideOwnReplicaFunctionIsAnError) {
  auto s = testing::mirrored(2);
  auto msg = testing::expect_throw<FailedPreconditionError>([&] { s->run([&] { auto scope = s->scope(); }); });
  EXPECT_NE(msg.find("Method requires being in cross-replica context"), std::string::npos) << msg;
}

TEST(ContextTest, ExperimentalSetStrategy) {
  auto s = testing::mirrored(2);
  experimental_set_strategy(s.get());
  EXPECT_EQ(&get_strategy(), s.get());
  EXPECT_TRUE(in_cross_replica_context());
  {
    auto scope = s->scope();  // nests inside the global scope
    auto msg = testing::expect_throw<FailedPreconditionError>([&] { experimental_set_strategy(nullptr); });
    EXPECT_NE(msg.find("Must not be called inside a `tf.distribute.Strategy` scope."), std::string::npos) << msg;
  }
  auto other = testing::mirrored(3);
  experimental_set_strategy(other.get());  // replaces the previous global strategy
  EXPECT_EQ(&get_strategy(), other.get());
  experimental_set_strategy(nullptr);
  expect_default_state();
  {
    auto scope = s->scope();
    EXPECT_THROW(experimental_set_strategy(other.get()), FailedPreconditionError);
  }
}

// A strategy that this thread made current with experimental_set_strategy
// is unset when it is destroyed (Python keeps it alive by reference; here the
// mode would name freed memory).
TEST(ContextTest, DestroyingTheGlobalStrategyUnsetsIt) {
  {
    auto s = testing::mirrored(2);
    experimental_set_strategy(s.get());
    { auto scope = s->scope(); }  // re-entered and left: only the global scope is open
    EXPECT_EQ(&get_strategy(), s.get());
  }
  expect_default_state();
  auto other = testing::mirrored(3);
  experimental_set_strategy(other.get());
  EXPECT_EQ(&get_strategy(), other.get());
  experimental_set_strategy(nullptr);
  expect_default_state();
}

// A thread that sets a strategy and ends without unsetting it gives the
// setting back as it ends: destroying the strategy afterwards is fine.
TEST(ContextTest, AThreadThatEndsWithAStrategySetLetsGoOfIt) {
  auto s = testing::mirrored(2);
  std::thread([&] {
    experimental_set_strategy(s.get());
    auto scope = s->scope();  // re-entered, and left before the thread ends
    EXPECT_EQ(&get_strategy(), s.get());
  }).join();
  s.reset();  // no open scope left: no abort
  expect_default_state();
}

// Destroying a strategy while a scope of it is entered would leave that
// thread's current strategy pointing at freed memory: the program ends with
// a message instead, whichever thread entered the scope.
TEST(ContextDeathTest, DestroyingAStrategyInsideItsScopeEndsTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string message = "was destroyed while still in use: 1 scope\\(\\) or run of it entered and not left";
  EXPECT_DEATH(
      {
        std::optional<StrategyScope> scope;
        auto s = testing::mirrored(2);
        scope.emplace(s->scope());
        s.reset();
      },
      "Strategy\\(2 replicas: CPU:0, CPU:1\\) " + message);
  // Re-entered: two scopes open.
  EXPECT_DEATH(
      {
        auto s = testing::mirrored(2);
        std::optional<StrategyScope> outer(s->scope());
        std::optional<StrategyScope> inner(s->scope());
        s.reset();
      },
      "2 scope\\(\\)s or runs of it entered and not left");
  // Entered on another thread, or set there by experimental_set_strategy, or
  // a run in progress there.
  for (const int how : {0, 1, 2}) {
    EXPECT_DEATH(
        {
          auto s = testing::mirrored(2);
          std::atomic<bool> entered{false};
          std::atomic<bool> leave{false};
          std::thread t([&] {
            std::optional<StrategyScope> scope;
            if (how == 0) scope.emplace(s->scope());
            if (how == 1) experimental_set_strategy(s.get());
            if (how == 2) {
              s->run([&](ReplicaContext& ctx) {
                if (ctx.replica_id_in_sync_group() != 0) return;
                entered = true;
                while (!leave) std::this_thread::yield();
              });
            }
            entered = true;
            while (!leave) std::this_thread::yield();
            if (how == 1) experimental_set_strategy(nullptr);
          });
          while (!entered) std::this_thread::yield();
          s.reset();
          leave = true;
          t.join();
        },
        message)
        << "case " << how;
  }
}

// std::exit unwinds nothing, so a scope entered where it is called stays
// open; a strategy with static storage is then destroyed by the exit itself,
// which is no misuse to report: the process ends with the code asked for.
TEST(ContextDeathTest, ExitInsideAScopeOfAStaticStrategyKeepsItsCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        static std::unique_ptr<MirroredStrategy> s = testing::mirrored(2);
        auto scope = s->scope();
        std::exit(3);
      },
      ::testing::ExitedWithCode(3), "");
}

TEST(ContextTest, ModeIsPerThread) {
  auto s = testing::mirrored(2);
  auto scope = s->scope();
  std::thread t([] { expect_default_state(); });
  t.join();
  EXPECT_TRUE(in_cross_replica_context());
}

TEST(ContextTest, CrossReplicaOnlyMethodsFailInReplicaContext) {
  auto s = testing::mirrored(2);
  s->run([&](ReplicaContext&) {
    auto r = testing::expect_throw<FailedPreconditionError>([&] {
      s->reduce(ReduceOp::kSum, PerReplica<Tensor>({constant(1), constant(1)}), std::nullopt);
    });
    EXPECT_NE(r.find("Method requires being in cross-replica context, use get_replica_context().merge_call()"),
              std::string::npos);
    auto g = testing::expect_throw<FailedPreconditionError>([&] {
      s->gather(PerReplica<Tensor>({constant({1}), constant({1})}), 0);
    });
    EXPECT_NE(g.find("tf.distribute.Strategy.gather method requires cross-replica context"), std::string::npos);
    EXPECT_THROW(s->run([] {}), FailedPreconditionError);
    EXPECT_THROW(s->extended().reduce_to(ReduceOp::kSum, constant(1.f), "CPU:0"), FailedPreconditionError);
    EXPECT_THROW(s->extended().broadcast_to(constant(1.f)), FailedPreconditionError);
  });
}

TEST(ContextTest, OtherStrategyNeedsItsScope) {
  auto s = testing::mirrored(2);
  auto other = testing::mirrored(2);
  // Inside s.run, calling other.reduce mixes strategies.
  s->run([&] {
    EXPECT_THROW(other->reduce(ReduceOp::kSum, PerReplica<Tensor>({constant(1), constant(1)}), std::nullopt),
                 FailedPreconditionError);
  });
  // Inside a default-strategy merge_fn, another strategy needs its own scope.
  get_replica_context()->merge_call([&](Strategy&) {
    auto msg = testing::expect_throw<FailedPreconditionError>([&] { other->run([] {}); });
    EXPECT_NE(msg.find("Need to be inside \"with strategy.scope()\""), std::string::npos) << msg;
  });
}

TEST(ContextTest, MergeCallOnWrongContext) {
  auto s = testing::mirrored(2);
  // merge_call inside merge_fn: no replica context.
  auto nested = testing::expect_throw<FailedPreconditionError>([&] {
    s->run([&](ReplicaContext& ctx) { ctx.merge_call([&](Strategy&) { ctx.merge_call([](Strategy&) {}); }); });
  });
  EXPECT_NE(nested.find("Need to be inside `call_for_each_replica()`"), std::string::npos) << nested;
  // Another replica's context, used from this replica's thread.
  std::atomic<ReplicaContext*> zero{nullptr};
  s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) zero = &ctx;
    ctx.all_reduce(ReduceOp::kSum, constant(1));  // after this, replica 0 has published its context
    if (ctx.replica_id_in_sync_group() == 1) {
      auto msg =
          testing::expect_throw<FailedPreconditionError>([&] { zero.load()->all_reduce(ReduceOp::kSum, constant(1)); });
      EXPECT_NE(msg.find("Mismatching ReplicaContext"), std::string::npos) << msg;
    }
  });
  // The default replica context used inside another strategy's replica function.
  ReplicaContext* default_ctx = get_replica_context();
  s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() != 0) return;
    auto msg =
        testing::expect_throw<FailedPreconditionError>([&] { default_ctx->all_reduce(ReduceOp::kSum, constant(1)); });
    EXPECT_NE(msg.find("Mismatching tf.distribute.Strategy objects"), std::string::npos) << msg;
  });
}

// A ReplicaContext kept past its run (TensorFlow keeps the object usable):
// its collectives raise a typed error naming the replica and the strategy,
// instead of reading a dead stack frame. Its plain accessors still answer.
TEST(ContextTest, AContextUsedAfterItsRunRaises) {
  auto s = testing::mirrored(2);
  std::atomic<ReplicaContext*> kept{nullptr};
  s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) kept = &ctx;
  });
  ASSERT_NE(kept.load(), nullptr);
  EXPECT_EQ(kept.load()->replica_id_in_sync_group(), 1);
  EXPECT_EQ(kept.load()->num_replicas_in_sync(), 2);
  auto msg =
      testing::expect_throw<FailedPreconditionError>([&] { kept.load()->all_reduce(ReduceOp::kSum, constant(1)); });
  EXPECT_NE(msg.find("context of replica 1 of MirroredStrategy(2 replicas"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after its run returned"), std::string::npos) << msg;
  msg = testing::expect_throw<FailedPreconditionError>([&] { kept.load()->all_gather(constant({1}), 0); });
  EXPECT_NE(msg.find("after its run returned"), std::string::npos) << msg;
  // The next run gives the same replica the same context again.
  s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) {
      EXPECT_EQ(&ctx, kept.load());
    }
    ctx.all_reduce(ReduceOp::kSum, constant(1));
  });
}

// A thread that a replica starts is no replica: using the replica's context
// there says so (it used to say that two strategies differ).
TEST(ContextTest, AContextUsedFromAThreadTheReplicaStartedSaysSo) {
  auto s = testing::mirrored(2);
  s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() != 0) return;
    std::string msg;
    std::thread helper([&] {
      msg = testing::expect_throw<FailedPreconditionError>([&] { ctx.all_reduce(ReduceOp::kSum, constant(1)); });
    });
    helper.join();
    EXPECT_NE(msg.find("from a thread that is not that replica's"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("Mismatching tf.distribute.Strategy objects"), std::string::npos) << msg;
  });
}

// Two strategies that print alike are told apart by their addresses.
TEST(ContextTest, StrategiesThatPrintAlikeAreToldApart) {
  auto a = testing::mirrored(2);
  auto b = testing::mirrored(2);
  ASSERT_EQ(a->describe(), b->describe());
  MirroredVariable w = [&] {
    auto scope = a->scope();
    return MirroredVariable(constant(1.f), {.name = "w"});
  }();
  auto scope = b->scope();
  auto msg = testing::expect_throw<FailedPreconditionError>([&] { w.assign(constant(2.f)); });
  EXPECT_NE(msg.find(" at 0x"), std::string::npos) << msg;
  msg = testing::expect_throw<FailedPreconditionError>([&] { static_cast<void>(a->scope()); });
  EXPECT_NE(msg.find(" at 0x"), std::string::npos) << msg;
  // Strategies that print differently need no address.
  auto c = testing::mirrored(3);
  msg = testing::expect_throw<FailedPreconditionError>([&] { static_cast<void>(c->scope()); });
  EXPECT_EQ(msg.find(" at 0x"), std::string::npos) << msg;
}

}  // namespace
}  // namespace distribute
