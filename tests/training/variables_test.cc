// Distributed variables: creation, reads and writes in every context, for
// each synchronization and aggregation, against TensorFlow's rules.
#include <distribute/distribute.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "testing/errors.h"
#include "testing/shared_results.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

using testing::expect_throw;
using testing::mirrored;

float f32(const Tensor& t) { return t.scalar<float>(); }

// Every component of v, as floats.
std::vector<float> components(const Variable& v) {
  std::vector<float> out;
  for (const Tensor& c : v.values()) out.push_back(f32(c));
  return out;
}

// ---- creation -------------------------------------------------------------------

TEST(VariableCreation, UnderScopeOneComponentPerReplicaOnItsDevice) {
  for (int n : testing::kReplicaCounts) {
    auto s = mirrored(n);
    auto scope = s->scope();
    MirroredVariable w(constant({1.f, 2.f}), {.name = "w"});
    ASSERT_EQ(w.size(), static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(w.values()[static_cast<std::size_t>(i)], constant({1.f, 2.f}));
      EXPECT_EQ(w.values()[static_cast<std::size_t>(i)].device(), s->devices()[static_cast<std::size_t>(i)]);
    }
    // Components do not share storage: a write to one cannot leak into another.
    if (n > 1) {
      EXPECT_NE(w.values()[0].storage(), w.values()[1].storage());
    }
    EXPECT_EQ(&w.distribute_strategy(), s.get());
    EXPECT_EQ(w.synchronization(), VariableSynchronization::kOnWrite);
    EXPECT_TRUE(w.trainable());
  }
}

TEST(VariableCreation, InitialValueIsCopied) {
  auto s = mirrored(2);
  auto scope = s->scope();
  Tensor init = constant(1.f);
  MirroredVariable w(init);
  init.mutable_flat<float>()[0] = 5.f;
  EXPECT_EQ(components(w), (std::vector<float>{1.f, 1.f}));
}

TEST(VariableCreation, SynchronizationAndTrainableDefaultsFollowTensorFlow) {
  auto s = mirrored(2);
  auto scope = s->scope();
  Variable automatic(constant(0.f));
  EXPECT_EQ(automatic.synchronization(), VariableSynchronization::kOnWrite);
  Variable on_read(constant(0.f), {.synchronization = VariableSynchronization::kOnRead});
  EXPECT_EQ(on_read.synchronization(), VariableSynchronization::kOnRead);
  EXPECT_FALSE(on_read.trainable());
  SyncOnReadVariable acc(constant(0.f));
  EXPECT_EQ(acc.synchronization(), VariableSynchronization::kOnRead);
  EXPECT_EQ(acc.aggregation(), VariableAggregation::kNone);
}

TEST(VariableCreation, RejectsWhatTensorFlowRejects) {
  auto s = mirrored(2);
  auto scope = s->scope();
  EXPECT_NE(expect_throw<InvalidArgumentError>([] {
              Variable v(constant(1), {.aggregation = VariableAggregation::kMean});
            }).find("aggregation=MEAN and a non-floating dtype"),
            std::string::npos);
  EXPECT_NE(expect_throw<InvalidArgumentError>(
                [] { Variable v(constant(1.f), {.name = "x", .synchronization = VariableSynchronization::kNone}); })
                .find("`NONE` variable synchronization mode is not supported with tf.distribute strategy. Please "
                      "change the `synchronization` for variable: x"),
            std::string::npos);
  EXPECT_NE(expect_throw<InvalidArgumentError>([] {
              SyncOnReadVariable v(constant(1.f), {.trainable = true});
            }).find("ON_READ only for non-trainable variables"),
            std::string::npos);
  EXPECT_NE(expect_throw<InvalidArgumentError>([] {
              MirroredVariable v(constant(1.f), {.synchronization = VariableSynchronization::kOnRead});
            }).find("MirroredVariable 'Variable' needs synchronization ON_WRITE"),
            std::string::npos);
  EXPECT_NE(expect_throw<InvalidArgumentError>([] {
              SyncOnReadVariable v(constant(1.f), {.synchronization = VariableSynchronization::kOnWrite});
            }).find("needs synchronization ON_READ"),
            std::string::npos);
}

