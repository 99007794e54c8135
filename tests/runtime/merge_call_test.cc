// merge_call: one merge_fn per step, PerReplica arguments, result fan-out,
// nested steps, and the mismatches TensorFlow does not detect.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>

#include "comm/threads/local_group.h"
#include "runtime/merge_call_other_file.h"
#include "runtime/mode.h"
#include "runtime/replica_channel.h"
#include "runtime/replica_pool.h"
#include "testing/shared_results.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

TEST(MergeCallTest, RunsOnceWithArgumentsGroupedInReplicaOrder) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    std::atomic<int> calls{0};
    auto r = s->run([&](ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      return ctx.merge_call(
          [&](Strategy& strategy, const PerReplica<int>& ids, const PerReplica<std::string>& names) {
            ++calls;
            EXPECT_EQ(&strategy, s.get());
            EXPECT_EQ(ids.size(), static_cast<std::size_t>(n));
            for (int k = 0; k < n; ++k) {
              EXPECT_EQ(ids[static_cast<std::size_t>(k)], k);
              EXPECT_EQ(names[static_cast<std::size_t>(k)], "r" + std::to_string(k));
            }
            int total = 0;
            for (int v : ids.values()) total += v;
            return total;  // not distributed: shared by every replica
          },
          id, "r" + std::to_string(id));
    });
    EXPECT_EQ(calls.load(), 1);
    for (int k = 0; k < n; ++k) EXPECT_EQ(r[static_cast<std::size_t>(k)], n * (n - 1) / 2);
  }
}

TEST(MergeCallTest, PerReplicaAndMirroredResultsGiveEachReplicaItsComponent) {
  auto s = testing::mirrored(3);
  auto r = s->run([](ReplicaContext& ctx) {
    auto [mine, same, shared] = ctx.merge_call(
        [](Strategy&, const PerReplica<int>& ids) {
          std::vector<int> doubled;
          for (int v : ids.values()) doubled.push_back(v * 2);
          return std::make_tuple(PerReplica<int>(doubled), Mirrored<int>(std::vector<int>{9, 9, 9}),
                                 std::string("all"));
        },
        ctx.replica_id_in_sync_group());
    EXPECT_EQ(same, 9);
    EXPECT_EQ(shared, "all");
    return mine;
  });
  EXPECT_EQ(r.values(), (std::vector<int>{0, 2, 4}));
}

TEST(MergeCallTest, ReduceToInsideMergeFnIsAnAllReduce) {
  auto s = testing::mirrored(4);
  auto r = s->run([](ReplicaContext& ctx) {
    Tensor grad = constant(static_cast<float>(ctx.replica_id_in_sync_group()));
    return ctx.merge_call(
        [](Strategy& strategy, const PerReplica<Tensor>& g) {
          return strategy.extended().reduce_to(ReduceOp::kMean, g, g);
        },
        grad);
  });
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(r[static_cast<std::size_t>(k)], constant(1.5f));
    EXPECT_EQ(r[static_cast<std::size_t>(k)].device(), s->devices()[static_cast<std::size_t>(k)]);
  }
}

