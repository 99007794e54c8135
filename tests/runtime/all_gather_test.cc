// ReplicaContext::all_gather: ragged along any axis, nests, every dtype, and
// the argument errors, which every replica must report identically.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <tuple>
#include <vector>

#include "comm/threads/shared_memory_communicator.h"
#include "core/storage.h"
#include "testing/shared_results.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

using N = Nest<Tensor>;

// Replica r's value: shape with dims[axis] = r + extra, elements 12r + i (small enough for int8).
Tensor ragged_value(DType dtype, std::vector<std::int64_t> dims, int axis, int r, std::int64_t extra) {
  const int a = axis < 0 ? axis + static_cast<int>(dims.size()) : axis;
  dims[static_cast<std::size_t>(a)] = r + extra;
  return iota(dtype, Shape(dims), dtype == DType::kBool ? r % 2 : r * 12.0, dtype == DType::kBool ? 0 : 1);
}

class AllGatherAxisTest : public ::testing::TestWithParam<std::tuple<int, DType>> {};

void check_all_gather(int n, int axis, DType dtype);

TEST_P(AllGatherAxisTest, EqualsConcatOfEveryReplicasValueInOrder) {
  const auto [axis, dtype] = GetParam();
  for (int n : testing::kReplicaCounts) {
    SCOPED_TRACE("replicas=" + std::to_string(n));
    check_all_gather(n, axis, dtype);
  }
}

