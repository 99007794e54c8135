// The MPI backend against the same reference as the threads backend, run by
// ctest under mpirun with 2 and 3 processes. Rank r holds x_r[i] = (i % 5) + r.
#include "comm/mpi/mpi_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>

#include "core/storage.h"
#include "testing/reduce_reference.h"

namespace distribute::internal {
namespace {

CollectiveCall call(std::string_view op, std::uint64_t seq = 1, double timeout = 60) {
  CollectiveCall c;
  c.op = op;
  c.sequence = seq;
  c.timeout_seconds = timeout;
  return c;
}

using distribute::testing::expected_value;
using distribute::testing::input_value;
using distribute::testing::same_bits;
using distribute::testing::to_dtype;

// All-reduces `count` elements of rank r's x_r and checks every element
// against the reference: out of place with a tag (compared alongside the
// data), in place without one (no header round above 64 KiB).
void expect_all_reduce(MpiCommunicator& comm, DType dtype, ReduceOp op, std::size_t count, bool in_place) {
  const std::size_t esz = size_of(dtype);
  std::vector<std::byte> send(count * esz + 1), recv(count * esz + 1);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* p = reinterpret_cast<T*>(send.data());
    for (std::size_t i = 0; i < count; ++i) p[i] = to_dtype<T>(input_value(dtype, comm.rank(), i));
  });
  void* out = in_place ? static_cast<void*>(send.data()) : recv.data();
  CollectiveCall c = call("all_reduce");
  c.signature_tag = in_place ? 0 : 0x2468;
  comm.all_reduce(send.data(), out, count, dtype, op, c);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = reinterpret_cast<const T*>(out);
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(same_bits(p[i], expected_value<T>(op, comm.size(), i, dtype)))
          << "rank " << comm.rank() << " element " << i << " count " << count << " in_place " << in_place;
    }
  });
}

class MpiAllReduceTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(MpiAllReduceTest, MatchesReferenceOnEveryRank) {
  const auto [dtype, op] = GetParam();
  MpiCommunicator comm;
  // Counts straddle the header-round path (64 KiB) for the wider dtypes; the
  // scatter path (over 1 MiB received) is in LargeAllReduceScattersSlices.
  // 12288: 48 KiB of 4-byte elements, one step on 2 ranks, sliced on 3
  // (ranks x bytes above 128 KiB).
  for (std::size_t count : {0u, 1u, 7u, 1000u, 4097u, 12288u, 65537u}) {
    for (bool in_place : {false, true}) expect_all_reduce(comm, dtype, op, count, in_place);
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, MpiAllReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllReduceOps)),
                         [](const auto& p) {
                           return std::string(to_string(std::get<0>(p.param))) + "_" +
                                  std::string(to_string(std::get<1>(p.param)));
                         });

// Above 1 MiB received per rank the all-reduce scatters slices (of unequal
// lengths here), reduces them and gathers them back.
TEST(MpiCommunicatorTest, LargeAllReduceScattersSlices) {
  MpiCommunicator comm;
  const int n = comm.size();
  for (auto [dtype, op] : {std::pair{DType::kFloat32, ReduceOp::kSum}, std::pair{DType::kInt32, ReduceOp::kMax},
                           std::pair{DType::kFloat16, ReduceOp::kMean}}) {
    const std::size_t esz = size_of(dtype);
    const std::size_t count = (1u << 20) / esz / static_cast<std::size_t>(std::max(1, n - 1)) + 1001;
    std::vector<std::byte> send(count * esz), recv(count * esz);
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      auto* p = reinterpret_cast<T*>(send.data());
      for (std::size_t i = 0; i < count; ++i) p[i] = to_dtype<T>(input_value(dtype, comm.rank(), i));
    });
    comm.all_reduce(send.data(), recv.data(), count, dtype, op, call("all_reduce"));
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* p = reinterpret_cast<const T*>(recv.data());
      for (std::size_t i = 0; i < count; i += 7) {
        ASSERT_TRUE(same_bits(p[i], expected_value<T>(op, n, i, dtype)))
            << "rank " << comm.rank() << " element " << i << " of " << count << " " << to_string(dtype);
      }
    });
  }
}

// ctest runs every rank on one host: there, all-reduces above 64 KiB go
// through memory the ranks share, unless DISTRIBUTE_MPI_SHARED_MEMORY=0 (the
// suite runs both ways, so MPI's own path, the one between hosts, stays
// tested).
TEST(MpiCommunicatorTest, RanksOnOneHostShareMemoryUnlessTurnedOff) {
  MpiCommunicator comm;
  const char* setting = std::getenv("DISTRIBUTE_MPI_SHARED_MEMORY");
  const bool off = setting != nullptr && std::string(setting) == "0";
  EXPECT_EQ(comm.uses_node_shared_memory(), comm.size() > 1 && !off);
  const char* single = std::getenv("DISTRIBUTE_MPI_SINGLE_COPY");
  const bool single_off = single != nullptr && std::string(single) == "0";
  if (single_off || !comm.uses_node_shared_memory()) {
    EXPECT_FALSE(comm.uses_single_copy());
  } else if (!comm.uses_single_copy()) {
    // Not a failure: the kernel may forbid it (ptrace rules, containers), and
    // large all-gathers then go through MPI (tested by the *_no_single_copy runs).
    std::printf("[rank %d] the kernel refused process_vm_readv between the ranks here\n", comm.rank());
  }
}

// MPI's paths and node shared memory read and write host memory only.
TEST(MpiCommunicatorTest, ReachesHostMemoryOnly) {
  MpiCommunicator comm;
  EXPECT_TRUE(comm.reaches(BufferPlace{}));
  EXPECT_FALSE(comm.reaches(BufferPlace{.kind = MemoryKind::kCuda, .device_index = 0}));
}

