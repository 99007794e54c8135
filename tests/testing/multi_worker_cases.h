// The behaviour of MultiWorkerMirroredStrategy, written once and run by two
// harnesses: in one process, with threads standing for the workers
// (tests/runtime/multi_worker_test.cc, also under the sanitizers), and under
// mpirun, one worker per process (tests/mpi/multi_worker_mpi_test.cc).
//
// Every case runs on every worker at once. Replica g (global id) contributes
// values made from g; the expected results come from a MirroredStrategy with
// as many replicas as the whole cluster, run in the same worker, so the
// multi-worker strategy must agree with the single-process one. Values are
// small integers, so the hierarchical order of additions changes no bit.
#pragma once

#include <distribute/distribute.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/replica_pool.h"
#include "testing/faults.h"
#include "testing/reference_model.h"
#include "testing/strategies.h"

namespace distribute::testing {

struct WorkerEnv {
  int worker = 0;
  int workers = 1;
  int local_replicas = 1;
  // Makes this worker's strategy (a collective: every worker makes one).
  std::function<std::unique_ptr<MultiWorkerMirroredStrategy>(int local_replicas, CommunicationOptions)> make;

  std::unique_ptr<MultiWorkerMirroredStrategy> strategy(CommunicationOptions options = {}) const {
    if (!options.timeout) options.timeout = kTestTimeout;
    return make(local_replicas, options);
  }
  int replicas() const { return workers * local_replicas; }
};

// The class name of the distribute::Error `f` throws ("std::exception" for
// another exception, "" for none), and its message.
inline std::string error_kind(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.message();
    return std::string(to_string(e.code()));
  } catch (const std::exception& e) {
    if (message) *message = e.what();
    return "std::exception";
  }
  return "";
}

inline bool identical(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// What a MirroredStrategy of n replicas gives each replica for fn(ctx, g).
inline std::vector<Tensor> single_process_reference(int n, const std::function<Tensor(ReplicaContext&, int)>& fn) {
  auto reference = mirrored(n);
  return reference->run([&](ReplicaContext& ctx) { return fn(ctx, ctx.replica_id_in_sync_group()); }).values();
}

// Runs fn(ctx, g) on the multi-worker strategy and checks each local
// replica's result against the single-process reference, bit for bit.
inline void expect_same_as_single_process(const WorkerEnv& env, MultiWorkerMirroredStrategy& s,
                                          const std::function<Tensor(ReplicaContext&, int)>& fn,
                                          const std::string& what) {
  const std::vector<Tensor> got =
      s.run([&](ReplicaContext& ctx) { return fn(ctx, ctx.replica_id_in_sync_group()); }).values();
  const std::vector<Tensor> want = single_process_reference(env.replicas(), fn);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(env.local_replicas));
  for (int i = 0; i < env.local_replicas; ++i) {
    const Tensor& w = want[static_cast<std::size_t>(s.first_replica_id() + i)];
    EXPECT_TRUE(identical(got[static_cast<std::size_t>(i)], w))
        << what << " on replica " << s.first_replica_id() + i << ": got " << got[static_cast<std::size_t>(i)].repr()
        << ", want " << w.repr();
  }
}

// ---- cases ------------------------------------------------------------------------

inline void IdsDevicesAndSeedExample(const WorkerEnv& env) {
  auto s = env.strategy();
  EXPECT_EQ(s->num_replicas_in_sync(), env.replicas());
  EXPECT_EQ(s->num_local_replicas(), env.local_replicas);
  EXPECT_EQ(s->worker_rank(), env.worker);
  EXPECT_EQ(s->num_workers(), env.workers);
  EXPECT_EQ(s->first_replica_id(), env.worker * env.local_replicas);
  if (env.workers > 1) {
    EXPECT_EQ(s->extended().worker_devices()[0],
              "/job:worker/replica:0/task:" + std::to_string(env.worker) + "/device:CPU:0");
  }
  // The seed: every replica adds 1; the sum is the number of replicas.
  auto r = s->run([](ReplicaContext& ctx) {
    return Nest<Tensor>::list({ctx.all_reduce(ReduceOp::kSum, constant(1.f)),
                               scalar(DType::kInt32, ctx.replica_id_in_sync_group()),
                               scalar(DType::kInt32, ctx.num_replicas_in_sync())});
  });
  const std::vector<Nest<Tensor>> local = s->experimental_local_results(r);
  ASSERT_EQ(local.size(), static_cast<std::size_t>(env.local_replicas));
  for (int i = 0; i < env.local_replicas; ++i) {
    const Nest<Tensor>& v = local[static_cast<std::size_t>(i)];
    EXPECT_EQ(v[0].leaf().scalar<float>(), static_cast<float>(env.replicas()));
    EXPECT_EQ(v[1].leaf().scalar<std::int32_t>(), env.worker * env.local_replicas + i);
    EXPECT_EQ(v[2].leaf().scalar<std::int32_t>(), env.replicas());
  }
}

inline void AllReduceEveryOpAndDtype(const WorkerEnv& env) {
  auto s = env.strategy();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      expect_same_as_single_process(
          env, *s,
          [dtype, op](ReplicaContext& ctx, int g) {
            const Tensor v =
                cast(constant({static_cast<float>(g + 1), static_cast<float>(g % 3 - 1), 2.f, -4.f}), dtype);
            return ctx.all_reduce(op, v);
          },
          std::string(to_string(op)) + " of " + std::string(to_string(dtype)));
    }
  }
}

inline void AllReduceLargeNestedAndPacked(const WorkerEnv& env) {
  CommunicationOptions options;
  options.bytes_per_pack = 1024;  // many packs
  auto s = env.strategy(options);
  auto value = [](int g) {
    return Nest<Tensor>::dict({{"big", iota(DType::kFloat32, Shape{300001}, g, 1)},
                               {"small", Nest<Tensor>::list({fill(DType::kInt64, Shape{5}, g),
                                                             fill(DType::kFloat32, Shape{3, 100}, 2 * g)})}});
  };
  auto r = s->run([&](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kSum, value(ctx.replica_id_in_sync_group()), options);
  });
  const auto want = mirrored(env.replicas(), options)->run([&](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kSum, value(ctx.replica_id_in_sync_group()), options);
  });
  for (int i = 0; i < env.local_replicas; ++i) {
    const auto got_leaves = r.values()[static_cast<std::size_t>(i)].flatten();
    const auto want_leaves = want.values()[0].flatten();
    ASSERT_EQ(got_leaves.size(), want_leaves.size());
    for (std::size_t k = 0; k < got_leaves.size(); ++k) {
      EXPECT_TRUE(identical(got_leaves[k], want_leaves[k])) << "leaf " << k << " of replica " << i;
      EXPECT_TRUE(got_leaves[k].is_read_only()) << "leaf " << k << " of replica " << i;
    }
    // "big" (its own pack, 1.2 MB): one result for the replicas of a worker.
    EXPECT_EQ(got_leaves[0].raw_data(), r.values()[0].flatten()[0].raw_data()) << "replica " << i;
  }
}

inline void AllReduceIndexedSlices(const WorkerEnv& env) {
  auto s = env.strategy();
  auto r = s->run([](ReplicaContext& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    IndexedSlices slices(fill(DType::kFloat32, Shape{1, 2}, g + 1), constant({static_cast<std::int64_t>(g)}),
                         Shape{64, 2});
    return ctx.all_reduce(ReduceOp::kSum, slices);
  });
  for (const IndexedSlices& got : r.values()) {
    ASSERT_EQ(got.indices().num_elements(), env.replicas());
    for (int g = 0; g < env.replicas(); ++g) {
      EXPECT_EQ(got.indices().flat<std::int64_t>()[static_cast<std::size_t>(g)], g);
      EXPECT_EQ(got.values().flat<float>()[static_cast<std::size_t>(2 * g)], static_cast<float>(g + 1));
    }
  }
}

