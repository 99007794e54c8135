// Strategy construction, run, reduce, gather, local results and extended().
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "testing/shared_results.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

TEST(DeviceNameTest, AcceptsTensorFlowSpellings) {
  const std::string want = "/job:localhost/replica:0/task:0/device:CPU:2";
  for (const char* name : {"CPU:2", "cpu:2", "/cpu:2", "/CPU:2", "/device:CPU:2", "device:cpu:2",
                           "/job:localhost/replica:0/task:0/device:CPU:2", "/job:localhost/device:CPU:2"}) {
    EXPECT_EQ(canonical_device_name(name), want) << name;
  }
}

// Replicas do not run on GPUs yet: "GPU:k" is InvalidArgumentError where
// there is no such GPU (none in a build without CUDA or on a machine without
// one), UnimplementedError where there is.
template <class F>
void expect_gpu_refused(F&& f) {
  const ErrorCode want = list_physical_devices("GPU").empty() ? ErrorCode::kInvalidArgument : ErrorCode::kUnimplemented;
  try {
    f();
    ADD_FAILURE() << "a GPU device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
  }
}

TEST(DeviceNameTest, RejectsGpuRemoteAndMalformedNames) {
  expect_gpu_refused([] { canonical_device_name("GPU:0"); });
  if (list_physical_devices("GPU").empty()) {
    auto gpu = testing::expect_throw<InvalidArgumentError>([] { canonical_device_name("/device:GPU:0"); });
    EXPECT_NE(gpu.find("device '/device:GPU:0' does not exist: no GPU is visible: " + gpus_unavailable_reason()),
              std::string::npos)
        << gpu;
  }
  auto missing = testing::expect_throw<InvalidArgumentError>([] { canonical_device_name("gpu:4096"); });
  EXPECT_NE(missing.find("device 'gpu:4096' does not exist"), std::string::npos) << missing;
  EXPECT_EQ(canonical_device_name("/job:worker/replica:0/task:1/device:CPU:0"),
            "/job:worker/replica:0/task:1/device:CPU:0");  // a device of worker 1 (MultiWorkerMirroredStrategy)
  EXPECT_THROW(canonical_device_name("/job:chief/replica:0/task:0/device:CPU:0"), InvalidArgumentError);
  EXPECT_THROW(MirroredStrategy({"/job:worker/replica:0/task:1/device:CPU:0"}), InvalidArgumentError);
  EXPECT_THROW(canonical_device_name("/job:localhost/replica:0/task:1/device:CPU:0"), InvalidArgumentError);
  for (const char* bad : {"", "CPU", "CPU:x", "TPU:0", "CPU:-1", "/device:CPU", "banana"}) {
    EXPECT_THROW(canonical_device_name(bad), InvalidArgumentError) << bad;
  }
}

TEST(MirroredStrategyTest, ConstructionRules) {
  MirroredStrategy s({"CPU:0", "/cpu:1", "/job:localhost/replica:0/task:0/device:CPU:5"});
  EXPECT_EQ(s.num_replicas_in_sync(), 3);
  EXPECT_EQ(s.num_local_replicas(), 3);
  EXPECT_EQ(s.devices()[2], "/job:localhost/replica:0/task:0/device:CPU:5");
  EXPECT_EQ(s.extended().worker_devices(), s.devices());
  EXPECT_EQ(s.name(), "MirroredStrategy");
  EXPECT_EQ(s.describe(), "MirroredStrategy(3 replicas: CPU:0, CPU:1, CPU:5)");
  EXPECT_THROW(MirroredStrategy(std::vector<std::string>{}), InvalidArgumentError);
  auto dup = testing::expect_throw<InvalidArgumentError>([] { MirroredStrategy({"CPU:0", "/cpu:0"}); });
  EXPECT_NE(dup.find("No duplicates allowed in `devices` argument"), std::string::npos) << dup;
  expect_gpu_refused([] { MirroredStrategy({"GPU:0", "GPU:1"}); });
  MirroredStrategy all;
  // One replica per CPU this process may use (its affinity mask).
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  EXPECT_EQ(all.num_replicas_in_sync(), CPU_COUNT(&mask));
}

TEST(MirroredStrategyTest, ManyVirtualDevices) {
  auto s = testing::mirrored(16);
  auto r = s->run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(1)); });
  for (const auto& t : r.values()) EXPECT_EQ(t, constant(16));
}

TEST(OneDeviceStrategyTest, RunsOnceOnItsDevice) {
  OneDeviceStrategy s("CPU:3");
  EXPECT_EQ(s.num_replicas_in_sync(), 1);
  auto r = s.run([](ReplicaContext& ctx) {
    EXPECT_EQ(ctx.devices(), std::vector<std::string>{"/job:localhost/replica:0/task:0/device:CPU:3"});
    return ctx.all_reduce(ReduceOp::kSum, constant({1.f, 2.f}));
  });
  EXPECT_EQ(s.experimental_local_results(r).size(), 1u);
  EXPECT_EQ(r[0], constant({1.f, 2.f}));
  EXPECT_EQ(r[0].device(), "/job:localhost/replica:0/task:0/device:CPU:3");
  expect_gpu_refused([] { OneDeviceStrategy("GPU:0"); });
}

TEST(DefaultStrategyTest, IsASingleReplicaWithoutWorkerDevices) {
  Strategy& d = default_strategy();
  EXPECT_EQ(d.num_replicas_in_sync(), 1);
  EXPECT_EQ(d.name(), "_DefaultDistributionStrategy");
  auto msg = testing::expect_throw<FailedPreconditionError>([&] { d.extended().worker_devices(); });
  EXPECT_NE(msg.find("worker_devices() method unsupported by default tf.distribute.Strategy."), std::string::npos);
  // reduce_to and reduce return the value unchanged.
  EXPECT_EQ(d.extended().reduce_to(ReduceOp::kSum, constant(3.f), "CPU:0")[0], constant(3.f));
  EXPECT_EQ(d.reduce(ReduceOp::kSum, constant(3.f), std::nullopt), constant(3.f));
}