TEST(VariableCreation, InsideRunIsRefused) {
  auto s = mirrored(2);
  const std::string msg =
      expect_throw<FailedPreconditionError>([&] { s->run([] { Variable v(constant(1.f), {.name = "late"}); }); });
  EXPECT_NE(msg.find("Variable 'late' was created inside Strategy::run"), std::string::npos) << msg;
}

TEST(VariableCreation, OutsideAnyScopeBelongsToTheDefaultStrategy) {
  Variable v(constant(1.f), {.name = "plain", .aggregation = VariableAggregation::kMean});
  EXPECT_TRUE(is_default_strategy(v.distribute_strategy()));
  EXPECT_EQ(v.size(), 1u);
  v.assign_add(constant(2.f));
  EXPECT_EQ(f32(v.read_value()), 3.f);
  EXPECT_EQ(v.repr(), "<tf.Variable 'plain:0' shape=() dtype=float32, numpy=3.0>");
  // A default-strategy variable inside the default strategy's own run: one replica.
  default_strategy().run([&] { v.assign_sub(constant(1.f)); });
  EXPECT_EQ(f32(v.read_value()), 2.f);
}

TEST(VariablePrinting, ReprIsTensorFlows) {
  auto s = mirrored(2);
  auto scope = s->scope();
  MirroredVariable w(constant(1.f), {.name = "w"});
  EXPECT_EQ(w.repr(),
            "MirroredVariable:{\n"
            "  0: <tf.Variable 'w:0' shape=() dtype=float32, numpy=1.0>,\n"
            "  1: <tf.Variable 'w/replica_1:0' shape=() dtype=float32, numpy=1.0>\n"
            "}");
  SyncOnReadVariable a(constant({1, 2}), {.name = "a"});
  EXPECT_EQ(a.repr().substr(0, 22), "SyncOnReadVariable:{\n ");
  EXPECT_NE(a.repr().find("numpy=array([1, 2], dtype=int32)"), std::string::npos) << a.repr();
}

// ---- MirroredVariable -------------------------------------------------------------

// Replica g writes (g + 1): the aggregate of every replica's value.
struct AggregationCase {
  VariableAggregation aggregation;
  float (*expected_add)(int n);  // what assign_add of (g + 1) adds
};

TEST(MirroredVariableTest, ReplicaWritesAggregateThroughOneMergeCall) {
  const AggregationCase cases[] = {
      {VariableAggregation::kSum, [](int n) { return n * (n + 1) / 2.f; }},
      {VariableAggregation::kMean, [](int n) { return (n + 1) / 2.f; }},
      {VariableAggregation::kOnlyFirstReplica, [](int) { return 1.f; }},
  };
  for (int n : testing::kReplicaCounts) {
    for (const auto& c : cases) {
      SCOPED_TRACE("replicas " + std::to_string(n) + ", aggregation " + std::string(to_string(c.aggregation)));
      auto s = mirrored(n);
      std::optional<MirroredVariable> w;
      {
        auto scope = s->scope();
        w.emplace(constant(10.f), VariableOptions{.name = "w", .aggregation = c.aggregation});
      }
      auto seen = s->run([&](ReplicaContext& ctx) {
        const float mine = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
        w->assign_add(constant(mine));
        return w->read_value();  // after the merge_call: every replica sees the new value
      });
      const float want = 10.f + c.expected_add(n);
      EXPECT_EQ(components(*w), std::vector<float>(static_cast<std::size_t>(n), want));
      for (const Tensor& t : seen.values()) EXPECT_EQ(f32(t), want);
      s->run([&](ReplicaContext& ctx) {
        w->assign_sub(constant(static_cast<float>(ctx.replica_id_in_sync_group() + 1)));
      });
      EXPECT_EQ(components(*w), std::vector<float>(static_cast<std::size_t>(n), 10.f));  // the add taken back
      s->run([&](ReplicaContext& ctx) { w->assign(constant(static_cast<float>(ctx.replica_id_in_sync_group() + 1))); });
      EXPECT_EQ(components(*w), std::vector<float>(static_cast<std::size_t>(n), c.expected_add(n)));
    }
  }
}

TEST(MirroredVariableTest, IntegerSumWraps) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(2147483647), VariableOptions{.aggregation = VariableAggregation::kSum});
  }
  s->run([&] { w->assign_add(constant(1)); });
  for (const Tensor& c : w->values()) EXPECT_EQ(c.scalar<int>(), -2147483647);
}