// A nest of IndexedSlices and dense tensors, mixed, across workers: each leaf
// as a single-process strategy of as many replicas reduces it (ragged rows).
inline void AllReduceNestsOfIndexedSlicesAndTensors(const WorkerEnv& env) {
  using Mixed = Nest<TensorOrSlices>;
  const auto value_of = [](int g) {
    std::vector<float> rows;
    std::vector<std::int64_t> idx;
    for (int k = 0; k <= g % 3; ++k) {
      rows.insert(rows.end(), {static_cast<float>(g), static_cast<float>(k)});
      idx.push_back((g + k) % 7);
    }
    const IndexedSlices sparse(constant(rows, Shape{g % 3 + 1, 2}), constant(idx, Shape{g % 3 + 1}), Shape{7, 2});
    return Mixed::dict({{"dense", fill(DType::kFloat32, Shape{3}, g)},
                        {"grads", Mixed::list({sparse, fill(DType::kInt64, Shape{2}, g)})}});
  };
  auto s = env.strategy();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
    auto got =
        s->run([&](ReplicaContext& ctx) { return ctx.all_reduce(op, value_of(ctx.replica_id_in_sync_group())); });
    auto reference = mirrored(env.replicas());
    auto want = reference->run(
        [&](ReplicaContext& ctx) { return ctx.all_reduce(op, value_of(ctx.replica_id_in_sync_group())); });
    for (const Mixed& g : got.values()) {
      EXPECT_EQ(std::get<IndexedSlices>(g["grads"][0].leaf()), std::get<IndexedSlices>(want[0]["grads"][0].leaf()));
      EXPECT_TRUE(identical(std::get<Tensor>(g["grads"][1].leaf()), std::get<Tensor>(want[0]["grads"][1].leaf())));
      EXPECT_TRUE(identical(std::get<Tensor>(g["dense"].leaf()), std::get<Tensor>(want[0]["dense"].leaf())));
    }
  }
}

// Per-replica IndexedSlices in the cross-replica context, across workers:
// every replica's slices in replica order (SUM), the values divided (MEAN).
inline void CrossReplicaIndexedSlicesAcrossWorkers(const WorkerEnv& env) {
  auto s = env.strategy();
  const auto slices_of = [](int g) {
    return IndexedSlices(fill(DType::kFloat32, Shape{g % 2 + 1, 2}, g + 1),
                         constant(std::vector<std::int64_t>(static_cast<std::size_t>(g % 2 + 1), g), Shape{g % 2 + 1}),
                         Shape{64, 2});
  };
  const PerReplica<IndexedSlices> mine =
      s->run([&](ReplicaContext& ctx) { return slices_of(ctx.replica_id_in_sync_group()); });
  std::vector<float> values;
  std::vector<std::int64_t> indices;
  for (int g = 0; g < env.replicas(); ++g) {
    for (int k = 0; k <= g % 2; ++k) {
      values.insert(values.end(), {static_cast<float>(g + 1), static_cast<float>(g + 1)});
      indices.push_back(g);
    }
  }
  const auto rows = static_cast<std::int64_t>(indices.size());
  const IndexedSlices sum = s->reduce(ReduceOp::kSum, mine);
  EXPECT_EQ(sum.values(), constant(values, Shape{rows, 2}));
  EXPECT_EQ(sum.indices(), constant(indices, Shape{rows}));
  const Mirrored<IndexedSlices> mean = s->extended().reduce_to(ReduceOp::kMean, mine, Destinations("CPU:0"));
  for (float& v : values) v /= static_cast<float>(env.replicas());
  EXPECT_EQ(mean.primary().values(), constant(values, Shape{rows, 2}));
  const auto batch = s->extended().batch_reduce_to(ReduceOp::kSum, {{mine, Destinations("CPU:0")}});
  EXPECT_EQ(batch.at(0).primary(), sum);
  // MIN is refused on every worker, and the strategy stays usable.
  EXPECT_EQ(error_kind([&] { s->reduce(ReduceOp::kMin, mine); }), "InvalidArgumentError");
  EXPECT_EQ(s->reduce(ReduceOp::kSum, mine), sum);
}

// A value that is not distributed is one value per worker under several
// workers (each worker's own, reduced across the workers, as TensorFlow
// does: two workers holding 1.0 give 2.0), and one value for the whole group
// with one worker (SUM refused). A shape that differs between workers fails
// every worker alike, and the strategy stays usable.
inline void NonDistributedValuesAreOnePerWorker(const WorkerEnv& env) {
  auto s = env.strategy();
  const auto w = static_cast<float>(env.workers);
  const Tensor mine = constant({static_cast<float>(env.worker), 1.f});
  if (env.workers == 1) {
    EXPECT_EQ(error_kind([&] { s->reduce(ReduceOp::kSum, mine, std::nullopt); }), "InvalidArgumentError");
    EXPECT_EQ(s->reduce(ReduceOp::kMean, mine, std::nullopt), mine);
    return;
  }
  EXPECT_EQ(s->reduce(ReduceOp::kSum, mine, std::nullopt), constant({w * (w - 1) / 2, w}));
  EXPECT_EQ(s->reduce(ReduceOp::kMean, mine, std::nullopt), constant({(w - 1) / 2, 1.f}));
  EXPECT_EQ(s->reduce(ReduceOp::kMax, mine, std::nullopt), constant({w - 1, 1.f}));
  const Mirrored<Tensor> to = s->extended().reduce_to(ReduceOp::kSum, constant(1.f), Destinations("CPU:0"));
  EXPECT_EQ(to.primary(), constant(w));
  const auto batch = s->extended().batch_reduce_to(
      ReduceOp::kSum, {{constant(1.f), Destinations("CPU:0")}, {constant(std::int64_t{2}), Destinations("CPU:0")}});
  EXPECT_EQ(batch.at(0).primary(), constant(w));
  EXPECT_EQ(batch.at(1).primary(), constant(static_cast<std::int64_t>(2 * env.workers)));
  // Integers: an exact MEAN over the workers, truncated.
  EXPECT_EQ(s->reduce(ReduceOp::kMean, constant(env.worker == 0 ? 1 : 0), std::nullopt), constant(0));
  std::string message;
  const std::string kind = error_kind(
      [&] {
        s->reduce(ReduceOp::kSum, env.worker == env.workers - 1 ? constant({1.f, 2.f, 3.f}) : constant({1.f, 2.f}),
                  std::nullopt);
      },
      &message);
  EXPECT_EQ(kind, "InvalidArgumentError") << message;
  EXPECT_NE(message.find("worker"), std::string::npos) << message;
  EXPECT_EQ(s->reduce(ReduceOp::kSum, constant(1.f), std::nullopt), constant(w));
}

inline void AllGatherRaggedNested(const WorkerEnv& env) {
  auto s = env.strategy();
  for (int axis : {0, 1}) {
    auto value = [axis](int g) {
      const Shape a = axis == 0 ? Shape{g + 1, 2} : Shape{2, g + 1};
      const Shape b = axis == 0 ? Shape{g % 2 + 1, 3} : Shape{3, g % 2 + 1};
      return Nest<Tensor>::tuple({fill(DType::kInt32, a, g), fill(DType::kFloat64, b, -g)});
    };
    auto r = s->run([&](ReplicaContext& ctx) { return ctx.all_gather(value(ctx.replica_id_in_sync_group()), axis); });
    const auto want = mirrored(env.replicas())->run([&](ReplicaContext& ctx) {
      return ctx.all_gather(value(ctx.replica_id_in_sync_group()), axis);
    });
    for (int i = 0; i < env.local_replicas; ++i) {
      const auto got_leaves = r.values()[static_cast<std::size_t>(i)].flatten();
      const auto want_leaves = want.values()[0].flatten();
      for (std::size_t k = 0; k < got_leaves.size(); ++k) {
        EXPECT_TRUE(identical(got_leaves[k], want_leaves[k]))
            << "axis " << axis << " leaf " << k << ": got " << got_leaves[k].repr() << ", want "
            << want_leaves[k].repr();
      }
    }
  }
}