TEST(RunTest, ReplicasRunInParallelOnPoolThreadsReusedAcrossRuns) {
  auto s = testing::mirrored(4);
  std::mutex mu;
  std::set<std::thread::id> first, second;
  std::atomic<int> inside{0}, max_inside{0};
  auto body = [&](std::set<std::thread::id>& ids) {
    return [&](ReplicaContext& ctx) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      const int now = ++inside;
      int prev = max_inside.load();
      while (now > prev && !max_inside.compare_exchange_weak(prev, now)) {
      }
      ctx.all_reduce(ReduceOp::kSum, constant(1));  // all four must be inside at once to pass this
      --inside;
    };
  };
  s->run(body(first));
  s->run(body(second));
  EXPECT_EQ(first.size(), 4u);
  EXPECT_EQ(first, second);  // the same pool threads
  EXPECT_EQ(max_inside.load(), 4);
  EXPECT_TRUE(first.count(std::this_thread::get_id()));  // replica 0 runs on the caller
}

TEST(RunTest, PerReplicaArgumentsAreSplitOthersShared) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    std::vector<Tensor> parts;
    for (int i = 0; i < n; ++i) parts.push_back(constant(i * 10));
    PerReplica<Tensor> per_replica(parts);
    Mirrored<int> mirrored_int(std::vector<int>(static_cast<std::size_t>(n), 7));
    const Tensor shared = constant(100);
    auto r = s->run(
        [](ReplicaContext& ctx, const Tensor& mine, int m, const Tensor& common) {
          EXPECT_EQ(mine.scalar<int>(), ctx.replica_id_in_sync_group() * 10);
          EXPECT_EQ(m, 7);
          return mine.scalar<int>() + common.scalar<int>();
        },
        per_replica, mirrored_int, shared);
    for (int i = 0; i < n; ++i) EXPECT_EQ(r[static_cast<std::size_t>(i)], i * 10 + 100);
  }
}

// A Tensor every replica receives is one storage for all of them: each
// replica gets it read-only (a write would race with the others' reads),
// and so are a shared Nest<Tensor>'s leaves; a PerReplica component is the
// replica's own and stays writable. The caller's own tensor is unchanged.
TEST(RunTest, SharedTensorArgumentsAreReadOnlyOwnComponentsWritable) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    std::vector<Tensor> parts;
    for (int i = 0; i < n; ++i) parts.push_back(constant({i, i}));
    const PerReplica<Tensor> per_replica(parts);
    const Tensor shared = constant({1.f, 2.f});
    const Nest<Tensor> nest = Nest<Tensor>::dict({{"w", Nest<Tensor>(constant({3, 4}))}});
    auto r = s->run(
        [&](const Tensor& mine, const Tensor& common, const Nest<Tensor>& tree) {
          EXPECT_TRUE(common.is_read_only());
          EXPECT_EQ(common.raw_data(), shared.raw_data());  // shared, not copied
          EXPECT_TRUE(testing::refuses_writes(common, "float32 (2,)", shared.device()));
          EXPECT_TRUE(tree["w"].leaf().is_read_only());
          EXPECT_EQ(tree["w"].leaf(), constant({3, 4}));
          EXPECT_FALSE(mine.is_read_only());
          mine.mutable_flat<int>()[0] += 1;  // its own component
          Tensor copy = common.clone();
          copy.mutable_flat<float>()[0] = 5.f;
          return mine.flat<int>()[0] + static_cast<int>(copy.flat<float>()[0] + common.flat<float>()[1]);
        },
        per_replica, shared, nest);
    for (int i = 0; i < n; ++i) EXPECT_EQ(r[static_cast<std::size_t>(i)], i + 1 + 7);
    EXPECT_FALSE(shared.is_read_only());
    EXPECT_FALSE(nest["w"].leaf().is_read_only());
  }
}

// Inside a std::tuple, std::pair or std::vector a shared Tensor is read-only
// too, and a tuple's reference element becomes the replica's read-only copy
// (not a reference to a temporary). A replica function that returns a
// reference to its argument returns a copy of it (the argument may be a
// temporary; ASan would see a read of it after its end).
TEST(RunTest, SharedTensorsInsideTuplesPairsAndVectorsAreReadOnly) {
  auto s = testing::mirrored(2);
  const Tensor a = constant({1, 2});
  const Tensor b = constant({3.f});
  auto sizes = s->run(
      [&](const std::tuple<Tensor, int>& t, const std::tuple<Tensor>& by_ref, const std::pair<Tensor, Tensor>& p,
          const std::vector<Tensor>& v) {
        EXPECT_TRUE(std::get<0>(t).is_read_only());
        EXPECT_TRUE(std::get<0>(by_ref).is_read_only());
        EXPECT_EQ(std::get<0>(by_ref).raw_data(), a.raw_data());
        EXPECT_TRUE(p.first.is_read_only());
        EXPECT_TRUE(p.second.is_read_only());
        for (const Tensor& e : v) EXPECT_TRUE(e.is_read_only());
        return std::get<1>(t) + static_cast<int>(v.size());
      },
      std::make_tuple(a, 5), std::forward_as_tuple(a), std::make_pair(a, b), std::vector<Tensor>{a, b});
  for (int r : sizes.values()) EXPECT_EQ(r, 7);
  auto same = s->run([](const Tensor& t) -> const Tensor& { return t; }, b);
  for (const Tensor& t : same.values()) {
    EXPECT_EQ(t, constant({3.f}));
    EXPECT_TRUE(t.is_read_only());
  }
}