// Calls of every kind and of sizes that take every path, with data of their
// own, the ranks put out of step by random sleeps: on one host, a slot or
// buffer rewritten while a peer still reads it (the step parity rule of node
// shared memory) shows as a wrong value. Between hosts the same calls take
// MPI's paths.
TEST(MpiCommunicatorTest, MixedCallsOutOfStepKeepEveryResult) {
  MpiCommunicator comm;
  const int n = comm.size(), me = comm.rank();
  std::mt19937 random(1234u + static_cast<unsigned>(me));
  // int32 counts: the shared buffers, the single copy, several chunks, beyond 512 KiB.
  const std::size_t sizes[] = {1, 700, 3000, 40000, 150000};
  for (int it = 0; it < 600; ++it) {
    if (random() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
    const std::size_t count = sizes[static_cast<std::size_t>(it) % 5];
    const auto value = [&](int q, std::size_t i) {
      return static_cast<std::int32_t>(it * 7919 + q * 131 + static_cast<int>(i % 1000));
    };
    CollectiveCall c = call("mixed", static_cast<std::uint64_t>(it) + 1);
    c.signature_tag = it % 2 ? 0 : 0x1000 + 2 * static_cast<std::uint64_t>(it);
    const int kind = (it / 5) % 4;
    SCOPED_TRACE("call " + std::to_string(it) + " kind " + std::to_string(kind) + " count " + std::to_string(count));
    if (kind == 0) {
      std::vector<std::int32_t> send(count), recv(count, -1);
      for (std::size_t i = 0; i < count; ++i) send[i] = value(me, i);
      comm.all_reduce(send.data(), recv.data(), count, DType::kInt32, ReduceOp::kSum, c);
      for (std::size_t i = 0; i < count; ++i) {
        std::int32_t sum = 0;
        for (int q = 0; q < n; ++q) sum += value(q, i);
        ASSERT_EQ(recv[i], sum) << "element " << i;
      }
    } else if (kind == 1) {
      std::vector<std::size_t> counts;
      for (int q = 0; q < n; ++q) counts.push_back(count + static_cast<std::size_t>(q));
      std::vector<std::int32_t> send(counts[static_cast<std::size_t>(me)]);
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(me, i);
      std::vector<std::int32_t> recv(count * static_cast<std::size_t>(n) + static_cast<std::size_t>(n * (n - 1) / 2),
                                     -1);
      comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kInt32, c);
      std::size_t k = 0;
      for (int q = 0; q < n; ++q) {
        for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i, ++k) {
          ASSERT_EQ(recv[k], value(q, i)) << "rank " << q << " element " << i;
        }
      }
    } else if (kind == 2) {
      const int root = it % n;
      std::vector<std::int32_t> buf(count, -1);
      if (me == root) {
        for (std::size_t i = 0; i < count; ++i) buf[i] = value(root, i);
      }
      comm.broadcast(buf.data(), count, DType::kInt32, root, c);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], value(root, i)) << "element " << i;
    } else {
      const auto payload = [&](int q) {
        return std::string(count + static_cast<std::size_t>(q), static_cast<char>('a' + (it + q) % 26));
      };
      const std::vector<std::string> all = comm.exchange(payload(me), c);
      ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q) ASSERT_EQ(all[static_cast<std::size_t>(q)], payload(q)) << "rank " << q;
    }
  }
}

// Several chunks of the shared buffers (and a part of one), in place and
// not, tagged and not: every element against the reference.
TEST(MpiCommunicatorTest, AllReduceAcrossSeveralChunks) {
  MpiCommunicator comm;
  for (auto [dtype, op] : {std::pair{DType::kFloat32, ReduceOp::kSum}, std::pair{DType::kInt32, ReduceOp::kMax},
                           std::pair{DType::kFloat16, ReduceOp::kMean}, std::pair{DType::kFloat64, ReduceOp::kMin}}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    const std::size_t count = 3 * NodeSharedMemory::kChunkBytes / size_of(dtype) + 7;
    for (bool in_place : {false, true}) expect_all_reduce(comm, dtype, op, count, in_place);
  }
}

// Rank q contributes `outer` rows of counts[q] values, each naming its rank,
// row and position; checks that row o of the result is every rank's row o, in
// rank order.
void expect_all_gather_v(MpiCommunicator& comm, const std::vector<std::size_t>& counts, std::size_t outer,
                         const CollectiveCall& c) {
  const auto value = [](int q, std::size_t o, std::size_t j) {
    return q * 1000000 + static_cast<int>(o) * 100000 + static_cast<int>(j);
  };
  std::vector<std::int32_t> send;
  for (std::size_t o = 0; o < outer; ++o) {
    for (std::size_t j = 0; j < counts[static_cast<std::size_t>(comm.rank())]; ++j)
      send.push_back(value(comm.rank(), o, j));
  }
  std::size_t row = 0;
  for (std::size_t count : counts) row += count;
  std::vector<std::int32_t> recv(outer * row, -1);
  comm.all_gather_v(send.data(), recv.data(), counts, outer, DType::kInt32, c);
  std::size_t k = 0;
  for (std::size_t o = 0; o < outer; ++o) {
    for (int q = 0; q < comm.size(); ++q) {
      for (std::size_t j = 0; j < counts[static_cast<std::size_t>(q)]; ++j, ++k) {
        ASSERT_EQ(recv[k], value(q, o, j)) << "outer " << outer << ", rank " << q << ", position " << j;
      }
    }
  }
}