TEST(MirroredVariableTest, NoneAggregationInAReplicaIsAnErrorNotADrift) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(0.f), VariableOptions{.name = "w"});
  }
  const std::string msg = expect_throw<InvalidArgumentError>([&] {
    s->run([&](ReplicaContext& ctx) { w->assign(constant(static_cast<float>(ctx.replica_id_in_sync_group()))); });
  });
  EXPECT_NE(msg.find("You must specify an aggregation method to update a MirroredVariable in Replica Context"),
            std::string::npos)
      << msg;
  EXPECT_EQ(components(*w), (std::vector<float>{0.f, 0.f}));
}

TEST(MirroredVariableTest, CrossReplicaWritesEveryComponentAndReadsThePrimary) {
  auto s = mirrored(3);
  auto scope = s->scope();
  MirroredVariable w(constant(1.f));
  w.assign(constant(4.f));
  w.assign_add(constant(2.f));
  w.assign_sub(constant(1.f));
  EXPECT_EQ(components(w), (std::vector<float>{5.f, 5.f, 5.f}));
  EXPECT_EQ(f32(w.read_value()), 5.f);
}

// A cross-replica value() is a view of component 0: a write of it reads it
// whole before any component changes, so every mirror gets the same value
// (written component by component from the view, component 0 doubled first
// and the others got 3x).
TEST(MirroredVariableTest, ACrossReplicaWriteOfItsOwnValueReachesEveryComponentAlike) {
  auto s = mirrored(3);
  auto scope = s->scope();
  MirroredVariable w(constant({1.f, 2.f}));
  w.assign_add(w.value());
  for (const Tensor& c : w.values()) EXPECT_EQ(c, constant({2.f, 4.f}));
  w.assign(w.value());  // no change
  for (const Tensor& c : w.values()) EXPECT_EQ(c, constant({2.f, 4.f}));
  w.assign_sub(w.value().reshape(Shape{2}));  // a view of it by another name
  for (const Tensor& c : w.values()) EXPECT_EQ(c, constant({0.f, 0.f}));
  SyncOnReadVariable first(constant(3.f), {.aggregation = VariableAggregation::kOnlyFirstReplica});
  first.assign_add(first.value());
  EXPECT_EQ(components(first), (std::vector<float>{6.f, 6.f, 6.f}));
}

TEST(MirroredVariableTest, OutsideAnyScopeActsInItsStrategysCrossReplicaContext) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(1.f));
  }
  w->assign_add(constant(1.f));
  EXPECT_EQ(components(*w), (std::vector<float>{2.f, 2.f}));
}

TEST(MirroredVariableTest, ReadValueIsASnapshotValueIsAView) {
  auto s = mirrored(2);
  auto scope = s->scope();
  MirroredVariable w(constant(1.f));
  Tensor snapshot = w.read_value();
  Tensor view = w.value();
  w.assign(constant(7.f));
  EXPECT_EQ(f32(snapshot), 1.f);
  EXPECT_EQ(f32(view), 7.f);
}

TEST(MirroredVariableTest, WrongDtypeOrShapeIsRefusedOnEveryReplica) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant({1.f, 2.f}), VariableOptions{.name = "w", .aggregation = VariableAggregation::kSum});
  }
  std::string msg = expect_throw<InvalidArgumentError>([&] { s->run([&] { w->assign_add(constant({1.f})); }); });
  EXPECT_NE(msg.find("assign_add to variable 'w' of float32(2,): the value is float32(1,)"), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([&] { w->assign(constant({1, 2})); });
  EXPECT_NE(msg.find("the value is int32(2,)"), std::string::npos) << msg;
  // Only replica 1 passes a bad value: replica 0, already in the merge_call, is released.
  msg = expect_throw<InvalidArgumentError>([&] {
    s->run([&](ReplicaContext& ctx) {
      w->assign_add(ctx.replica_id_in_sync_group() == 1 ? constant({1.f, 2.f, 3.f}) : constant({1.f, 2.f}));
    });
  });
  EXPECT_NE(msg.find("the value is float32(3,)"), std::string::npos) << msg;
  EXPECT_EQ(w->values()[0], constant({1.f, 2.f}));
}