// std::map (its values) and std::optional are mapped as TensorFlow's
// select_replica maps dicts: a PerReplica inside gives each replica its own
// component, a Tensor every replica receives is read-only, an empty optional
// stays empty; an IndexedSlices' values and indices are read-only too, the
// same storage for every replica. The caller's own values keep their flags.
TEST(RunTest, MapsOptionalsAndIndexedSlicesAreSelectedPerReplica) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    std::vector<Tensor> parts;
    for (int i = 0; i < n; ++i) parts.push_back(constant({i}));
    const std::map<std::string, PerReplica<Tensor>> features{{"x", PerReplica<Tensor>(parts)}};
    const std::map<std::string, Tensor> weights{{"w", constant({1.f, 2.f})}};
    const std::optional<PerReplica<Tensor>> maybe{PerReplica<Tensor>(parts)};
    const std::optional<Tensor> shared(constant({7}));
    const std::optional<Tensor> none;
    const IndexedSlices slices(constant({{1.f, 2.f}}), constant({1}), Shape{3, 2});
    const std::map<std::string, const Tensor> frozen{{"c", constant({5})}};  // a const element type too
    auto r = s->run(
        [&](ReplicaContext& ctx, const std::map<std::string, Tensor>& mine, const std::map<std::string, Tensor>& w,
            const std::optional<Tensor>& own, const std::optional<Tensor>& common, const std::optional<Tensor>& empty,
            const IndexedSlices& rows, const std::map<std::string, Tensor>& c) {
          EXPECT_TRUE(c.at("c").is_read_only());
          const int id = ctx.replica_id_in_sync_group();
          EXPECT_EQ(mine.at("x"), constant({id}));
          EXPECT_FALSE(mine.at("x").is_read_only());  // its own component
          EXPECT_TRUE(w.at("w").is_read_only());
          EXPECT_EQ(w.at("w").raw_data(), weights.at("w").raw_data());
          EXPECT_TRUE(testing::refuses_writes(w.at("w"), "float32 (2,)", weights.at("w").device()));
          EXPECT_EQ(*own, constant({id}));
          EXPECT_TRUE(common->is_read_only());
          EXPECT_EQ(common->raw_data(), shared->raw_data());
          EXPECT_FALSE(empty.has_value());
          EXPECT_TRUE(rows.values().is_read_only());
          EXPECT_TRUE(rows.indices().is_read_only());
          EXPECT_EQ(rows.values().raw_data(), slices.values().raw_data());
          EXPECT_EQ(rows.to_dense(), constant({{0.f, 0.f}, {1.f, 2.f}, {0.f, 0.f}}));
          return mine.at("x").flat<int>()[0] + own->flat<int>()[0];
        },
        features, weights, maybe, shared, none, slices, frozen);
    for (int i = 0; i < n; ++i) EXPECT_EQ(r[static_cast<std::size_t>(i)], 2 * i);
    EXPECT_FALSE(weights.at("w").is_read_only());
    EXPECT_FALSE(shared->is_read_only());
    EXPECT_FALSE(slices.values().is_read_only());
  }
}

// A merge_fn's map of Mirrored values gives each replica its own component of
// each, as TensorFlow's select_replica does with a dict.
TEST(RunTest, AMergeFnsMapOfMirroredValuesIsSelectedPerReplica) {
  auto s = testing::mirrored(3);
  auto r = s->run([](ReplicaContext& ctx) {
    const std::map<std::string, Tensor> got = ctx.merge_call(
        [](Strategy& strategy, const PerReplica<Tensor>& ids) {
          return std::map<std::string, Mirrored<Tensor>>{
              {"sum", strategy.extended().reduce_to(ReduceOp::kSum, ids, ids)}};
        },
        constant(ctx.replica_id_in_sync_group()));
    return got.at("sum").device() ==
                   ctx.strategy().extended().worker_devices()[static_cast<std::size_t>(ctx.local_replica_id())]
               ? got.at("sum").scalar<int>()
               : -1;
  });
  EXPECT_EQ(r.values(), (std::vector<int>{3, 3, 3}));
}

TEST(RunTest, WrongNumberOfComponentsIsAnError) {
  auto s = testing::mirrored(2);
  PerReplica<int> three(std::vector<int>{1, 2, 3});
  auto msg = testing::expect_throw<InvalidArgumentError>([&] { s->run([](int) {}, three); });
  EXPECT_NE(msg.find("has 3 components"), std::string::npos) << msg;
}

// Nested distributed values are counted too, before any replica runs: too
// many components would pass unnoticed, too few would fail in one replica
// only (an OutOfRangeError there, and the others aborted).
TEST(RunTest, WrongNumberOfComponentsInsideAnArgumentIsAnError) {
  auto s = testing::mirrored(2);
  const PerReplica<int> one(std::vector<int>{1});
  const PerReplica<int> three(std::vector<int>{1, 2, 3});
  const PerReplica<int> two(std::vector<int>{1, 2});
  std::atomic<int> calls{0};
  const auto expect_refused = [&](const auto& arg, const std::string& components) {
    const std::string msg =
        testing::expect_throw<InvalidArgumentError>([&] { s->run([&](const auto&) { ++calls; }, arg); });
    EXPECT_NE(msg.find("run: a distributed value has " + components + " components but"), std::string::npos) << msg;
  };
  expect_refused(std::make_tuple(two, three), "3");
  expect_refused(std::make_pair(1, one), "1");
  expect_refused(std::vector<PerReplica<int>>{two, three}, "3");
  expect_refused(std::optional<PerReplica<int>>(one), "1");
  expect_refused(std::map<std::string, PerReplica<int>>{{"a", two}, {"b", three}}, "3");
  expect_refused(std::vector<std::optional<std::tuple<PerReplica<int>>>>{std::make_tuple(one)}, "1");
  expect_refused(std::vector<std::pair<PerReplica<int>, int>>{{three, 0}}, "3");  // a vector of pairs is no map
  EXPECT_EQ(calls.load(), 0);                                                     // no replica ran
  // The right count, or none at all, runs.
  s->run([&](const std::map<std::string, int>&, const std::optional<int>&) { ++calls; },
         std::map<std::string, PerReplica<int>>{{"a", two}}, std::optional<PerReplica<int>>());
  EXPECT_EQ(calls.load(), 2);
}

