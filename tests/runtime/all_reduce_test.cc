// ReplicaContext::all_reduce: every dtype and op on 1, 2, 3, 4 and 7 replicas,
// counts 0 and 1, nests, packing, IndexedSlices and bit-identical results.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "comm/threads/shared_memory_communicator.h"
#include "core/storage.h"
#include "runtime/packing.h"
#include "runtime/replica_channel.h"
#include "runtime/runtime_util.h"
#include "testing/scoped_env.h"
#include "testing/shared_results.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

using N = Nest<Tensor>;

// Replica r holds x[i] = i % 4 + r + 1 (bool: (i + r) % 2 == 0).
double input_value(DType dtype, int replica, std::int64_t i) {
  return dtype == DType::kBool ? ((i + replica) % 2 == 0) : static_cast<double>(i % 4 + replica + 1);
}

Tensor input(DType dtype, int replica, std::int64_t count) {
  Tensor t(dtype, Shape{count});
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(static_cast<std::byte*>(t.mutable_raw_data()) + i * static_cast<std::int64_t>(size_of(dtype)),
                scalar(dtype, input_value(dtype, replica, i)).raw_data(), size_of(dtype));
  }
  return t;
}

// The expected value, by the documented rules, computed in double (exact here).
double expected(DType dtype, ReduceOp op, int n, std::int64_t i) {
  double acc = input_value(dtype, 0, i);
  for (int r = 1; r < n; ++r) {
    const double x = input_value(dtype, r, i);
    if (op == ReduceOp::kSum || op == ReduceOp::kMean) acc += x;
    if (op == ReduceOp::kProduct) acc *= x;
    if (op == ReduceOp::kMin) acc = std::min(acc, x);
    if (op == ReduceOp::kMax) acc = std::max(acc, x);
  }
  if (op == ReduceOp::kMean) acc = is_floating(dtype) ? acc / n : std::trunc(acc / n);
  if (dtype == DType::kBool) return acc != 0;
  return scalar(dtype, acc).element_as_double(0);  // rounds to the dtype
}

class AllReduceDTypeOpTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

void check_all_reduce(int n, DType dtype, ReduceOp op);

TEST_P(AllReduceDTypeOpTest, MatchesTheRulesOnEveryReplicaBitForBit) {
  const auto [dtype, op] = GetParam();
  for (int n : testing::kReplicaCounts) {
    SCOPED_TRACE("replicas=" + std::to_string(n));
    check_all_reduce(n, dtype, op);
  }
}