TEST(MirroredVariableTest, BoolHasNoArithmetic) {
  auto s = mirrored(2);
  auto scope = s->scope();
  MirroredVariable flag(constant(true));
  flag.assign(constant(false));
  EXPECT_FALSE(flag.read_value().scalar<bool>());
  EXPECT_NE(expect_throw<InvalidArgumentError>([&] { flag.assign_add(constant(true)); }).find("bool is not a numeric"),
            std::string::npos);
}

TEST(MirroredVariableTest, ReplicasWritingDifferentVariablesFailInsteadOfLosingAWrite) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> a;
  std::optional<MirroredVariable> b;
  {
    auto scope = s->scope();
    a.emplace(constant(0.f), VariableOptions{.name = "a", .aggregation = VariableAggregation::kSum});
    b.emplace(constant(0.f), VariableOptions{.name = "b", .aggregation = VariableAggregation::kSum});
  }
  const std::string msg = expect_throw<InvalidArgumentError>([&] {
    s->run([&](ReplicaContext& ctx) { (ctx.replica_id_in_sync_group() == 0 ? *a : *b).assign_add(constant(1.f)); });
  });
  EXPECT_NE(msg.find("replica 0 wrote 'a', replica 1 wrote 'b'"), std::string::npos) << msg;
  EXPECT_EQ(components(*a), (std::vector<float>{0.f, 0.f}));
  EXPECT_EQ(components(*b), (std::vector<float>{0.f, 0.f}));
}

TEST(MirroredVariableTest, ReplicasMakingDifferentWritesFail) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> a;
  {
    auto scope = s->scope();
    a.emplace(constant(0.f), VariableOptions{.name = "a", .aggregation = VariableAggregation::kSum});
  }
  const std::string msg = expect_throw<InvalidArgumentError>([&] {
    s->run([&](ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 0) {
        a->assign_add(constant(1.f));
      } else {
        a->assign_sub(constant(1.f));
      }
    });
  });
  EXPECT_NE(msg.find("replica 0 called assign_add, replica 1 called assign_sub"), std::string::npos) << msg;
}

TEST(MirroredVariableTest, AnotherStrategysVariableIsRefused) {
  auto s = mirrored(2);
  auto t = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(0.f), VariableOptions{.name = "w", .aggregation = VariableAggregation::kSum});
  }
  std::string msg = expect_throw<FailedPreconditionError>([&] { t->run([&] { w->assign_add(constant(1.f)); }); });
  EXPECT_NE(msg.find("Mixing different tf.distribute.Strategy objects"), std::string::npos) << msg;
  msg = expect_throw<FailedPreconditionError>([&] {
    auto scope = t->scope();
    w->read_value();
  });
  EXPECT_NE(msg.find("variable 'w'"), std::string::npos) << msg;
  Variable plain(constant(0.f), {.name = "plain"});
  msg = expect_throw<FailedPreconditionError>([&] { s->run([&] { plain.read_value(); }); });
  EXPECT_NE(msg.find("Mixing different tf.distribute.Strategy objects"), std::string::npos) << msg;
}

// ---- SyncOnReadVariable ------------------------------------------------------------

TEST(SyncOnReadVariableTest, ReplicasWriteTheirOwnComponentCrossReplicaReadsAggregate) {
  for (int n : testing::kReplicaCounts) {
    SCOPED_TRACE("replicas " + std::to_string(n));
    auto s = mirrored(n);
    std::optional<SyncOnReadVariable> sum, mean, first, none;
    {
      auto scope = s->scope();
      sum.emplace(constant(0.f), VariableOptions{.aggregation = VariableAggregation::kSum});
      mean.emplace(constant(0.f), VariableOptions{.aggregation = VariableAggregation::kMean});
      first.emplace(constant(0.f), VariableOptions{.aggregation = VariableAggregation::kOnlyFirstReplica});
      none.emplace(constant(0.f), VariableOptions{.name = "none"});
    }
    auto local = s->run([&](ReplicaContext& ctx) {
      const Tensor mine = constant(static_cast<float>(ctx.replica_id_in_sync_group() + 1));
      for (auto* v : {&*sum, &*mean, &*first, &*none}) v->assign_add(mine);
      return sum->read_value();  // a replica reads its own component
    });
    for (int i = 0; i < n; ++i) EXPECT_EQ(f32(local.values()[static_cast<std::size_t>(i)]), i + 1.f);
    EXPECT_EQ(f32(sum->read_value()), n * (n + 1) / 2.f);
    EXPECT_EQ(f32(mean->read_value()), (n + 1) / 2.f);
    EXPECT_EQ(f32(first->read_value()), 1.f);
    const std::string msg = expect_throw<InvalidArgumentError>([&] { none->read_value(); });
    EXPECT_NE(msg.find("Could not convert from `tf.VariableAggregation` VariableAggregation.NONE to`tf.distribute."
                       "ReduceOp` type"),
              std::string::npos)
        << msg;
  }
}