TEST(RunTest, VoidFunctionsAndNestedResults) {
  auto s = testing::mirrored(2);
  std::atomic<int> calls{0};
  s->run([&] { ++calls; });
  EXPECT_EQ(calls.load(), 2);
  using N = Nest<Tensor>;
  auto r = s->run([](ReplicaContext& ctx) {
    return N::dict({{"id", constant(ctx.replica_id_in_sync_group())}, {"x", N::list({constant(1.f)})}});
  });
  auto locals = s->experimental_local_results(r);
  ASSERT_EQ(locals.size(), 2u);
  EXPECT_EQ(locals[1]["id"].leaf(), constant(1));
  EXPECT_EQ(repr(r).substr(0, 13), "PerReplica:{\n");
}

// Replicas that return results of different structures (TensorFlow's
// regroup refuses them): an error naming the replicas and the first
// difference, instead of a PerReplica of mismatched values. Leaves may differ.
TEST(RunTest, ResultsOfDifferentStructuresAreRefused) {
  auto s = testing::mirrored(3);
  using N = Nest<Tensor>;
  auto msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->run([](ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      return N::dict(
          {{"a", constant(1)},
           {"b", id == 2 ? N::list({constant(1), constant(2), constant(3)}) : N::list({constant(1), constant(2)})}});
    });
  });
  EXPECT_NE(msg.find("run: the replicas returned results of different structures"), std::string::npos) << msg;
  EXPECT_NE(msg.find("They first differ at['b']: replica 0 has [*, *], replica 2 has [*, *, *]"), std::string::npos)
      << msg;
  // Vectors of different lengths, and maps with different keys.
  msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->run([](ReplicaContext& ctx) {
      return std::vector<Tensor>(static_cast<std::size_t>(1 + ctx.replica_id_in_sync_group()), constant(1));
    });
  });
  EXPECT_NE(msg.find("(replica 0: [*]; replica 1: [*, *])"), std::string::npos) << msg;
  msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->run([](ReplicaContext& ctx) {
      std::map<std::string, Tensor> m{{"loss", constant(1.f)}};
      if (ctx.replica_id_in_sync_group() == 1) m["extra"] = constant(2.f);
      return m;
    });
  });
  EXPECT_NE(msg.find("replica 1: {'extra': *, 'loss': *}"), std::string::npos) << msg;
  msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->run([](ReplicaContext& ctx) {
      return std::make_pair(constant(1), ctx.replica_id_in_sync_group() == 0 ? std::optional<Tensor>()
                                                                             : std::optional<Tensor>(constant(2)));
    });
  });
  EXPECT_NE(msg.find("replica 0: (*, None); replica 1: (*, *)"), std::string::npos) << msg;
  // Same structures, different leaves (dtypes, shapes): fine, as in TensorFlow.
  auto r = s->run([](ReplicaContext& ctx) {
    return N::list({fill(DType::kFloat32, Shape{ctx.replica_id_in_sync_group() + 1}, 1)});
  });
  EXPECT_EQ(r.size(), 3u);
}

TEST(LocalResultsTest, NonDistributedValueIsATupleOfOne) {
  auto s = testing::mirrored(3);
  EXPECT_EQ(s->experimental_local_results(constant(4)).size(), 1u);
  Mirrored<int> m(std::vector<int>{5, 5, 5});
  EXPECT_EQ(s->experimental_local_results(m), (std::vector<int>{5, 5, 5}));
  EXPECT_EQ(repr_tuple(std::vector<int>{1}), "(1,)");
}

PerReplica<Tensor> per_replica(const std::vector<Tensor>& v) { return PerReplica<Tensor>(v); }

