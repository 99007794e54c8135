// Every example of the seed page (../shared/seed/replica_context_en.md), with
// its values verbatim, run on MirroredStrategy with two CPU devices.
#include <gtest/gtest.h>

#include "testing/strategies.h"

namespace distribute {
namespace {

using N = Nest<Tensor>;

class SeedExamples : public ::testing::Test {
 protected:
  std::unique_ptr<MirroredStrategy> strategy = testing::mirrored(2);
};

// strategy.run(func) where func returns replica_context.replica_id_in_sync_group.
TEST_F(SeedExamples, ReplicaIdInSyncGroup) {
  auto func = [] {
    auto* replica_context = get_replica_context();
    return constant(replica_context->replica_id_in_sync_group());
  };
  EXPECT_EQ(repr(strategy->run(func)),
            "PerReplica:{\n"
            "  0: <tf.Tensor: shape=(), dtype=int32, numpy=0>,\n"
            "  1: <tf.Tensor: shape=(), dtype=int32, numpy=1>\n"
            "}");
}

TEST_F(SeedExamples, AllGatherOneTensor) {
  auto gather_value = [] {
    auto* ctx = get_replica_context();
    auto local_value = constant({1, 2, 3});
    return ctx->all_gather(local_value, 0);
  };
  auto result = strategy->run(gather_value);
  EXPECT_EQ(repr(result),
            "PerReplica:{\n"
            "  0: <tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>,\n"
            "  1: <tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>\n"
            "}");
  EXPECT_EQ(repr_tuple(strategy->experimental_local_results(result)),
            "(<tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>,\n"
            " <tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>)");
}

TEST_F(SeedExamples, AllGatherNestList) {
  auto gather_nest = [] {
    auto* ctx = get_replica_context();
    auto value_1 = constant({1, 2, 3});
    auto value_2 = constant({{1, 2}, {3, 4}});
    return ctx->all_gather({value_1, value_2}, 0);
  };
  auto result = strategy->run(gather_nest);
  for (const auto& local : strategy->experimental_local_results(result)) {
    ASSERT_EQ(local.size(), 2u);
    EXPECT_EQ(local[0], constant({1, 2, 3, 1, 2, 3}));
    EXPECT_EQ(local[0].shape(), (Shape{6}));
    EXPECT_EQ(local[1], constant({{1, 2}, {3, 4}, {1, 2}, {3, 4}}));
    EXPECT_EQ(local[1].shape(), (Shape{4, 2}));
  }
}

// {'a': [0], 'b': [[0, 1]]} and {'a': [1], 'b': [[2, 3], [4, 5]]} gather to
// {'a': [0, 1], 'b': [[0, 1], [2, 3], [4, 5]]} (the Russian page's [1, 2] is a typo).
TEST_F(SeedExamples, AllGatherRaggedNestedDict) {
  PerReplica<N> value({N::dict({{"a", constant({0})}, {"b", constant({{0, 1}})}}),
                       N::dict({{"a", constant({1})}, {"b", constant({{2, 3}, {4, 5}})}})});
  auto result = strategy->run([](ReplicaContext& ctx, const N& v) { return ctx.all_gather(v, 0); }, value);
  for (const auto& local : strategy->experimental_local_results(result)) {
    EXPECT_EQ(local["a"].leaf().to_list_string(), "[0, 1]");
    EXPECT_EQ(local["b"].leaf().to_list_string(), "[[0, 1], [2, 3], [4, 5]]");
    EXPECT_EQ(local.structure_string(), "{'a': *, 'b': *}");
  }
}

TEST_F(SeedExamples, AllReduceSumOfOne) {
  auto step_fn = [] {
    auto* ctx = get_replica_context();
    auto value = constant(1.f);
    return ctx->all_reduce(ReduceOp::kSum, value);
  };
  EXPECT_EQ(repr_tuple(strategy->experimental_local_results(strategy->run(step_fn))),
            "(<tf.Tensor: shape=(), dtype=float32, numpy=2.0>,\n"
            " <tf.Tensor: shape=(), dtype=float32, numpy=2.0>)");
}

TEST_F(SeedExamples, AllReduceBatchedList) {
  auto step_fn = [] {
    auto* ctx = get_replica_context();
    auto value1 = constant(1.f);
    auto value2 = constant(2.f);
    return ctx->all_reduce(ReduceOp::kSum, {value1, value2});
  };
  for (const auto& local : strategy->experimental_local_results(strategy->run(step_fn))) {
    ASSERT_EQ(local.size(), 2u);
    EXPECT_EQ(local[0], constant(2.f));
    EXPECT_EQ(local[1], constant(4.f));
  }
}

// "Outside a distributed context it is equivalent to: strategy = get_strategy();
// with cross-replica-context(strategy): return merge_fn(strategy, *args)".
TEST_F(SeedExamples, MergeCallOutsideDistributedContext) {
  bool ran = false;
  auto out = get_replica_context()->merge_call(
      [&](Strategy& s, const PerReplica<Tensor>& v) {
        ran = true;
        EXPECT_EQ(&s, &get_strategy());
        EXPECT_TRUE(in_cross_replica_context());
        EXPECT_EQ(get_replica_context(), nullptr);
        EXPECT_EQ(v.size(), 1u);
        return v[0];
      },
      constant(5));
  EXPECT_TRUE(ran);
  EXPECT_EQ(out, constant(5));
}

TEST_F(SeedExamples, MergeCallInsideRunSeesPerReplicaArgs) {
  auto result = strategy->run([] {
    auto* ctx = get_replica_context();
    return ctx->merge_call(
        [](Strategy& s, const PerReplica<int>& ids) {
          EXPECT_EQ(get_replica_context(), nullptr);
          EXPECT_EQ(get_cross_replica_context(), &s);
          return ids[0] * 10 + ids[1];
        },
        ctx->replica_id_in_sync_group());
  });
  EXPECT_EQ(result.values(), (std::vector<int>{1, 1}));
}

}  // namespace
}  // namespace distribute
