// Randomized differential tests: random replica counts (1 to 8), nests,
// dtypes, shapes, axes, ops and pack sizes, each collective compared with the
// reference model (testing/reference_model.h) bit for bit: the arithmetic is
// documented to the bit (replica order, accumulation types), so no tolerance
// is needed. Seeded and reproducible: a failure prints its seed;
// DISTRIBUTE_TEST_SEED=<seed> DISTRIBUTE_RANDOMIZED_CASES=1 reruns that case.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "testing/reference_model.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

using testing::bitwise_equal;
using testing::random_tensor;
using testing::reference_gather;
using testing::reference_reduce;

// 1000 cases a test (150 under the sanitizers, which run 5 to 15x slower).
std::vector<std::uint64_t> seeds(std::uint64_t salt) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return testing::test_seeds(20261130 + salt * 100000, 150);
#else
  return testing::test_seeds(20261130 + salt * 100000, 1000);
#endif
}

std::string rerun(std::uint64_t seed) { return testing::rerun_hint(seed); }

using testing::random_case;
using testing::RandomCase;
using testing::uniform;

TEST(RandomizedTest, AllReduceOfRandomNestsMatchesTheReference) {
  for (std::uint64_t seed : seeds(1)) {
    SCOPED_TRACE(rerun(seed));
    std::mt19937_64 gen(seed);
    const int n = uniform(gen, 1, 8);
    const RandomCase c = random_case(gen, n, /*ragged=*/false);
    auto s = testing::mirrored(n);
    auto results = s->run([&](ReplicaContext& ctx) {
      return ctx.all_reduce(c.op, c.value_of(ctx.replica_id_in_sync_group()), {.bytes_per_pack = c.bytes_per_pack});
    });
    for (std::size_t i = 0; i < c.leaves(); ++i) {
      const Tensor want = reference_reduce(c.op, c.column(i));
      for (int r = 0; r < n; ++r) {
        const Tensor got = results.values()[static_cast<std::size_t>(r)].flatten()[i];
        ASSERT_TRUE(bitwise_equal(got, want))
            << "replica " << r << " of " << n << ", leaf " << i << ", " << to_string(c.op) << ", bytes_per_pack "
            << c.bytes_per_pack << ": got " << got.repr() << ", want " << want.repr();
      }
    }
  }
}

TEST(RandomizedTest, RaggedAllGatherOfRandomNestsMatchesTheReference) {
  for (std::uint64_t seed : seeds(2)) {
    SCOPED_TRACE(rerun(seed));
    std::mt19937_64 gen(seed);
    const int n = uniform(gen, 1, 8);
    const RandomCase c = random_case(gen, n, /*ragged=*/true);
    auto s = testing::mirrored(n);
    auto results =
        s->run([&](ReplicaContext& ctx) { return ctx.all_gather(c.value_of(ctx.replica_id_in_sync_group()), c.axis); });
    for (std::size_t i = 0; i < c.leaves(); ++i) {
      const Tensor want = reference_gather(c.column(i), c.normalized);
      for (int r = 0; r < n; ++r) {
        const Tensor got = results.values()[static_cast<std::size_t>(r)].flatten()[i];
        ASSERT_TRUE(bitwise_equal(got, want)) << "replica " << r << " of " << n << ", leaf " << i << ", axis " << c.axis
                                              << ": got " << got.repr() << ", want " << want.repr();
      }
    }
  }
}