// broadcast_to and reduce_to inside a merge_fn share large copies (from
// 128 KiB per destination for each helping replica) with the replicas
// paused in merge_call, split
// evenly by bytes whatever the number of destinations. Every copy must be
// whole when the call returns (merge_fn reads them), exact, and its own; the
// first destination on the source's own device is the source itself (its
// storage shared, as TensorFlow's identity on one device).
TEST(MergeCallTest, LargeCopiesSharedWithPausedReplicasAreExactAndDistinct) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    const std::vector<std::string>& devices = s->devices();
    const std::vector<std::string> three = {devices[0], devices.back(), devices[0]};
    const std::int64_t shared_from = (std::int64_t{128} << 10) * std::max(1, n - 1);  // on both sides of it
    for (const std::int64_t bytes : {shared_from - 1, shared_from, shared_from + 3, 3 * shared_from + 7}) {
      SCOPED_TRACE(std::to_string(n) + " replicas, " + std::to_string(bytes) + " bytes");
      Tensor source = Tensor::uninitialized(DType::kInt8, Shape{bytes});
      auto bytes_of = source.mutable_flat<std::int8_t>();
      for (std::int64_t i = 0; i < bytes; ++i)
        bytes_of[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(i % 251);
      auto r = s->run([&](ReplicaContext& ctx) {
        return ctx.merge_call(
            [&](Strategy& strategy, const PerReplica<Tensor>& mine) {
              const Mirrored<Tensor> all = strategy.extended().broadcast_to(source);
              const Mirrored<Tensor> few = strategy.extended().broadcast_to(source, Destinations::of_devices(three));
              const Mirrored<Tensor> one = strategy.extended().broadcast_to(source, Destinations(devices.back()));
              const Mirrored<Tensor> sum =
                  strategy.extended().reduce_to(ReduceOp::kSum, mine, Destinations::of_devices(devices));
              EXPECT_EQ(all.size(), devices.size());
              EXPECT_EQ(few.size(), 3u);
              EXPECT_EQ(one.size(), 1u);
              for (const auto* m : {&all, &few, &one}) {
                bool shared = false;
                for (const Tensor& t : m->values()) {
                  EXPECT_EQ(t, source);
                  const bool same = t.raw_data() == source.raw_data();
                  // Only the first destination on the source's device shares.
                  EXPECT_EQ(same, !shared && t.device() == source.device()) << t.device();
                  shared = shared || same;
                }
                EXPECT_EQ(shared, m != &one || n == 1) << "a destination on " << source.device();
              }
              for (std::size_t k = 0; k < few.size(); ++k) EXPECT_EQ(few.values()[k].device(), three[k]);
              // Every copy is its own: writing one changes no other.
              few.values()[2].mutable_flat<std::int8_t>()[static_cast<std::size_t>(bytes - 1)] = 1;
              EXPECT_EQ(few.values()[0].flat<std::int8_t>()[static_cast<std::size_t>(bytes - 1)],
                        static_cast<std::int8_t>((bytes - 1) % 251));
              EXPECT_EQ(source.flat<std::int8_t>()[static_cast<std::size_t>(bytes - 1)],
                        static_cast<std::int8_t>((bytes - 1) % 251));
              return sum;
            },
            source);
      });
      Tensor want = Tensor::uninitialized(DType::kInt8, Shape{bytes});
      auto want_of = want.mutable_flat<std::int8_t>();
      for (std::int64_t i = 0; i < bytes; ++i) {
        want_of[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(static_cast<std::uint8_t>((i % 251) * n));
      }
      for (int k = 0; k < n; ++k) {
        EXPECT_EQ(r[static_cast<std::size_t>(k)], want);
        EXPECT_EQ(r[static_cast<std::size_t>(k)].device(), devices[static_cast<std::size_t>(k)]);
      }
    }
  }
}

// Copies are shared with the paused replicas from 128 KiB per destination
// for each helping replica, not below; a value on one destination's device is
// that destination's result, so with N replicas N - 1 copies are made.
TEST(MergeCallTest, CopiesAreSharedFromTheThresholdOfTheReplicaCount) {
  for (int n : {2, 3, 4}) {
    auto s = testing::mirrored(n);
    const std::int64_t shared_from = (std::int64_t{128} << 10) * (n - 1);
    for (const std::int64_t bytes : {shared_from - 1, shared_from}) {
      SCOPED_TRACE(std::to_string(n) + " replicas, " + std::to_string(bytes) + " bytes");
      const std::uint64_t before = internal::shared_merge_tasks();
      s->run([&](ReplicaContext& ctx) {
        const Tensor mine = Tensor(DType::kInt8, Shape{bytes});
        const Tensor copy = ctx.merge_call(
            [](Strategy& strategy, const PerReplica<Tensor>& v) { return strategy.extended().broadcast_to(v[0]); },
            mine);
        EXPECT_EQ(copy.num_elements(), bytes);
        return 0;
      });
      EXPECT_EQ(internal::shared_merge_tasks() - before, bytes >= shared_from ? 1u : 0u);
    }
  }
}