TEST(SyncOnReadVariableTest, CrossReplicaAssignOfASumIsSpreadSoTheReadGivesItBack) {
  auto s = mirrored(4);
  auto scope = s->scope();
  SyncOnReadVariable total(constant(0.f), {.aggregation = VariableAggregation::kSum});
  total.assign(constant(10.f));
  EXPECT_EQ(components(total), (std::vector<float>{2.5f, 2.5f, 2.5f, 2.5f}));
  EXPECT_EQ(f32(total.read_value()), 10.f);
  SyncOnReadVariable count(constant(0), {.aggregation = VariableAggregation::kSum});
  count.assign(constant(10));  // integers truncate, as TensorFlow's cast(10 / 4)
  EXPECT_EQ(count.values()[0].scalar<int>(), 2);
  const std::string msg = expect_throw<InvalidArgumentError>([&] { total.assign_add(constant(1.f)); });
  EXPECT_NE(msg.find("SyncOnReadVariable does not support `assign_add` in cross-replica context when aggregation is "
                     "set to `tf.VariableAggregation.SUM`"),
            std::string::npos)
      << msg;
  EXPECT_NE(expect_throw<InvalidArgumentError>([&] { total.assign_sub(constant(1.f)); }).find("`assign_sub`"),
            std::string::npos);
}

// Integers are divided exactly, truncating toward zero, with no detour
// through double (where 2^63 - 1 becomes 2^63, which does not convert back).
TEST(SyncOnReadVariableTest, CrossReplicaAssignOfAnIntegerSumDividesExactly) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  {
    auto s = mirrored(1);
    auto scope = s->scope();
    SyncOnReadVariable big(constant(std::int64_t{0}), {.aggregation = VariableAggregation::kSum});
    big.assign(constant(kMax));
    EXPECT_EQ(big.values()[0].scalar<std::int64_t>(), kMax);
  }
  auto s = mirrored(4);
  auto scope = s->scope();
  SyncOnReadVariable v(constant(std::int64_t{0}), {.aggregation = VariableAggregation::kSum});
  v.assign(constant(std::int64_t{-10}));
  EXPECT_EQ(v.values()[0].scalar<std::int64_t>(), -2);
  v.assign(constant(kMin));
  EXPECT_EQ(v.values()[0].scalar<std::int64_t>(), kMin / 4);
  SyncOnReadVariable u(cast(constant(0), DType::kUInt8), {.aggregation = VariableAggregation::kSum});
  u.assign(cast(constant(255), DType::kUInt8));
  EXPECT_EQ(u.values()[0].scalar<std::uint8_t>(), 63);
}

// Outside any strategy a SyncOnRead variable is a plain variable (one
// component, aggregation ignored: docs/semantics.md §5.6), as a Keras
// metric's ON_READ SUM counter outside any strategy is in TensorFlow.
// In a replica, a SyncOnRead write of its own component's value (a view of
// it) acts as on a copy.
TEST(SyncOnReadVariableTest, AReplicaWriteOfItsOwnValue) {
  auto s = mirrored(2);
  std::optional<SyncOnReadVariable> v;
  {
    auto scope = s->scope();
    v.emplace(constant({1.f, 2.f}), VariableOptions{.aggregation = VariableAggregation::kSum});
  }
  s->run([&](ReplicaContext&) {
    v->assign(v->value());
    v->assign_add(v->value());
  });
  for (const Tensor& c : v->values()) EXPECT_EQ(c, constant({2.f, 4.f}));
}

TEST(SyncOnReadVariableTest, OutsideAnyStrategyItIsAPlainVariable) {
  SyncOnReadVariable none(constant(1.f));
  EXPECT_EQ(f32(none.read_value()), 1.f);
  none.assign_add(constant(2.f));
  EXPECT_EQ(f32(none.value()), 3.f);
  SyncOnReadVariable total(constant(0.f), {.aggregation = VariableAggregation::kSum});
  total.assign_add(constant(3.f));
  total.assign_sub(constant(1.f));
  EXPECT_EQ(f32(total.read_value()), 2.f);
  total.assign(constant(5.f));  // not divided: one component
  EXPECT_EQ(components(total), (std::vector<float>{5.f}));
}