TEST(ReduceTest, ElementwiseAcrossReplicasEveryOp) {
  auto s = testing::mirrored(3);
  auto v = per_replica({constant({1.f, 5.f}), constant({2.f, 4.f}), constant({6.f, 3.f})});
  EXPECT_EQ(s->reduce(ReduceOp::kSum, v, std::nullopt), constant({9.f, 12.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kMean, v, std::nullopt), constant({3.f, 4.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kMin, v, std::nullopt), constant({1.f, 3.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kMax, v, std::nullopt), constant({6.f, 5.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kProduct, v, std::nullopt), constant({12.f, 60.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kSum, v, std::nullopt).device(), std::string(kHostDevice));
}

TEST(ReduceTest, MeanAlongBatchAxisIsTheGlobalMeanWithRaggedLastBatch) {
  auto s = testing::mirrored(2);
  // Replica 0 has 3 examples, replica 1 only 1 (a ragged last batch).
  auto v = per_replica({constant({{1.f, 10.f}, {2.f, 20.f}, {3.f, 30.f}}), constant({{6.f, 60.f}})});
  EXPECT_EQ(s->reduce(ReduceOp::kMean, v, 0), constant({3.f, 30.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kSum, v, 0), constant({12.f, 120.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kMean, v, std::vector<int>{0, 1}), constant(16.5f));
  // Along axis 1 the batch dimensions remain, and they differ: an error.
  EXPECT_THROW(s->reduce(ReduceOp::kMax, v, -1), InvalidArgumentError);
  EXPECT_EQ(s->reduce(ReduceOp::kMin, v, std::vector<int>{0, 1}), constant(1.f));
  // Integer mean truncates toward zero and keeps the dtype.
  auto ints = per_replica({constant({1, 2}), constant({4})});
  EXPECT_EQ(s->reduce(ReduceOp::kMean, ints, 0), constant(2));
}

TEST(ReduceTest, AxisErrors) {
  auto s = testing::mirrored(2);
  auto v = per_replica({constant({{1.f}}), constant({{2.f}})});
  auto msg = testing::expect_throw<InvalidArgumentError>([&] { s->reduce(ReduceOp::kSum, v, 2); });
  EXPECT_NE(msg.find("`axis` = 2 out of range for `value` with rank 2"), std::string::npos) << msg;
  EXPECT_THROW(s->reduce(ReduceOp::kSum, v, std::vector<int>{0, -2}), InvalidArgumentError);
  auto mismatch = per_replica({constant({{1.f, 2.f}}), constant({{2.f}})});
  EXPECT_THROW(s->reduce(ReduceOp::kSum, mismatch, 0), InvalidArgumentError);
  EXPECT_THROW(s->reduce(ReduceOp::kSum, mismatch, std::nullopt), InvalidArgumentError);
  EXPECT_THROW(s->reduce(ReduceOp::kSum, per_replica({constant(1.f), constant(1)}), std::nullopt),
               InvalidArgumentError);
}

TEST(ReduceTest, NonDistributedValues) {
  auto s = testing::mirrored(2);
  EXPECT_EQ(s->reduce(ReduceOp::kMean, constant(5.f), std::nullopt), constant(5.f));
  auto msg =
      testing::expect_throw<InvalidArgumentError>([&] { s->reduce(ReduceOp::kSum, constant(5.f), std::nullopt); });
  EXPECT_NE(msg.find("A non-DistributedValues value 5.0 cannot be reduced with the given reduce op SUM."),
            std::string::npos)
      << msg;
  EXPECT_EQ(s->reduce(ReduceOp::kMean, constant({2.f, 4.f}), 0), constant(3.f));
  Mirrored<Tensor> m(std::vector<Tensor>{constant(2.f), constant(2.f)});
  EXPECT_EQ(s->reduce(ReduceOp::kMean, m, std::nullopt), constant(2.f));
  EXPECT_THROW(s->reduce(ReduceOp::kSum, m, std::nullopt), InvalidArgumentError);
  OneDeviceStrategy one("CPU:0");
  EXPECT_EQ(one.reduce(ReduceOp::kSum, constant(5.f), std::nullopt), constant(5.f));
}

// Per-replica IndexedSlices in the cross-replica context, as TensorFlow: SUM
// concatenates every replica's slices in replica order (dense shape kept),
// MEAN divides the values too; MIN and mismatched slices are refused.
TEST(ReduceTest, IndexedSlicesConcatenateAcrossReplicas) {
  for (int n : {1, 2, 3}) {
    auto s = testing::mirrored(n);
    std::vector<IndexedSlices> parts;
    std::vector<float> want_values;
    std::vector<std::int64_t> want_indices;
    for (int r = 0; r < n; ++r) {
      std::vector<float> rows;
      std::vector<std::int64_t> idx;
      for (int k = 0; k <= r; ++k) {
        rows.insert(rows.end(), {static_cast<float>(r), static_cast<float>(k)});
        idx.push_back((r + k) % 6);
      }
      parts.emplace_back(constant(rows, Shape{r + 1, 2}), constant(idx, Shape{r + 1}), Shape{6, 2});
      want_values.insert(want_values.end(), rows.begin(), rows.end());
      want_indices.insert(want_indices.end(), idx.begin(), idx.end());
    }
    const PerReplica<IndexedSlices> value(parts);
    const auto rows = static_cast<std::int64_t>(want_indices.size());
    const IndexedSlices sum = s->reduce(ReduceOp::kSum, value);
    EXPECT_EQ(sum.values(), constant(want_values, Shape{rows, 2}));
    EXPECT_EQ(sum.indices(), constant(want_indices, Shape{rows}));
    EXPECT_EQ(sum.dense_shape(), (Shape{6, 2}));
    const Mirrored<IndexedSlices> to = s->extended().reduce_to(ReduceOp::kMean, value, Destinations("CPU:0"));
    ASSERT_EQ(to.size(), 1u);
    std::vector<float> means = want_values;
    for (float& v : means) v /= static_cast<float>(n);
    EXPECT_EQ(to.primary().values(), constant(means, Shape{rows, 2}));
    EXPECT_EQ(to.primary().indices(), constant(want_indices, Shape{rows}));
    // The dense value of the SUM is the sum of the dense values.
    std::vector<float> dense_sum(12, 0.f);
    for (const IndexedSlices& p : parts) {
      const Tensor d = p.to_dense();
      for (std::size_t k = 0; k < dense_sum.size(); ++k) dense_sum[k] += d.flat<float>()[k];
    }
    EXPECT_EQ(sum.to_dense(), constant(dense_sum, Shape{6, 2}));
    const auto batch = s->extended().batch_reduce_to(
        ReduceOp::kSum, {{value, Destinations("CPU:0")}, {value, Destinations::of_devices(s->devices())}});
    ASSERT_EQ(batch.size(), 2u);
    EXPECT_EQ(batch[1].size(), static_cast<std::size_t>(n));
    EXPECT_EQ(batch[1].component(static_cast<std::size_t>(n - 1)), sum);
  }
  auto s = testing::mirrored(2);
  const IndexedSlices a(constant({{1.f}}), constant({0}), Shape{3, 1});
  auto msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->reduce(ReduceOp::kMin, PerReplica<IndexedSlices>({a, a}));
  });
  EXPECT_NE(msg.find("reduce of IndexedSlices supports SUM and MEAN only, not MIN"), std::string::npos) << msg;
  const IndexedSlices wider(constant({{1.f}}), constant({0}), Shape{4, 1});
  msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->extended().reduce_to(ReduceOp::kSum, PerReplica<IndexedSlices>({a, wider}), Destinations("CPU:0"));
  });
  EXPECT_NE(msg.find("replica 1 has float32(?, 1), dense_shape (4, 1)"), std::string::npos) << msg;
  EXPECT_THROW(s->reduce(ReduceOp::kSum, PerReplica<IndexedSlices>({a})), InvalidArgumentError);  // 1 of 2
  // The default strategy and OneDevice: the one component.
  OneDeviceStrategy one("CPU:0");
  EXPECT_EQ(one.reduce(ReduceOp::kSum, PerReplica<IndexedSlices>({a})), a);
}

// batch_reduce_to takes values that are not per-replica, as reduce_to does.
TEST(ReduceTest, BatchReduceToTakesNonDistributedValues) {
  auto s = testing::mirrored(2);
  const auto out = s->extended().batch_reduce_to(
      ReduceOp::kMean,
      {{constant(5.f), Destinations("CPU:0")}, {constant({1, 2}), Destinations::of_devices(s->devices())}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].primary(), constant(5.f));
  EXPECT_EQ(out[1].component(1), constant({1, 2}));
  const auto msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->extended().batch_reduce_to(ReduceOp::kSum, {{constant(5.f), Destinations("CPU:0")}});
  });
  EXPECT_NE(msg.find("A non-DistributedValues value 5.0 cannot be reduced with the given reduce op SUM."),
            std::string::npos)
      << msg;
}

TEST(ReduceTest, MirroredValueAlongAnAxis) {
  auto s = testing::mirrored(2);
  Mirrored<Tensor> m(std::vector<Tensor>{constant({2.f, 4.f}), constant({2.f, 4.f})});
  EXPECT_EQ(s->reduce(ReduceOp::kMean, m, 0), constant(3.f));
  EXPECT_EQ(s->reduce(ReduceOp::kMax, m, 0), constant(4.f));
}

TEST(ReduceTest, EmptyAxisGivesTheIdentityOfTheDtype) {
  auto s = testing::mirrored(2);
  auto empty =
      PerReplica<Tensor>(std::vector<Tensor>{Tensor(DType::kInt32, Shape{0, 2}), Tensor(DType::kInt32, Shape{0, 2})});
  EXPECT_EQ(s->reduce(ReduceOp::kMin, empty, 0), fill(DType::kInt32, Shape{2}, 2147483647));
  EXPECT_EQ(s->reduce(ReduceOp::kMax, empty, 0), fill(DType::kInt32, Shape{2}, -2147483648.0));
  EXPECT_EQ(s->reduce(ReduceOp::kSum, empty, 0), fill(DType::kInt32, Shape{2}, 0));
  EXPECT_THROW(s->reduce(ReduceOp::kMean, empty, 0), InvalidArgumentError);
  auto empty_f =
      PerReplica<Tensor>(std::vector<Tensor>{Tensor(DType::kFloat32, Shape{0}), Tensor(DType::kFloat32, Shape{0})});
  EXPECT_TRUE(std::isnan(s->reduce(ReduceOp::kMean, empty_f, 0).scalar<float>()));
  EXPECT_TRUE(std::isinf(s->reduce(ReduceOp::kMin, empty_f, 0).scalar<float>()));
}

TEST(GatherTest, ConcatenatesInReplicaOrderRaggedAlongAxis) {
  auto s = testing::mirrored(3);
  auto v = per_replica({constant({{1, 2}}), constant({{3, 4}, {5, 6}}), constant({{7, 8}})});
  EXPECT_EQ(s->gather(v, 0), constant({{1, 2}, {3, 4}, {5, 6}, {7, 8}}));
  auto cols = per_replica({constant({{1}, {2}}), constant({{3, 4}, {5, 6}}), constant({{7}, {8}})});
  EXPECT_EQ(s->gather(cols, 1), constant({{1, 3, 4, 7}, {2, 5, 6, 8}}));
  EXPECT_EQ(s->gather(cols, -1), constant({{1, 3, 4, 7}, {2, 5, 6, 8}}));
  EXPECT_EQ(s->gather(constant({9}), 0), constant({9}));  // a non-distributed value is returned as is
}

TEST(GatherTest, Errors) {
  auto s = testing::mirrored(2);
  auto rank0 = testing::expect_throw<InvalidArgumentError>([&] {
    s->gather(per_replica({constant(1), constant(2)}), 0);
  });
  EXPECT_NE(rank0.find("rank >= 1"), std::string::npos) << rank0;
  auto dims = testing::expect_throw<InvalidArgumentError>([&] {
    s->gather(per_replica({constant({{1, 2}}), constant({{1, 2, 3}})}), 0);
  });
  EXPECT_NE(dims.find("Dimension 1"), std::string::npos) << dims;
  EXPECT_NE(dims.find("replica 0: (1, 2)"), std::string::npos) << dims;
  EXPECT_NE(dims.find("replica 1: (1, 3)"), std::string::npos) << dims;
  EXPECT_THROW(s->gather(per_replica({constant({1}), constant({1.f})}), 0), InvalidArgumentError);
  EXPECT_THROW(s->gather(per_replica({constant({1}), constant({{1}})}), 0), InvalidArgumentError);
  EXPECT_THROW(s->gather(per_replica({constant({1}), constant({1})}), 1), InvalidArgumentError);
  IndexedSlices slices(constant({{1.f}}), constant({0}), Shape{2, 1});
  auto sparse = testing::expect_throw<UnimplementedError>([&] { s->gather(slices, 0); });
  EXPECT_EQ(sparse, "gather does not support IndexedSlices");
}

TEST(ExtendedTest, ReduceToPlacesCopiesOnDestinations) {
  auto s = testing::mirrored(2);
  auto v = per_replica({constant(1.f), constant(2.f)});
  auto on_host = s->extended().reduce_to(ReduceOp::kSum, v, "CPU:0");
  ASSERT_EQ(on_host.size(), 1u);
  EXPECT_EQ(on_host[0], constant(3.f));
  EXPECT_EQ(on_host[0].device(), "/job:localhost/replica:0/task:0/device:CPU:0");
  auto all = s->extended().reduce_to(ReduceOp::kMean, v, Destinations::of_devices({"CPU:0", "CPU:1"}));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1], constant(1.5f));
  EXPECT_EQ(all[1].device(), "/job:localhost/replica:0/task:0/device:CPU:1");
  EXPECT_NE(all[0].raw_data(), all[1].raw_data());  // distinct storage per device
  EXPECT_THROW(s->extended().reduce_to(ReduceOp::kSum, v, ""), InvalidArgumentError);
  expect_gpu_refused([&] { s->extended().reduce_to(ReduceOp::kSum, v, "GPU:0"); });
  EXPECT_THROW(s->extended().reduce_to(ReduceOp::kSum, v, "CPU:0", {.bytes_per_pack = -1}), InvalidArgumentError);
}

