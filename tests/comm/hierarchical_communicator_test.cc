// HierarchicalCommunicator: W workers x L local replicas, all threads of this
// process (the workers' link is an in-process communicator). Checks every
// operation against its definition in global rank order, and that a
// signature mismatch anywhere reaches every member.
#include "comm/hierarchical/hierarchical_communicator.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <numeric>

#include "core/payload_list.h"
#include "core/storage.h"
#include "testing/threads.h"

namespace distribute::internal {
namespace {

using testing::message_of;
using testing::run_threads;

struct Cluster {
  int workers;
  int local;
  std::shared_ptr<LocalGroup> link_group;
  std::vector<std::unique_ptr<SharedMemoryCommunicator>> links;
  std::vector<std::shared_ptr<LocalGroup>> locals;
  std::vector<std::unique_ptr<HierarchicalCommunicator>> members;  // by global rank

  Cluster(int w, int l) : workers(w), local(l), link_group(std::make_shared<LocalGroup>(w)) {
    for (int k = 0; k < w; ++k) {
      links.push_back(std::make_unique<SharedMemoryCommunicator>(link_group, k));
      locals.push_back(std::make_shared<LocalGroup>(l));
      for (int i = 0; i < l; ++i) {
        members.push_back(std::make_unique<HierarchicalCommunicator>(locals.back(), i, links.back().get()));
      }
    }
  }
  int size() const { return workers * local; }
  // Runs f(rank, communicator) on every member; fails the test on any exception.
  void run(const std::function<void(int, Communicator&)>& f) {
    const auto errors = run_threads(size(), [&](int r) { f(r, *members[static_cast<std::size_t>(r)]); });
    for (std::size_t r = 0; r < errors.size(); ++r)
      EXPECT_FALSE(errors[r]) << "rank " << r << ": " << message_of(errors[r]);
  }
  // Each rank's output of a shared collective is its worker leader's if
  // `shared`, its own otherwise, and never another worker's.
  void expect_shared_within_workers(const std::vector<std::shared_ptr<std::byte>>& out, bool shared) const {
    for (int r = 0; r < size(); ++r) {
      const int leader = r / local * local;
      if (r != leader) {
        EXPECT_EQ(out[static_cast<std::size_t>(r)] == out[static_cast<std::size_t>(leader)], shared) << r;
      }
      if (r >= local) {
        EXPECT_NE(out[static_cast<std::size_t>(r)], out[0]) << r;
      }
    }
  }
};

class HierarchicalTest : public ::testing::TestWithParam<std::pair<int, int>> {
 protected:
  Cluster cluster{GetParam().first, GetParam().second};
  CollectiveCall call{.op = "test", .sequence = 1, .timeout_seconds = 20};
};

TEST_P(HierarchicalTest, RanksFollowGlobalReplicaIds) {
  for (int r = 0; r < cluster.size(); ++r) {
    EXPECT_EQ(cluster.members[static_cast<std::size_t>(r)]->rank(), r);
    EXPECT_EQ(cluster.members[static_cast<std::size_t>(r)]->size(), cluster.size());
  }
}

TEST_P(HierarchicalTest, ExchangeGivesEveryPayloadInRankOrder) {
  cluster.run([&](int r, Communicator& c) {
    const auto all = c.exchange("payload of " + std::to_string(r), call);
    ASSERT_EQ(all.size(), static_cast<std::size_t>(cluster.size()));
    for (int q = 0; q < cluster.size(); ++q)
      EXPECT_EQ(all[static_cast<std::size_t>(q)], "payload of " + std::to_string(q));
  });
}

TEST_P(HierarchicalTest, AllReduceSumsEveryRank) {
  for (std::size_t count : {std::size_t{3}, std::size_t{100000}}) {
    cluster.run([&](int r, Communicator& c) {
      std::vector<double> send(count), recv(count, -1);
      for (std::size_t k = 0; k < count; ++k) send[k] = static_cast<double>(r * 1000 + static_cast<int>(k % 7));
      c.all_reduce(send.data(), recv.data(), count, DType::kFloat64, ReduceOp::kMean, call);
      const int n = cluster.size();
      for (std::size_t k = 0; k < count; k += 997) {
        EXPECT_EQ(recv[k], 1000.0 * (n - 1) / 2 + static_cast<double>(k % 7)) << k;
      }
    });
  }
}

// The shared form, small and large, one value or a pack of two: a float
// MEAN (local sums, one division across the workers), an int32 SUM, and an
// int8 MEAN of values near the top of the type (exact: gathered, never
// shared; sums would wrap). Above 1 KiB the replicas of a worker hold one
// output, never the replicas of two workers.
TEST_P(HierarchicalTest, AllReduceSharedReducesEveryRankAndSharesAWorkersOutput) {
  const int n = cluster.size();
  // Element k of rank r, and the expected result, by dtype.
  const auto value = [](DType dtype, int r, std::size_t k) {
    const int j = static_cast<int>(k % 7);
    return dtype == DType::kInt8 ? 120 - r - j % 3 : r * 1000 + j;
  };
  // 2000: over the 1 KiB from which a worker's replicas share, under the
  // in-process engine's 64 KiB. (Whether the local step shares too is not
  // seen here: the fan-out hands out the leader's block either way;
  // SharedAllReduceTest.ShareReduceAboveIsWhereTheOutputIsShared checks the
  // setting the local step is given.)
  for (const std::size_t count : {std::size_t{3}, std::size_t{2000}, std::size_t{100000}}) {
    for (const auto& [dtype, op] :
         {std::pair{DType::kFloat64, ReduceOp::kMean}, std::pair{DType::kInt32, ReduceOp::kSum},
          std::pair{DType::kInt8, ReduceOp::kMean}}) {
      SCOPED_TRACE(std::to_string(count) + " " + std::string(to_string(dtype)) + " " + std::string(to_string(op)));
      std::vector<std::shared_ptr<std::byte>> out(static_cast<std::size_t>(n));
      cluster.run([&](int r, Communicator& c) {
        std::vector<std::byte> send(count * size_of(dtype));
        for (std::size_t k = 0; k < count; ++k) {
          const int v = value(dtype, r, k);
          if (dtype == DType::kFloat64) reinterpret_cast<double*>(send.data())[k] = v;
          if (dtype == DType::kInt32) reinterpret_cast<std::int32_t*>(send.data())[k] = v;
          if (dtype == DType::kInt8) reinterpret_cast<std::int8_t*>(send.data())[k] = static_cast<std::int8_t>(v);
        }
        // Two segments: the first 2 elements, then the rest.
        const Communicator::Segment segments[] = {{.send = send.data(), .count = 2},
                                                  {.send = send.data() + 2 * size_of(dtype), .count = count - 2}};
        out[static_cast<std::size_t>(r)] = c.all_reduce_shared(segments, dtype, op, call);
        const std::byte* got = out[static_cast<std::size_t>(r)].get();
        for (std::size_t k = 0; k < count; k += 997) {
          double sum = 0;
          for (int q = 0; q < n; ++q) sum += value(dtype, q, k);
          double want = dtype == DType::kFloat64 ? sum / n : dtype == DType::kInt32 ? sum : std::trunc(sum / n);
          double have = dtype == DType::kFloat64 ? reinterpret_cast<const double*>(got)[k]
                        : dtype == DType::kInt32 ? reinterpret_cast<const std::int32_t*>(got)[k]
                                                 : reinterpret_cast<const std::int8_t*>(got)[k];
          EXPECT_EQ(have, want) << k;
        }
      });
      const bool shared = SharedMemoryCommunicator::shares_reduce(cluster.local, count * size_of(dtype),
                                                                  HierarchicalCommunicator::kShareReduceBytes) &&
                          dtype != DType::kInt8;
      cluster.expect_shared_within_workers(out, shared);
    }
  }
}

TEST_P(HierarchicalTest, AllGatherVLaysOutRowsInRankOrder) {
  const std::size_t outer = 2;
  std::vector<std::size_t> counts;
  for (int r = 0; r < cluster.size(); ++r) counts.push_back(static_cast<std::size_t>(r % 3));
  const std::size_t row = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  cluster.run([&](int r, Communicator& c) {
    const std::size_t mine = counts[static_cast<std::size_t>(r)];
    std::vector<std::int32_t> send(outer * mine), recv(outer * row, -1);
    for (std::size_t o = 0; o < outer; ++o) {
      for (std::size_t k = 0; k < mine; ++k) send[o * mine + k] = static_cast<std::int32_t>(100 * o + 10 * r + k);
    }
    c.all_gather_v(send.data(), recv.data(), counts, outer, DType::kInt32, call);
    std::size_t at = 0;
    for (std::size_t o = 0; o < outer; ++o) {
      for (int q = 0; q < cluster.size(); ++q) {
        for (std::size_t k = 0; k < counts[static_cast<std::size_t>(q)]; ++k) {
          EXPECT_EQ(recv[at++], static_cast<std::int32_t>(100 * o + 10 * q + k));
        }
      }
    }
  });
}

// The shared form: the same layout, small and large, and the replicas of a
// worker hold one output.
TEST_P(HierarchicalTest, AllGatherVSharedLaysOutRowsInRankOrderAndSharesAWorkersOutput) {
  for (const std::size_t scale : {std::size_t{1}, std::size_t{100}, std::size_t{3000}}) {
    const std::size_t outer = 2;
    std::vector<std::size_t> counts;
    for (int r = 0; r < cluster.size(); ++r) counts.push_back(static_cast<std::size_t>(r % 3) * scale);
    const std::size_t row = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    std::vector<std::shared_ptr<std::byte>> out(static_cast<std::size_t>(cluster.size()));
    cluster.run([&](int r, Communicator& c) {
      const std::size_t mine = counts[static_cast<std::size_t>(r)];
      std::vector<std::int32_t> send(outer * mine);
      for (std::size_t o = 0; o < outer; ++o) {
        for (std::size_t k = 0; k < mine; ++k)
          send[o * mine + k] = static_cast<std::int32_t>(100000 * o + 10000 * r + k);
      }
      out[static_cast<std::size_t>(r)] = c.all_gather_v_shared(send.data(), counts, outer, DType::kInt32, call);
      const auto* got = reinterpret_cast<const std::int32_t*>(out[static_cast<std::size_t>(r)].get());
      std::size_t at = 0;
      for (std::size_t o = 0; o < outer; ++o) {
        for (int q = 0; q < cluster.size(); ++q) {
          for (std::size_t k = 0; k < counts[static_cast<std::size_t>(q)]; ++k, ++at) {
            if (got[at] != static_cast<std::int32_t>(100000 * o + 10000 * q + k)) {
              FAIL() << "rank " << r << " outer " << o << " from " << q << " k " << k << ": " << got[at];
            }
          }
        }
      }
      EXPECT_EQ(at, outer * row);
    });
    // Shared within a worker past 4 KiB of contribution (2 x 2 x 3000 int32), never across workers.
    const bool shared = cluster.local > 1 && scale == 3000;
    cluster.expect_shared_within_workers(out, shared);
  }
}

// A loop that lets go of its last result before the next gather, as a
// training step does, takes no fresh storage once warm: the worker's shared
// block and output come back from the cache every step.
TEST_P(HierarchicalTest, AllGatherVSharedTakesNoFreshStorageOnceWarm) {
  const std::size_t count = 5000;
  const std::vector<std::size_t> counts(static_cast<std::size_t>(cluster.size()), count);
  std::atomic<std::uint64_t> fresh_warm{0};
  cluster.run([&](int r, Communicator& c) {
    const std::vector<float> send(count, static_cast<float>(r));
    std::shared_ptr<std::byte> out;
    for (int step = 0; step < 20; ++step) {
      out.reset();
      out = c.all_gather_v_shared(send.data(), counts, 1, DType::kFloat32, call);
      if (step == 2) {
        c.barrier(call);  // every member past step 2 before the count is read
        if (r == 0) fresh_warm = storage_stats().fresh_blocks;
        c.barrier(call);
      }
    }
    EXPECT_EQ(reinterpret_cast<const float*>(out.get())[count * static_cast<std::size_t>(cluster.size()) - 1],
              static_cast<float>(cluster.size() - 1));
    out.reset();
    c.barrier(call);
    if (r == 0) {
      EXPECT_EQ(storage_stats().fresh_blocks, fresh_warm.load());
    }
  });
}

TEST_P(HierarchicalTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < cluster.size(); ++root) {
    for (std::size_t count : {std::size_t{5}, std::size_t{20000}}) {
      cluster.run([&](int r, Communicator& c) {
        std::vector<float> buffer(count, -1.f);
        if (r == root) std::iota(buffer.begin(), buffer.end(), static_cast<float>(root));
        c.broadcast(buffer.data(), count, DType::kFloat32, root, call);
        EXPECT_EQ(buffer[0], static_cast<float>(root));
        EXPECT_EQ(buffer[count - 1], static_cast<float>(root) + static_cast<float>(count - 1));
      });
    }
  }
}

// The shared form: root's bytes everywhere, small and past the sharing
// threshold, and the replicas of a worker hold one output.
TEST_P(HierarchicalTest, BroadcastSharedFromEveryRootSharesAWorkersOutput) {
  for (int root = 0; root < cluster.size(); ++root) {
    for (const std::size_t count : {std::size_t{5}, std::size_t{20000}}) {
      std::vector<std::shared_ptr<std::byte>> out(static_cast<std::size_t>(cluster.size()));
      cluster.run([&](int r, Communicator& c) {
        std::vector<float> send(count, -1.f);
        if (r == root) std::iota(send.begin(), send.end(), static_cast<float>(root));
        out[static_cast<std::size_t>(r)] = c.broadcast_shared(send.data(), count, DType::kFloat32, root, call);
        const auto* got = reinterpret_cast<const float*>(out[static_cast<std::size_t>(r)].get());
        for (std::size_t k = 0; k < count; ++k) {
          if (got[k] != static_cast<float>(root) + static_cast<float>(k)) FAIL() << "rank " << r << " k " << k;
        }
      });
      const bool shared = cluster.local > 1 && count == 20000;
      cluster.expect_shared_within_workers(out, shared);
    }
  }
}

// The root's buffer is only read, from any root (one that is not its
// worker's leader too), small and large: here it lies on a page that cannot
// be written, so a write into it would crash the test.
TEST_P(HierarchicalTest, BroadcastOnlyReadsTheRootsBuffer) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  for (const std::size_t count : {std::size_t{5}, std::size_t{20000}}) {
    const std::size_t bytes = (count * sizeof(float) + page - 1) / page * page;
    void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    auto* values = static_cast<float*>(mapped);
    std::iota(values, values + count, 1.f);
    ASSERT_EQ(mprotect(mapped, bytes, PROT_READ), 0);
    for (int root = 0; root < cluster.size(); ++root) {
      cluster.run([&](int r, Communicator& c) {
        std::vector<float> mine(count, -1.f);
        float* buffer = r == root ? values : mine.data();  // broadcast's buffer is not const: the root's is only read
        c.broadcast(buffer, count, DType::kFloat32, root, call);
        const auto out = c.broadcast_shared(values, count, DType::kFloat32, root, call);
        const auto* got = reinterpret_cast<const float*>(out.get());
        // Out of place (the default form: in place, then the root's copy):
        // the root's recv gets its bytes too.
        std::vector<float> recv(count, -1.f);
        c.broadcast_out_of_place(r == root ? values : nullptr, recv.data(), count, DType::kFloat32, root, call);
        for (std::size_t k = 0; k < count; ++k) {
          if (buffer[k] != static_cast<float>(k + 1) || got[k] != static_cast<float>(k + 1) ||
              recv[k] != static_cast<float>(k + 1)) {
            FAIL() << "rank " << r << " root " << root << " k " << k;
          }
        }
      });
    }
    munmap(mapped, bytes);
  }
}