// From 24 MiB per destination the shared copies use streaming stores, as the
// engine's broadcast: every byte arrives, whatever the alignment of the parts.
TEST(MergeCallTest, StreamedSharedCopiesAreExact) {
  auto s = testing::mirrored(2);
  const std::int64_t bytes = (std::int64_t{24} << 20) + 5;
  Tensor source = Tensor::uninitialized(DType::kInt8, Shape{bytes});
  auto bytes_of = source.mutable_flat<std::int8_t>();
  for (std::int64_t i = 0; i < bytes; ++i) bytes_of[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(i % 253);
  auto r = s->run([&](ReplicaContext& ctx) {
    return ctx.merge_call([&](Strategy& strategy) { return strategy.extended().broadcast_to(source); });
  });
  for (const Tensor& t : r.values()) EXPECT_EQ(t, source);
  EXPECT_NE(r[1].raw_data(), source.raw_data());
}

TEST(MergeCallTest, NestedCallForEachReplicaInsideMergeFn) {
  auto s = testing::mirrored(2);
  auto r = s->run([](ReplicaContext& ctx) {
    return ctx.merge_call([](Strategy& strategy) {
      // A nested step: its replicas may use collectives and merge_call too.
      auto inner = strategy.extended().call_for_each_replica([](ReplicaContext& inner_ctx) {
        const Tensor x = constant(inner_ctx.replica_id_in_sync_group() + 1);
        Tensor total = inner_ctx.all_reduce(ReduceOp::kSum, x);
        return inner_ctx.merge_call([](Strategy&, const PerReplica<Tensor>& t) { return t[0].scalar<int>() * 100; },
                                    total);
      });
      return inner[0] + inner[1];
    });
  });
  EXPECT_EQ(r[0], 600);
  EXPECT_EQ(r[1], 600);
}

// A merge_fn's plain Tensor result reaches every replica as one storage:
// each gets it read-only, as an all_reduce result (TensorFlow's tensors are
// immutable; here a write would race with the other replicas' reads). A
// Nest<Tensor>'s leaves likewise. A Mirrored result gives each replica its
// own component, which stays writable.
TEST(MergeCallTest, SharedTensorResultsAreReadOnlyOwnComponentsWritable) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    std::vector<const void*> addresses(static_cast<std::size_t>(n)), own_addresses(static_cast<std::size_t>(n));
    s->run([&](ReplicaContext& ctx) {
      const Tensor plain = ctx.merge_call([](Strategy&) { return constant({1.f, 2.f, 3.f}); });
      EXPECT_EQ(plain, constant({1.f, 2.f, 3.f}));
      EXPECT_TRUE(plain.is_read_only());
      EXPECT_TRUE(testing::refuses_writes(plain, "float32 (3,)", plain.device()));
      addresses[static_cast<std::size_t>(ctx.local_replica_id())] = plain.raw_data();
      const Nest<Tensor> tree =
          ctx.merge_call([](Strategy&) { return Nest<Tensor>::list({Nest<Tensor>(constant({7}))}); });
      EXPECT_TRUE(tree[0].leaf().is_read_only());
      const Tensor own = ctx.merge_call(
          [](Strategy& strategy, const PerReplica<Tensor>& v) { return strategy.extended().broadcast_to(v[0]); },
          constant({ctx.replica_id_in_sync_group()}));
      EXPECT_EQ(own, constant({0}));
      EXPECT_FALSE(own.is_read_only());
      own.mutable_flat<int>()[0] = 1;  // the replica's own copy
      own_addresses[static_cast<std::size_t>(ctx.local_replica_id())] = own.raw_data();
    });
    for (const void* a : addresses) EXPECT_EQ(a, addresses[0]);  // one storage for all
    for (std::size_t i = 0; i < own_addresses.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) EXPECT_NE(own_addresses[i], own_addresses[j]);  // one each
    }
  }
}