// All-gathers around the sizes where the paths change. Between hosts: blocks
// copied behind the header (up to 1 KiB), sent in place with it (up to
// 16 KiB), and beyond: with a tag, a message of their own posted alongside
// the header round; untagged, a message of their own. On one host: through
// the shared buffers (up to 8 KiB), beyond read where they are. Ragged, with
// and without outer rows, tagged and untagged.
TEST(MpiCommunicatorTest, AllGatherAcrossTheHeaderRoundPaths) {
  MpiCommunicator comm;
  std::uint64_t seq = 0;
  // The largest block (base + n - 1 ints) is the last that travels in the header round.
  const std::size_t last_inline =
      MpiCommunicator::kPostedGatherBytes / sizeof(std::int32_t) + 1 - static_cast<std::size_t>(comm.size());
  // On one host: the last that moves through the shared buffers.
  const std::size_t last_shared =
      MpiCommunicator::kSharedGatherBytes / sizeof(std::int32_t) + 1 - static_cast<std::size_t>(comm.size());
  for (std::size_t base : {std::size_t{255}, std::size_t{256}, std::size_t{257}, last_shared, last_shared + 1,
                           last_inline, last_inline + 1, std::size_t{40000}}) {
    std::vector<std::size_t> counts;
    for (int q = 0; q < comm.size(); ++q) counts.push_back(base + static_cast<std::size_t>(q));
    for (std::size_t outer : {std::size_t{1}, std::size_t{3}}) {
      for (std::uint64_t tag : {std::uint64_t{0}, std::uint64_t{0x2468}}) {
        SCOPED_TRACE("base " + std::to_string(base) + " outer " + std::to_string(outer) + " tag " +
                     std::to_string(tag));
        CollectiveCall c = call("all_gather", ++seq);
        c.signature_tag = tag;
        expect_all_gather_v(comm, counts, outer, c);
      }
    }
  }
}

// A mismatch of block sizes, in the header round and beyond it: every rank
// throws SignatureMismatch, and the next calls (small and large) find no
// stray message. Blocks of the size a rank expects may have arrived (a
// posted all-gather receives them into place alongside the header round);
// none of another size, and never this rank's own block.
TEST(MpiCommunicatorTest, MismatchedBlockSizesLeaveNoStrayMessage) {
  MpiCommunicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks: one disagrees with the others";
  const int n = comm.size();
  // In ints: 1000: every block in the header round; 3000: the last rank
  // posts its receives (24 KB blocks), the others send theirs in the header
  // round (12 KB); 70000: all posted.
  constexpr std::size_t kPosted = MpiCommunicator::kPostedGatherBytes;
  static_assert(kPosted >= 24000 / 2 && kPosted < 24000);
  for (std::size_t block : {std::size_t{1000}, std::size_t{3000}, std::size_t{70000}}) {
    SCOPED_TRACE("block " + std::to_string(block));
    const std::size_t mine = comm.rank() == n - 1 ? 2 * block : block;
    std::vector<std::int32_t> send(mine, comm.rank()), recv(mine * static_cast<std::size_t>(n), -1);
    const std::vector<std::size_t> counts(static_cast<std::size_t>(n), mine);
    CollectiveCall c = call("all_gather");
    c.signature_tag = comm.rank() == n - 1 ? 0x999a : 0x5678;  // even: only the comparison can fail them
    EXPECT_THROW(comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kInt32, c), SignatureMismatch);
    for (std::size_t q = 0; q < static_cast<std::size_t>(n); ++q) {
      // Rank q's block here: mine ints at q * mine. Rank q sent `block` ints
      // (2 * block from the last rank): only a block of the size this rank
      // expects can have landed, and this rank's own never.
      const std::size_t sent = static_cast<int>(q) == n - 1 ? 2 * block : block;
      const bool may_land = sent == mine && static_cast<int>(q) != comm.rank() && mine * 4 > kPosted;
      const std::vector<std::int32_t> got(recv.begin() + static_cast<std::ptrdiff_t>(q * mine),
                                          recv.begin() + static_cast<std::ptrdiff_t>((q + 1) * mine));
      const std::vector<std::int32_t> untouched(mine, -1), landed(mine, static_cast<std::int32_t>(q));
      if (may_land) {
        EXPECT_TRUE(got == untouched || got == landed) << "rank " << q << "'s block is neither untouched nor whole";
      } else {
        EXPECT_EQ(got, untouched) << "rank " << q << "'s block was written";
      }
    }
    float in = 1, out = -1;
    CollectiveCall after = call("all_reduce", 2);
    after.signature_tag = 0x1234;
    comm.all_reduce(&in, &out, 1, DType::kFloat32, ReduceOp::kSum, after);
    EXPECT_EQ(out, static_cast<float>(n));
    std::vector<std::size_t> same(static_cast<std::size_t>(n), block);
    CollectiveCall again = call("all_gather", 3);
    again.signature_tag = 0x4322;
    expect_all_gather_v(comm, same, 1, again);
  }
}

// Blocks and payloads over 64 KiB do not fit in the header round: a second round moves them.
TEST(MpiCommunicatorTest, LargeExchangeAndAllGatherTakeASecondRound) {
  MpiCommunicator comm;
  const int n = comm.size();
  CollectiveCall tagged = call("exchange");
  tagged.signature_tag = 0x5678;
  const auto all = comm.exchange(
      std::string(70000 + static_cast<std::size_t>(comm.rank()), 'a' + static_cast<char>(comm.rank())), tagged);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(all[static_cast<std::size_t>(q)],
              std::string(70000 + static_cast<std::size_t>(q), 'a' + static_cast<char>(q)));
  }
  std::vector<std::size_t> counts;
  for (int q = 0; q < n; ++q) counts.push_back(20000 + static_cast<std::size_t>(q));  // > 64 KiB of int32
  CollectiveCall gather = call("all_gather", 2);
  gather.signature_tag = 0x9abc;
  for (std::size_t outer : {std::size_t{1}, std::size_t{2}}) expect_all_gather_v(comm, counts, outer, gather);
}

// Every row empty, however many rows (the 2^62 of shape (2^62, 0)): the
// gather returns at once instead of walking them, tagged or not.
TEST(MpiCommunicatorTest, ManyEmptyRowsReturnAtOnce) {
  MpiCommunicator comm;
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), 0);
  for (std::uint64_t tag : {std::uint64_t{0}, std::uint64_t{0x2468}}) {
    CollectiveCall c = call("all_gather");
    c.signature_tag = tag;
    std::int32_t send = 0, recv = -1;
    comm.all_gather_v(&send, &recv, counts, std::size_t{1} << 62, DType::kInt32, c);
    EXPECT_EQ(recv, -1);
  }
}