// Small values (one round through the inline areas), and values past the
// 4 KiB from which the replicas share one result's storage (every dtype:
// int8's 8800 bytes to float64's 70400 at dims[axis] = 1100).
void check_all_gather(int n, int axis, DType dtype) {
  auto s = testing::mirrored(n);
  for (const std::vector<std::int64_t>& dims : {std::vector<std::int64_t>{2, 3, 2}, {4, 1100, 2}}) {
    for (std::int64_t extra : {0, 1}) {
      auto r = s->run([&, extra = extra](ReplicaContext& ctx) {
        return ctx.all_gather(ragged_value(dtype, dims, axis, ctx.replica_id_in_sync_group(), extra), axis);
      });
      std::vector<Tensor> parts;
      std::size_t largest = 0;
      for (int q = 0; q < n; ++q) {
        parts.push_back(ragged_value(dtype, dims, axis, q, extra));
        largest = std::max(largest, parts.back().nbytes());
      }
      const Tensor want = concat(parts, axis);
      const bool shared = n > 1 && internal::SharedMemoryCommunicator::shares_gather(largest);
      for (int q = 0; q < n; ++q) {
        const Tensor& got = r[static_cast<std::size_t>(q)];
        EXPECT_EQ(got, want) << "replica " << q;
        EXPECT_EQ(got.device(), s->devices()[static_cast<std::size_t>(q)]);
        EXPECT_TRUE(got.is_read_only());
        EXPECT_EQ(got.raw_data() == r[0].raw_data(), q == 0 || shared) << "replica " << q << ", " << largest << " B";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, AllGatherAxisTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, -1), ::testing::ValuesIn(kAllDTypes)),
                         [](const auto& p) {
                           const int axis = std::get<0>(p.param);
                           return "axis" + (axis < 0 ? "m" + std::to_string(-axis) : std::to_string(axis)) + "_" +
                                  std::string(to_string(std::get<1>(p.param)));
                         });

TEST(AllGatherTest, ShapesFromTheSeedDocstring) {
  // Components of shape (1, 2, 3) and (1, 3, 3) gather along axis 1, not 0 or 2.
  auto s = testing::mirrored(2);
  auto value = [](int r) { return fill(DType::kFloat32, Shape{1, r == 0 ? 2 : 3, 3}, r); };
  auto ok = s->run([&](ReplicaContext& ctx) { return ctx.all_gather(value(ctx.replica_id_in_sync_group()), 1); });
  EXPECT_EQ(ok[0].shape(), (Shape{1, 5, 3}));
  for (int axis : {0, 2}) {
    auto msg = testing::expect_throw<InvalidArgumentError>(
        [&] { s->run([&](ReplicaContext& ctx) { ctx.all_gather(value(ctx.replica_id_in_sync_group()), axis); }); });
    EXPECT_NE(msg.find("Shape mismatch: Dimension 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("replica 0: (1, 2, 3); replica 1: (1, 3, 3)"), std::string::npos) << msg;
  }
}

// Each error case: every replica must throw the same type and message.
template <class E>
void expect_same_error_on_every_replica(int n, const std::function<void(ReplicaContext&)>& body,
                                        const std::string& fragment) {
  auto s = testing::mirrored(n);
  std::vector<std::string> messages(static_cast<std::size_t>(n));
  std::vector<int> caught(static_cast<std::size_t>(n), 0);
  s->run([&](ReplicaContext& ctx) {
    const auto i = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
    try {
      body(ctx);
    } catch (const E& e) {
      messages[i] = e.what();
      caught[i] = 1;
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(caught[static_cast<std::size_t>(r)], 1) << "replica " << r << " did not throw";
    EXPECT_EQ(messages[static_cast<std::size_t>(r)], messages[0]) << "replica " << r;
  }
  EXPECT_NE(messages[0].find(fragment), std::string::npos) << messages[0];
  // The strategy is usable at once.
  auto again = s->run([](ReplicaContext& ctx) { return ctx.all_gather(constant({1}), 0); });
  EXPECT_EQ(again[0].num_elements(), n);
}

// The one-Tensor overload hashes its signature in place (a fast path); the
// nest overload builds it. Replicas may mix the two: equal shapes (one
// round), ragged values (the signatures are exchanged), along a negative axis.
TEST(AllGatherTest, OneTensorOverloadAgreesWithTheOneLeafNest) {
  for (int n : {2, 3}) {
    for (bool ragged : {false, true}) {
      SCOPED_TRACE("replicas=" + std::to_string(n) + (ragged ? " ragged" : " equal shapes"));
      // Replica q's value: shape (2, 3), or (2, q + 2) when ragged.
      auto value = [ragged](int q) { return ragged_value(DType::kInt32, {2, 0}, -1, ragged ? q : 1, 2); };
      auto s = testing::mirrored(n);
      auto r = s->run([&](ReplicaContext& ctx) -> Tensor {
        const int id = ctx.replica_id_in_sync_group();
        if (id % 2 == 0) return ctx.all_gather(value(id), -1);
        return ctx.all_gather(N(value(id)), -1).leaf();
      });
      std::vector<Tensor> parts;
      for (int q = 0; q < n; ++q) parts.push_back(value(q));
      const Tensor want = concat(parts, -1);
      for (int k = 0; k < n; ++k) EXPECT_EQ(r[static_cast<std::size_t>(k)], want) << "replica " << k;
    }
  }
}

TEST(AllGatherErrorsTest, RankZeroOnOneReplicaMixingOverloads) {
  expect_same_error_on_every_replica<InvalidArgumentError>(
      3,
      [](ReplicaContext& ctx) {
        const int id = ctx.replica_id_in_sync_group();
        const Tensor x = id == 1 ? constant(1) : constant({1});
        if (id == 2) {
          ctx.all_gather(N(x), 0);
        } else {
          ctx.all_gather(x, 0);
        }
      },
      "all_gather #1 on replica 1: all_gather needs a value of rank >= 1");
}

TEST(AllGatherErrorsTest, RankZeroOnOneReplica) {
  expect_same_error_on_every_replica<InvalidArgumentError>(
      3,
      [](ReplicaContext& ctx) { ctx.all_gather(ctx.replica_id_in_sync_group() == 1 ? constant(1) : constant({1}), 0); },
      "all_gather #1 on replica 1: all_gather needs a value of rank >= 1");
}

TEST(AllGatherErrorsTest, AxisOutOfRange) {
  expect_same_error_on_every_replica<InvalidArgumentError>(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_gather(constant({{1, 2}}), 2);
      },
      "axis 2 is out of range for a value of shape (1, 2)");
  expect_same_error_on_every_replica<InvalidArgumentError>(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_gather(constant({{1, 2}}), -3);
      },
      "axis -3 is out of range");
}

TEST(AllGatherErrorsTest, MismatchedRankDtypeAndDims) {
  expect_same_error_on_every_replica<InvalidArgumentError>(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_gather(ctx.replica_id_in_sync_group() == 0 ? constant({1}) : constant({{1}}), 0);
      },
      "Ranks of all input tensors should match");
  expect_same_error_on_every_replica<InvalidArgumentError>(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_gather(ctx.replica_id_in_sync_group() == 0 ? constant({1}) : constant({1.f}), 0);
      },
      "has different dtypes on different replicas (replica 0: int32; replica 1: float32)");
  expect_same_error_on_every_replica<InvalidArgumentError>(
      2,
      [](ReplicaContext& ctx) {
        N v = N::dict(
            {{"a", constant({1})},
             {"b", N::list({constant({{1, 2}}),
                            ctx.replica_id_in_sync_group() == 0 ? constant({{1, 2}}) : constant({{1, 2, 3}})})}});
        ctx.all_gather(v, 0);
      },
      "Dimension 1 of value ['b'][1] must be equal on every replica");
}

TEST(AllGatherErrorsTest, DifferentStructuresOrAxes) {
  expect_same_error_on_every_replica<InvalidArgumentError>(
      2,
      [](ReplicaContext& ctx) {
        if (ctx.replica_id_in_sync_group() == 0) {
          ctx.all_gather(N::list({constant({1}), constant({2})}), 0);
        } else {
          ctx.all_gather(N::list({constant({1})}), 0);
        }
      },
      "different structure");
  expect_same_error_on_every_replica<InvalidArgumentError>(
      2, [](ReplicaContext& ctx) { ctx.all_gather(constant({{1}}), ctx.replica_id_in_sync_group()); },
      "different axis");
}

TEST(AllGatherErrorsTest, IndexedSlicesAreRejectedAsTensorFlowDoes) {
  expect_same_error_on_every_replica<UnimplementedError>(
      2,
      [](ReplicaContext& ctx) {
        ctx.all_gather(IndexedSlices(constant({{1.f}}), constant({0}), Shape{1, 1}), 0);
      },
      "all_gather does not support IndexedSlices");
}

TEST(AllGatherTest, NegativeAxisIsPerValueInANestOfDifferentRanks) {
  auto s = testing::mirrored(2);
  auto r = s->run([](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    // axis -1 is dimension 0 of the vector and dimension 1 of the matrix
    return ctx.all_gather({fill(DType::kInt32, Shape{id + 1}, id), fill(DType::kInt32, Shape{2, id + 1}, id)}, -1);
  });
  EXPECT_EQ(r[0][0], constant({0, 1, 1}));
  EXPECT_EQ(r[1][1], constant({{0, 1, 1}, {0, 1, 1}}));
}

TEST(AllGatherTest, NestOfManyValuesAndEmptyParts) {
  auto s = testing::mirrored(3);
  auto r = s->run([](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    std::vector<Tensor> values;
    for (int k = 0; k < 20; ++k) values.push_back(fill(DType::kInt64, Shape{id, 2}, k));  // replica 0 has 0 rows
    return ctx.all_gather(values, 0);
  });
  for (const auto& local : r.values()) {
    ASSERT_EQ(local.size(), 20u);
    EXPECT_EQ(local[7], fill(DType::kInt64, Shape{3, 2}, 7));
  }
}

// The replicas of one process share one result: writing it through any
// replica's tensor is a clear error (it would change, and race with, the
// others'); a clone is the replica's own. Nested results are read-only too.
TEST(AllGatherTest, ResultsAreReadOnlyAndSharedByTheReplicas) {
  auto s = testing::mirrored(3);
  std::atomic<int> refused{0};
  auto r = s->run([&](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    Tensor big = ctx.all_gather(fill(DType::kFloat32, Shape{2000}, id), 0);
    if (testing::refuses_writes(big, "float32 (6000,)", ctx.devices()[0])) ++refused;
    Tensor mine = big.clone();
    mine.mutable_flat<float>()[0] = 100.f + static_cast<float>(id);
    Nest<Tensor> nest = ctx.all_gather(N::list({N(fill(DType::kInt32, Shape{3}, id)), N(mine)}), 0);
    for (const Tensor& leaf : nest.flatten()) EXPECT_TRUE(leaf.is_read_only());
    return N::list({N(big), nest});
  });
  EXPECT_EQ(refused.load(), 3);
  const Tensor want =
      concat(std::vector<Tensor>{fill(DType::kFloat32, Shape{2000}, 0), fill(DType::kFloat32, Shape{2000}, 1),
                                 fill(DType::kFloat32, Shape{2000}, 2)},
             0);
  for (std::size_t q = 0; q < 3; ++q) {
    const Tensor& big = r[q][0].leaf();
    EXPECT_EQ(big, want) << "replica " << q;  // no replica's write or clone reached it
    EXPECT_EQ(big.raw_data(), r[0][0].leaf().raw_data());
    const Tensor& clones = r[q][1][1].leaf();
    for (int p = 0; p < 3; ++p) EXPECT_EQ(clones.at<float>({p * 6000}), 100.f + static_cast<float>(p));
  }
}

// Ragged values on either side of the sharing threshold and of the small
// paths (8 bytes, 2000, 12000): the first round, where each replica assumes
// the others' shapes are its own, takes different paths on different
// replicas (a small round, the inline areas, the shared output), which must
// end in the same mismatch everywhere; the second round gathers into one
// shared output.
TEST(AllGatherTest, RaggedValuesAcrossTheSharingThreshold) {
  const std::vector<std::int64_t> lengths = {3000, 2, 500};
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " replicas");
    auto s = testing::mirrored(n);
    auto r = s->run([&](ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      return ctx.all_gather(iota(DType::kFloat32, Shape{lengths[static_cast<std::size_t>(id)]}, id * 10000.0), 0);
    });
    std::vector<Tensor> parts;
    for (int q = 0; q < n; ++q)
      parts.push_back(iota(DType::kFloat32, Shape{lengths[static_cast<std::size_t>(q)]}, q * 10000.0));
    const Tensor want = concat(parts, 0);
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(r[static_cast<std::size_t>(q)], want) << "replica " << q;
      EXPECT_EQ(r[static_cast<std::size_t>(q)].raw_data(), r[0].raw_data()) << "replica " << q;
    }
  }
}