// all_gather of empty values whose sizes along the axis are near 2^63: one
// replica's own size, taken once per replica, passes int64 while the total
// fits, and every replica of every worker gathers; past the limit in total,
// every replica raises the same error at once. (Before, that one replica
// raised the overflow alone, a valid total included, and the others failed
// with another error: it had returned without the collective.)
inline void AllGatherSizesNearTheLimitDecideAlike(const WorkerEnv& env) {
  auto s = env.strategy();
  const std::int64_t huge = std::int64_t{1} << 62;
  for (const int huge_replicas : {1, 2}) {
    auto r = s->run([&](ReplicaContext& ctx) {
      const std::int64_t along = ctx.replica_id_in_sync_group() < huge_replicas ? huge : 1;
      try {
        return ctx.all_gather(fill(DType::kFloat32, Shape{0, along}, 0), 1).shape().to_string();
      } catch (const InvalidArgumentError& e) {
        return std::string(e.what());
      }
    });
    const std::int64_t others = env.replicas() - huge_replicas;
    const std::string want = huge_replicas == 1 ? Shape{0, huge + others}.to_string()
                                                : "the sizes along axis 1 add up to more than 2^63 - 1";
    for (const std::string& got : r.values()) {
      EXPECT_NE(got.find(want), std::string::npos) << huge_replicas << " huge value(s): " << got;
    }
  }
}

// ReplicaContext::broadcast from every replica of the cluster: a lone value
// below and past the 4 KiB from which a worker's replicas share one result,
// and a nest of two dtypes; then replicas naming different roots fail alike
// everywhere, and the strategy goes on.
inline void ReplicaBroadcastFromEveryRoot(const WorkerEnv& env) {
  auto s = env.strategy();
  for (int root = 0; root < env.replicas(); ++root) {
    for (const std::int64_t count : {3, 20000}) {
      expect_same_as_single_process(
          env, *s,
          [root, count](ReplicaContext& ctx, int g) {
            return ctx.broadcast(iota(DType::kFloat32, Shape{count}, 100.0 * g, 1), root);
          },
          "broadcast of " + std::to_string(count) + " from replica " + std::to_string(root));
    }
    auto r = s->run([root](ReplicaContext& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      return ctx.broadcast(
          Nest<Tensor>::list({fill(DType::kInt64, Shape{4}, g), fill(DType::kFloat64, Shape{2000}, -g)}), root);
    });
    for (const Nest<Tensor>& got : r.values()) {
      EXPECT_EQ(got[0].leaf(), fill(DType::kInt64, Shape{4}, root));
      EXPECT_EQ(got[1].leaf(), fill(DType::kFloat64, Shape{2000}, -root));
    }
  }
  if (env.replicas() > 1) {
    const std::string msg = expect_throw<InvalidArgumentError>([&] {
      s->run([&](ReplicaContext& ctx) {
        ctx.broadcast(constant(1.f), ctx.replica_id_in_sync_group() == env.replicas() - 1 ? 1 : 0);
      });
    });
    EXPECT_NE(msg.find("the replicas passed different root replica"), std::string::npos) << msg;
  }
  auto after = s->run([](ReplicaContext& ctx) { return ctx.broadcast(constant(2.f), 0); });
  for (const Tensor& t : after.values()) EXPECT_EQ(t, constant(2.f));
}

inline void MergeCallOncePerWorkerAndReduceToAcrossWorkers(const WorkerEnv& env) {
  auto s = env.strategy();
  std::atomic<int> merge_fn_runs{0};
  auto r = s->run([&](ReplicaContext& ctx) {
    const Tensor mine = fill(DType::kFloat32, Shape{2}, ctx.replica_id_in_sync_group() + 1);
    return ctx.merge_call(
        [&](Strategy& strategy, const PerReplica<Tensor>& values) {
          ++merge_fn_runs;
          EXPECT_EQ(values.size(), static_cast<std::size_t>(strategy.num_local_replicas()));
          // reduce_to in merge_fn reduces across every worker's replicas.
          auto summed = strategy.extended().reduce_to(ReduceOp::kSum, values, values);
          auto batch = strategy.extended().batch_reduce_to(ReduceOp::kMean, {{values, values}, {values, values}});
          EXPECT_EQ(batch.size(), 2u);
          return std::make_pair(summed, batch[1]);
        },
        mine);
  });
  EXPECT_EQ(merge_fn_runs.load(), 1);
  const float n = static_cast<float>(env.replicas());
  for (const auto& [sum, mean] : r.values()) {
    EXPECT_EQ(sum.flat<float>()[0], n * (n + 1) / 2);
    EXPECT_EQ(mean.flat<float>()[1], (n + 1) / 2);
  }
  // Workers may run merge functions of different types (as in TensorFlow):
  // only the call is checked across workers. A large broadcast_to in it is
  // copied by the worker's paused replicas too.
  const Tensor big = iota(DType::kInt32, Shape{(1 << 18) + 3}, env.worker);
  const auto own = [&big](Strategy& strategy, const PerReplica<int>&) { return strategy.extended().broadcast_to(big); };
  const auto other = [&big](Strategy& strategy, const PerReplica<int>& ids) {
    EXPECT_EQ(ids.size(), static_cast<std::size_t>(strategy.num_local_replicas()));
    return strategy.extended().broadcast_to(big);
  };
  const auto copies = s->run([&](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return env.worker == 0 ? ctx.merge_call(own, id) : ctx.merge_call(other, id);
  });
  for (const Tensor& t : copies.values()) {
    EXPECT_EQ(t, big);
    // Shared only on big's own device (TensorFlow's identity), copied elsewhere.
    EXPECT_EQ(t.raw_data() == big.raw_data(), t.device() == big.device()) << t.device();
  }
}

inline void StrategyReduceGatherAndBroadcastTo(const WorkerEnv& env) {
  auto s = env.strategy();
  auto r = s->run([](ReplicaContext& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    return std::make_pair(fill(DType::kFloat32, Shape{3}, g + 1), iota(DType::kInt64, Shape{g + 1, 2}, 10 * g));
  });
  std::vector<Tensor> equal, ragged;
  for (const auto& [a, b] : r.values()) {
    equal.push_back(a);
    ragged.push_back(b);
  }
  const PerReplica<Tensor> pe(equal), pr(ragged);
  const int n = env.replicas();
  EXPECT_EQ(s->reduce(ReduceOp::kSum, pe, std::nullopt).flat<float>()[2], static_cast<float>(n * (n + 1) / 2));
  // Cross-replica results are the caller's own: writable (unlike all_reduce's in a replica).
  EXPECT_FALSE(s->reduce(ReduceOp::kSum, pe, std::nullopt).is_read_only());
  EXPECT_EQ(s->reduce(ReduceOp::kMax, pe, std::nullopt).flat<float>()[0], static_cast<float>(n));
  // A ragged batch: the mean of every element of every replica.
  const Tensor mean = s->reduce(ReduceOp::kSum, pr, 0);
  const Tensor gathered = s->gather(pr, 0);
  std::int64_t rows = 0, total = 0;
  std::vector<std::int64_t> want;
  for (int g = 0; g < n; ++g) {
    for (int k = 0; k < 2 * (g + 1); ++k) want.push_back(10 * g + k);
    rows += g + 1;
  }
  for (std::int64_t v : want) total += v;
  ASSERT_EQ(gathered.shape(), (Shape{rows, 2}));
  for (std::size_t k = 0; k < want.size(); ++k) EXPECT_EQ(gathered.flat<std::int64_t>()[k], want[k]) << k;
  std::int64_t col_sum = 0;
  for (std::size_t k = 0; k < want.size(); k += 2) col_sum += want[k];
  EXPECT_EQ(mean.flat<std::int64_t>()[0], col_sum);
  EXPECT_EQ(s->reduce(ReduceOp::kSum, pr, std::vector<int>{0, 1}).scalar<std::int64_t>(), total);
  // broadcast_to and experimental_local_results stay on this worker.
  const Mirrored<Tensor> copies = s->extended().broadcast_to(constant({7}));
  EXPECT_EQ(copies.size(), static_cast<std::size_t>(env.local_replicas));
}