// A nested run whose third replica's thread cannot start: the replica that
// did start, waiting in an all_reduce for the other two, is aborted and
// joined, and the run raises the system's error at once (before, the started
// thread was destroyed unjoined, which ends the process). Nested steps run
// again afterwards.
TEST(MergeCallTest, ANestedRunThatCannotStartAllItsThreadsFailsCleanly) {
  auto s = testing::mirrored(3);
  const auto start = std::chrono::steady_clock::now();
  try {
    s->run([](ReplicaContext& ctx) {
      ctx.merge_call([](Strategy& strategy) {
        internal::fail_thread_starts_for_testing(1);  // on this thread: the nested run's second start
        strategy.extended().call_for_each_replica(
            [](ReplicaContext& inner) { return inner.all_reduce(ReduceOp::kSum, constant(1)); });
      });
    });
    ADD_FAILURE() << "a nested run of 3 replicas ran with 2 threads";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("could not start a replica thread"), std::string::npos) << e.what();
  }
  internal::fail_thread_starts_for_testing(-1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  auto r = s->run([](ReplicaContext& ctx) {
    return ctx.merge_call([](Strategy& strategy) {
      auto inner = strategy.extended().call_for_each_replica(
          [](ReplicaContext& c) { return c.all_reduce(ReduceOp::kSum, constant(c.replica_id_in_sync_group())); });
      return inner[0];
    });
  });
  for (const Tensor& t : r.values()) EXPECT_EQ(t, constant(3));
}

// The last merge_fn's result sits in replica 0's entry of the group until
// another round replaces it; run() lets it go when it returns, so a large
// result the replicas dropped is not held until the next step. A copy job
// (large broadcast_to copies shared with the paused replicas) holds its
// tensors the same way.
TEST(MergeCallTest, TheLastMergeResultIsLetGoWhenRunReturns) {
  for (int n : testing::kReplicaCounts) {
    auto s = testing::mirrored(n);
    std::weak_ptr<std::byte> result_storage, copy_storage;
    s->run([&](ReplicaContext& ctx) {
      const Tensor mine = ctx.merge_call([&](Strategy& strategy) {
        Tensor big(DType::kFloat32, Shape{std::int64_t{1} << 18});  // 1 MiB: copies shared from 3 replicas on
        result_storage = big.storage();
        Mirrored<Tensor> placed = strategy.extended().broadcast_to(big);
        copy_storage = placed.values().back().storage();
        return placed;
      });
      EXPECT_EQ(mine.num_elements(), std::int64_t{1} << 18);
    });
    EXPECT_TRUE(result_storage.expired()) << n << " replicas";
    EXPECT_TRUE(copy_storage.expired()) << n << " replicas";
  }
}

TEST(MergeCallTest, ManyStepsInARow) {
  auto s = testing::mirrored(3);
  auto r = s->run([](ReplicaContext& ctx) {
    int acc = 0;
    for (int step = 0; step < 200; ++step) {
      acc += ctx.merge_call([](Strategy&, const PerReplica<int>& v) { return v[0] + v[1] + v[2]; }, step);
      if (step % 10 == 0) ctx.all_reduce(ReduceOp::kSum, constant(step));
    }
    return acc;
  });
  EXPECT_EQ(r[2], 3 * 199 * 200 / 2);
}

TEST(MergeCallTest, DifferentMergeFunctionsAreDetected) {
  auto s = testing::mirrored(2);
  std::vector<std::string> messages(2);
  s->run([&](ReplicaContext& ctx) {
    try {
      if (ctx.replica_id_in_sync_group() == 0) {
        ctx.merge_call([](Strategy&, const PerReplica<int>&) {}, 1);
      } else {
        ctx.merge_call([](Strategy&, const PerReplica<int>&) {}, 1);  // another lambda: another merge_fn
      }
    } catch (const FailedPreconditionError& e) {
      messages[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = e.what();
    }
  });
  EXPECT_FALSE(messages[0].empty());
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("merge_call #1: the replicas passed different merge_fn and argument types"),
            std::string::npos)
      << messages[0];
}

