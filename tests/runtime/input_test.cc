// Distributed input: value functions, contexts, and datasets split across
// replicas, including uneven last batches.
#include <distribute/distribute.h>
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "testing/strategies.h"

namespace distribute {
namespace {

using testing::expect_throw;
using testing::mirrored;

// Batches of `sizes[k]` rows: features (rows, 2) holding 2 * row + column
// counted from `first row`, labels (rows,) holding the row number.
BatchFn batches_of(std::vector<std::int64_t> sizes) {
  auto next = std::make_shared<std::size_t>(0);
  auto row = std::make_shared<std::int64_t>(0);
  return [=]() -> std::optional<Nest<Tensor>> {
    if (*next >= sizes.size()) return std::nullopt;
    const std::int64_t rows = sizes[(*next)++];
    const auto first = static_cast<double>(*row);
    *row += rows;
    return Nest<Tensor>::tuple(
        {iota(DType::kFloat32, Shape{rows, 2}, 2 * first), iota(DType::kInt32, Shape{rows}, first)});
  };
}

std::vector<int> labels(const Nest<Tensor>& batch) {
  auto f = batch[1].leaf().flat<int>();
  return {f.begin(), f.end()};
}

TEST(ContextsTest, ValueAndInputContextsFollowTensorFlow) {
  EXPECT_EQ(ValueContext(1, 2).to_string(), "tf.distribute.ValueContext(replica id 1,  total replicas in sync: 2)");
  const InputContext ctx(2, 1, 4);
  EXPECT_EQ(ctx.to_string(), "tf.distribute.InputContext(input pipeline id 1, total: 2)");
  EXPECT_EQ(ctx.get_per_replica_batch_size(64), 16);
  EXPECT_EQ(expect_throw<InvalidArgumentError>([&] { ctx.get_per_replica_batch_size(10); }),
            "The `global_batch_size` 10 is not divisible by `num_replicas_in_sync` 4 ");
  EXPECT_THROW(InputContext(2, 2, 4), InvalidArgumentError);
  EXPECT_THROW(InputContext(0, 0, 4), InvalidArgumentError);
  const InputContext defaults;
  EXPECT_EQ(defaults.num_input_pipelines() + defaults.input_pipeline_id() + defaults.num_replicas_in_sync(), 2);
}

TEST(ValuesFromFunctionTest, OneValuePerReplicaOnItsDevice) {
  auto s = mirrored(3);
  auto values = s->experimental_distribute_values_from_function([](const ValueContext& ctx) {
    return fill(DType::kInt32, Shape{2}, ctx.replica_id_in_sync_group() * 10 + ctx.num_replicas_in_sync());
  });
  ASSERT_EQ(values.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(values[i], fill(DType::kInt32, Shape{2}, static_cast<double>(i) * 10 + 3));
    EXPECT_EQ(values[i].device(), s->devices()[i]);
  }
  // The result feeds run like any PerReplica.
  auto doubled = s->run([](const Tensor& t) { return t.flat<int>()[0] * 2; }, values);
  EXPECT_EQ(doubled.values(), (std::vector<int>{6, 26, 46}));
}

TEST(DistributeDatasetTest, SplitsEachGlobalBatchAsTensorFlowRebatches) {
  auto s = mirrored(4);
  // Global batch 10 over 4 replicas: 3, 3, 2, 2 rows. The last batch (5 rows)
  // fills the replicas in order: 3, 2, 0, 0.
  DistributedDataset dataset = s->experimental_distribute_dataset(batches_of({10, 10, 5}), 10);
  std::vector<std::vector<std::vector<int>>> steps;
  for (const PerReplica<Nest<Tensor>>& step : dataset) {
    std::vector<std::vector<int>> per;
    for (std::size_t i = 0; i < step.size(); ++i) {
      per.push_back(labels(step[i]));
      EXPECT_EQ(step[i][0].leaf().device(), s->devices()[i]);
      EXPECT_EQ(step[i][0].leaf().shape()[1], 2);
      if (!per.back().empty()) {
        EXPECT_EQ(step[i][0].leaf().flat<float>()[0], 2.f * static_cast<float>(per.back()[0]));
      }
    }
    steps.push_back(per);
  }
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0], (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}, {6, 7}, {8, 9}}));
  EXPECT_EQ(steps[1][3], (std::vector<int>{18, 19}));
  EXPECT_EQ(steps[2], (std::vector<std::vector<int>>{{20, 21, 22}, {23, 24}, {}, {}}));
  EXPECT_FALSE(dataset.get_next());  // stays exhausted
}