// ---- failures: the same error on every worker, never a hang --------------------------

// Catches what `f` throws; "" if nothing.

inline void MismatchedCollectivesFailEverywhere(const WorkerEnv& env) {
  if (env.replicas() < 2) return;
  auto s = env.strategy();
  // The last replica calls `odd`, every other replica `usual`. With one local
  // replica per worker, a merge_call (local to each worker) meets a
  // collective of another worker: it must fail there, not at a later one.
  const std::pair<Kind, Kind> cases[] = {
      {Kind::kAllReduce, Kind::kAllGather}, {Kind::kMergeCall, Kind::kAllReduce}, {Kind::kAllGather, Kind::kMergeCall}};
  for (const auto& [usual, odd] : cases) {
    SCOPED_TRACE("the last replica calls collective " + std::to_string(static_cast<int>(odd)) + ", the others " +
                 std::to_string(static_cast<int>(usual)));
    std::string message;
    const std::string kind = error_kind(
        [&] {
          s->run([&](ReplicaContext& ctx) {
            call(ctx, ctx.replica_id_in_sync_group() == env.replicas() - 1 ? odd : usual, DType::kFloat32, false);
          });
        },
        &message);
    EXPECT_EQ(kind, "FailedPreconditionError") << message;
    EXPECT_NE(message.find("Collective mismatch"), std::string::npos) << message;
    // Found at the call itself: the message names both collectives.
    for (const Kind k : {usual, odd}) {
      const char* name = k == Kind::kAllReduce ? "all_reduce" : k == Kind::kAllGather ? "all_gather" : "merge_call";
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
    // The strategy is still usable: nothing was left in flight.
    auto r = s->run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(1)); });
    EXPECT_EQ(r.values()[0].scalar<std::int32_t>(), env.replicas());
  }
}

inline void MismatchedShapesFailEverywhere(const WorkerEnv& env) {
  if (env.replicas() < 2) return;
  auto s = env.strategy();
  std::string message;
  const std::string kind = error_kind(
      [&] {
        s->run([&](ReplicaContext& ctx) {
          const bool last = ctx.replica_id_in_sync_group() == env.replicas() - 1;
          ctx.all_reduce(ReduceOp::kSum, fill(DType::kFloat32, Shape{last ? 3 : 2}, 1));
        });
      },
      &message);
  EXPECT_EQ(kind, "InvalidArgumentError") << message;
  EXPECT_NE(message.find("different shapes"), std::string::npos) << message;
  // Cross-replica: a worker whose value has another shape fails every worker's reduce.
  if (env.workers > 1) {
    const int n = s->num_local_replicas();
    std::vector<Tensor> values(static_cast<std::size_t>(n),
                               fill(DType::kFloat32, Shape{env.worker == env.workers - 1 ? 3 : 2}, 1));
    const std::string cross =
        error_kind([&] { s->reduce(ReduceOp::kSum, PerReplica<Tensor>(values), std::nullopt); }, &message);
    EXPECT_EQ(cross, "InvalidArgumentError") << message;
    EXPECT_NE(message.find("worker"), std::string::npos) << message;
  }
}

// A reduce_to inside merge_fn whose values disagree between workers (or
// between one worker's replicas) fails every worker's merge_fn alike, as the
// same reduce_to outside merge_call does: the workers' link stays usable.
// (Found by distribute-soak: the link used to close, so every later run
// failed with this error.)
inline void MergeFnMismatchFailsAlikeAndLeavesTheStrategyUsable(const WorkerEnv& env) {
  auto s = env.strategy();
  for (const bool within_a_worker : {false, true}) {
    if (within_a_worker ? env.local_replicas < 2 : env.workers < 2) continue;
    std::string message;
    const std::string kind = error_kind(
        [&] {
          s->run([&](ReplicaContext& ctx) {
            const int g = ctx.replica_id_in_sync_group();
            const bool odd_one =
                within_a_worker ? ctx.local_replica_id() == env.local_replicas - 1 : env.worker == env.workers - 1;
            const Tensor value = fill(DType::kFloat32, Shape{odd_one ? 3 : 2}, g);
            ctx.merge_call(
                [](Strategy& strategy, const PerReplica<Tensor>& v) {
                  return strategy.extended().reduce_to(ReduceOp::kSum, v, v);
                },
                value);
          });
        },
        &message);
    // The replica whose merge_fn ran raised the reduce_to's error; run rethrows it.
    EXPECT_EQ(kind, "InvalidArgumentError") << message;
    EXPECT_NE(message.find("reduce_to"), std::string::npos) << message;
    // Usable: the next run computes the right sum on every worker.
    const auto sums = s->run(
        [](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(ctx.replica_id_in_sync_group())); });
    const int n = env.replicas();
    for (const Tensor& t : s->experimental_local_results(sums)) EXPECT_EQ(t.scalar<int>(), n * (n - 1) / 2);
  }
}

// A merge_fn that throws on one worker only (nothing agreed between workers)
// still aborts the others at once and closes the link, as a replica that
// throws does: the agreed-error path above must not take it for one.
inline void MergeFnThrowingOnOneWorkerAbortsTheOthers(const WorkerEnv& env) {
  if (env.workers < 2) return;
  auto s = env.strategy();
  const int thrower = env.workers - 1;
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  const std::string kind = error_kind(
      [&] {
        s->run([&](ReplicaContext& ctx) {
          ctx.merge_call(
              [&](Strategy& strategy, const PerReplica<Tensor>& v) {
                if (env.worker == thrower) throw std::runtime_error("boom in the last worker's merge_fn");
                return strategy.extended().reduce_to(ReduceOp::kSum, v, v);
              },
              constant(1.f));
        });
      },
      &message);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("boom in the last worker's merge_fn"), std::string::npos) << message;
  EXPECT_EQ(kind, env.worker == thrower ? "std::exception" : "AbortedError") << message;
  EXPECT_LT(seconds, 10.0) << "the failure took " << seconds << " s to reach worker " << env.worker;
  const std::string later =
      error_kind([&] { s->run([](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::kSum, constant(1)); }); });
  EXPECT_FALSE(later.empty()) << "the link should be closed";
}