// distribute::(anonymous namespace)::SameName, as in merge_call_other_file.cc:
// the same names, another type.
struct SameName {
  int operator()(Strategy&, const PerReplica<int>&) const { return 1; }
};

// Two merge_fn types of one name (each in an unnamed namespace of its own
// file) have the same names and digest: every replica still raises, and no
// merge_fn runs on the other's arguments.
TEST(MergeCallTest, TypesOfTheSameNameFromTwoFilesAreDetected) {
  for (const int n : {2, 3}) {
    auto s = testing::mirrored(n);
    auto r = s->run([&](ReplicaContext& ctx) {
      try {
        return ctx.replica_id_in_sync_group() == n - 1 ? testing::merge_call_from_another_file(ctx)
                                                       : ctx.merge_call(SameName{}, 1);
      } catch (const FailedPreconditionError& e) {
        EXPECT_NE(std::string(e.what()).find("merge_call #1: the replicas passed different merge_fn and argument "
                                             "types: replica 0 and replica " +
                                             std::to_string(n - 1) + " passed types of the same names"),
                  std::string::npos)
            << e.what();
        return -1;
      }
    });
    for (const int got : r.values()) EXPECT_EQ(got, -1) << n << " replicas";
    // The same type from every replica, after the failure: merge_fn runs.
    EXPECT_EQ(s->run([](ReplicaContext& ctx) { return testing::merge_call_from_another_file(ctx); }).values()[0], 2);
  }
}

TEST(MergeCallTest, DifferentArgumentTypesAreDetected) {
  auto s = testing::mirrored(2);
  auto msg = testing::expect_throw<FailedPreconditionError>([&] {
    s->run([&](ReplicaContext& ctx) {
      auto fn = [](Strategy&, const auto&) {};
      if (ctx.replica_id_in_sync_group() == 0) {
        ctx.merge_call(fn, 1);
      } else {
        ctx.merge_call(fn, 1.0);
      }
    });
  });
  EXPECT_NE(msg.find("different merge_fn and argument types"), std::string::npos) << msg;
}