TEST(DistributeDatasetTest, ReplicasGetViewsOfTheGlobalBatchNotCopies) {
  auto s = mirrored(2);
  const Tensor global = iota(DType::kFloat32, Shape{4, 3});
  bool given = false;
  DistributedDataset dataset = s->experimental_distribute_dataset(
      [&]() -> std::optional<Nest<Tensor>> {
        if (given) return std::nullopt;
        given = true;
        return Nest<Tensor>(global);
      },
      4);
  auto step = dataset.get_next();
  ASSERT_TRUE(step);
  EXPECT_EQ((*step)[1].leaf().raw_data(), static_cast<const float*>(global.raw_data()) + 6);
  EXPECT_EQ((*step)[1].leaf(), iota(DType::kFloat32, Shape{2, 3}, 6));
}

// Once the function has said there is nothing left, it is not called again
// (a reader that restarts, or throws, past its end).
TEST(DistributeDatasetTest, StaysExhaustedWithoutCallingTheFunctionAgain) {
  auto s = mirrored(2);
  auto calls = std::make_shared<int>(0);
  DistributedDataset dataset = s->experimental_distribute_dataset(
      [calls]() -> std::optional<Nest<Tensor>> {
        ++*calls;
        if (*calls == 2) return std::nullopt;  // after its end it would start again
        return Nest<Tensor>(constant({1.f, 2.f}));
      },
      2);
  EXPECT_TRUE(dataset.get_next());
  EXPECT_FALSE(dataset.get_next());
  EXPECT_FALSE(dataset.get_next());
  EXPECT_EQ(*calls, 2);
}

// A dataset used after its strategy is destroyed says so; it reads no freed
// memory (under ASan, a use of the strategy would be reported).
TEST(DistributeDatasetTest, ADatasetThatOutlivesItsStrategyRaisesFailedPrecondition) {
  auto s = mirrored(2);
  auto one = []() -> std::optional<Nest<Tensor>> { return Nest<Tensor>(constant({1.f, 2.f})); };
  DistributedDataset rebatched = s->experimental_distribute_dataset(one, 2);
  DistributedDataset pipelined =
      s->distribute_datasets_from_function([&](const InputContext&) { return BatchFn(one); });
  EXPECT_TRUE(rebatched.get_next());
  s.reset();
  const std::string msg = expect_throw<FailedPreconditionError>([&] { rebatched.get_next(); });
  EXPECT_NE(msg.find("the distributed dataset of experimental_distribute_dataset was used after its strategy, "
                     "MirroredStrategy(2 replicas"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("was destroyed"), std::string::npos) << msg;
  EXPECT_THROW(pipelined.get_next(), FailedPreconditionError);
}

// An error the dataset's function raises reaches the caller as it was
// raised (its own type), in both kinds of dataset.
struct EndOfShard : OutOfRangeError {
  EndOfShard() : OutOfRangeError("end of shard") {}
};

TEST(DistributeDatasetTest, TheFunctionsOwnErrorKeepsItsType) {
  auto s = mirrored(2);
  auto raises = []() -> std::optional<Nest<Tensor>> { throw EndOfShard(); };
  EXPECT_THROW(s->experimental_distribute_dataset(raises, 2).get_next(), EndOfShard);
  EXPECT_THROW(s->distribute_datasets_from_function([&](const InputContext&) { return BatchFn(raises); }).get_next(),
               EndOfShard);
  auto other = []() -> std::optional<Nest<Tensor>> { throw std::runtime_error("disk gone"); };
  EXPECT_THROW(s->experimental_distribute_dataset(other, 2).get_next(), std::runtime_error);
}

TEST(DistributeDatasetTest, BadBatchesAreClearErrors) {
  auto s = mirrored(2);
  EXPECT_NE(expect_throw<InvalidArgumentError>([&] {
              s->experimental_distribute_dataset(batches_of({4}), 3).get_next();
            }).find("a batch has 4 rows, more than the global batch size 3"),
            std::string::npos);
  EXPECT_THROW(s->experimental_distribute_dataset(batches_of({4}), 0), InvalidArgumentError);
  auto ragged = [] {
    return std::optional<Nest<Tensor>>(
        Nest<Tensor>::list({Tensor(DType::kFloat32, Shape{2}), Tensor(DType::kFloat32, Shape{3})}));
  };
  EXPECT_NE(expect_throw<InvalidArgumentError>([&] {
              s->experimental_distribute_dataset(ragged, 4).get_next();
            }).find("different batch sizes ([0]: 2, [1]: 3)"),
            std::string::npos);
  auto scalar = [] { return std::optional<Nest<Tensor>>(Nest<Tensor>(constant(1.f))); };
  EXPECT_NE(expect_throw<InvalidArgumentError>([&] {
              s->experimental_distribute_dataset(scalar, 4).get_next();
            }).find("is a scalar"),
            std::string::npos);
  DistributedDataset dataset = s->experimental_distribute_dataset(batches_of({2}), 2);
  EXPECT_THROW(s->run([&] { dataset.get_next(); }), FailedPreconditionError);
}

TEST(DatasetsFromFunctionTest, EachReplicaTakesTheNextBatchOfItsPipeline) {
  auto s = mirrored(3);
  std::optional<InputContext> seen;
  DistributedDataset dataset = s->distribute_datasets_from_function([&](const InputContext& ctx) {
    seen = ctx;
    return batches_of({2, 2, 2, 2, 1});  // per-replica batches
  });
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->num_input_pipelines(), 1);
  EXPECT_EQ(seen->input_pipeline_id(), 0);
  EXPECT_EQ(seen->num_replicas_in_sync(), 3);
  auto first = dataset.get_next();
  ASSERT_TRUE(first);
  EXPECT_EQ(labels((*first)[2]), (std::vector<int>{4, 5}));
  // Second step: replicas 0 and 1 get the last two batches; replica 2 an empty one.
  auto second = dataset.get_next();
  ASSERT_TRUE(second);
  EXPECT_EQ(labels((*second)[0]), (std::vector<int>{6, 7}));
  EXPECT_EQ(labels((*second)[1]), (std::vector<int>{8}));
  EXPECT_EQ((*second)[2][0].leaf().shape(), Shape({0, 2}));
  EXPECT_FALSE(dataset.get_next());
}