inline void ReplicaThrowsAbortsEveryWorker(const WorkerEnv& env) {
  if (env.replicas() < 2) return;
  auto s = env.strategy();
  const int thrower = env.replicas() - 1;
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  const std::string kind = error_kind(
      [&] {
        s->run([&](ReplicaContext& ctx) {
          if (ctx.replica_id_in_sync_group() == thrower) throw std::runtime_error("boom on the last replica");
          for (int k = 0; k < 3; ++k) ctx.all_reduce(ReduceOp::kSum, constant({1.f}));
        });
      },
      &message);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("boom on the last replica"), std::string::npos) << message;
  if (env.worker == thrower / env.local_replicas) {
    EXPECT_EQ(kind, "std::exception");  // the thrower's own exception
  } else {
    EXPECT_EQ(kind, "AbortedError") << message;
    EXPECT_NE(message.find("Replica " + std::to_string(thrower)), std::string::npos) << message;
  }
  EXPECT_LT(seconds, 10.0) << "the failure took " << seconds << " s to reach worker " << env.worker;
  // The link between the workers is broken for good: later collectives fail at
  // once. (One worker has no link: it recovers, as MirroredStrategy does.)
  const std::string later =
      error_kind([&] { s->run([](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::kSum, constant(1)); }); });
  EXPECT_EQ(later.empty(), env.workers == 1) << later;
}

inline void LateWorkerTimesOutEverywhere(const WorkerEnv& env) {
  if (env.workers < 2) return;
  CommunicationOptions options;
  options.timeout = std::chrono::duration<double>(1.0);
  auto s = env.strategy(options);
  const bool late = env.worker == env.workers - 1;
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  const std::string kind = error_kind(
      [&] {
        s->run([&](ReplicaContext& ctx) {
          if (late) std::this_thread::sleep_for(std::chrono::seconds(3));
          ctx.all_reduce(ReduceOp::kSum, constant({1.f}));
        });
      },
      &message);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (late && kind.empty()) {
    // The others' inputs had all arrived (MPI delivers small messages
    // eagerly), so the late worker may finish this collective; its next one
    // then hears of the others' timeout.
    const std::string next = error_kind(
        [&] { s->run([](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::kSum, constant({1.f})); }); }, &message);
    EXPECT_EQ(next, "DeadlineExceededError") << message;
  } else {
    EXPECT_EQ(kind, "DeadlineExceededError") << message;
  }
  EXPECT_NE(message.find("timed out"), std::string::npos) << message;
  if (!late) {
    EXPECT_LT(seconds, 1.0 + 5.0) << message;
  }
}

// A per-call timeout bounds a cross-replica call across workers, the
// workers' agreement included: a strategy without a timeout, one worker
// late, and reduce_to / batch_reduce_to with a timeout of their own fail on
// time (the agreement used the strategy's options only, and waited for ever).
// The link between the workers is failed after (a timeout closes it), so one
// call per case.
inline void expect_per_call_timeout_bounds_agreement(const WorkerEnv& env, bool batch) {
  if (env.workers < 2) return;
  auto s = env.make(env.local_replicas, {.timeout = std::chrono::duration<double>(0)});
  const PerReplica<Tensor> value = s->run([](ReplicaContext&) { return constant(1.f); });
  const bool late = env.worker == env.workers - 1;
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const CommunicationOptions per_call{.timeout = std::chrono::duration<double>(0.3)};
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  const std::string kind = error_kind(
      [&] {
        if (batch) {
          s->extended().batch_reduce_to(ReduceOp::kSum, {{value, Destinations("CPU:0")}}, per_call);
        } else {
          s->extended().reduce_to(ReduceOp::kSum, value, Destinations("CPU:0"), per_call);
        }
      },
      &message);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(kind, "DeadlineExceededError") << message;
  EXPECT_NE(message.find("timed out"), std::string::npos) << message;
  if (!late) {
    EXPECT_LT(seconds, 0.3 + 1.0) << message;
  }
}
inline void APerCallTimeoutBoundsReduceToAcrossWorkers(const WorkerEnv& env) {
  expect_per_call_timeout_bounds_agreement(env, false);
}
inline void APerCallTimeoutBoundsBatchReduceToAcrossWorkers(const WorkerEnv& env) {
  expect_per_call_timeout_bounds_agreement(env, true);
}

inline void UnequalLocalReplicaCountsAreRejected(const WorkerEnv& env) {
  if (env.workers < 2) return;
  std::string message;
  CommunicationOptions options;
  options.timeout = kTestTimeout;
  const std::string kind =
      error_kind([&] { env.make(env.local_replicas + (env.worker == env.workers - 1 ? 1 : 0), options); }, &message);
  EXPECT_EQ(kind, "InvalidArgumentError") << message;
  EXPECT_NE(message.find("same number of local replicas"), std::string::npos) << message;
}

// A worker whose own arguments are bad (no local replica; a negative
// bytes_per_pack) still meets the others when the strategy is created: it
// raises its error, and every other worker the same kind of error naming
// it, at once rather than at the timeout. The workers can go on.
inline void AWorkerWithBadArgumentsFailsEveryWorkerAtOnce(const WorkerEnv& env) {
  if (env.workers < 2) return;
  const int culprit = env.workers - 1;
  // The culprit's bad count, bad bytes_per_pack, or bad timeout (with which
  // it meets the others under the environment's timeout, here none).
  for (const std::string bad : {"at least one local replica", "bytes_per_pack", "timeout"}) {
    CommunicationOptions options;
    options.timeout = kTestTimeout;
    int local = env.local_replicas;
    if (env.worker == culprit) {
      if (bad == "bytes_per_pack") options.bytes_per_pack = -1;
      if (bad == "timeout") options.timeout = std::chrono::duration<double>(-1);
      if (bad == "at least one local replica") local = 0;
    }
    std::string message;
    const auto start = std::chrono::steady_clock::now();
    const std::string kind = error_kind([&] { env.make(local, options); }, &message);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(kind, "InvalidArgumentError") << message;
    EXPECT_NE(message.find(bad), std::string::npos) << message;
    if (env.worker != culprit) {
      EXPECT_NE(message.find("worker " + std::to_string(culprit) + " could not create its strategy"), std::string::npos)
          << message;
    }
    EXPECT_LT(seconds, 10.0) << message;  // the timeout is 20 s
  }
  // Nothing was left in flight: the next creation meets as usual.
  auto s = env.strategy();
  EXPECT_EQ(s->num_replicas_in_sync(), env.replicas());
}

// A worker whose strategy fails after its arguments passed their checks
// (here no thread for a replica, injected into its replica pool) still
// meets the others: it raises its own error, and every other worker an
// InternalError naming it, at once rather than at the timeout (before, the
// others went on and waited in their first collective). The workers can go on.
inline void AWorkerWhoseStrategyFailsLateFailsEveryWorkerAtOnce(const WorkerEnv& env) {
  if (env.workers < 2 || env.local_replicas < 2) return;  // a pool of one replica starts no thread
  const int culprit = env.workers - 1;
  if (env.worker == culprit) internal::fail_thread_starts_for_testing(0);
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  const std::string kind = error_kind([&] { env.strategy(); }, &message);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  internal::fail_thread_starts_for_testing(-1);
  EXPECT_EQ(kind, env.worker == culprit ? "std::exception" : "InternalError") << message;
  EXPECT_NE(message.find("could not start a replica thread (injected)"), std::string::npos) << message;
  if (env.worker != culprit) {
    EXPECT_NE(message.find("worker " + std::to_string(culprit) + " could not create its strategy"), std::string::npos)
        << message;
  }
  EXPECT_LT(seconds, 10.0) << message;  // the timeout is 20 s
  auto s = env.strategy();
  EXPECT_EQ(s->num_replicas_in_sync(), env.replicas());
}