TEST(SyncOnReadVariableTest, CrossReplicaWritesOfOtherAggregationsReachEveryComponent) {
  auto s = mirrored(2);
  auto scope = s->scope();
  SyncOnReadVariable mean(constant(1.f), {.aggregation = VariableAggregation::kMean});
  mean.assign_add(constant(2.f));
  EXPECT_EQ(components(mean), (std::vector<float>{3.f, 3.f}));
  mean.assign(constant(5.f));
  EXPECT_EQ(f32(mean.read_value()), 5.f);
}

// A variable used after its strategy is destroyed raises
// FailedPreconditionError (no read of freed memory: ASan would report one),
// also against a new strategy that may sit at the old one's address; what
// needs no strategy (its components, printing) still works.
TEST(VariableLifetimeTest, AVariableThatOutlivesItsStrategyRaisesFailedPrecondition) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(1.f), VariableOptions{.name = "w"});
  }
  s.reset();
  const std::string msg = expect_throw<FailedPreconditionError>([&] { static_cast<void>(w->value()); });
  EXPECT_NE(msg.find("variable 'w' was used after its strategy, MirroredStrategy(2 replicas"), std::string::npos)
      << msg;
  EXPECT_THROW(w->assign(constant(2.f)), FailedPreconditionError);
  EXPECT_THROW(w->distribute_strategy(), FailedPreconditionError);
  auto again = mirrored(2);
  EXPECT_THROW(again->extended().update(*w, [](Tensor&) {}), FailedPreconditionError);
  EXPECT_THROW(again->run([&](ReplicaContext&) { w->assign_add(constant(1.f)); }), FailedPreconditionError);
  EXPECT_EQ(components(*w), (std::vector<float>{1.f, 1.f}));
  EXPECT_NE(w->repr().find("MirroredVariable:{"), std::string::npos);
}

// ---- extended().update -------------------------------------------------------------

TEST(VariableUpdate, CrossReplicaFnRunsOncePerComponentWithItsShareOfTheArguments) {
  auto s = mirrored(3);
  auto scope = s->scope();
  MirroredVariable w(constant(1.f));
  PerReplica<Tensor> per({constant(10.f), constant(20.f), constant(30.f)});
  int calls = 0;
  s->extended().update(
      w,
      [&](Tensor& c, const Tensor& x) {
        ++calls;
        c.mutable_flat<float>()[0] += x.scalar<float>();
        EXPECT_EQ(c.device(), internal::default_device());  // fn runs under the component's device
      },
      per);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(components(w), (std::vector<float>{11.f, 21.f, 31.f}));
}

TEST(VariableUpdate, InAReplicaOneMergeCallUpdatesEachComponentOnce) {
  auto s = mirrored(4);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(0.f));
  }
  std::atomic<int> calls{0};
  auto results = s->run([&](ReplicaContext& ctx) {
    // Each replica passes its id: component i is updated with replica i's value.
    return s->extended().update(
        *w,
        [&](Tensor& c, const Tensor& id) {
          ++calls;
          c = constant(id.scalar<float>() * 2.f);  // replacing the component is allowed
          return c.scalar<float>();
        },
        constant(static_cast<float>(ctx.replica_id_in_sync_group())));
  });
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(components(*w), (std::vector<float>{0.f, 2.f, 4.f, 6.f}));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(results.values()[static_cast<std::size_t>(i)].values(), (std::vector<float>{0.f, 2.f, 4.f, 6.f}));
    EXPECT_EQ(w->values()[static_cast<std::size_t>(i)].device(), s->devices()[static_cast<std::size_t>(i)]);
  }
}