TEST(MpiCommunicatorTest, ResultsAreBitIdenticalAcrossRanks) {
  MpiCommunicator comm;
  std::vector<float> x(100000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 97) + 0.01f * comm.rank();
  std::vector<float> out(x.size());
  comm.all_reduce(x.data(), out.data(), x.size(), DType::kFloat32, ReduceOp::kMean, call("all_reduce"));
  std::vector<float> root(out);
  comm.broadcast(root.data(), root.size(), DType::kFloat32, 0, call("broadcast", 2));
  EXPECT_EQ(std::memcmp(root.data(), out.data(), out.size() * sizeof(float)), 0);
}

TEST(MpiCommunicatorTest, RaggedAllGatherWithOuterRows) {
  MpiCommunicator comm;
  std::vector<std::size_t> counts;
  for (int q = 0; q < comm.size(); ++q) counts.push_back(static_cast<std::size_t>(q) + 2);
  for (std::size_t outer : {std::size_t{1}, std::size_t{3}})
    expect_all_gather_v(comm, counts, outer, call("all_gather"));
}

TEST(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  MpiCommunicator comm;
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<double> buf(5000, comm.rank() == root ? 1.5 * root : -1.0);
    comm.broadcast(buf.data(), buf.size(), DType::kFloat64, root, call("broadcast"));
    EXPECT_EQ(buf, std::vector<double>(5000, 1.5 * root));
  }
}

// On one host, payloads and broadcasts beyond the shared buffers (512 KiB)
// move through MPI after the first step; the others through the buffers.
// Between hosts, the same calls take the header round's second round.
TEST(MpiCommunicatorTest, PayloadsAndBroadcastsOnBothSidesOfTheSharedBuffers) {
  MpiCommunicator comm;
  const int n = comm.size();
  const std::size_t large = NodeSharedMemory::kChunkBytes + 1;
  const auto payload = [&](int q) {
    // Rank 0's beyond the buffers, the others' within (mixed in one call).
    return std::string(q == 0 ? large : 1000 + static_cast<std::size_t>(q), static_cast<char>('a' + q));
  };
  for (std::uint64_t tag : {std::uint64_t{0}, std::uint64_t{0x2468}}) {
    CollectiveCall c = call("exchange");
    c.signature_tag = tag;
    const auto all = comm.exchange(payload(comm.rank()), c);
    ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) EXPECT_EQ(all[static_cast<std::size_t>(q)], payload(q)) << "rank " << q;
  }
  for (std::size_t bytes : {NodeSharedMemory::kChunkBytes, large}) {
    for (int root = 0; root < n; ++root) {
      std::vector<std::uint8_t> buf(bytes, comm.rank() == root ? static_cast<std::uint8_t>(10 + root) : 0);
      if (comm.rank() == root) buf.back() = 7;
      CollectiveCall c = call("broadcast");
      c.signature_tag = 0x1358;
      comm.broadcast(buf.data(), buf.size(), DType::kUInt8, root, c);
      EXPECT_EQ(std::count(buf.begin(), buf.end() - 1, static_cast<std::uint8_t>(10 + root)),
                static_cast<std::ptrdiff_t>(bytes - 1))
          << "bytes " << bytes << " root " << root;
      EXPECT_EQ(buf.back(), 7);
    }
  }
}

// Untagged calls of different kinds (which MPI's path cannot tell apart
// without a tag): on one host the first step compares kinds and sizes, and
// every rank fails with the same InvalidArgumentError, the communicator
// closed.
TEST(MpiCommunicatorTest, UntaggedCallsOfDifferentKindsFailOnOneHost) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    MpiCommunicator comm;
    if (!comm.uses_node_shared_memory()) GTEST_SKIP() << "MPI's path does not compare untagged calls";
    const bool odd_one = comm.rank() == comm.size() - 1;
    const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), 100);
    std::vector<std::int32_t> send(200, 1), recv(200 * static_cast<std::size_t>(comm.size()), -1);
    std::string expected;
    try {
      if (!odd_one) {
        comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kInt32, call("all_gather", 3));
      } else if (variant == 0) {
        comm.barrier(call("all_gather", 3));
      } else if (variant == 1) {
        // Another size than the others expect of it (ragged calls are fine,
        // as long as every rank's counts agree).
        std::vector<std::size_t> mine = counts;
        mine.back() = 200;
        comm.all_gather_v(send.data(), recv.data(), mine, 1, DType::kInt32, call("all_gather", 3));
      } else {
        comm.all_reduce(send.data(), recv.data(), 100, DType::kInt32, ReduceOp::kSum, call("all_gather", 3));
      }
      ADD_FAILURE() << "rank " << comm.rank() << " finished a call the others did not make";
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("all_gather #3: rank "), std::string::npos) << what;
      EXPECT_NE(what.find(variant == 0   ? "a barrier"
                          : variant == 1 ? "an all-gather sending 800 bytes of int32"
                                         : "an all-reduce of 400 bytes of int32 (SUM)"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("an all-gather sending 400 bytes of int32"), std::string::npos) << what;
    }
    EXPECT_EQ(std::count(recv.begin(), recv.end(), -1), static_cast<std::ptrdiff_t>(recv.size()))
        << "the output was written";
    EXPECT_THROW(comm.barrier(call("barrier", 4)), InvalidArgumentError);  // closed
  }
  // Broadcasts from different roots.
  MpiCommunicator comm;
  if (!comm.uses_node_shared_memory()) GTEST_SKIP() << "MPI's path does not compare untagged calls";
  const int root = comm.rank() == comm.size() - 1 ? 1 : 0;
  std::vector<std::int32_t> buf(100, comm.rank() == root ? 5 : -1);
  try {
    comm.broadcast(buf.data(), buf.size(), DType::kInt32, root, call("broadcast", 5));
    ADD_FAILURE() << "rank " << comm.rank() << " finished a broadcast from another root";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("a broadcast of 400 bytes of int32 from rank 1"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("a broadcast of 400 bytes of int32 from rank 0"), std::string::npos)
        << e.what();
  }
  if (comm.rank() != root) {
    EXPECT_EQ(buf, std::vector<std::int32_t>(100, -1)) << "the buffer was written";
  }
}