// A step that lets go of its last result before the next all_gather gets
// the same storage back every time: the output is allocated once every
// replica has arrived (and let go), from the cache all threads share.
TEST(AllGatherTest, AStepThatDropsItsLastResultTakesNoFreshStorage) {
  auto s = testing::mirrored(2);
  const auto step = [](ReplicaContext& ctx) {
    return ctx.all_gather(fill(DType::kFloat32, Shape{300000}, ctx.replica_id_in_sync_group()), 0);
  };
  EXPECT_EQ(testing::fresh_blocks_after_the_first_step(
                *s, step, [](const Tensor& out) { EXPECT_EQ(out.at<float>({300000}), 1.f); }),
            0u);
}

// An empty value with very many rows before the axis, shape (2^62, 0):
// nothing moves, and nothing loops over its rows (every layer used to copy
// each row's zero bytes, 2^62 times).
TEST(AllGatherTest, EmptyValueWithVeryManyRowsReturnsAtOnce) {
  const std::int64_t rows = std::int64_t{1} << 62;
  const Tensor empty = fill(DType::kFloat32, Shape{rows, 0}, 0);
  auto s = testing::mirrored(3);
  auto r = s->run([&](ReplicaContext& ctx) {
    Tensor one = ctx.all_gather(empty, 1);
    Nest<Tensor> nest = ctx.all_gather(N::list({N(empty), N(fill(DType::kInt32, Shape{0, rows, 0}, 0))}), -1);
    return N::list({N(one), nest});
  });
  for (const auto& local : r.values()) {
    EXPECT_EQ(local[0].leaf().shape(), (Shape{rows, 0}));
    EXPECT_EQ(local[1][0].leaf().shape(), (Shape{rows, 0}));
    EXPECT_EQ(local[1][1].leaf().shape(), (Shape{0, rows, 0}));
  }
  EXPECT_EQ(s->gather(PerReplica<Tensor>({empty, empty, empty}), 1).shape(), (Shape{rows, 0}));
  EXPECT_EQ(concat({empty, empty}, 1).shape(), (Shape{rows, 0}));
  EXPECT_EQ(empty.to_list_string(), "[[], [], [], ..., [], [], []]");
  EXPECT_EQ(fill(DType::kFloat32, Shape{2, 0}, 0).to_list_string(), "[[], []]");
}