// A Tensor argument every component receives whole arrives read-only
// (select_replica); a component replaced with it takes a copy of its own, so
// that the variable stays writable and its components apart.
TEST(VariableUpdate, ACrossReplicaArgumentIsReadOnlyAndAReplacementIsCopied) {
  auto s = mirrored(3);
  auto scope = s->scope();
  MirroredVariable w(constant(1.f));
  const Tensor seven = constant(7.f);
  s->extended().update(
      w,
      [&](Tensor& c, const Tensor& x) {
        EXPECT_TRUE(x.is_read_only());
        EXPECT_EQ(x.raw_data(), seven.raw_data());
        c = x;
      },
      seven);
  EXPECT_EQ(components(w), (std::vector<float>{7.f, 7.f, 7.f}));
  for (std::size_t i = 0; i < w.size(); ++i) {
    EXPECT_FALSE(w.values()[i].is_read_only()) << "component " << i;
    EXPECT_NE(w.values()[i].raw_data(), seven.raw_data()) << "component " << i;
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(w.values()[i].raw_data(), w.values()[j].raw_data());
  }
  w.assign_add(constant(1.f));  // written once per component, not three times into one storage
  EXPECT_EQ(components(w), (std::vector<float>{8.f, 8.f, 8.f}));
  EXPECT_EQ(seven, constant(7.f));
}

// A replacement that is writable but held elsewhere too (each replica's own
// argument, a tensor fn captured) is copied as well: the components never
// share storage with it, with another variable or with each other.
TEST(VariableUpdate, AWritableReplacementHeldElsewhereIsCopied) {
  auto s = mirrored(3);
  auto scope = s->scope();
  MirroredVariable online(constant({1.f, 2.f}));
  MirroredVariable target(constant({0.f, 0.f}));
  // In a replica context: "copy online into target", one merge_call.
  s->run([&](ReplicaContext&) {
    s->extended().update(
        target, [](Tensor& c, const Tensor& x) { c = x; }, online.value());
  });
  for (std::size_t i = 0; i < target.size(); ++i) {
    EXPECT_EQ(target.values()[i], constant({1.f, 2.f})) << "component " << i;
    EXPECT_NE(target.values()[i].raw_data(), online.values()[i].raw_data()) << "component " << i;
  }
  online.assign_add(constant({10.f, 10.f}));
  for (const Tensor& c : target.values()) EXPECT_EQ(c, constant({1.f, 2.f}));
  // In the cross-replica context, fn installs one captured tensor in every component.
  Tensor shared = constant({5.f, 5.f});
  s->extended().update(target, [&](Tensor& c) { c = shared; });
  for (std::size_t i = 0; i < target.size(); ++i) {
    EXPECT_NE(target.values()[i].raw_data(), shared.raw_data()) << "component " << i;
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(target.values()[i].raw_data(), target.values()[j].raw_data());
  }
  target.assign_add(constant({1.f, 1.f}));  // once per component, not three times into one storage
  for (const Tensor& c : target.values()) EXPECT_EQ(c, constant({6.f, 6.f}));
  EXPECT_EQ(shared, constant({5.f, 5.f}));
  // A component written in place keeps its storage.
  const void* before = target.values()[1].raw_data();
  s->extended().update(target, [](Tensor& c) { c.mutable_flat<float>()[0] = 0.f; });
  EXPECT_EQ(target.values()[1].raw_data(), before);
  // A fresh tensor that fn installs and returns is not copied: the result
  // views the variable, as a component written in place and returned does.
  const Mirrored<Tensor> returned = s->extended().update(target, [](Tensor& c) {
    c = constant({3.f, 4.f});
    return c;
  });
  for (std::size_t i = 0; i < target.size(); ++i) {
    EXPECT_EQ(returned.values()[i].raw_data(), target.values()[i].raw_data()) << "component " << i;
  }
}

// A PerReplica argument of the wrong length is refused before any component
// changes (it used to update the first two of three, then fail on the third).
TEST(VariableUpdate, ADistributedArgumentOfTheWrongLengthIsRefusedFirst) {
  auto s = mirrored(3);
  auto scope = s->scope();
  MirroredVariable w(constant(1.f));
  auto set = [](Tensor& c, const Tensor& x) { c.mutable_flat<float>()[0] = x.flat<float>()[0]; };
  for (std::size_t n : {std::size_t{2}, std::size_t{4}}) {
    std::vector<Tensor> parts(n, constant(5.f));
    const std::string msg =
        testing::error_message<InvalidArgumentError>([&] { s->extended().update(w, set, PerReplica<Tensor>(parts)); });
    EXPECT_NE(msg.find("update"), std::string::npos) << msg;
    EXPECT_EQ(components(w), (std::vector<float>{1.f, 1.f, 1.f})) << n << " components";
  }
}