TEST(MpiCommunicatorTest, ExchangeGivesEveryPayloadInRankOrder) {
  MpiCommunicator comm;
  auto all = comm.exchange(std::string(static_cast<std::size_t>(comm.rank()) * 3, 'a' + static_cast<char>(comm.rank())),
                           call("exchange"));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(comm.size()));
  for (int q = 0; q < comm.size(); ++q) {
    EXPECT_EQ(all[static_cast<std::size_t>(q)],
              std::string(static_cast<std::size_t>(q) * 3, 'a' + static_cast<char>(q)));
  }
  EXPECT_EQ(comm.backend_name(), "mpi");
}

TEST(MpiCommunicatorTest, DifferentTagsThrowOnEveryRankAndTheCommunicatorStaysUsable) {
  MpiCommunicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks: one disagrees with the others";
  CollectiveCall c = call("all_reduce");
  c.signature_tag = comm.rank() == comm.size() - 1 ? 0x1234 : 0x5678;
  float in = 1, out = -1;
  EXPECT_THROW(comm.all_reduce(&in, &out, 1, DType::kFloat32, ReduceOp::kSum, c), SignatureMismatch);
  EXPECT_EQ(out, -1);  // no data moved
  c.signature_tag = 0x5678;
  comm.all_reduce(&in, &out, 1, DType::kFloat32, ReduceOp::kSum, c);
  EXPECT_EQ(out, static_cast<float>(comm.size()));
}

// A large all-gather (beyond the header round's inline data, its blocks
// posted alongside the header round): a peer in another call, or one whose
// tag says another block size or another tag with the same size, makes
// every rank throw SignatureMismatch, and the communicator stays usable:
// nothing is left in flight.
TEST(MpiCommunicatorTest, LargeAllGatherMismatchesFailCleanly) {
  MpiCommunicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks: one disagrees with the others";
  const int n = comm.size();
  const std::size_t big = 100000;  // floats: 400 KB per rank, beyond the header round's inline data
  std::vector<float> send(2 * big, static_cast<float>(comm.rank())), recv(2 * big * static_cast<std::size_t>(n));
  CollectiveCall c = call("all_gather");
  c.signature_tag = 0x5678;
  // The last rank is in another call instead: a small all_reduce (its data
  // in the header round), a barrier, a large broadcast and a large
  // all_reduce (the header round, then data).
  std::vector<float> large(400000, 1.0f), large_out(large.size());
  for (int kind = 0; kind < 4; ++kind) {
    SCOPED_TRACE("the last rank's call: " + std::to_string(kind));
    if (comm.rank() == n - 1) {
      float in = 1, out = -1;
      CollectiveCall other = call(kind == 1 ? "barrier" : kind == 2 ? "broadcast" : "all_reduce");
      other.signature_tag = 0x1234;
      if (kind == 0) {
        EXPECT_THROW(comm.all_reduce(&in, &out, 1, DType::kFloat32, ReduceOp::kSum, other), SignatureMismatch);
      } else if (kind == 1) {
        EXPECT_THROW(comm.barrier(other), SignatureMismatch);
      } else if (kind == 2) {
        EXPECT_THROW(comm.broadcast(large.data(), large.size(), DType::kFloat32, 0, other), SignatureMismatch);
      } else {
        EXPECT_THROW(
            comm.all_reduce(large.data(), large_out.data(), large.size(), DType::kFloat32, ReduceOp::kSum, other),
            SignatureMismatch);
      }
    } else {
      const std::vector<std::size_t> counts(static_cast<std::size_t>(n), big);
      EXPECT_THROW(comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kFloat32, c), SignatureMismatch);
    }
  }
  // The last rank's block is twice as long, as each rank assumes all are like its own.
  {
    const std::size_t mine = comm.rank() == n - 1 ? 2 * big : big;
    const std::vector<std::size_t> counts(static_cast<std::size_t>(n), mine);
    CollectiveCall shaped = c;
    shaped.signature_tag = comm.rank() == n - 1 ? 0x9999 : 0x5678;  // the shapes are in the tag
    EXPECT_THROW(comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kFloat32, shaped), SignatureMismatch);
  }
  // The same block sizes, another tag on the last rank: the blocks arrive
  // (they match the receives posted for them), and every rank still throws.
  {
    const std::vector<std::size_t> counts(static_cast<std::size_t>(n), big);
    CollectiveCall tagged = c;
    tagged.signature_tag = comm.rank() == n - 1 ? 0x9998 : 0x5678;
    EXPECT_THROW(comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kFloat32, tagged), SignatureMismatch);
  }
  // The last rank in an exchange of a payload too large for the header round.
  if (comm.rank() == n - 1) {
    CollectiveCall other = call("exchange");
    other.signature_tag = 0x1234;
    EXPECT_THROW(comm.exchange(std::string(100000, 'x'), other), SignatureMismatch);
  } else {
    const std::vector<std::size_t> counts(static_cast<std::size_t>(n), big);
    EXPECT_THROW(comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kFloat32, c), SignatureMismatch);
  }
  // Then a matching one goes through, every block in place.
  std::fill(recv.begin(), recv.end(), -1.0f);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(n), big);
  comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kFloat32, c);
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(recv[static_cast<std::size_t>(q) * big], static_cast<float>(q));
    EXPECT_EQ(recv[static_cast<std::size_t>(q + 1) * big - 1], static_cast<float>(q));
  }
  float in = 1, out = -1;
  CollectiveCall after = call("all_reduce");
  after.signature_tag = 0x1234;
  comm.all_reduce(&in, &out, 1, DType::kFloat32, ReduceOp::kSum, after);
  EXPECT_EQ(out, static_cast<float>(n));
}