TEST(ExtendedTest, BatchReduceToKeepsOrder) {
  auto s = testing::mirrored(2);
  auto a = per_replica({constant(1.f), constant(2.f)});
  auto b = per_replica({constant({1, 1}), constant({2, 3})});
  auto out = s->extended().batch_reduce_to(ReduceOp::kSum, {{a, "CPU:0"}, {b, "CPU:1"}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0][0], constant(3.f));
  EXPECT_EQ(out[1][0], constant({3, 4}));
  EXPECT_EQ(out[1][0].device(), "/job:localhost/replica:0/task:0/device:CPU:1");
}

// Packed: every pack size and dtype mix gives what one reduce_to per value gives.
TEST(ExtendedTest, BatchReduceToPacksLikeSeparateReduceTo) {
  for (int n : {1, 3}) {
    auto s = testing::mirrored(n);
    std::vector<std::pair<PerReplica<Tensor>, Destinations>> pairs;
    for (int k = 0; k < 23; ++k) {
      std::vector<Tensor> comps;
      const DType dtype = k % 3 == 0 ? DType::kInt32 : (k % 3 == 1 ? DType::kFloat32 : DType::kFloat64);
      for (int r = 0; r < n; ++r) comps.push_back(iota(dtype, Shape{k % 5, 3}, r * 7 + k));
      pairs.emplace_back(PerReplica<Tensor>(comps), Destinations("CPU:0"));
    }
    for (std::int64_t bytes : {0, 1, 40, 100, 1 << 20}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
        auto batch = s->extended().batch_reduce_to(op, pairs, {.bytes_per_pack = bytes});
        ASSERT_EQ(batch.size(), pairs.size());
        for (std::size_t k = 0; k < pairs.size(); ++k) {
          const Tensor want = s->extended().reduce_to(op, pairs[k].first, "CPU:0")[0];
          EXPECT_EQ(batch[k][0], want) << "value " << k << ", bytes_per_pack " << bytes << ", op " << to_string(op);
          EXPECT_EQ(batch[k][0].device(), want.device());
        }
      }
    }
  }
}

