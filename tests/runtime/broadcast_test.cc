// ReplicaContext::broadcast (not in TensorFlow's ReplicaContext): every
// replica gets the root's value, for every dtype, root, replica count and
// size boundary; nests packed per dtype; the argument errors, which every
// replica must report identically; the single-replica strategies.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "comm/threads/local_group.h"
#include "comm/threads/shared_memory_communicator.h"
#include "runtime/replica_channel.h"
#include "testing/shared_results.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

using internal::LocalGroup;
using internal::SharedMemoryCommunicator;

// Replica r's value of `count` elements: r * 7 + i (small enough for int8; bool alternates).
Tensor value_of(DType dtype, std::int64_t count, int r) {
  return iota(dtype, Shape{count}, dtype == DType::kBool ? r % 2 : r * 7.0, dtype == DType::kBool ? 0 : 1);
}

// Element counts at the engine's edges for one dtype: none, one, the most a
// small round carries and one more, the most the inline path carries and one
// more (past it the replicas share one result), and a bandwidth-path size.
std::vector<std::int64_t> edge_counts(DType dtype) {
  const auto esz = static_cast<std::int64_t>(size_of(dtype));
  const auto small = static_cast<std::int64_t>(LocalGroup::kSmallBytes) / esz;
  const auto inline_max = static_cast<std::int64_t>(LocalGroup::kInlineBytes) / esz;
  return {0, 1, small, small + 1, inline_max, inline_max + 1, 20000};
}

class BroadcastDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(BroadcastDTypeTest, EveryReplicaGetsTheRootsValueFromEveryRoot) {
  const DType dtype = GetParam();
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    for (const std::int64_t count : edge_counts(dtype)) {
      const bool shared =
          n > 1 && SharedMemoryCommunicator::shares_broadcast(static_cast<std::size_t>(count) * size_of(dtype));
      for (const int root : {0, n / 2, n - 1}) {
        SCOPED_TRACE(std::to_string(n) + " replicas, root " + std::to_string(root) + ", " + std::to_string(count) +
                     " elements");
        auto r = s->run([&](ReplicaContext& ctx) {
          return ctx.broadcast(value_of(dtype, count, ctx.replica_id_in_sync_group()), root);
        });
        const Tensor want = value_of(dtype, count, root);
        for (int q = 0; q < n; ++q) {
          const Tensor& got = r[static_cast<std::size_t>(q)];
          EXPECT_EQ(got, want) << "replica " << q;
          EXPECT_EQ(got.device(), s->devices()[static_cast<std::size_t>(q)]);
          EXPECT_TRUE(got.is_read_only());
          if (count > 0) {
            EXPECT_EQ(got.raw_data() == r[0].raw_data(), q == 0 || shared) << "replica " << q;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, BroadcastDTypeTest, ::testing::ValuesIn(kAllDTypes),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// A nest keeps its structure, dtypes and shapes; its leaves are packed per
// dtype (one collective per pack, as all_reduce's: with bytes_per_pack 1 the
// float32 leaves, flattened as rest[1] (empty), rest[2], w, take two packs:
// the first two together, then w), and the list overload is the list nest.
TEST(BroadcastTest, NestsArePackedPerDtypeAndKeepTheirStructure) {
  auto s = testing::mirrored(3);
  const auto value = [](int r) {
    return Nest<Tensor>::dict(
        {{"w", fill(DType::kFloat32, Shape{3000, 2}, r)},
         {"rest", Nest<Tensor>::list({fill(DType::kInt64, Shape{5}, r + 10), fill(DType::kFloat32, Shape{0}, r),
                                      fill(DType::kFloat32, Shape{2, 3}, -r)})}});
  };
  for (auto [bytes_per_pack, want_calls] : std::vector<std::pair<std::int64_t, std::uint64_t>>{{0, 2}, {1, 3}}) {
    SCOPED_TRACE("bytes_per_pack " + std::to_string(bytes_per_pack));
    auto r = s->run([&, b = bytes_per_pack](ReplicaContext& ctx) {
      const std::uint64_t before = internal::Access::channel(ctx).data_calls;
      Nest<Tensor> got = ctx.broadcast(value(ctx.replica_id_in_sync_group()), 2, {.bytes_per_pack = b});
      EXPECT_EQ(internal::Access::channel(ctx).data_calls - before, want_calls);
      return got;
    });
    const Nest<Tensor> want = value(2);
    for (int q = 0; q < 3; ++q) {
      const Nest<Tensor>& got = r[static_cast<std::size_t>(q)];
      EXPECT_EQ(got.structure_string(), want.structure_string());
      const auto got_leaves = got.flatten();
      const auto want_leaves = want.flatten();
      ASSERT_EQ(got_leaves.size(), want_leaves.size());
      for (std::size_t i = 0; i < got_leaves.size(); ++i) {
        EXPECT_EQ(got_leaves[i], want_leaves[i]) << "replica " << q << " leaf " << i;
        EXPECT_TRUE(got_leaves[i].is_read_only());
      }
    }
  }
  auto lists = s->run([](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return ctx.broadcast(std::vector<Tensor>{fill(DType::kInt32, Shape{4}, id), fill(DType::kFloat64, Shape{1}, id)},
                         1);
  });
  for (const std::vector<Tensor>& got : lists.values()) {
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0], fill(DType::kInt32, Shape{4}, 1));
    EXPECT_EQ(got[1], fill(DType::kFloat64, Shape{1}, 1));
  }
  // Nothing to move: the replicas still meet, and agree.
  auto empty = s->run([](ReplicaContext& ctx) { return ctx.broadcast(std::vector<Tensor>{}, 0).size(); });
  for (std::size_t size : empty.values()) EXPECT_EQ(size, 0u);
}

// The root's value is read, the others' only described: a non-root's own
// value does not reach anybody, and writing the result is refused.
TEST(BroadcastTest, ResultsAreReadOnlyAndNotTheRootsOwnStorage) {
  auto s = testing::mirrored(2);
  std::atomic<int> refused{0};
  auto r = s->run([&](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    Tensor mine = fill(DType::kFloat32, Shape{6000}, id + 1);
    Tensor got = ctx.broadcast(mine, 1);
    if (testing::refuses_writes(got, "float32 (6000,)", ctx.devices()[0])) ++refused;
    mine.mutable_flat<float>()[0] = -1.f;  // the root's own value stays its own to write
    return got;
  });
  EXPECT_EQ(refused.load(), 2);
  for (const Tensor& got : r.values()) EXPECT_EQ(got, fill(DType::kFloat32, Shape{6000}, 2));
}

// A step that drops its last result before the next broadcast gets the same
// storage back every time (the shared output comes from the cache every
// thread shares, allocated once every replica has arrived).
TEST(BroadcastTest, AStepThatDropsItsLastResultTakesNoFreshStorage) {
  auto s = testing::mirrored(2);
  const auto step = [](ReplicaContext& ctx) {
    return ctx.broadcast(fill(DType::kFloat32, Shape{300000}, ctx.replica_id_in_sync_group()), 1);
  };
  EXPECT_EQ(testing::fresh_blocks_after_the_first_step(
                *s, step, [](const Tensor& out) { EXPECT_EQ(out.at<float>({299999}), 1.f); }),
            0u);
}

// Runs `fn` on n replicas; returns each replica's error message (empty if none).
template <class E, class F>
std::vector<std::string> errors_on_every_replica(Strategy& s, int n, F&& fn) {
  std::vector<std::string> messages(static_cast<std::size_t>(n));
  s.run([&](ReplicaContext& ctx) {
    try {
      fn(ctx);
    } catch (const E& e) {
      messages[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = e.what();
    }
  });
  return messages;
}

void expect_alike(const std::vector<std::string>& messages, const std::string& part) {
  ASSERT_FALSE(messages.empty());
  for (const std::string& m : messages) {
    EXPECT_EQ(m, messages[0]);
    EXPECT_NE(m.find(part), std::string::npos) << m;
  }
}

// Each mistake raises one error, the same on every replica, before any data
// moves; the strategy stays usable.
TEST(BroadcastTest, ArgumentErrorsAreRaisedAlikeOnEveryReplica) {
  const int n = 3;
  auto s = testing::mirrored(n);
  const auto id = [](ReplicaContext& ctx) { return ctx.replica_id_in_sync_group(); };
  // A root that is not a replica, small and large.
  for (const std::int64_t count : {2, 5000}) {
    expect_alike(errors_on_every_replica<InvalidArgumentError>(
                     *s, n, [&](ReplicaContext& ctx) { ctx.broadcast(value_of(DType::kFloat32, count, id(ctx)), 3); }),
                 "broadcast #1 on replica 0: broadcast: root_replica 3 is not a replica of this sync group "
                 "(3 replicas: 0 to 2)");
  }
  expect_alike(errors_on_every_replica<InvalidArgumentError>(
                   *s, n, [&](ReplicaContext& ctx) { ctx.broadcast(Nest<Tensor>(constant(1.f)), -1); }),
               "root_replica -1 is not a replica");
  // Replicas that name different roots.
  expect_alike(
      errors_on_every_replica<InvalidArgumentError>(*s, n,
                                                    [&](ReplicaContext& ctx) {
                                                      ctx.broadcast(constant({1.f, 2.f}), id(ctx) == 2 ? 1 : 0);
                                                    }),
      "broadcast #1: the replicas passed different root replica (replicas 0, 1: 0; replica 2: 1)");
  // Shapes, dtypes and structures must be equal.
  expect_alike(errors_on_every_replica<InvalidArgumentError>(
                   *s, n, [&](ReplicaContext& ctx) { ctx.broadcast(value_of(DType::kInt32, 5000 + id(ctx) / 2, 0)); }),
               "broadcast #1: the value has different shapes on different replicas (replicas 0, 1: (5000,); "
               "replica 2: (5001,)); broadcast needs equal shapes.");
  expect_alike(
      errors_on_every_replica<InvalidArgumentError>(
          *s, n,
          [&](ReplicaContext& ctx) { ctx.broadcast(value_of(id(ctx) == 1 ? DType::kInt64 : DType::kInt32, 3, 0)); }),
      "the value has different dtypes on different replicas");
  expect_alike(errors_on_every_replica<InvalidArgumentError>(
                   *s, n,
                   [&](ReplicaContext& ctx) {
                     ctx.broadcast(id(ctx) == 0 ? Nest<Tensor>::list({constant(1.f)})
                                                : Nest<Tensor>::list({constant(1.f), constant(2.f)}));
                   }),
               "the replicas passed different structure");
  // Dict keys that hold a quote: {"a': *, 'b": x, "c": y} printed as
  // {'a': *, 'b': *, 'c': *} without escaping, as {"a": x, "b': *, 'c": y}
  // did; with a different number of leaves, leaf 1 was read past the end
  // of one replica's list. Every collective refuses both, alike everywhere.
  auto tricky = [](int replica) {
    using N = Nest<Tensor>;
    if (replica == 0) return N::dict({{"a': *, 'b", N(constant({1.f}))}, {"c", N(constant({2.f}))}});
    if (replica == 1) return N::dict({{"a", N(constant({1.f}))}, {"b': *, 'c", N(constant({2.f}))}});
    return N::dict({{"a", N(constant({1.f}))}, {"b", N(constant({2.f}))}, {"c", N(constant({3.f}))}});
  };
  for (const int kind : {0, 1, 2}) {
    expect_alike(errors_on_every_replica<InvalidArgumentError>(*s, n,
                                                               [&](ReplicaContext& ctx) {
                                                                 const Nest<Tensor> v = tricky(id(ctx));
                                                                 if (kind == 0) ctx.broadcast(v);
                                                                 if (kind == 1) ctx.all_reduce(ReduceOp::kSum, v);
                                                                 if (kind == 2) ctx.all_gather(v, 0);
                                                               }),
                 "the replicas passed different structure");
  }
  // Another collective on one replica.
  expect_alike(errors_on_every_replica<FailedPreconditionError>(*s, n,
                                                                [&](ReplicaContext& ctx) {
                                                                  if (id(ctx) == 1) {
                                                                    ctx.all_reduce(ReduceOp::kSum, constant(1.f));
                                                                  } else {
                                                                    ctx.broadcast(constant(1.f));
                                                                  }
                                                                }),
               "Collective mismatch: the replicas called different collectives");
  // Usable after all that.
  auto r = s->run([&](ReplicaContext& ctx) { return ctx.broadcast(fill(DType::kInt32, Shape{2}, id(ctx)), 2); });
  for (const Tensor& t : r.values()) EXPECT_EQ(t, fill(DType::kInt32, Shape{2}, 2));
}

// One replica: the default replica context and OneDeviceStrategy give the
// value back (read-only); root 0 is the only root.
TEST(BroadcastTest, OneReplicaGivesTheValueBack) {
  const Tensor v = constant({1, 2, 3});
  const Tensor got = get_replica_context()->broadcast(v);
  EXPECT_EQ(got, v);
  EXPECT_TRUE(got.is_read_only());
  EXPECT_THROW(get_replica_context()->broadcast(v, 1), InvalidArgumentError);
  OneDeviceStrategy one("CPU:0");
  auto r = one.run([&](ReplicaContext& ctx) { return ctx.broadcast(v, 0); });
  EXPECT_EQ(r.values()[0], v);
  const std::string msg =
      testing::expect_throw<InvalidArgumentError>([&] { one.run([&](ReplicaContext& ctx) { ctx.broadcast(v, 1); }); });
  EXPECT_NE(msg.find("root_replica 1 is not a replica of this sync group (1 replicas: 0 to 0)"), std::string::npos)
      << msg;
}

// In the cross-replica context it is refused as the other replica-context collectives are.
TEST(BroadcastTest, OutsideAReplicaContextIsAnError) {
  auto s = testing::mirrored(2);
  std::atomic<int> refused{0};
  s->run([&](ReplicaContext& ctx) {
    ctx.merge_call([&](Strategy&) {
      const std::string msg = testing::expect_throw<FailedPreconditionError>([&] { ctx.broadcast(constant(1.f)); });
      if (msg.find("ReplicaContext::broadcast was called in a cross-replica context") != std::string::npos) ++refused;
    });
  });
  EXPECT_EQ(refused.load(), 1);  // one merge_fn runs
}

}  // namespace
}  // namespace distribute