// A tagged all-reduce of 64 KiB to 1 MiB per rank sends its input alongside
// the header round (every rank gathers every input; on one host, unless
// turned off, it compares the tags first and goes through shared memory). A peer with another tag,
// another count or in another call makes every rank throw SignatureMismatch,
// the output untouched, and nothing is left in flight.
TEST(MpiCommunicatorTest, MidSizeAllReduceMismatchesFailCleanly) {
  MpiCommunicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks: one disagrees with the others";
  const int n = comm.size();
  const bool odd_one = comm.rank() == n - 1;
  const std::size_t count = 50000;  // floats: 200 KB per rank
  std::vector<float> send(2 * count, 1.0f), recv(2 * count, -1.0f);
  for (int kind = 0; kind < 4; ++kind) {
    SCOPED_TRACE("the last rank's call: " + std::to_string(kind));
    CollectiveCall c = call("all_reduce", 10 + static_cast<std::uint64_t>(kind));
    c.signature_tag = 0x5678;
    std::fill(recv.begin(), recv.end(), -1.0f);
    if (odd_one && kind == 0) {
      c.signature_tag = 0x9998;  // the same count, another tag: its input arrives, and is not used
      EXPECT_THROW(comm.all_reduce(send.data(), recv.data(), count, DType::kFloat32, ReduceOp::kSum, c),
                   SignatureMismatch);
    } else if (odd_one && kind == 1) {
      c.signature_tag = 0x999a;  // twice the count (the shapes are in the tag)
      EXPECT_THROW(comm.all_reduce(send.data(), recv.data(), 2 * count, DType::kFloat32, ReduceOp::kSum, c),
                   SignatureMismatch);
    } else if (odd_one && kind == 2) {
      c.op = "all_gather";  // a large all-gather, its block posted alongside too
      c.signature_tag = 0x1234;
      const std::vector<std::size_t> counts(static_cast<std::size_t>(n), count);
      std::vector<float> gathered(count * static_cast<std::size_t>(n));
      EXPECT_THROW(comm.all_gather_v(send.data(), gathered.data(), counts, 1, DType::kFloat32, c), SignatureMismatch);
    } else if (odd_one && kind == 3) {
      c.op = "broadcast";  // the header round, then data
      c.signature_tag = 0x1234;
      EXPECT_THROW(comm.broadcast(send.data(), count, DType::kFloat32, 0, c), SignatureMismatch);
    } else {
      EXPECT_THROW(comm.all_reduce(send.data(), recv.data(), count, DType::kFloat32, ReduceOp::kSum, c),
                   SignatureMismatch);
    }
    if (!odd_one || kind < 2) {
      EXPECT_EQ(std::count(recv.begin(), recv.end(), -1.0f), static_cast<std::ptrdiff_t>(recv.size()))
          << "the output was written";
    }
    // Then a matching one goes through on every rank.
    CollectiveCall good = call("all_reduce", 20 + static_cast<std::uint64_t>(kind));
    good.signature_tag = 0x4322;
    comm.all_reduce(send.data(), recv.data(), count, DType::kFloat32, ReduceOp::kSum, good);
    EXPECT_EQ(recv[0], static_cast<float>(n));
    EXPECT_EQ(recv[count - 1], static_cast<float>(n));
  }
}