TEST(ExtendedTest, BatchReduceToNamesTheBadValue) {
  auto s = testing::mirrored(2);
  auto good = per_replica({constant(1.f), constant(2.f)});
  auto bad = per_replica({constant({1.f}), constant({1.f, 2.f})});
  const std::string msg = testing::expect_throw<InvalidArgumentError>([&] {
    s->extended().batch_reduce_to(ReduceOp::kSum, {{good, "CPU:0"}, {bad, "CPU:0"}});
  });
  EXPECT_NE(msg.find("value 1: batch_reduce_to: the components must have the same dtype and shape"), std::string::npos)
      << msg;
  EXPECT_TRUE(s->extended()
                  .batch_reduce_to(ReduceOp::kSum, std::vector<std::pair<PerReplica<Tensor>, Destinations>>{})
                  .empty());
}

TEST(ExtendedTest, BroadcastToEveryDevice) {
  auto s = testing::mirrored(3);
  auto m = s->extended().broadcast_to(constant({1, 2}));
  ASSERT_EQ(m.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m[i], constant({1, 2}));
    EXPECT_EQ(m[i].device(), s->devices()[i]);
  }
  EXPECT_EQ(s->extended().broadcast_to(constant(1), Destinations("CPU:2")).size(), 1u);
}

// As TensorFlow's identity on one device: the destination on the value's own
// device gets the value (its storage shared), every other one a copy of its own.
TEST(ExtendedTest, BroadcastToSharesOnlyOnTheValuesOwnDevice) {
  auto s = testing::mirrored(3);
  const Tensor value = constant({1, 2}).with_device(s->devices()[1]);
  const Mirrored<Tensor> m = s->extended().broadcast_to(value);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1].raw_data(), value.raw_data());
  EXPECT_NE(m[0].raw_data(), value.raw_data());
  EXPECT_NE(m[2].raw_data(), value.raw_data());
  EXPECT_NE(m[0].raw_data(), m[2].raw_data());
  m[0].mutable_flat<int>()[0] = 7;
  EXPECT_EQ(value, constant({1, 2}));
  EXPECT_EQ(m[2], constant({1, 2}));
  // A value on no destination's device is copied to every one.
  const Tensor elsewhere = constant({3}).with_device("/job:localhost/replica:0/task:0/device:CPU:5");
  const Mirrored<Tensor> copies = s->extended().broadcast_to(elsewhere);
  for (const Tensor& t : copies.values()) {
    EXPECT_EQ(t, elsewhere);
    EXPECT_NE(t.raw_data(), elsewhere.raw_data());
  }
}