// broadcast (packed per dtype by bytes_per_pack): every replica gets the
// root's leaves, bit for bit.
TEST(RandomizedTest, BroadcastOfRandomNestsGivesEveryReplicaTheRoots) {
  for (std::uint64_t seed : seeds(5)) {
    SCOPED_TRACE(rerun(seed));
    std::mt19937_64 gen(seed);
    const int n = uniform(gen, 1, 8);
    const RandomCase c = random_case(gen, n, /*ragged=*/false);
    const int root = uniform(gen, 0, n - 1);
    auto s = testing::mirrored(n);
    auto results = s->run([&](ReplicaContext& ctx) {
      return ctx.broadcast(c.value_of(ctx.replica_id_in_sync_group()), root, {.bytes_per_pack = c.bytes_per_pack});
    });
    for (std::size_t i = 0; i < c.leaves(); ++i) {
      const Tensor want = c.column(i)[static_cast<std::size_t>(root)];
      for (int r = 0; r < n; ++r) {
        const Tensor got = results.values()[static_cast<std::size_t>(r)].flatten()[i];
        ASSERT_TRUE(bitwise_equal(got, want))
            << "replica " << r << " of " << n << ", root " << root << ", leaf " << i << ", bytes_per_pack "
            << c.bytes_per_pack << ": got " << got.repr() << ", want " << want.repr();
      }
    }
  }
}

TEST(RandomizedTest, StrategyReduceAndGatherMatchTheReference) {
  for (std::uint64_t seed : seeds(3)) {
    SCOPED_TRACE(rerun(seed));
    std::mt19937_64 gen(seed);
    const int n = uniform(gen, 1, 8);
    const DType dtype = kAllDTypes[gen() % std::size(kAllDTypes)];
    std::vector<std::int64_t> dims(static_cast<std::size_t>(uniform(gen, 1, 3)));
    for (auto& d : dims) d = uniform(gen, 0, 5);
    const Shape shape(dims);
    const ReduceOp op = kAllReduceOps[gen() % std::size(kAllReduceOps)];
    std::vector<Tensor> values;
    for (int r = 0; r < n; ++r) values.push_back(random_tensor(gen, dtype, shape));
    auto s = testing::mirrored(n);
    const PerReplica<Tensor> per(values);
    const Tensor reduced = s->reduce(op, per, std::nullopt);
    ASSERT_TRUE(bitwise_equal(reduced, reference_reduce(op, values)))
        << to_string(dtype) << shape << " " << to_string(op) << ": got " << reduced.repr();
    // batch_reduce_to packs several values: each must still be its own reduction.
    auto batch = s->extended().batch_reduce_to(op, {{per, "CPU:0"}, {per, "CPU:0"}}, {.bytes_per_pack = 1});
    ASSERT_TRUE(bitwise_equal(batch[1][0], reference_reduce(op, values)));
    const int axis = uniform(gen, 0, shape.rank() - 1);
    const Tensor gathered = s->gather(per, axis);
    ASSERT_TRUE(bitwise_equal(gathered, reference_gather(values, axis))) << "axis " << axis;
  }
}

// merge_call regroups every replica's arguments in replica order and hands
// each replica its own component of a PerReplica result.
TEST(RandomizedTest, MergeCallRegroupsInReplicaOrder) {
  for (std::uint64_t seed : seeds(4)) {
    SCOPED_TRACE(rerun(seed));
    std::mt19937_64 gen(seed);
    const int n = uniform(gen, 1, 8);
    std::vector<std::int64_t> offered(static_cast<std::size_t>(n));
    for (auto& v : offered) v = static_cast<std::int64_t>(gen() % 1000);
    auto s = testing::mirrored(n);
    auto got = s->run([&](ReplicaContext& ctx) {
      const std::int64_t mine = offered[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
      return ctx.merge_call(
          [&](Strategy&, const PerReplica<std::int64_t>& all, const PerReplica<int>& ids) {
            std::vector<std::int64_t> back;
            for (std::size_t r = 0; r < all.size(); ++r) {
              EXPECT_EQ(ids.values()[r], static_cast<int>(r));
              back.push_back(all.values()[r] * 2 + static_cast<std::int64_t>(r));
            }
            return std::make_pair(PerReplica<std::int64_t>(back), static_cast<std::int64_t>(all.size()));
          },
          mine, ctx.replica_id_in_sync_group());
    });
    for (int r = 0; r < n; ++r) {
      const auto& [own, shared] = got.values()[static_cast<std::size_t>(r)];
      ASSERT_EQ(own, offered[static_cast<std::size_t>(r)] * 2 + r) << "replica " << r << " of " << n;
      ASSERT_EQ(shared, n);
    }
  }
}

}  // namespace
}  // namespace distribute