// Whether a late rank can still finish the collective that a failed rank had
// started depends on MPI's algorithm; the next one cannot finish without the
// failed rank, and the failure notice ends it.
void expect_notice_on_late_rank(MpiCommunicator& comm, std::uint64_t started, ErrorCode code, const std::string& text) {
  try {
    comm.barrier(call("barrier", started, 20));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
  try {
    comm.barrier(call("barrier", started + 1, 20));
    ADD_FAILURE() << "rank " << comm.rank() << " finished a barrier that rank 0 never joined";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find("Worker 0 failed: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// Rank 0 alone calls `first` (`op` #7, a 0.2 s timeout) on a communicator
// of its own (unusable after a timeout); the others come 800 ms late, and
// hear of rank 0's timeout.
template <class First>
void expect_late_ranks_hear_of_the_timeout(const std::string& op, First&& first) {
  MpiCommunicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks: one disagrees with the others";
  if (comm.rank() == 0) {
    try {
      first(comm, call(op, 7, 0.2));
      FAIL() << "expected DeadlineExceededError";
    } catch (const DeadlineExceededError& e) {
      EXPECT_NE(std::string(e.what()).find(op + " #7 timed out after 0.2 s"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm.barrier(call("barrier", 8)), DeadlineExceededError);  // broken for good
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    expect_notice_on_late_rank(comm, 7, ErrorCode::kDeadlineExceeded, op + " #7 timed out");
  }
}

TEST(MpiCommunicatorTest, LateRankMakesTheOthersTimeOutAndHearsOfIt) {
  expect_late_ranks_hear_of_the_timeout("barrier",
                                        [](MpiCommunicator& comm, const CollectiveCall& c) { comm.barrier(c); });
}

// An untagged large all-reduce has no header round: rank 0 waits for the
// others in its data steps (in shared memory on one host), and times out
// there just the same. On MPI's path its sends are left pending, so its
// input is tensor storage: quarantined, it outlives the test for MPI to read.
TEST(MpiCommunicatorTest, LateRanksMakeALargeAllReduceTimeOut) {
  expect_late_ranks_hear_of_the_timeout("all_reduce", [](MpiCommunicator& comm, const CollectiveCall& c) {
    const std::size_t count = std::size_t{1} << 18;  // 1 MiB
    const std::shared_ptr<std::byte> storage = allocate_storage(count * sizeof(float));
    auto* big = reinterpret_cast<float*>(storage.get());
    std::fill(big, big + count, 1.0f);
    comm.all_reduce(big, big, count, DType::kFloat32, ReduceOp::kSum, c);
  });
}

// Between hosts a mid-size exchange sends its payload inside the header
// round, from where it is: rank 0 times out with that send pending, and MPI
// may read the payload after exchange has thrown, so it is sent from a copy
// in tensor storage (quarantined), not from the caller's string (ASan saw it
// freed).
TEST(MpiCommunicatorTest, LateRanksMakeAnExchangeTimeOut) {
  expect_late_ranks_hear_of_the_timeout(
      "exchange", [](MpiCommunicator& comm, const CollectiveCall& c) { comm.exchange(std::string(30000, 'x'), c); });
}

// Inside the data steps of an untagged large all-reduce (in shared memory on
// one host): rank 0's abort from another thread releases it, and its notice
// releases the ranks that then wait for it there. On MPI's path rank 0's
// sends are still pending when it gives up (its peers come after): MPI may
// read its input after the call has thrown, and a late peer may finish the
// call with what it reads, so the input (tensor storage) is kept aside
// (quarantined) with its bytes, never reused; the peer then finishes with the
// right sums (small pieces go out eagerly: the *_pieces runs), or hears of the
// abort, and its next call hears of it.
TEST(MpiCommunicatorTest, AbortReleasesRanksWaitingInALargeAllReduce) {
  MpiCommunicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::size_t count = std::size_t{1} << 18;  // 1 MiB
  std::shared_ptr<std::byte> storage = allocate_storage(count * sizeof(float));
  auto* big = reinterpret_cast<float*>(storage.get());
  std::fill(big, big + count, 1.0f);
  const auto all_reduce = [&] {
    comm.all_reduce(big, big, count, DType::kFloat32, ReduceOp::kSum, call("all_reduce", 1, 0));
  };
  if (comm.rank() == 0) {
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.abort(ErrorCode::kAborted, "replica 3 failed", 3);
    });
    EXPECT_THROW(all_reduce(), AbortedError);
    stopper.join();
    const std::size_t kept = quarantined_blocks();
    storage.reset();
    // The peers come after this (the barrier below): on MPI's path a send
    // of a whole slice (not eager, so MPI waits for its receive) was left,
    // and the input is kept. (1000-byte pieces may all have gone eagerly.)
    if (!comm.uses_node_shared_memory() && comm.max_message_bytes() == MpiCommunicator::kMaxMessageBytes) {
      EXPECT_EQ(quarantined_blocks(), kept + 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);  // until rank 0 has given up
    try {
      all_reduce();
      if (comm.uses_node_shared_memory()) {
        ADD_FAILURE() << "rank " << comm.rank() << " finished an all-reduce that rank 0 left";
      }
      EXPECT_EQ(std::count(big, big + count, static_cast<float>(comm.size())), static_cast<std::ptrdiff_t>(count));
      expect_notice_on_late_rank(comm, 2, ErrorCode::kAborted, "replica 3 failed");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
      EXPECT_NE(std::string(e.what()).find("Worker 0 failed: replica 3 failed"), std::string::npos) << e.what();
    }
  }
}

// Untagged calls have no header round to compare them; through shared memory
// the ranks still compare sizes, dtypes and ops before reading each other's
// buffers, and all fail with the same InvalidArgumentError.
TEST(MpiCommunicatorTest, UntaggedAllReducesOfDifferentSizesFailInSharedMemory) {
  MpiCommunicator comm;
  if (!comm.uses_node_shared_memory()) GTEST_SKIP() << "MPI's path does not compare untagged calls";
  const bool odd_one = comm.rank() == comm.size() - 1;
  const std::size_t count = odd_one ? 200000 : 100000;  // floats: 800 KB against 400 KB
  std::vector<float> data(count, 1.0f);
  try {
    comm.all_reduce(data.data(), data.data(), count, DType::kFloat32, ReduceOp::kSum, call("all_reduce", 5));
    ADD_FAILURE() << "rank " << comm.rank() << " all-reduced across different sizes";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce #5: rank "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("800000 bytes of float32 (SUM)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("400000 bytes of float32 (SUM)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm.barrier(call("barrier", 6)), InvalidArgumentError);  // broken for good
}

TEST(MpiCommunicatorTest, AbortReleasesAWaitingRankAndReachesTheOthers) {
  MpiCommunicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  if (comm.rank() == 0) {
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.abort(ErrorCode::kAborted, "replica 3 failed", 3);
    });
    EXPECT_THROW(comm.barrier(call("barrier", 1, 0)), AbortedError);
    stopper.join();
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    expect_notice_on_late_rank(comm, 1, ErrorCode::kAborted, "replica 3 failed");
  }
}

// MPI counts are ints: blocks above max_message_bytes() (1 GiB) travel in
// pieces. The *_pieces runs set a piece of 1000 bytes, so that every test
// here moves its larger blocks in pieces (ends that fall inside elements,
// ragged last pieces) on MPI's path between hosts.
TEST(MpiCommunicatorTest, MessagePieceSizeComesFromTheEnvironment) {
  MpiCommunicator comm;
  const char* setting = std::getenv("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES");
  const std::size_t expected =
      setting != nullptr ? static_cast<std::size_t>(std::stoull(setting)) : MpiCommunicator::kMaxMessageBytes;
  EXPECT_EQ(comm.max_message_bytes(), expected);
}

// A setting that is no size fails the constructor on every rank (none is
// left waiting in a collective), with the rank that has it named.
TEST(MpiCommunicatorTest, AMessagePieceSizeThatIsNoSizeFailsEveryRank) {
  MpiCommunicator probe;
  if (probe.size() < 2) GTEST_SKIP() << "needs two ranks: one has the bad setting";
  const char* before = std::getenv("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES");
  const std::string saved = before != nullptr ? before : "";
  for (const char* bad : {"0", "999", "12x", "-5", " -18446744073709551615", "1073741825", ""}) {
    if (probe.rank() == 1) setenv("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES", bad, 1);
    try {
      MpiCommunicator comm;
      ADD_FAILURE() << "rank " << probe.rank() << " made a communicator with the setting \"" << bad << "\" on rank 1";
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES on rank 1 is not a whole number of bytes from 1000 to "
                          "1073741824"),
                std::string::npos)
          << what;
      EXPECT_EQ(what.find("(it is \"" + std::string(bad) + "\")") != std::string::npos, probe.rank() == 1) << what;
    }
    if (before != nullptr) {
      setenv("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES", saved.c_str(), 1);
    } else {
      unsetenv("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES");
    }
  }
  // The ranks still agree on the next communicator, and it works.
  MpiCommunicator comm;
  std::int32_t x = comm.rank() + 1, sum = 0;
  comm.all_reduce(&x, &sum, 1, DType::kInt32, ReduceOp::kSum, call("all_reduce"));
  EXPECT_EQ(sum, comm.size() * (comm.size() + 1) / 2);
}

// Sizes around whole numbers of pieces (of 1000 bytes in the *_pieces runs;
// the same sizes, whole messages, in the others), each beyond the header
// round, so that MPI's path sends it point to point: every all-reduce path
// (every input to every rank up to 1 MiB received; beyond, slices that fall
// on piece boundaries), all-gather blocks over kPostedGatherBytes, a
// broadcast, and exchange payloads over kInlineBytes. Every element checked.
TEST(MpiCommunicatorTest, BlocksAroundWholeNumbersOfPiecesArriveWhole) {
  MpiCommunicator comm;
  const int n = comm.size();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t piece = std::min<std::size_t>(comm.max_message_bytes(), 1000);
  std::uint64_t seq = 1;
  for (std::ptrdiff_t delta : {-1, 0, 1}) {
    const auto around = [&](std::size_t whole) {
      return static_cast<std::size_t>(static_cast<std::ptrdiff_t>(whole) + delta);
    };
    // all_reduce of int8 (one byte an element): 70 pieces, then slices of
    // 1100 pieces each (n * 1100 * piece bytes, over 1 MiB received).
    for (std::size_t bytes : {around(70 * piece), around(un * 1100 * piece)}) {
      static_assert(MpiCommunicator::kInlineBytes < 70 * 1000);
      expect_all_reduce(comm, DType::kInt8, ReduceOp::kMax, bytes, /*in_place=*/false);
      expect_all_reduce(comm, DType::kInt8, ReduceOp::kSum, bytes, /*in_place=*/true);
    }
    // all_gather of int32: blocks of 20 pieces (+ 4 bytes per rank and delta).
    std::vector<std::size_t> counts;
    for (int q = 0; q < n; ++q) counts.push_back(around(20 * piece / 4 + static_cast<std::size_t>(q)));
    static_assert(MpiCommunicator::kPostedGatherBytes < 20 * 1000 - 4);
    expect_all_gather_v(comm, counts, 1, call("all_gather", ++seq));
    const std::size_t bytes = around(3 * piece);
    for (int root = 0; root < n; ++root) {
      std::vector<std::uint8_t> buf(bytes);
      const auto byte = [&](std::size_t i) {
        return static_cast<std::uint8_t>(i * 7 + static_cast<std::size_t>(root));
      };
      for (std::size_t i = 0; i < bytes; ++i) buf[i] = comm.rank() == root ? byte(i) : 0;
      comm.broadcast(buf.data(), bytes, DType::kUInt8, root, call("broadcast", ++seq));
      for (std::size_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(buf[i], byte(i)) << "byte " << i << " of " << bytes << " root " << root;
      }
    }
    const auto payload = [&](int q) {
      std::string p(around(66 * piece) + static_cast<std::size_t>(q) * 3, '\0');
      static_assert(MpiCommunicator::kInlineBytes < 66 * 1000 - 1);
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] = static_cast<char>('a' + (i + static_cast<std::size_t>(q)) % 26);
      }
      return p;
    };
    const auto all = comm.exchange(payload(comm.rank()), call("exchange", ++seq));
    ASSERT_EQ(all.size(), un);
    for (int q = 0; q < n; ++q) EXPECT_EQ(all[static_cast<std::size_t>(q)], payload(q)) << "delta " << delta;
  }
}