// Ragged values whose total along the axis fits, though one replica's own
// size taken once per replica does not (the fast path's layout): every
// replica gathers. Past the limit in total, every replica raises the same
// error (none raises alone while the others wait), and the strategy goes on.
TEST(AllGatherTest, SizesNearTheLimitDecideOnEveryReplicaAlike) {
  const std::int64_t huge = std::int64_t{1} << 62;
  for (const int n : {2, 3}) {
    auto s = testing::mirrored(n);
    // n = 2: 2^62 + 1 fits; n = 3: 2^62 + 2^62 + 1 does not.
    auto along = [&](int r) { return r + 1 < n ? huge : 1; };
    auto r = s->run([&](ReplicaContext& ctx) {
      const Tensor mine = fill(DType::kFloat32, Shape{0, along(ctx.replica_id_in_sync_group())}, 0);
      std::vector<std::string> seen;
      for (const bool nest : {false, true}) {
        try {
          const Tensor out = nest ? ctx.all_gather(N::list({N(mine)}), 1)[0].leaf() : ctx.all_gather(mine, 1);
          seen.push_back(out.shape().to_string());
        } catch (const InvalidArgumentError& e) {
          seen.push_back(e.what());
        }
      }
      return seen;
    });
    const std::string want =
        n == 2 ? Shape{0, huge + 1}.to_string() : "all_gather: the sizes along axis 1 add up to more than 2^63 - 1";
    for (const auto& seen : r.values()) {
      for (const std::string& got : seen) EXPECT_NE(got.find(want), std::string::npos) << n << " replicas: " << got;
    }
    EXPECT_EQ(s->run([](ReplicaContext& ctx) { return ctx.all_gather(constant({1.f}), 0); }).values()[0],
              fill(DType::kFloat32, Shape{n}, 1));
  }
}

}  // namespace
}  // namespace distribute