void check_all_reduce(int n, DType dtype, ReduceOp op) {
  auto s = testing::mirrored(n);
  // 65537 elements: past where the replicas share one output, for every
  // dtype (with 2 and 3 replicas: the element-wise check is slow under the
  // sanitizers).
  std::vector<std::int64_t> counts = {0, 1, 5, 1031};
  if (n == 2 || n == 3) counts.push_back(65537);
  for (std::int64_t count : counts) {
    auto r = s->run([&, count = count](ReplicaContext& ctx) {
      return ctx.all_reduce(op, input(dtype, ctx.replica_id_in_sync_group(), count));
    });
    const Tensor& first = r[0];
    ASSERT_EQ(first.dtype(), dtype);
    ASSERT_EQ(first.shape(), (Shape{count}));
    for (std::int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(first.element_as_double(i), expected(dtype, op, n, i)) << "element " << i;
    }
    // Every result is read-only; above 64 KiB the replicas share one.
    const bool shared = internal::SharedMemoryCommunicator::shares_reduce(n, first.nbytes());
    for (int k = 0; k < n; ++k) {
      const Tensor& got = r[static_cast<std::size_t>(k)];
      EXPECT_TRUE(got.is_read_only()) << "replica " << k;
      if (k == 0) continue;
      EXPECT_EQ(got, first) << "replica " << k << " differs from replica 0";
      EXPECT_EQ(got.device(), s->devices()[static_cast<std::size_t>(k)]);
      if (count > 0) {
        EXPECT_EQ(got.raw_data() == first.raw_data(), shared) << "replica " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, AllReduceDTypeOpTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllReduceOps)),
                         [](const auto& p) {
                           return std::string(to_string(std::get<0>(p.param))) + "_" +
                                  std::string(to_string(std::get<1>(p.param)));
                         });

// DISTRIBUTE_STREAM_ALL_REDUCE_BYTES as the strategy found it when made
// (changing it later changes nothing): here 1, so every all_reduce above
// 1 KiB streams, one Tensor and a packed list alike.
TEST(AllReduceTest, StreamingAsSetWhenTheStrategyWasMade) {
  const testing::ScopedEnv env("DISTRIBUTE_STREAM_ALL_REDUCE_BYTES", "1");
  auto s = testing::mirrored(3);
  env.set("0");
  auto r = s->run([&](ReplicaContext& ctx) -> std::vector<Tensor> {
    const int id = ctx.replica_id_in_sync_group();
    const auto* comm = dynamic_cast<const internal::SharedMemoryCommunicator*>(internal::Access::channel(ctx).comm);
    if (comm == nullptr || !comm->streams(2000)) throw std::runtime_error("this all_reduce would not stream");
    std::vector<Tensor> out = {ctx.all_reduce(ReduceOp::kSum, input(DType::kFloat32, id, 5003))};
    for (const Tensor& t : ctx.all_reduce(
             ReduceOp::kMax, std::vector<Tensor>{input(DType::kInt32, id, 3001), input(DType::kInt32, id, 7)})) {
      out.push_back(t);
    }
    return out;
  });
  for (int k = 0; k < 3; ++k) {
    const auto& out = r[static_cast<std::size_t>(k)];
    ASSERT_EQ(out.size(), 3u);
    for (std::int64_t i = 0; i < 5003; ++i) {
      ASSERT_EQ(out[0].element_as_double(i), expected(DType::kFloat32, ReduceOp::kSum, 3, i)) << "replica " << k;
    }
    for (std::int64_t i = 0; i < 3001; ++i) {
      ASSERT_EQ(out[1].element_as_double(i), expected(DType::kInt32, ReduceOp::kMax, 3, i)) << "replica " << k;
    }
    for (std::int64_t i = 0; i < 7; ++i) {
      ASSERT_EQ(out[2].element_as_double(i), expected(DType::kInt32, ReduceOp::kMax, 3, i)) << "replica " << k;
    }
  }
}

// The one-Tensor overload hashes its signature in place (a fast path). Its
// tag must be the nest overload's for the same one-leaf value, so replicas
// may mix the two, with any bytes_per_pack they agree on.
TEST(AllReduceTest, OneTensorOverloadAgreesWithTheOneLeafNest) {
  for (int n : {2, 3}) {
    for (std::int64_t bytes_per_pack : {std::int64_t{0}, std::int64_t{12345}}) {
      SCOPED_TRACE("replicas=" + std::to_string(n) + " bytes_per_pack=" + std::to_string(bytes_per_pack));
      auto s = testing::mirrored(n);
      auto r = s->run([&](ReplicaContext& ctx) -> Tensor {
        const int id = ctx.replica_id_in_sync_group();
        const Tensor x = input(DType::kFloat32, id, 7);
        const CommunicationOptions options{.bytes_per_pack = bytes_per_pack};
        if (id % 2 == 0) return ctx.all_reduce(ReduceOp::kMax, x, options);
        return ctx.all_reduce(ReduceOp::kMax, N(x), options).leaf();
      });
      for (int k = 0; k < n; ++k) {
        for (std::int64_t i = 0; i < 7; ++i) {
          EXPECT_EQ(r[static_cast<std::size_t>(k)].element_as_double(i),
                    expected(DType::kFloat32, ReduceOp::kMax, n, i))
              << "replica " << k << " element " << i;
        }
      }
    }
  }
}

// The list overload (no Nest built) is the same collective as the list as a
// Nest: replicas may mix the two, and a mismatch is explained alike.
TEST(AllReduceTest, ListOverloadAgreesWithTheListNest) {
  for (int n : {2, 3}) {
    SCOPED_TRACE("replicas=" + std::to_string(n));
    auto s = testing::mirrored(n);
    auto r = s->run([&](ReplicaContext& ctx) -> std::vector<Tensor> {
      const int id = ctx.replica_id_in_sync_group();
      const std::vector<Tensor> xs = {input(DType::kFloat32, id, 7), input(DType::kInt32, id, 3),
                                      input(DType::kFloat32, id, 2)};
      if (id % 2 == 0) return ctx.all_reduce(ReduceOp::kSum, xs);
      return ctx.all_reduce(ReduceOp::kSum, N::list(std::vector<N>(xs.begin(), xs.end()))).flatten();
    });
    for (int k = 0; k < n; ++k) {
      const auto& out = r[static_cast<std::size_t>(k)];
      ASSERT_EQ(out.size(), 3u);
      for (std::int64_t i = 0; i < 7; ++i) {
        EXPECT_EQ(out[0].element_as_double(i), expected(DType::kFloat32, ReduceOp::kSum, n, i)) << "replica " << k;
      }
      for (std::int64_t i = 0; i < 3; ++i) {
        EXPECT_EQ(out[1].element_as_double(i), expected(DType::kInt32, ReduceOp::kSum, n, i)) << "replica " << k;
      }
      for (std::int64_t i = 0; i < 2; ++i) {
        EXPECT_EQ(out[2].element_as_double(i), expected(DType::kFloat32, ReduceOp::kSum, n, i)) << "replica " << k;
      }
    }
  }
  EXPECT_EQ(N::list_of_leaves_structure(0), N().structure_string());
  EXPECT_EQ(N::list_of_leaves_structure(1), N::list({N(Tensor())}).structure_string());
  EXPECT_EQ(N::list_of_leaves_structure(3), N::list({N(Tensor()), N(Tensor()), N(Tensor())}).structure_string());
  // Lists of other lengths, one replica through each overload: both raise
  // the same error, which names both structures.
  auto s = testing::mirrored(2);
  auto messages = s->run([&](ReplicaContext& ctx) -> std::string {
    const int id = ctx.replica_id_in_sync_group();
    const std::vector<Tensor> xs(static_cast<std::size_t>(2 + id), input(DType::kFloat32, id, 4));
    try {
      if (id == 0) {
        ctx.all_reduce(ReduceOp::kSum, xs);
      } else {
        ctx.all_reduce(ReduceOp::kSum, N::list(std::vector<N>(xs.begin(), xs.end())));
      }
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("[*, *]"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("[*, *, *]"), std::string::npos) << messages[0];
}

TEST(AllReduceTest, IntegerMeanKeepsDtypeAndTruncatesTowardZero) {
  auto s = testing::mirrored(2);
  auto r = s->run([](ReplicaContext& ctx) {
    const bool first = ctx.replica_id_in_sync_group() == 0;
    return ctx.all_reduce(ReduceOp::kMean, first ? constant({1, -1, 127}) : constant({2, -2, 126}));
  });
  EXPECT_EQ(r[0], constant({1, -1, 126}));
  auto bytes = s->run([](ReplicaContext& ctx) {
    const std::int8_t v = ctx.replica_id_in_sync_group() == 0 ? 127 : 125;
    return ctx.all_reduce(ReduceOp::kMean, constant(std::vector<std::int8_t>{v}, Shape{1}));
  });
  EXPECT_EQ(bytes[1], constant(std::vector<std::int8_t>{126}, Shape{1}));  // no overflow in the int8 sum
}

TEST(AllReduceTest, NestedStructureKeepsStructureAndDtypes) {
  auto s = testing::mirrored(3);
  auto r = s->run([](ReplicaContext& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    N value = N::dict({{"w", N::list({constant({id, 1.f}), constant(std::vector<std::int64_t>{2}, Shape{1})})},
                       {"b", N::tuple({constant(1.0), constant(true)})}});
    return ctx.all_reduce(ReduceOp::kSum, value);
  });
  for (const auto& local : r.values()) {
    EXPECT_EQ(local.structure_string(), "{'b': (*, *), 'w': [*, *]}");
    EXPECT_EQ(local["w"][0].leaf(), constant({3.f, 3.f}));
    EXPECT_EQ(local["w"][1].leaf(), constant(std::vector<std::int64_t>{6}, Shape{1}));
    EXPECT_EQ(local["b"][0].leaf(), constant(3.0));
    EXPECT_EQ(local["b"][1].leaf(), constant(true));
  }
}

TEST(AllReduceTest, EmptyNestAndEmptyTensors) {
  auto s = testing::mirrored(2);
  auto r = s->run([](ReplicaContext& ctx) {
    auto empty_list = ctx.all_reduce(ReduceOp::kSum, std::vector<Tensor>{});
    EXPECT_TRUE(empty_list.empty());
    return ctx.all_reduce(ReduceOp::kSum, Tensor(DType::kFloat32, Shape{0, 3}));
  });
  EXPECT_EQ(r[1].shape(), (Shape{0, 3}));
}

TEST(PackingTest, GroupsByDtypeWithTensorFlowsSizeRule) {
  auto f = [](std::int64_t n) { return Tensor(DType::kFloat32, Shape{n}); };
  auto i = [](std::int64_t n) { return Tensor(DType::kInt32, Shape{n}); };
  // float32: 4, 8, 4, 12 bytes ... with bytes_per_pack 8: a pack closes once it holds more than 8 bytes.
  std::vector<Tensor> values = {f(1), i(1), f(2), f(1), i(3), f(3), f(1)};
  auto packs = internal::plan_packs(values, 8);
  ASSERT_EQ(packs.size(), 4u);
  EXPECT_EQ(packs[0].dtype, DType::kFloat32);
  EXPECT_EQ(packs[0].leaves, (std::vector<std::size_t>{0, 2}));  // 4 + 8 = 12 > 8: closed
  EXPECT_EQ(packs[1].leaves, (std::vector<std::size_t>{3, 5}));  // 4 + 12 = 16
  EXPECT_EQ(packs[2].leaves, (std::vector<std::size_t>{6}));
  EXPECT_EQ(packs[3].dtype, DType::kInt32);
  EXPECT_EQ(packs[3].leaves, (std::vector<std::size_t>{1, 4}));
  EXPECT_EQ(packs[3].count, 4u);
  auto one_per_dtype = internal::plan_packs(values, 0);
  ASSERT_EQ(one_per_dtype.size(), 2u);
  EXPECT_EQ(one_per_dtype[0].leaves.size(), 5u);
  EXPECT_TRUE(internal::plan_packs({}, 0).empty());
}

// The replicas of one process may share one result (above 64 KiB):
// writing it through any replica's tensor is a clear error, small or large,
// lone or packed; a clone is the replica's own.
TEST(AllReduceTest, ResultsAreReadOnlyAndSharedByTheReplicas) {
  auto s = testing::mirrored(3);
  std::atomic<int> refused{0};
  auto r = s->run([&](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    Tensor big = ctx.all_reduce(ReduceOp::kSum, fill(DType::kFloat32, Shape{20000}, id));
    if (testing::refuses_writes(big, "float32 (20000,)", ctx.devices()[0])) ++refused;
    Tensor mine = big.clone();
    mine.mutable_flat<float>()[0] = 100.f + static_cast<float>(id);
    const Tensor small = ctx.all_reduce(ReduceOp::kSum, fill(DType::kInt32, Shape{3}, id));
    EXPECT_TRUE(small.is_read_only());
    EXPECT_THROW(small.mutable_raw_data(), FailedPreconditionError);
    const std::vector<Tensor> packed = ctx.all_reduce(
        ReduceOp::kMax, std::vector<Tensor>{fill(DType::kInt32, Shape{17000}, id), fill(DType::kInt32, Shape{5}, id)});
    for (const Tensor& t : packed) EXPECT_TRUE(t.is_read_only());
    return std::vector<Tensor>{big, mine, packed[0]};
  });
  EXPECT_EQ(refused.load(), 3);
  for (std::size_t q = 0; q < 3; ++q) {
    EXPECT_EQ(r[q][0], fill(DType::kFloat32, Shape{20000}, 3)) << "replica " << q;  // no write or clone reached it
    EXPECT_EQ(r[q][0].raw_data(), r[0][0].raw_data());
    EXPECT_EQ(r[q][1].at<float>({0}), 100.f + static_cast<float>(q));
    EXPECT_EQ(r[q][2].raw_data(), r[0][2].raw_data());  // a pack of 68020 bytes: shared too
    EXPECT_EQ(r[q][2], fill(DType::kInt32, Shape{17000}, 2));
  }
}

// A step that lets go of its last result before the next all_reduce gets
// the same storage back every time: the output is allocated once every
// replica has arrived (and let go), from the cache all threads share.
TEST(AllReduceTest, AStepThatDropsItsLastResultTakesNoFreshStorage) {
  auto s = testing::mirrored(2);
  const auto step = [](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kSum, fill(DType::kFloat32, Shape{300000}, ctx.replica_id_in_sync_group()));
  };
  EXPECT_EQ(testing::fresh_blocks_after_the_first_step(
                *s, step, [](const Tensor& out) { EXPECT_EQ(out.at<float>({299999}), 1.f); }),
            0u);
}

TEST(AllReduceTest, OneCollectivePerPack) {
  auto s = testing::mirrored(2);
  for (auto [bytes_per_pack, want_calls] :
       std::vector<std::pair<std::int64_t, std::uint64_t>>{{0, 2}, {4096, 101}, {8192, 68}, {1 << 20, 2}}) {
    auto r = s->run([&, b = bytes_per_pack](ReplicaContext& ctx) {
      std::vector<Tensor> grads;
      for (int k = 0; k < 200; ++k) grads.push_back(fill(DType::kFloat32, Shape{1024}, k));
      grads.push_back(constant({1, 2}));  // an int32 value: its own pack
      auto out = ctx.all_reduce(ReduceOp::kMean, grads, {.bytes_per_pack = b});
      for (int k = 0; k < 200; ++k) EXPECT_EQ(out[static_cast<std::size_t>(k)], fill(DType::kFloat32, Shape{1024}, k));
      EXPECT_EQ(out[200], constant({1, 2}));
      return internal::Access::channel(ctx).data_calls;
    });
    EXPECT_EQ(r[0], want_calls) << "bytes_per_pack " << bytes_per_pack;
  }
}

TEST(AllReduceTest, IndexedSlicesConcatenateInReplicaOrder) {
  for (int n : {1, 2, 3}) {
    auto s = testing::mirrored(n);
    auto r = s->run([](ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      // replica r contributes r + 1 rows, all with index r
      std::vector<float> rows;
      std::vector<std::int64_t> idx;
      for (int k = 0; k <= id; ++k) {
        rows.insert(rows.end(), {static_cast<float>(id), static_cast<float>(k)});
        idx.push_back(id);
      }
      IndexedSlices g(constant(rows, Shape{id + 1, 2}), constant(idx, Shape{id + 1}), Shape{5, 2});
      return std::make_pair(ctx.all_reduce(ReduceOp::kSum, g), ctx.all_reduce(ReduceOp::kMean, g));
    });
    for (int k = 0; k < n; ++k) {
      const IndexedSlices& sum = r[static_cast<std::size_t>(k)].first;
      const IndexedSlices& mean = r[static_cast<std::size_t>(k)].second;
      EXPECT_EQ(sum.dense_shape(), (Shape{5, 2}));
      EXPECT_TRUE(sum.values().is_read_only());  // as every all_reduce result
      EXPECT_TRUE(sum.indices().is_read_only());
      std::vector<float> want_rows;
      std::vector<std::int64_t> want_idx;
      for (int q = 0; q < n; ++q) {
        for (int j = 0; j <= q; ++j) {
          want_rows.insert(want_rows.end(), {static_cast<float>(q), static_cast<float>(j)});
          want_idx.push_back(q);
        }
      }
      const auto rows = static_cast<std::int64_t>(want_idx.size());
      EXPECT_EQ(sum.values(), constant(want_rows, Shape{rows, 2}));
      EXPECT_EQ(sum.indices(), constant(want_idx, Shape{rows}));
      for (float& v : want_rows) v /= static_cast<float>(n);
      EXPECT_EQ(mean.values(), constant(want_rows, Shape{rows, 2}));
    }
  }
}

TEST(AllReduceTest, IndexedSlicesRejectMinAndMismatchedDenseShapes) {
  auto s = testing::mirrored(2);
  auto msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->run([](ReplicaContext& ctx) {
      IndexedSlices g(constant({{1.f}}), constant({0}), Shape{ctx.replica_id_in_sync_group() + 2, 1});
      ctx.all_reduce(ReduceOp::kSum, g);
    });
  });
  EXPECT_NE(msg.find("dense_shape"), std::string::npos) << msg;
  EXPECT_THROW(s->run([](ReplicaContext& ctx) {
    ctx.all_reduce(ReduceOp::kMin, IndexedSlices(constant({{1.f}}), constant({0}), Shape{2, 1}));
  }),
               InvalidArgumentError);
}

// A nest that holds IndexedSlices and dense tensors side by side (gradients,
// some sparse): each leaf comes back as its lone all_reduce gives it, in one
// collective; a list of sparse gradients alone too.
TEST(AllReduceTest, NestsOfIndexedSlicesAndTensorsReduceEachLeafAsAlone) {
  using Mixed = Nest<TensorOrSlices>;
  for (int n : {1, 2, 3}) {
    auto s = testing::mirrored(n);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      auto r = s->run([&](ReplicaContext& ctx) {
        const int id = ctx.replica_id_in_sync_group();
        // Ragged: replica r has r + 1 rows of the first sparse leaf, 1 of the second.
        std::vector<float> rows;
        std::vector<std::int64_t> idx;
        for (int k = 0; k <= id; ++k) {
          rows.insert(rows.end(), {static_cast<float>(id), static_cast<float>(k)});
          idx.push_back(k % 5);
        }
        const IndexedSlices embedding(constant(rows, Shape{id + 1, 2}), constant(idx, Shape{id + 1}), Shape{5, 2});
        const IndexedSlices other(fill(DType::kFloat64, Shape{1, 3}, id), constant({id}), Shape{4, 3});
        const Tensor dense = fill(DType::kFloat32, Shape{2, 2}, id + 1);
        const Tensor count = constant({id});
        const Mixed value =
            Mixed::dict({{"embedding", embedding}, {"layers", Mixed::list({dense, Mixed::tuple({other, count})})}});
        const Mixed got = ctx.all_reduce(op, value);
        // Each leaf as its own all_reduce gives it (later collectives of this run).
        const IndexedSlices want_embedding = ctx.all_reduce(op, embedding);
        const IndexedSlices want_other = ctx.all_reduce(op, other);
        const Tensor want_dense = ctx.all_reduce(op, dense);
        const Tensor want_count = ctx.all_reduce(op, count);
        EXPECT_EQ(got.structure_string(), value.structure_string());
        EXPECT_EQ(std::get<IndexedSlices>(got["embedding"].leaf()), want_embedding);
        EXPECT_EQ(std::get<Tensor>(got["layers"][0].leaf()), want_dense);
        EXPECT_EQ(std::get<IndexedSlices>(got["layers"][1][0].leaf()), want_other);
        EXPECT_EQ(std::get<Tensor>(got["layers"][1][1].leaf()), want_count);
        EXPECT_TRUE(std::get<Tensor>(got["layers"][0].leaf()).is_read_only());
        // A list of sparse gradients alone.
        const Mixed sparse_only = ctx.all_reduce(op, Mixed::list({embedding, other}));
        EXPECT_EQ(std::get<IndexedSlices>(sparse_only[0].leaf()), want_embedding);
        EXPECT_EQ(std::get<IndexedSlices>(sparse_only[1].leaf()), want_other);
        // Dense leaves only: the Nest<Tensor> collective.
        const Mixed dense_only = ctx.all_reduce(op, Mixed::list({dense, count}));
        EXPECT_EQ(std::get<Tensor>(dense_only[1].leaf()), want_count);
        return internal::Access::channel(ctx).sequence;
      });
      EXPECT_EQ(r[0], 7u) << "one collective per call";
    }
  }
}