TEST(ExtendedTest, UpdateInCrossReplicaAndReplicaContext) {
  auto s = testing::mirrored(2);
  Mirrored<Tensor> var(std::vector<Tensor>{constant(10.f), constant(10.f)});
  auto add = [](Tensor& v, const Tensor& delta) {
    v = constant(v.scalar<float>() + delta.scalar<float>());
    return v;
  };
  auto out = s->extended().update(var, add, constant(1.f));
  EXPECT_EQ(out[0], constant(11.f));
  EXPECT_EQ(var[1], constant(11.f));
  // In replica context: one merge_call; each component updated once, with its replica's value.
  s->run([&](ReplicaContext& ctx) {
    auto result = s->extended().update(var, add, constant(static_cast<float>(ctx.replica_id_in_sync_group() + 1)));
    EXPECT_EQ(result.size(), 2u);
  });
  EXPECT_EQ(var[0], constant(12.f));
  EXPECT_EQ(var[1], constant(13.f));
  Mirrored<Tensor> wrong(std::vector<Tensor>{constant(1.f)});
  EXPECT_THROW(s->extended().update(wrong, add, constant(1.f)), InvalidArgumentError);
}

// An argument with another number of components than the strategy has
// replicas, at the top or nested (too few would fail part-way, leaving some
// components updated; too many would pass unnoticed): refused before any
// component is touched, naming update.
TEST(ExtendedTest, UpdateRefusesArgumentsWithOtherComponentCounts) {
  auto s = testing::mirrored(2);
  Mirrored<Tensor> var(std::vector<Tensor>{constant(10.f), constant(10.f)});
  std::atomic<int> calls{0};
  // Generic: update's replica-context branch (compiled, not taken here)
  // hands fn a replica's whole argument.
  auto add = [&](Tensor& v, const auto& delta) {
    if constexpr (std::is_same_v<std::decay_t<decltype(delta)>, Tensor>) {
      ++calls;
      v = constant(v.scalar<float>() + delta.template scalar<float>());
    } else {
      ADD_FAILURE() << "called with a replica's whole argument";
    }
  };
  const PerReplica<Tensor> one(std::vector<Tensor>{constant(1.f)});
  const PerReplica<Tensor> three(std::vector<Tensor>{constant(1.f), constant(2.f), constant(3.f)});
  for (const PerReplica<Tensor>* bad : {&one, &three}) {
    const std::string msg = testing::expect_throw<InvalidArgumentError>([&] { s->extended().update(var, add, *bad); });
    EXPECT_NE(msg.find("update: a distributed value has " + std::to_string(bad->size()) + " components but"),
              std::string::npos)
        << msg;
    // Nested in a vector, as select_replica looks into it.
    auto nested = [&](Tensor& v, const auto& deltas) { add(v, deltas[0]); };
    EXPECT_THROW(s->extended().update(var, nested, std::vector<PerReplica<Tensor>>{*bad}), InvalidArgumentError);
  }
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(var[0], constant(10.f));
  EXPECT_EQ(var[1], constant(10.f));
  // The right count goes through.
  s->extended().update(var, add, PerReplica<Tensor>(std::vector<Tensor>{constant(1.f), constant(2.f)}));
  EXPECT_EQ(var[0], constant(11.f));
  EXPECT_EQ(var[1], constant(12.f));
}

// update() in a replica context hands every replica the whole result, whose
// tensors are one storage for all of them (here the variable's components
// themselves): each replica's are read-only views, alone or inside a pair or
// a Nest, so a write by one replica cannot race with the others' reads. The
// variable stays writable.
TEST(ExtendedTest, UpdateResultsInAReplicaContextAreReadOnly) {
  for (int n : testing::kReplicaCounts) {
    const auto count = static_cast<std::size_t>(n);
    auto s = testing::mirrored(n);
    std::vector<Tensor> init;
    for (std::size_t i = 0; i < count; ++i) init.push_back(constant({0.f, 0.f}));
    Mirrored<Tensor> var(std::move(init));
    auto set = [](Tensor& v, const Tensor& x) {
      v = constant({x.scalar<float>(), 1.f});
      return v;  // the component itself
    };
    auto both = [](Tensor& v, const Tensor&) { return std::make_pair(v, Nest<Tensor>::list({Nest<Tensor>(v)})); };
    std::vector<std::vector<const void*>> seen(count);
    s->run([&](ReplicaContext& ctx) {
      const auto id = static_cast<float>(ctx.replica_id_in_sync_group());
      const Mirrored<Tensor> out = s->extended().update(var, set, constant(id));
      ASSERT_EQ(out.size(), count);
      for (std::size_t i = 0; i < count; ++i) {
        EXPECT_EQ(out[i], constant({static_cast<float>(i), 1.f}));
        EXPECT_TRUE(testing::refuses_writes(out[i], "float32 (2,)", out[i].device()));
        seen[static_cast<std::size_t>(ctx.local_replica_id())].push_back(out[i].raw_data());
      }
      const auto pairs = s->extended().update(var, both, constant(id));
      for (std::size_t i = 0; i < count; ++i) {
        EXPECT_TRUE(pairs[i].first.is_read_only());
        EXPECT_TRUE(pairs[i].second[0].leaf().is_read_only());
      }
    });
    for (std::size_t i = 0; i < count; ++i) {
      for (const auto& replica : seen) EXPECT_EQ(replica.at(i), var[i].raw_data());  // one storage: the variable's
      var.mutable_values()[i].mutable_flat<float>()[1] = 2.f;  // the variable itself stays writable
      EXPECT_EQ(var[i], constant({static_cast<float>(i), 2.f}));
    }
  }
}

TEST(ExtendedTest, CallForEachReplica) {
  auto s = testing::mirrored(2);
  auto scope = s->scope();
  auto r = s->extended().call_for_each_replica([](ReplicaContext& ctx) { return ctx.replica_id_in_sync_group(); });
  EXPECT_EQ(r.values(), (std::vector<int>{0, 1}));
}

TEST(ConcurrencyTest, RunsFromTwoThreadsTakeTurns) {
  auto s = testing::mirrored(2);
  auto work = [&] {
    for (int i = 0; i < 50; ++i) {
      auto r = s->run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(1)); });
      EXPECT_EQ(r[1], constant(2));
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
}

}  // namespace
}  // namespace distribute