TEST_P(HierarchicalTest, BarrierThenMoreRounds) {
  cluster.run([&](int, Communicator& c) {
    for (int k = 0; k < 5; ++k) c.barrier(call);
  });
}

// A member whose tag differs: every member of every worker gets
// SignatureMismatch, in an all_reduce and in the shared all_gather, all_reduce and broadcast (small and
// past the local engine's sharing threshold).
void expect_mismatch_everywhere(Cluster& cluster, int odd_rank) {
  std::vector<int> mismatches(static_cast<std::size_t>(cluster.size()), 0);
  cluster.run([&](int r, Communicator& c) {
    CollectiveCall call{.op = "test", .sequence = 1, .timeout_seconds = 20};
    call.signature_tag = r == odd_rank ? 0x1234 : 0x5678;
    float v = 1;
    try {
      c.all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kSum, call);
    } catch (const SignatureMismatch&) {
      ++mismatches[static_cast<std::size_t>(r)];
    }
    for (const std::size_t count : {std::size_t{2}, std::size_t{3000}}) {
      const std::vector<std::size_t> counts(static_cast<std::size_t>(cluster.size()), count);
      const std::vector<float> send(count, 1.f);
      try {
        c.all_gather_v_shared(send.data(), counts, 1, DType::kFloat32, call);
      } catch (const SignatureMismatch&) {
        ++mismatches[static_cast<std::size_t>(r)];
      }
      try {
        const Communicator::Segment whole{.send = send.data(), .count = count};
        c.all_reduce_shared({&whole, 1}, DType::kFloat32, ReduceOp::kSum, call);
      } catch (const SignatureMismatch&) {
        ++mismatches[static_cast<std::size_t>(r)];
      }
      try {
        c.broadcast_shared(send.data(), count, DType::kFloat32, cluster.size() - 1, call);
      } catch (const SignatureMismatch&) {
        ++mismatches[static_cast<std::size_t>(r)];
      }
    }
    // The group goes on: an untagged collective after the mismatch works.
    call.signature_tag = 0;
    float one = 1, sum = 0;
    c.all_reduce(&one, &sum, 1, DType::kFloat32, ReduceOp::kSum, call);
    EXPECT_EQ(sum, static_cast<float>(cluster.size()));
  });
  for (int r = 0; r < cluster.size(); ++r) EXPECT_EQ(mismatches[static_cast<std::size_t>(r)], 7) << "rank " << r;
}