// The real thing, beyond MPI's int counts: a broadcast of 2 GiB + 7 bytes
// (three messages of the default 1 GiB pieces) and an all-gather of blocks
// of 1 GiB + 3 bytes. About 5 GB per rank and a minute of first touch, so
// only with DISTRIBUTE_TEST_BEYOND_INT_MAX=1 (docs/algorithms.md has a run).
TEST(MpiCommunicatorTest, BlocksBeyondIntMaxBytes) {
  const char* wanted = std::getenv("DISTRIBUTE_TEST_BEYOND_INT_MAX");
  if (wanted == nullptr || std::string(wanted) != "1") GTEST_SKIP() << "set DISTRIBUTE_TEST_BEYOND_INT_MAX=1";
  MpiCommunicator comm;
  const int n = comm.size();
  const auto pattern = [](std::size_t i, int salt) {
    return static_cast<std::uint8_t>((i * 2654435761u) >> 13) ^ static_cast<std::uint8_t>(salt);
  };
  {
    const std::size_t bytes = (std::size_t{2} << 30) + 7;
    std::vector<std::uint8_t> buf(bytes);
    if (comm.rank() == 0) {
      for (std::size_t i = 0; i < bytes; ++i) buf[i] = pattern(i, 1);
    }
    comm.broadcast(buf.data(), bytes, DType::kUInt8, 0, call("broadcast", 1, 600));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < bytes; ++i) wrong += buf[i] != pattern(i, 1);
    EXPECT_EQ(wrong, 0u) << "rank " << comm.rank();
  }
  {
    const std::size_t block = (std::size_t{1} << 30) + 3;
    std::vector<std::uint8_t> send(block), recv(block * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < block; ++i) send[i] = pattern(i, 2 + comm.rank());
    const std::vector<std::size_t> counts(static_cast<std::size_t>(n), block);
    comm.all_gather_v(send.data(), recv.data(), counts, 1, DType::kUInt8, call("all_gather", 2, 600));
    std::size_t wrong = 0;
    for (int q = 0; q < n; ++q) {
      const std::uint8_t* b = recv.data() + static_cast<std::size_t>(q) * block;
      for (std::size_t i = 0; i < block; ++i) wrong += b[i] != pattern(i, 2 + q);
    }
    EXPECT_EQ(wrong, 0u) << "rank " << comm.rank();
  }
}

}  // namespace
}  // namespace distribute::internal