// Variables: every worker starts from worker 0's initial value, replica
// writes aggregate over every worker's replicas, and a SyncOnReadVariable's
// cross-replica read reduces across workers.
// Every replica assigning the same value to a SUM-aggregated
// MirroredVariable in a replica context: TensorFlow takes it as one value and
// refuses to SUM it; it never adds it N times (2 replicas assigning 5.0 gave
// 10.0). Refused on every worker alike; values that differ are summed; the
// strategy stays usable.
inline void SumAssignOfOneValueIsRefused(const WorkerEnv& env) {
  auto s = env.strategy();
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(0.f), VariableOptions{.name = "w", .aggregation = VariableAggregation::kSum});
  }
  if (env.replicas() > 1) {
    std::string message;
    const std::string kind = error_kind([&] { s->run([&](ReplicaContext&) { w->assign(constant(5.f)); }); }, &message);
    EXPECT_EQ(kind, "InvalidArgumentError") << message;
    EXPECT_NE(message.find("A non-DistributedValues value 5.0 cannot be reduced with the given reduce op SUM."),
              std::string::npos)
        << message;
    for (const Tensor& c : w->values()) EXPECT_EQ(c.scalar<float>(), 0.f);  // nothing written
  }
  // Per-replica values: their SUM, as TensorFlow's per-replica tensors.
  s->run([&](ReplicaContext& ctx) { w->assign(constant(static_cast<float>(ctx.replica_id_in_sync_group() + 1))); });
  const auto n = static_cast<float>(env.replicas());
  for (const Tensor& c : w->values()) EXPECT_EQ(c.scalar<float>(), n * (n + 1) / 2);
  // One replica: its value is the SUM.
  if (env.replicas() == 1) {
    s->run([&](ReplicaContext&) { w->assign(constant(5.f)); });
    EXPECT_EQ(w->values()[0].scalar<float>(), 5.f);
  }
}

inline void VariablesStartFromWorkerZeroAndAggregateAcrossWorkers(const WorkerEnv& env) {
  auto s = env.strategy();
  const float n = static_cast<float>(env.replicas());
  std::optional<MirroredVariable> sum, mean, first;
  std::optional<SyncOnReadVariable> seen;
  {
    auto scope = s->scope();
    // Each worker offers its rank: all must end up with worker 0's.
    const Tensor offered = constant(static_cast<float>(env.worker));
    sum.emplace(offered, VariableOptions{.name = "sum", .aggregation = VariableAggregation::kSum});
    mean.emplace(offered, VariableOptions{.name = "mean", .aggregation = VariableAggregation::kMean});
    first.emplace(offered, VariableOptions{.name = "first", .aggregation = VariableAggregation::kOnlyFirstReplica});
    seen.emplace(constant(0.f), VariableOptions{.name = "seen", .aggregation = VariableAggregation::kSum});
  }
  for (const auto* v : {&*sum, &*mean, &*first}) {
    for (const Tensor& c : v->values()) EXPECT_EQ(c.scalar<float>(), 0.f) << v->name();
  }
  s->run([&](ReplicaContext& ctx) {
    const Tensor mine = constant(static_cast<float>(ctx.replica_id_in_sync_group() + 1));
    sum->assign_add(mine);
    mean->assign_add(mine);
    first->assign(mine);  // global replica 0's value, on every worker
    seen->assign_add(mine);
  });
  for (const Tensor& c : sum->values()) EXPECT_EQ(c.scalar<float>(), n * (n + 1) / 2);
  for (const Tensor& c : mean->values()) EXPECT_EQ(c.scalar<float>(), (n + 1) / 2);
  for (const Tensor& c : first->values()) EXPECT_EQ(c.scalar<float>(), 1.f);
  EXPECT_EQ(seen->read_value().scalar<float>(), n * (n + 1) / 2);  // a collective: every worker reads
  // extended().update in a replica context: one merge_call per worker, each
  // component written once with its own replica's argument.
  s->run([&](ReplicaContext& ctx) {
    s->extended().update(
        *first, [](Tensor& c, const Tensor& x) { c.mutable_flat<float>()[0] += x.scalar<float>(); },
        constant(static_cast<float>(ctx.replica_id_in_sync_group())));
  });
  for (int i = 0; i < s->num_local_replicas(); ++i) {
    EXPECT_EQ(first->values()[static_cast<std::size_t>(i)].scalar<float>(), 1.f + s->first_replica_id() + i);
  }
  // Workers creating variables of different shapes fail alike instead of waiting.
  if (env.workers > 1) {
    std::string message;
    const std::string kind = error_kind(
        [&] {
          auto scope = s->scope();
          MirroredVariable bad(fill(DType::kFloat32, Shape{env.worker == 0 ? 2 : 3}, 0));
        },
        &message);
    EXPECT_EQ(kind, "InvalidArgumentError") << message;
    EXPECT_NE(message.find("variable creation"), std::string::npos) << message;
    // A MEAN variable whose dtype is integer on the last worker only: the
    // dtypes differ, found by every worker (the MEAN check alone would fail
    // on the last worker and leave the others waiting).
    const std::string mean_kind = error_kind(
        [&] {
          auto scope = s->scope();
          const Tensor init = env.worker == env.workers - 1 ? constant(std::vector<int>{0, 0}, Shape{2})
                                                            : fill(DType::kFloat32, Shape{2}, 0);
          MirroredVariable bad(init, {.aggregation = VariableAggregation::kMean});
        },
        &message);
    EXPECT_EQ(mean_kind, "InvalidArgumentError") << "worker " << env.worker << ": " << message;
    EXPECT_NE(message.find("variable creation"), std::string::npos) << message;
    // Still in step: a variable made alike everywhere.
    auto scope = s->scope();
    MirroredVariable good(constant(1.f));
    EXPECT_EQ(good.values()[0], constant(1.f));
  }
}

// An optimizer step across workers equals the same step on one process with
// as many replicas: gradients summed over every worker's replicas, once.
inline void OptimizerStepsMatchTheSingleProcessStrategy(const WorkerEnv& env) {
  auto train = [&](Strategy& s) {
    std::optional<MirroredVariable> w;
    {
      auto scope = s.scope();
      w.emplace(constant({1.f, -2.f, 4.f}), VariableOptions{.name = "w"});
    }
    Adam adam({.learning_rate = 0.125});
    for (int step = 0; step < 3; ++step) {
      s.run([&](ReplicaContext& ctx) {
        const float g = static_cast<float>((ctx.replica_id_in_sync_group() + 1) * (step + 1));
        adam.apply_gradients({{constant({g, -g, 0.5f * g}), *w}}, {.bytes_per_pack = 4});
      });
    }
    EXPECT_EQ(adam.iterations(), 3);
    return w->values();
  };
  auto s = env.strategy();
  const std::vector<Tensor> got = train(*s);
  const std::vector<Tensor> want = train(*mirrored(env.replicas()));
  for (const Tensor& c : got) EXPECT_TRUE(identical(c, want[0])) << c.repr() << " vs " << want[0].repr();
}