// Every label of one pass (range-for), step after step.
std::vector<int> one_pass(DistributedDataset& dataset) {
  std::vector<int> seen;
  for (const PerReplica<Nest<Tensor>>& step : dataset) {
    for (const Nest<Tensor>& mine : step.values()) {
      auto l = labels(mine);
      seen.insert(seen.end(), l.begin(), l.end());
    }
  }
  return seen;
}

// A DatasetFn is iterated once per epoch, as a tf.data.Dataset: each
// range-for starts a new pass from the first batch.
TEST(DistributeDatasetTest, ADatasetFnStartsANewPassForEveryEpoch) {
  auto s = mirrored(2);
  int passes = 0;
  DistributedDataset dataset = s->experimental_distribute_dataset(DatasetFn([&] {
                                                                    ++passes;
                                                                    return batches_of({4, 4, 2});
                                                                  }),
                                                                  4);
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(one_pass(dataset), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "epoch " << epoch;
  }
  EXPECT_EQ(passes, 3);
  // A pass left early starts again from the first batch too.
  ASSERT_TRUE(dataset.begin() != dataset.end());
  EXPECT_EQ(one_pass(dataset), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

// A one-shot BatchFn is not silently empty in its second epoch: the second
// pass after it was exhausted is refused, naming what to pass instead.
TEST(DistributeDatasetTest, AnExhaustedBatchFnRefusesASecondPass) {
  auto s = mirrored(2);
  DistributedDataset dataset = s->experimental_distribute_dataset(batches_of({4, 2}), 4);
  EXPECT_EQ(one_pass(dataset), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  const std::string message = expect_throw<FailedPreconditionError>([&] { one_pass(dataset); });
  EXPECT_NE(message.find("experimental_distribute_dataset"), std::string::npos) << message;
  EXPECT_NE(message.find("DatasetFn"), std::string::npos) << message;
  EXPECT_FALSE(dataset.get_next());  // get_next still says the end, as before
}

// A BatchFn left before its end goes on where it stopped in the next loop.
TEST(DistributeDatasetTest, ABatchFnLeftEarlyContinuesWhereItStopped) {
  auto s = mirrored(2);
  DistributedDataset dataset = s->experimental_distribute_dataset(batches_of({2, 2, 2}), 2);
  for (const auto& step : dataset) {
    EXPECT_EQ(labels(step.values()[0]), (std::vector<int>{0}));
    break;
  }
  EXPECT_EQ(one_pass(dataset), (std::vector<int>{2, 3, 4, 5}));
}

// distribute_datasets_from_function: each later pass calls dataset_fn again.
TEST(DatasetsFromFunctionTest, EveryPassCallsTheDatasetFunctionAgain) {
  auto s = mirrored(2);
  int calls = 0;
  DistributedDataset dataset = s->distribute_datasets_from_function([&](const InputContext&) {
    ++calls;
    return batches_of({2, 2, 1});
  });
  EXPECT_EQ(calls, 1);
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(one_pass(dataset), (std::vector<int>{0, 1, 2, 3, 4})) << "epoch " << epoch;
  }
  EXPECT_EQ(calls, 3);  // the first pass used the function made at creation
}

// A dataset whose strategy is gone refuses a new pass as it refuses get_next.
TEST(DistributeDatasetTest, ANewPassAfterTheStrategyIsGoneRaisesFailedPrecondition) {
  auto s = mirrored(2);
  DistributedDataset dataset = s->experimental_distribute_dataset(DatasetFn([] { return batches_of({2}); }), 2);
  EXPECT_EQ(one_pass(dataset), (std::vector<int>{0, 1}));
  s.reset();
  EXPECT_THROW(dataset.begin(), FailedPreconditionError);
}

}  // namespace
}  // namespace distribute