TEST(MergeCallTest, DifferentNumberOfMergeCallsRaisesInsteadOfHanging) {
  auto s = testing::mirrored(3);
  const auto start = std::chrono::steady_clock::now();
  auto msg = testing::expect_throw<FailedPreconditionError>([&] {
    s->run([](ReplicaContext& ctx) {
      ctx.merge_call([](Strategy&) {});
      if (ctx.replica_id_in_sync_group() != 2) ctx.merge_call([](Strategy&) {});
    });
  });
  EXPECT_NE(msg.find("Some replicas made a different number of replica_context().merge_call() calls"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("replica(s) 2 returned"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(MergeCallTest, MergeFnExceptionIsRethrownByRunAndOthersAreReleased) {
  auto s = testing::mirrored(3);
  struct Boom : std::runtime_error {
    Boom() : std::runtime_error("boom") {}
  };
  EXPECT_THROW(s->run([](ReplicaContext& ctx) { ctx.merge_call([](Strategy&) { throw Boom(); }); }), Boom);
  // Usable again.
  auto r = s->run([](ReplicaContext& ctx) { return ctx.merge_call([](Strategy&) { return 5; }); });
  EXPECT_EQ(r[2], 5);
}

TEST(MergeCallTest, DefaultContextWorksAgainAfterMergeFnThrows) {
  ReplicaContext* ctx = get_replica_context();
  EXPECT_THROW(ctx->merge_call([](Strategy&) { throw std::runtime_error("no"); }), std::runtime_error);
  EXPECT_EQ(ctx->merge_call([](Strategy&) { return 3; }), 3);
  EXPECT_EQ(ctx->all_reduce(ReduceOp::kSum, constant(2)), constant(2));
}

TEST(MergeCallTest, NestedDefaultStrategyRunsOnTwoThreadsAtOnce) {
  auto work = [] {
    for (int k = 0; k < 100; ++k) {
      int v = get_replica_context()->merge_call([k](Strategy& s) {
        auto r = s.run([k](ReplicaContext& c) { return c.all_reduce(ReduceOp::kSum, constant(k)).scalar<int>(); });
        return r[0];
      });
      EXPECT_EQ(v, k);
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
}

TEST(MergeCallTest, MergeCallVersusCollectiveIsAMismatch) {
  auto s = testing::mirrored(2);
  auto msg = testing::expect_throw<FailedPreconditionError>([&] {
    s->run([](ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 0) {
        ctx.merge_call([](Strategy&) {});
      } else {
        ctx.all_reduce(ReduceOp::kSum, constant(1));
      }
    });
  });
  EXPECT_NE(msg.find("Collective mismatch"), std::string::npos) << msg;
}

// An argument that knows whether the object it is copied from was destroyed
// (by address: a live object registers itself, a destroyed one is listed).
// The first copy of another replica's argument runs `on_first_copy` and then
// waits, so that whatever that sets off has time to happen.
struct ArgumentProbe {
  static inline std::mutex mutex;
  static inline std::set<const void*> destroyed;
  static inline std::function<void()> on_first_copy;
  static inline std::atomic<bool> fired{false};
  static inline std::atomic<int> copies_of_destroyed{0};

  int replica = 0;
  explicit ArgumentProbe(int r) : replica(r) { alive(); }
  ArgumentProbe(const ArgumentProbe& other) : replica(other.replica) {
    if (other.replica != 0 && on_first_copy && !fired.exchange(true)) {
      on_first_copy();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (destroyed.count(&other) != 0) ++copies_of_destroyed;
    destroyed.erase(this);
  }
  ArgumentProbe& operator=(const ArgumentProbe&) = delete;
  ~ArgumentProbe() {
    std::lock_guard<std::mutex> lock(mutex);
    destroyed.insert(this);
  }

 private:
  void alive() {
    std::lock_guard<std::mutex> lock(mutex);
    destroyed.erase(this);
  }
};

// merge_call reads the other replicas' arguments where they are, on their
// stacks, while it groups them. An abort that comes meanwhile (here from
// inside the copy; in a program, from another worker's failure) releases the
// waiting replicas, which must not unwind those arguments until replica 0 has
// copied them.
TEST(MergeCallTest, AnAbortWhileArgumentsAreCopiedUnwindsNoArgumentBeingCopied) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " replicas");
    auto s = testing::mirrored(n);
    ArgumentProbe::fired = false;
    ArgumentProbe::copies_of_destroyed = 0;
    std::atomic<internal::ReplicaRendezvous*> group{nullptr};
    ArgumentProbe::on_first_copy = [&group] {
      group.load()->abort(ErrorCode::kAborted, "test: aborted while merge_call copies arguments", 0);
    };
    std::atomic<int> merge_fns{0};
    EXPECT_THROW(s->run([&](ReplicaContext& ctx) {
      if (ctx.local_replica_id() == 0) group = internal::Access::channel(ctx).local;
      const ArgumentProbe mine(ctx.replica_id_in_sync_group());
      return ctx.merge_call(
          [&](Strategy&, const PerReplica<ArgumentProbe>& all) {
            ++merge_fns;
            return static_cast<int>(all.size());
          },
          mine);
    }),
                 Error);
    ArgumentProbe::on_first_copy = nullptr;
    EXPECT_TRUE(ArgumentProbe::fired);
    EXPECT_EQ(merge_fns.load(), 1);
    EXPECT_EQ(ArgumentProbe::copies_of_destroyed.load(), 0);
  }
}

}  // namespace
}  // namespace distribute