// Input across workers: a global batch is split over every worker's replicas
// exactly as one process with as many replicas splits it, and pipelines that
// run dry at different steps end together.
inline void DatasetsSplitAcrossWorkersAndEndTogether(const WorkerEnv& env) {
  auto s = env.strategy();
  auto global_batches = [] {
    auto next = std::make_shared<int>(0);
    return BatchFn([next]() -> std::optional<Nest<Tensor>> {
      if (*next == 3) return std::nullopt;
      const std::int64_t rows = *next == 2 ? 4 : 7;  // the last batch is short
      return Nest<Tensor>(iota(DType::kInt32, Shape{rows}, 100 * (*next)++));
    });
  };
  auto reference = mirrored(env.replicas());
  DistributedDataset want = reference->experimental_distribute_dataset(global_batches(), 7);
  int steps = 0;
  for (const auto& got : s->experimental_distribute_dataset(global_batches(), 7)) {
    const auto expected = want.get_next();
    ASSERT_TRUE(expected);
    for (int i = 0; i < s->num_local_replicas(); ++i) {
      EXPECT_EQ(got[static_cast<std::size_t>(i)].leaf(),
                (*expected)[static_cast<std::size_t>(s->first_replica_id() + i)].leaf())
          << "step " << steps << ", replica " << s->first_replica_id() + i;
    }
    ++steps;
  }
  EXPECT_EQ(steps, 3);
  // Worker w's pipeline has w + 1 per-replica batches per local replica: the
  // workers that run dry give empty batches until the last one is done.
  int pipeline_id = -1;
  DistributedDataset pipelines = s->distribute_datasets_from_function([&](const InputContext& ctx) {
    pipeline_id = ctx.input_pipeline_id();
    EXPECT_EQ(ctx.num_input_pipelines(), env.workers);
    auto left = std::make_shared<int>((ctx.input_pipeline_id() + 1) * env.local_replicas);
    return BatchFn([left]() -> std::optional<Nest<Tensor>> {
      if (*left == 0) return std::nullopt;
      --*left;
      return Nest<Tensor>(constant({1.f, 2.f}));
    });
  });
  EXPECT_EQ(pipeline_id, env.worker);
  int pipeline_steps = 0;
  for (const auto& step : pipelines) {
    const std::int64_t rows = step[0].leaf().shape()[0];
    EXPECT_EQ(rows, pipeline_steps <= env.worker ? 2 : 0) << "step " << pipeline_steps;
    ++pipeline_steps;
  }
  EXPECT_EQ(pipeline_steps, env.workers);
}

// A bad batch found on one worker (before the workers exchange what they
// have) is raised by every worker instead of leaving the others waiting in
// the exchange: by that worker as it was raised, by the others naming it.
// The strategy and a new dataset go on.
inline void ABadBatchOnOneWorkerFailsEveryWorker(const WorkerEnv& env) {
  auto s = env.strategy();
  const int bad = env.workers - 1;
  // The last worker's second global batch has more rows than the global batch size.
  auto batches = [&] {
    auto next = std::make_shared<int>(0);
    return BatchFn([next, &env, bad]() -> std::optional<Nest<Tensor>> {
      const std::int64_t rows = env.worker == bad && *next == 1 ? 9 : 4;
      ++*next;
      return Nest<Tensor>(iota(DType::kInt32, Shape{rows}, 0));
    });
  };
  DistributedDataset dataset = s->experimental_distribute_dataset(batches(), 4);
  ASSERT_TRUE(dataset.get_next());
  try {
    dataset.get_next();
    ADD_FAILURE() << "worker " << env.worker << ": no error";
  } catch (const InvalidArgumentError& e) {
    const std::string said = e.message();
    EXPECT_NE(said.find("a batch has 9 rows, more than the global batch size 4"), std::string::npos) << said;
    if (env.worker != bad) {
      EXPECT_NE(said.find("on worker " + std::to_string(bad)), std::string::npos) << said;
    }
  }
  // A pipeline whose function gives worker 0 a scalar (no batch dimension).
  DistributedDataset pipelines = s->distribute_datasets_from_function([&](const InputContext& ctx) {
    const bool scalar = ctx.input_pipeline_id() == 0;
    return BatchFn([scalar]() -> std::optional<Nest<Tensor>> {
      return Nest<Tensor>(scalar ? constant(1.f) : constant({1.f, 2.f}));
    });
  });
  try {
    pipelines.get_next();
    ADD_FAILURE() << "worker " << env.worker << ": no error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(e.message().find("is a scalar"), std::string::npos) << e.message();
  }
  // The same bad batch read inside a merge_fn: every worker's merge_fn raises
  // it alike, so the workers' link stays usable (the reduce below crosses it).
  DistributedDataset in_merge = s->experimental_distribute_dataset(batches(), 4);
  ASSERT_TRUE(in_merge.get_next());
  std::string message;
  const std::string kind = error_kind(
      [&] { s->run([&](ReplicaContext& ctx) { ctx.merge_call([&](Strategy&) { in_merge.get_next(); }); }); }, &message);
  EXPECT_EQ(kind, "InvalidArgumentError") << message;
  EXPECT_NE(message.find("a batch has 9 rows"), std::string::npos) << message;
  // Global batches that differ between workers (the last worker's has 3
  // rows, the others' 4), found inside a merge_fn: the same.
  if (env.workers > 1) {
    DistributedDataset uneven = s->experimental_distribute_dataset(
        BatchFn([&env, bad]() -> std::optional<Nest<Tensor>> {
          return Nest<Tensor>(iota(DType::kInt32, Shape{env.worker == bad ? 3 : 4}, 0));
        }),
        4);
    const std::string differ = error_kind(
        [&] { s->run([&](ReplicaContext& ctx) { ctx.merge_call([&](Strategy&) { uneven.get_next(); }); }); }, &message);
    EXPECT_EQ(differ, "InvalidArgumentError") << message;
    EXPECT_NE(message.find("the workers' global batches differ"), std::string::npos) << message;
  }
  // Every worker is still in step: a new dataset, then a reduce across every replica.
  DistributedDataset good = s->experimental_distribute_dataset(batches(), 4);
  ASSERT_TRUE(good.get_next());
  const PerReplica<Tensor> ones = s->run([](ReplicaContext&) { return constant(1.f); });
  EXPECT_EQ(s->reduce(ReduceOp::kSum, ones, std::nullopt), constant(static_cast<float>(env.replicas())));
}

// distribute_datasets_from_function across workers: a dataset_fn that fails
// on one worker (a shard missing on its host), and a pipeline with no batch
// at all on one worker while the others have some, are raised by every
// worker, where the others used to wait for that one in their next exchange.
// The strategy goes on.
inline void APipelineThatFailsOnOneWorkerFailsEveryWorker(const WorkerEnv& env) {
  auto s = env.strategy();
  const int bad = env.workers - 1;
  std::string message;
  const std::string kind = error_kind(
      [&] {
        s->distribute_datasets_from_function([&](const InputContext& ctx) {
          if (ctx.input_pipeline_id() == bad) throw NotFoundError("no shard file on this host");
          return BatchFn([]() -> std::optional<Nest<Tensor>> { return Nest<Tensor>(constant({1.f})); });
        });
      },
      &message);
  EXPECT_EQ(kind, "NotFoundError") << "worker " << env.worker << ": " << message;
  EXPECT_NE(message.find("no shard file on this host"), std::string::npos) << message;
  if (env.worker != bad) {
    EXPECT_NE(message.find("on worker " + std::to_string(bad)), std::string::npos) << message;
  }
  if (env.workers > 1) {
    DistributedDataset dry = s->distribute_datasets_from_function([&](const InputContext& ctx) {
      const bool empty = ctx.input_pipeline_id() == bad;
      return BatchFn([empty]() -> std::optional<Nest<Tensor>> {
        if (empty) return std::nullopt;
        return Nest<Tensor>(constant({1.f, 2.f}));
      });
    });
    const std::string dry_kind = error_kind([&] { dry.get_next(); }, &message);
    EXPECT_EQ(dry_kind, "InvalidArgumentError") << "worker " << env.worker << ": " << message;
    EXPECT_NE(message.find("worker " + std::to_string(bad) + "'s dataset produced no batch at all"), std::string::npos)
        << message;
  }
  // Every worker is still in step: a reduce across every replica.
  const PerReplica<Tensor> ones = s->run([](ReplicaContext&) { return constant(1.f); });
  EXPECT_EQ(s->reduce(ReduceOp::kSum, ones, std::nullopt), constant(static_cast<float>(env.replicas())));
}