TEST_P(HierarchicalTest, MismatchOnTheLastRankReachesEveryone) {
  if (cluster.size() < 2) GTEST_SKIP();
  expect_mismatch_everywhere(cluster, cluster.size() - 1);
}

TEST_P(HierarchicalTest, MismatchOnALeaderReachesEveryone) {
  if (cluster.workers < 2) GTEST_SKIP();
  expect_mismatch_everywhere(cluster, cluster.local);  // worker 1's leader
}

TEST_P(HierarchicalTest, AbortReachesEveryWorker) {
  cluster.run([&](int r, Communicator& c) {
    if (r == cluster.size() - 1) {
      c.abort(ErrorCode::kAborted, "member " + std::to_string(r) + " gave up", r);
      return;
    }
    float v = 1;
    try {
      c.all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kSum, call);
      ADD_FAILURE() << "rank " << r << " finished an all_reduce the last rank never joined";
    } catch (const AbortedError& e) {
      EXPECT_NE(e.message().find("gave up"), std::string::npos) << e.message();
    }
  });
}

// The same in a shared gather and a shared all_reduce, small and large:
// nobody waits for ever.
TEST_P(HierarchicalTest, AbortReachesEveryWorkerInASharedGather) {
  for (const std::size_t count : {std::size_t{3}, std::size_t{3000}}) {
    for (const bool reduce : {false, true}) {
      Cluster fresh(cluster.workers, cluster.local);
      fresh.run([&](int r, Communicator& c) {
        if (r == fresh.size() - 1) {
          c.abort(ErrorCode::kAborted, "member " + std::to_string(r) + " gave up", r);
          return;
        }
        const std::vector<std::size_t> counts(static_cast<std::size_t>(fresh.size()), count);
        const std::vector<float> send(count, 1.f);
        try {
          if (reduce) {
            const Communicator::Segment whole{.send = send.data(), .count = count};
            c.all_reduce_shared({&whole, 1}, DType::kFloat32, ReduceOp::kSum, call);
          } else {
            c.all_gather_v_shared(send.data(), counts, 1, DType::kFloat32, call);
          }
          ADD_FAILURE() << "rank " << r << " finished a collective the last rank never joined";
        } catch (const AbortedError& e) {
          EXPECT_NE(e.message().find("gave up"), std::string::npos) << e.message();
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalTest,
                         ::testing::Values(std::pair{1, 1}, std::pair{1, 3}, std::pair{2, 1}, std::pair{2, 2},
                                           std::pair{3, 2}, std::pair{2, 3}),
                         [](const auto& param_info) {
                           return std::to_string(param_info.param.first) + "workers_x" +
                                  std::to_string(param_info.param.second) + "local";
                         });

TEST(PayloadListTest, RoundTrips) {
  const std::vector<std::string> lists[] = {{}, {""}, {"a", "", std::string("b\0c", 3)}};
  for (const auto& list : lists) EXPECT_EQ(decode_payload_list(encode_payload_list(list)), list);
  EXPECT_THROW(decode_payload_list(std::string("\x05\0\0\0\0\0\0\0ab", 10)), InternalError);
}

}  // namespace
}  // namespace distribute::internal