// update(w, fn, w.value()): w.value() views component 0, which fn writes
// first; every component still sees the value from before the update.
TEST(VariableUpdate, AnArgumentThatViewsAComponentIsReadBeforeAnyWrite) {
  auto s = mirrored(3);
  auto scope = s->scope();
  MirroredVariable w(constant({1.f, 2.f}));
  auto add = [](Tensor& c, const Tensor& x) {
    for (std::size_t k = 0; k < 2; ++k) c.mutable_flat<float>()[k] += x.flat<float>()[k];
  };
  s->extended().update(w, add, w.value());
  for (const Tensor& c : w.values()) EXPECT_EQ(c, constant({2.f, 4.f}));
  // The same inside a nest.
  s->extended().update(
      w, [&](Tensor& c, const Nest<Tensor>& x) { add(c, x.flatten()[0]); },
      Nest<Tensor>::list({Nest<Tensor>(w.value())}));
  for (const Tensor& c : w.values()) EXPECT_EQ(c, constant({4.f, 8.f}));
}

// A Variable's update in a replica context that returns the component: every
// replica gets the whole result read-only (it is the variable's storage, and
// every replica's), and the variable is still written through its own API.
TEST(VariableUpdate, InAReplicaTheWholeResultIsReadOnly) {
  auto s = mirrored(3);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(0.f));
  }
  s->run([&](ReplicaContext& ctx) {
    const Mirrored<Tensor> out = s->extended().update(
        *w,
        [](Tensor& c, const Tensor& id) -> Tensor& {
          c.mutable_flat<float>()[0] = id.scalar<float>() + 1.f;
          return c;
        },
        constant(static_cast<float>(ctx.replica_id_in_sync_group())));
    ASSERT_EQ(out.size(), 3u);
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i], constant(static_cast<float>(i) + 1.f));
      EXPECT_EQ(out[i].raw_data(), w->values()[i].raw_data());
      EXPECT_TRUE(testing::refuses_writes(out[i], "float32 ()", out[i].device()));
    }
  });
  EXPECT_EQ(components(*w), (std::vector<float>{1.f, 2.f, 3.f}));
  w->assign_add(constant(1.f));
  EXPECT_EQ(components(*w), (std::vector<float>{2.f, 3.f, 4.f}));
}

TEST(VariableUpdate, AnFnThatChangesTheShapeIsRefused) {
  auto s = mirrored(2);
  auto scope = s->scope();
  MirroredVariable w(constant({1.f, 2.f}), {.name = "w"});
  const std::string msg =
      expect_throw<InvalidArgumentError>([&] { s->extended().update(w, [](Tensor& c) { c = constant(1.f); }); });
  EXPECT_NE(msg.find("update of variable 'w' replaced component 0 (float32(2,)) with a tensor of float32(); the "
                     "component keeps its tensor from before the update"),
            std::string::npos)
      << msg;
  EXPECT_EQ(w.values()[0], constant({1.f, 2.f}));  // its value, not zeros
  EXPECT_EQ(w.values()[1], constant({1.f, 2.f}));  // not reached
  // An fn that replaces the component and then throws: its exception, and
  // the component's own tensor back.
  EXPECT_THROW(s->extended().update(w,
                                    [](Tensor& c) {
                                      c = constant(1.f);
                                      throw OutOfRangeError("fn failed");
                                    }),
               OutOfRangeError);
  EXPECT_EQ(w.values()[0], constant({1.f, 2.f}));
}

TEST(VariableAggregationTest, ConvertsToReduceOpAsTensorFlow) {
  EXPECT_EQ(reduce_op_from_variable_aggregation(VariableAggregation::kSum), ReduceOp::kSum);
  EXPECT_EQ(reduce_op_from_variable_aggregation(VariableAggregation::kMean), ReduceOp::kMean);
  EXPECT_THROW(reduce_op_from_variable_aggregation(VariableAggregation::kOnlyFirstReplica), InvalidArgumentError);
  EXPECT_EQ(to_string(VariableAggregation::kOnlyFirstReplica), "ONLY_FIRST_REPLICA");
  EXPECT_EQ(to_string(VariableSynchronization::kOnRead), "ON_READ");
}

}  // namespace
}  // namespace distribute