// Random collectives (testing/reference_model.h) across workers, bit for bit
// against the reference model: every worker draws the same case from the
// seed and feeds its own replicas' inputs.
inline void RandomCollectivesMatchTheReference(const WorkerEnv& env) {
  auto s = env.strategy();
  for (std::uint64_t seed = 20261130; seed < 20261130 + 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 gen(seed);
    const bool ragged = seed % 2 == 1;
    const RandomCase c = random_case(gen, env.replicas(), ragged);
    auto results = s->run([&](ReplicaContext& ctx) {
      const Nest<Tensor> mine = c.value_of(ctx.replica_id_in_sync_group());
      return ragged ? ctx.all_gather(mine, c.axis) : ctx.all_reduce(c.op, mine, {.bytes_per_pack = c.bytes_per_pack});
    });
    for (std::size_t i = 0; i < c.leaves(); ++i) {
      const Tensor want = ragged ? reference_gather(c.column(i), c.normalized)
                                 : reference_reduce_multi_worker(c.op, c.column(i), env.local_replicas);
      for (int r = 0; r < s->num_local_replicas(); ++r) {
        const Tensor got = results.values()[static_cast<std::size_t>(r)].flatten()[i];
        ASSERT_TRUE(bitwise_equal(got, want))
            << "replica " << s->first_replica_id() + r << ", leaf " << i << (ragged ? ", all_gather" : ", all_reduce ")
            << ": got " << got.repr() << ", want " << want.repr();
      }
    }
  }
  // An integer MEAN is exact across workers too: per-worker sums of 100s
  // would wrap in int8, the mean of all does not.
  const Tensor hundred = fill(DType::kInt8, Shape{3}, 100);
  const auto means = s->run([&](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kMean, hundred); });
  for (const Tensor& t : means.values()) EXPECT_EQ(t, hundred);
  std::vector<Tensor> locals(static_cast<std::size_t>(s->num_local_replicas()), hundred);
  EXPECT_EQ(s->reduce(ReduceOp::kMean, PerReplica<Tensor>(locals), std::nullopt), hundred);
  const Tensor flags = constant({true, false});
  std::vector<Tensor> mixed;
  for (int i = 0; i < s->num_local_replicas(); ++i) {
    mixed.push_back(s->first_replica_id() + i == 0 ? constant({true, true}) : flags);
  }
  EXPECT_EQ(s->reduce(ReduceOp::kMean, PerReplica<Tensor>(mixed), std::nullopt), flags);  // bool MEAN is AND
}

// Fault injection across workers (testing/faults.h): one replica of the
// cluster calls another collective, or passes another dtype or shape, or is
// slow, at a random step of a random program of all_reduce and all_gather.
// Every worker must raise the same documented error (these are found before
// data moves, so the strategy stays usable, docs/errors.md §6.1), and a
// correct step must follow. merge_call is in the programs: its merge_fn runs
// once per worker, but the call itself is checked across workers.
inline void InjectedFaultsFailAlikeEverywhere(const WorkerEnv& env) {
  auto s = env.strategy();
  for (std::uint64_t seed = 90210; seed < 90210 + 20; ++seed) {
    std::mt19937_64 gen(seed);
    std::vector<Kind> program(static_cast<std::size_t>(uniform(gen, 1, 5)));
    for (Kind& k : program) k = static_cast<Kind>(uniform(gen, 0, 2));
    const int faulty = uniform(gen, 0, env.replicas() - 1);
    const auto step = static_cast<std::size_t>(uniform(gen, 0, static_cast<int>(program.size()) - 1));
    auto fault = static_cast<Fault>(uniform(gen, 2, 5));  // the faults that keep the strategy usable
    // A merge_call has no dtype or shape to get wrong: it calls another collective instead.
    if ((fault == Fault::kOtherDtype || fault == Fault::kOtherShape) && program[step] == Kind::kMergeCall) {
      fault = Fault::kOtherCollective;
    }
    if (env.replicas() == 1) fault = Fault::kSlow;  // nobody to disagree with
    SCOPED_TRACE("seed " + std::to_string(seed) + ": replica " + std::to_string(faulty) + " " +
                 kFaultNames[static_cast<int>(fault)] + " at collective " + std::to_string(step) + " of " +
                 std::to_string(program.size()));
    std::string message;
    const std::string kind = error_kind(
        [&] {
          s->run([&](ReplicaContext& ctx) {
            const bool me = ctx.replica_id_in_sync_group() == faulty;
            for (std::size_t i = 0; i < program.size(); ++i) {
              if (me && i == step && fault != Fault::kSlow) {
                if (fault == Fault::kOtherCollective) {
                  call(ctx, static_cast<Kind>((static_cast<int>(program[i]) + 1) % 3), DType::kFloat32, false);
                } else {
                  call(ctx, program[i], fault == Fault::kOtherDtype ? DType::kInt32 : DType::kFloat32,
                       fault == Fault::kOtherShape);
                }
                continue;
              }
              if (me && i == step) std::this_thread::sleep_for(std::chrono::milliseconds(30));
              call(ctx, program[i], DType::kFloat32, false);
            }
          });
        },
        &message);
    const char* want = fault == Fault::kOtherCollective ? "FailedPreconditionError"
                       : fault == Fault::kSlow          ? ""
                                                        : "InvalidArgumentError";
    EXPECT_EQ(kind, want) << message;
    const auto after = s->run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(1.f)); });
    for (const Tensor& t : after.values()) ASSERT_EQ(t.scalar<float>(), static_cast<float>(env.replicas()));
  }
}

// Every case, for the harnesses' TEST macros.
#define DISTRIBUTE_MULTI_WORKER_CASES(X)                   \
  X(IdsDevicesAndSeedExample)                              \
  X(AllReduceEveryOpAndDtype)                              \
  X(AllReduceLargeNestedAndPacked)                         \
  X(AllReduceIndexedSlices)                                \
  X(AllReduceNestsOfIndexedSlicesAndTensors)               \
  X(CrossReplicaIndexedSlicesAcrossWorkers)                \
  X(NonDistributedValuesAreOnePerWorker)                   \
  X(SumAssignOfOneValueIsRefused)                          \
  X(AllGatherRaggedNested)                                 \
  X(AllGatherSizesNearTheLimitDecideAlike)                 \
  X(ReplicaBroadcastFromEveryRoot)                         \
  X(MergeCallOncePerWorkerAndReduceToAcrossWorkers)        \
  X(StrategyReduceGatherAndBroadcastTo)                    \
  X(MismatchedCollectivesFailEverywhere)                   \
  X(MismatchedShapesFailEverywhere)                        \
  X(MergeFnMismatchFailsAlikeAndLeavesTheStrategyUsable)   \
  X(MergeFnThrowingOnOneWorkerAbortsTheOthers)             \
  X(ReplicaThrowsAbortsEveryWorker)                        \
  X(LateWorkerTimesOutEverywhere)                          \
  X(APerCallTimeoutBoundsReduceToAcrossWorkers)            \
  X(APerCallTimeoutBoundsBatchReduceToAcrossWorkers)       \
  X(UnequalLocalReplicaCountsAreRejected)                  \
  X(AWorkerWithBadArgumentsFailsEveryWorkerAtOnce)         \
  X(AWorkerWhoseStrategyFailsLateFailsEveryWorkerAtOnce)   \
  X(VariablesStartFromWorkerZeroAndAggregateAcrossWorkers) \
  X(OptimizerStepsMatchTheSingleProcessStrategy)           \
  X(DatasetsSplitAcrossWorkersAndEndTogether)              \
  X(ABadBatchOnOneWorkerFailsEveryWorker)                  \
  X(APipelineThatFailsOnOneWorkerFailsEveryWorker)         \
  X(RandomCollectivesMatchTheReference)                    \
  X(InjectedFaultsFailAlikeEverywhere)

}  // namespace distribute::testing