// Mismatches of a mixed nest fail on every replica before data moves: a leaf
// that is sparse on one replica and dense on another, another dense_shape,
// and an op other than SUM and MEAN with a sparse leaf.
TEST(AllReduceTest, NestsOfIndexedSlicesMismatchOnEveryReplica) {
  using Mixed = Nest<TensorOrSlices>;
  auto s = testing::mirrored(3);
  const IndexedSlices slices(constant({{1.f, 2.f}}), constant({0}), Shape{4, 2});
  const auto expect_everywhere = [&](const std::function<Mixed(ReplicaContext&)>& make, ReduceOp op,
                                     const std::string& says) {
    std::vector<std::string> messages(3);
    EXPECT_THROW(s->run([&](ReplicaContext& ctx) {
      try {
        ctx.all_reduce(op, make(ctx));
      } catch (const InvalidArgumentError& e) {
        messages[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = e.what();
        throw;
      }
    }),
                 InvalidArgumentError);
    for (const std::string& m : messages) {
      EXPECT_EQ(m, messages[0]);
      EXPECT_NE(m.find(says), std::string::npos) << m;
    }
  };
  expect_everywhere(
      [&](ReplicaContext& ctx) {
        return ctx.replica_id_in_sync_group() == 2 ? Mixed::list({constant({{1.f, 2.f}}), slices})
                                                   : Mixed::list({slices, slices});
      },
      ReduceOp::kSum, "leaf kinds");
  expect_everywhere(
      [&](ReplicaContext& ctx) {
        return Mixed::list(
            {IndexedSlices(constant({{1.f, 2.f}}), constant({0}), Shape{4 + ctx.replica_id_in_sync_group(), 2})});
      },
      ReduceOp::kSum, "dense_shape (5, 2)");
  expect_everywhere(
      [&](ReplicaContext&) {
        return Mixed::list({slices, constant(1.f)});
      },
      ReduceOp::kMax, "supports SUM and MEAN only, not MAX");
  // Rows may differ; the rest of a sparse leaf's values may not.
  expect_everywhere(
      [&](ReplicaContext& ctx) {
        const std::int64_t width = ctx.replica_id_in_sync_group() == 1 ? 3 : 2;
        return Mixed::list({IndexedSlices(fill(DType::kFloat32, Shape{1, width}, 1), constant({0}), Shape{4, width})});
      },
      ReduceOp::kSum, "dense_shape");
}

TEST(AllReduceTest, ResultsAreTheSameRunToRun) {
  auto s = testing::mirrored(4);
  auto once = [&] {
    return s->run([](ReplicaContext& ctx) {
      Tensor x = iota(DType::kFloat32, Shape{4096}, 0.1 * (ctx.replica_id_in_sync_group() + 1), 1e-3);
      return ctx.all_reduce(ReduceOp::kMean, x);
    });
  };
  const auto a = once();
  for (int k = 0; k < 5; ++k) EXPECT_EQ(once()[3], a[0]);
}

TEST(AllReduceTest, NcclFallsBackToRingAndSaysSoOnce) {
  auto s = testing::mirrored(2);
  internal::reset_implementation_notice_for_testing();
  ::testing::internal::CaptureStderr();
  for (int k = 0; k < 3; ++k) {
    auto r = s->run([](ReplicaContext& ctx) {
      return ctx.all_reduce(ReduceOp::kSum, constant(1.f), {.implementation = CommunicationImplementation::kNccl});
    });
    EXPECT_EQ(r[0], constant(2.f));
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  const auto first = err.find("falling back to kRing");
  EXPECT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("falling back to kRing", first + 1), std::string::npos) << err;
}

}  // namespace
}  // namespace distribute
