// The threads backend against a plain reference, for every world size, count
// boundary, dtype and op. Rank r holds x_r[i] = (i % 5) + r (bool: (i + r) % 3 != 0).
#include "comm/threads/shared_memory_communicator.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "core/storage.h"
#include "distribute/errors.h"
#include "testing/reduce_reference.h"
#include "testing/scoped_env.h"
#include "testing/threads.h"

namespace distribute::internal {
namespace {

using distribute::testing::message_of;
using distribute::testing::run_threads;

CollectiveCall call(std::string_view op) {
  CollectiveCall c;
  c.op = op;
  c.sequence = 1;
  c.timeout_seconds = 30;
  return c;
}

using distribute::testing::expected_value;
using distribute::testing::input_value;
using distribute::testing::same_bits;
using distribute::testing::to_dtype;

constexpr std::size_t kNeverStream = SharedMemoryCommunicator::kNeverStream;

// stream_from: where the members' all_reduce starts to stream (1: every
// message of the bandwidth path).
void check_all_reduce(int n, std::size_t count, DType dtype, ReduceOp op, std::size_t stream_from = kNeverStream);

// One test per dtype and op (each a process under ctest); world sizes and
// count boundaries are looped inside, and a failure names them.
class AllReduceTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(AllReduceTest, MatchesReferenceOnEveryRankInAndOutOfPlace) {
  const auto [dtype, op] = GetParam();
  // The latency path is one small round: the elements of its first cache
  // line (48 bytes) and one more; the most it takes (1 KiB) and one more.
  const std::size_t one_line = 48 / size_of(dtype);
  const std::size_t latency = SharedMemoryCommunicator::kLatencyPathBytes / size_of(dtype);
  // The most all_reduce_shared gives each member its own output for, and one more.
  const std::size_t own = SharedMemoryCommunicator::kShareReduceBytes / size_of(dtype);
  for (int n : {1, 2, 3, 4, 7, 8}) {
    // 255/256/257 straddle the 1 KiB latency path for 4-byte types.
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, one_line, one_line + 1, std::size_t{255}, std::size_t{256},
          std::size_t{257}, latency, latency + 1, std::size_t{1000}, own, own + 1, std::size_t{65537}}) {
      if (count == 65537 && own + 1 == 65537) continue;  // (1-byte dtypes: run just above)
      for (std::size_t stream_from : {kNeverStream, std::size_t{1}}) {
        // Up to 1 KiB (the latency path) nothing streams: run it once.
        if (stream_from == 1 && count * size_of(dtype) <= SharedMemoryCommunicator::kLatencyPathBytes) continue;
        SCOPED_TRACE("n=" + std::to_string(n) + " count=" + std::to_string(count) +
                     (stream_from == 1 ? " streaming" : ""));
        check_all_reduce(n, count, dtype, op, stream_from);
      }
    }
  }
}

// Three ways: out of place, in place, and all_reduce_shared (one output for
// every member exactly when shares_reduce says, each its own otherwise).
void check_all_reduce(int n, std::size_t count, DType dtype, ReduceOp op, std::size_t stream_from) {
  enum class Way { kOutOfPlace, kInPlace, kShared };
  for (Way way : {Way::kOutOfPlace, Way::kInPlace, Way::kShared}) {
    const bool in_place = way == Way::kInPlace;
    SCOPED_TRACE(way == Way::kShared ? "shared" : in_place ? "in place" : "out of place");
    auto group = std::make_shared<LocalGroup>(n);
    std::vector<std::vector<std::byte>> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n));
    std::vector<std::shared_ptr<std::byte>> shared(static_cast<std::size_t>(n));
    const std::size_t esz = size_of(dtype);
    // One guard byte after every buffer: nothing may write past the count.
    constexpr std::byte kGuard{0xa5};
    for (int r = 0; r < n; ++r) {
      send[static_cast<std::size_t>(r)].resize(count * esz + 1, kGuard);
      recv[static_cast<std::size_t>(r)].resize(count * esz + 1, kGuard);
      visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        auto* p = reinterpret_cast<T*>(send[static_cast<std::size_t>(r)].data());
        for (std::size_t i = 0; i < count; ++i) p[i] = to_dtype<T>(input_value(dtype, r, i));
      });
    }
    auto errors = run_threads(n, [&](int r) {
      SharedMemoryCommunicator comm(group, r, stream_from);
      auto& s = send[static_cast<std::size_t>(r)];
      if (way == Way::kShared) {
        const Communicator::Segment whole{.send = s.data(), .count = count};
        shared[static_cast<std::size_t>(r)] = comm.all_reduce_shared({&whole, 1}, dtype, op, call("all_reduce"));
        return;
      }
      void* out = in_place ? static_cast<void*>(s.data()) : recv[static_cast<std::size_t>(r)].data();
      comm.all_reduce(s.data(), out, count, dtype, op, call("all_reduce"));
    });
    for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(send[static_cast<std::size_t>(r)].back(), kGuard) << "rank " << r << " wrote past its input";
      ASSERT_EQ(recv[static_cast<std::size_t>(r)].back(), kGuard) << "rank " << r << " wrote past its output";
      if (way == Way::kShared && r > 0 && count > 0) {  // (no elements: null for all)
        EXPECT_EQ(shared[static_cast<std::size_t>(r)] == shared[0],
                  SharedMemoryCommunicator::shares_reduce(n, count * esz))
            << "rank " << r;
      }
    }
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      for (int r = 0; r < n; ++r) {
        const std::byte* buf = way == Way::kShared ? shared[static_cast<std::size_t>(r)].get()
                               : in_place          ? send[static_cast<std::size_t>(r)].data()
                                                   : recv[static_cast<std::size_t>(r)].data();
        const T* p = reinterpret_cast<const T*>(buf);
        for (std::size_t i = 0; i < count; ++i) {
          // (no assertion per element: millions of them, slow under the sanitizers)
          if (!same_bits(p[i], expected_value<T>(op, n, i, dtype))) {
            FAIL() << "rank " << r << " element " << i << " dtype " << to_string(dtype) << " op " << to_string(op);
          }
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, AllReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllReduceOps)),
                         [](const auto& p) {
                           return std::string(to_string(std::get<0>(p.param))) + "_" +
                                  std::string(to_string(std::get<1>(p.param)));
                         });

// ---- reduce_scatter --------------------------------------------------------------

// Rank r's counts[r] elements against the reference, for the engine's own
// reduce_scatter and for the base class's default (all_reduce, keep a block),
// which the MPI and hierarchical backends use.
void check_reduce_scatter(int n, const std::vector<std::size_t>& counts, DType dtype, ReduceOp op, bool base) {
  auto group = std::make_shared<LocalGroup>(n);
  std::size_t total = 0;
  std::vector<std::size_t> offsets;
  for (std::size_t c : counts) {
    offsets.push_back(total);
    total += c;
  }
  const std::size_t esz = size_of(dtype);
  std::vector<std::vector<std::byte>> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    send[static_cast<std::size_t>(r)].resize(total * esz + 1);
    recv[static_cast<std::size_t>(r)].resize(counts[static_cast<std::size_t>(r)] * esz + 1);
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      auto* p = reinterpret_cast<T*>(send[static_cast<std::size_t>(r)].data());
      for (std::size_t i = 0; i < total; ++i) p[i] = to_dtype<T>(input_value(dtype, r, i));
    });
  }
  auto errors = run_threads(n, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    const void* in = send[static_cast<std::size_t>(r)].data();
    void* out = recv[static_cast<std::size_t>(r)].data();
    if (base) {
      comm.Communicator::reduce_scatter(in, out, counts, dtype, op, call("reduce_scatter"));
    } else {
      comm.reduce_scatter(in, out, counts, dtype, op, call("reduce_scatter"));
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int r = 0; r < n; ++r) {
      const T* p = reinterpret_cast<const T*>(recv[static_cast<std::size_t>(r)].data());
      for (std::size_t j = 0; j < counts[static_cast<std::size_t>(r)]; ++j) {
        const T want = expected_value<T>(op, n, offsets[static_cast<std::size_t>(r)] + j, dtype);
        ASSERT_TRUE(same_bits(p[j], want)) << "rank " << r << " element " << j << " of its block";
      }
    }
  });
}

class ReduceScatterTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(ReduceScatterTest, EachRankGetsItsBlockOfTheReduction) {
  const auto [dtype, op] = GetParam();
  for (int n : {1, 2, 3, 4, 7, 8}) {
    // Equal blocks around the 1 KiB latency path (total bytes) and the 64 KiB
    // chunk; ragged blocks, an empty one among them, on the bandwidth path and
    // on the latency path (a small round).
    std::vector<std::vector<std::size_t>> layouts;
    for (std::size_t c : {0u, 1u, 7u, 64u, 257u, 20000u}) layouts.emplace_back(static_cast<std::size_t>(n), c);
    std::vector<std::size_t> ragged, ragged_small;
    for (int r = 0; r < n; ++r) {
      ragged.push_back(r == 0 ? 0 : static_cast<std::size_t>(3 * r + 17000 * (r % 2)));
      ragged_small.push_back(r == 1 ? 0 : static_cast<std::size_t>(r + 1));
    }
    layouts.push_back(ragged);
    layouts.push_back(ragged_small);
    for (const auto& counts : layouts) {
      for (bool base : {false, true}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " counts[last]=" + std::to_string(counts.back()) +
                     (base ? " (the base class's default)" : ""));
        check_reduce_scatter(n, counts, dtype, op, base);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, ReduceScatterTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllReduceOps)),
                         [](const auto& p) {
                           return std::string(to_string(std::get<0>(p.param))) + "_" +
                                  std::string(to_string(std::get<1>(p.param)));
                         });

// Messages of many chunks, one byte short of where streaming starts (normal
// stores) and just there (streaming).
TEST(AllReduceLargeTest, LargeMessagesMatchReference) {
  const std::tuple<DType, ReduceOp, int> cases[] = {
      {DType::kFloat32, ReduceOp::kSum, 2}, {DType::kInt8, ReduceOp::kMean, 3}, {DType::kFloat16, ReduceOp::kMax, 2}};
  for (const auto& [dtype, op, n] : cases) {
    const std::size_t count = (std::size_t{2} << 20) / size_of(dtype) + 5;  // 32 chunks and more
    const std::size_t bytes = count * size_of(dtype);
    for (std::size_t stream_from : {bytes + 1, bytes}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " " + std::string(to_string(op)) + " n=" + std::to_string(n) +
                   " stream_from=" + std::to_string(stream_from));
      check_all_reduce(n, count, dtype, op, stream_from);
    }
  }
}

// A member streams from its threshold on, and never alone.
TEST(AllReduceStreamSettingTest, StreamsFromTheThresholdOn) {
  auto pair = std::make_shared<LocalGroup>(2);
  SharedMemoryCommunicator comm(pair, 0, 4096);
  EXPECT_FALSE(comm.streams(4095));
  EXPECT_TRUE(comm.streams(4096));
  EXPECT_FALSE(SharedMemoryCommunicator(pair, 1, kNeverStream).streams(std::size_t{1} << 40));
  SharedMemoryCommunicator alone(std::make_shared<LocalGroup>(1), 0, 1);
  EXPECT_FALSE(alone.streams(std::size_t{1} << 20));
}

// DISTRIBUTE_STREAM_ALL_REDUCE_BYTES: a whole number of bytes, 0 for never,
// unset or empty for the CPU's default (32 MiB on Intel CPUs, never
// elsewhere); anything else names the setting and its text.
TEST(AllReduceStreamSettingTest, ReadsTheSetting) {
  const char* kName = "DISTRIBUTE_STREAM_ALL_REDUCE_BYTES";
  const distribute::testing::ScopedEnv env(kName, nullptr);
  const auto value_with = [&](const char* text) {
    env.set(text);
    return SharedMemoryCommunicator::default_all_reduce_stream_bytes();
  };
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const std::size_t d = value_with(unset);
    EXPECT_TRUE(d == SharedMemoryCommunicator::kAllReduceStreamBytesIntel || d == kNeverStream) << d;
  }
  EXPECT_EQ(value_with("0"), kNeverStream);
  EXPECT_EQ(value_with("1"), 1u);
  EXPECT_EQ(value_with("33554432"), std::size_t{32} << 20);
  for (const char* bad : {"12x", "-5", " 5", "32M", "99999999999999999999999"}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    try {
      value_with(bad);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(kName) + "='" + bad + "' is not a whole number of bytes"),
                std::string::npos)
          << e.what();
    }
  }
}

// ---- the latency path in two small rounds ----------------------------------------

// One round while members x bytes stays within the read budget, two above
// it, and only on the latency path (up to 1 KiB) of a group of several.
TEST(TwoSmallRoundsTest, TakenAboveTheReadBudgetOnTheLatencyPath) {
  using C = SharedMemoryCommunicator;
  EXPECT_FALSE(C::two_small_rounds(1, 1024));
  EXPECT_FALSE(C::two_small_rounds(2, 1024));
  EXPECT_FALSE(C::two_small_rounds(4, 1024));
  EXPECT_FALSE(C::two_small_rounds(8, 512));
  EXPECT_TRUE(C::two_small_rounds(8, 513));
  EXPECT_FALSE(C::two_small_rounds(16, 256));
  EXPECT_TRUE(C::two_small_rounds(16, 260));
  EXPECT_TRUE(C::two_small_rounds(16, 1024));
  EXPECT_FALSE(C::two_small_rounds(16, 1028));  // the bandwidth path
  EXPECT_TRUE(C::two_small_rounds(2, 8, 0));
  const distribute::testing::ScopedEnv env("DISTRIBUTE_ONE_ROUND_READ_BYTES", "16");
  const C comm(std::make_shared<LocalGroup>(3), 0);
  EXPECT_FALSE(comm.two_small_rounds(5));
  EXPECT_TRUE(comm.two_small_rounds(6));
}

// Every member count, element count (fewer elements than members too: empty
// slices) and either path give the reference's bits: the two rounds reduce
// each element over the same inputs in the same order as the one round.
TEST(TwoSmallRoundsTest, EitherPathMatchesTheReference) {
  for (const char* budget : {"0", "1048576"}) {  // always two rounds; always one
    const distribute::testing::ScopedEnv env("DISTRIBUTE_ONE_ROUND_READ_BYTES", budget);
    for (int n : {2, 5, 16}) {
      for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{16}, std::size_t{17}, std::size_t{256}}) {
        for (auto [dtype, op] :
             {std::pair{DType::kFloat32, ReduceOp::kSum}, std::pair{DType::kFloat16, ReduceOp::kMean},
              std::pair{DType::kInt8, ReduceOp::kProduct}, std::pair{DType::kInt64, ReduceOp::kMax}}) {
          if (count * size_of(dtype) > SharedMemoryCommunicator::kLatencyPathBytes) continue;
          SCOPED_TRACE(std::string("budget=") + budget + " n=" + std::to_string(n) + " count=" + std::to_string(count) +
                       " " + std::string(to_string(dtype)) + " " + std::string(to_string(op)));
          check_all_reduce(n, count, dtype, op);
        }
      }
    }
  }
}

// DISTRIBUTE_ONE_ROUND_READ_BYTES: a whole number of bytes, or the default;
// anything else names the setting and its text.
TEST(TwoSmallRoundsTest, ReadsTheSetting) {
  const char* kName = "DISTRIBUTE_ONE_ROUND_READ_BYTES";
  const distribute::testing::ScopedEnv env(kName, nullptr);
  EXPECT_EQ(SharedMemoryCommunicator::default_one_round_read_bytes(), SharedMemoryCommunicator::kOneRoundReadBytes);
  env.set("0");
  EXPECT_EQ(SharedMemoryCommunicator::default_one_round_read_bytes(), 0u);
  env.set("2k");
  try {
    SharedMemoryCommunicator::default_one_round_read_bytes();
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(std::string(kName) + "='2k' is not a whole number of bytes"),
              std::string::npos)
        << e.what();
  }
}

// A pack of many values reduced in place of the values, and into one shared
// output: segment counts cross member slices and chunks, zero-length
// segments included.
TEST(AllReduceSegmentsTest, MatchesReferenceAcrossSegmentBoundaries) {
  const std::vector<std::size_t> counts = {0, 1, 300, 0, 17000, 5, 40000, 2};
  for (DType dtype : {DType::kFloat32, DType::kInt8, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      for (int n : {1, 2, 3, 7}) {
        for (auto [small, streaming] : {std::pair{true, false}, std::pair{false, false}, std::pair{false, true}}) {
          SCOPED_TRACE(std::string(to_string(dtype)) + " " + std::string(to_string(op)) + " n=" + std::to_string(n) +
                       (small ? " small" : " large") + (streaming ? " streaming" : ""));
          const std::vector<std::size_t> seg_counts = small ? std::vector<std::size_t>{3, 0, 5, 1} : counts;
          const std::size_t esz = size_of(dtype);
          auto group = std::make_shared<LocalGroup>(n);
          // send[r][s], recv[r][s]; element i of the concatenation is input_value(r, i)
          std::vector<std::vector<std::vector<std::byte>>> send(static_cast<std::size_t>(n)),
              recv(static_cast<std::size_t>(n));
          for (int r = 0; r < n; ++r) {
            std::size_t base = 0;
            for (std::size_t c : seg_counts) {
              std::vector<std::byte> in(c * esz + 1), out(c * esz + 1);
              visit_dtype(dtype, [&](auto tag) {
                using T = decltype(tag);
                for (std::size_t i = 0; i < c; ++i)
                  reinterpret_cast<T*>(in.data())[i] = to_dtype<T>(input_value(dtype, r, base + i));
              });
              send[static_cast<std::size_t>(r)].push_back(std::move(in));
              recv[static_cast<std::size_t>(r)].push_back(std::move(out));
              base += c;
            }
          }
          std::vector<std::shared_ptr<std::byte>> shared(static_cast<std::size_t>(n));
          auto errors = run_threads(n, [&](int r) {
            SharedMemoryCommunicator comm(group, r, streaming ? 1 : kNeverStream);
            std::vector<Communicator::Segment> segments;
            for (std::size_t s = 0; s < seg_counts.size(); ++s) {
              segments.push_back({send[static_cast<std::size_t>(r)][s].data(),
                                  recv[static_cast<std::size_t>(r)][s].data(), seg_counts[s]});
            }
            comm.all_reduce_segments(segments, dtype, op, call("all_reduce"));
            // The same pack into one output (the segments' recv unused).
            for (auto& seg : segments) seg.recv = nullptr;
            shared[static_cast<std::size_t>(r)] = comm.all_reduce_shared(segments, dtype, op, call("all_reduce"));
          });
          for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
          std::size_t total = 0;
          for (std::size_t c : seg_counts) total += c;
          visit_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            for (int r = 0; r < n; ++r) {
              std::size_t base = 0;
              const T* whole = reinterpret_cast<const T*>(shared[static_cast<std::size_t>(r)].get());
              for (std::size_t s = 0; s < seg_counts.size(); ++s) {
                const T* p = reinterpret_cast<const T*>(recv[static_cast<std::size_t>(r)][s].data());
                for (std::size_t i = 0; i < seg_counts[s]; ++i) {
                  const T want = expected_value<T>(op, n, base + i, dtype);
                  ASSERT_TRUE(same_bits(p[i], want)) << "rank " << r << " segment " << s << " element " << i;
                  ASSERT_TRUE(same_bits(whole[base + i], want))
                      << "rank " << r << " shared, segment " << s << " element " << i;
                }
                base += seg_counts[s];
              }
              if (r > 0) {
                EXPECT_EQ(shared[static_cast<std::size_t>(r)] == shared[0],
                          SharedMemoryCommunicator::shares_reduce(n, total * esz));
              }
            }
          });
        }
      }
    }
  }
}

class GatherTest : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

// Rank r contributes outer rows of (r + base) int32 elements each, valued
// r*1e6 + o*1e3 + j.
TEST_P(GatherTest, RaggedRowsLandInRankOrderWithinEachOuterRow) {
  const auto [n, outer] = GetParam();
  for (std::size_t base : {0u, 3u}) {
    auto group = std::make_shared<LocalGroup>(n);
    std::vector<std::size_t> counts;
    std::size_t row = 0;
    for (int r = 0; r < n; ++r) {
      counts.push_back(static_cast<std::size_t>(r) + base);
      row += counts.back();
    }
    std::vector<std::vector<std::int32_t>> recv(static_cast<std::size_t>(n),
                                                std::vector<std::int32_t>(outer * row + 1));
    auto errors = run_threads(n, [&](int r) {
      std::vector<std::int32_t> send;
      for (std::size_t o = 0; o < outer; ++o) {
        for (std::size_t j = 0; j < counts[static_cast<std::size_t>(r)]; ++j) {
          send.push_back(static_cast<std::int32_t>(r * 1000000 + static_cast<int>(o) * 1000 + static_cast<int>(j)));
        }
      }
      SharedMemoryCommunicator comm(group, r);
      comm.all_gather_v(send.data(), recv[static_cast<std::size_t>(r)].data(), counts, outer, DType::kInt32,
                        call("all_gather"));
    });
    for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
    for (int r = 0; r < n; ++r) {
      std::size_t k = 0;
      for (std::size_t o = 0; o < outer; ++o) {
        for (int q = 0; q < n; ++q) {
          for (std::size_t j = 0; j < counts[static_cast<std::size_t>(q)]; ++j, ++k) {
            ASSERT_EQ(recv[static_cast<std::size_t>(r)][k],
                      q * 1000000 + static_cast<int>(o) * 1000 + static_cast<int>(j))
                << "rank " << r << " outer " << o << " from " << q << " j " << j;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, GatherTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7), ::testing::Values<std::size_t>(0, 1, 5)));

// Contributions at the edge of a small round (LocalGroup::kSmallBytes): the
// largest decides the path for every member, so ragged counts straddle it too.
TEST(GatherTest, ContributionsAtTheEdgeOfASmallRound) {
  const std::size_t edge = LocalGroup::kSmallBytes / sizeof(std::int32_t);
  for (int n : {2, 3, 7}) {
    for (std::size_t largest : {edge, edge + 1}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " largest=" + std::to_string(largest));
      std::vector<std::size_t> counts;
      std::size_t total = 0;
      for (int r = 0; r < n; ++r) total += counts.emplace_back(largest - static_cast<std::size_t>(r) % 2);
      auto group = std::make_shared<LocalGroup>(n);
      std::vector<std::vector<std::int32_t>> recv(static_cast<std::size_t>(n),
                                                  std::vector<std::int32_t>(total + 1, -1));
      auto errors = run_threads(n, [&](int r) {
        std::vector<std::int32_t> send(counts[static_cast<std::size_t>(r)]);
        for (std::size_t j = 0; j < send.size(); ++j) send[j] = r * 1000000 + static_cast<int>(j);
        SharedMemoryCommunicator comm(group, r);
        for (int repeat = 0; repeat < 3; ++repeat) {  // the blocks of both parities, and one reused
          comm.all_gather_v(send.data(), recv[static_cast<std::size_t>(r)].data(), counts, 1, DType::kInt32,
                            call("all_gather"));
        }
      });
      for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
      for (int r = 0; r < n; ++r) {
        std::size_t k = 0;
        for (int q = 0; q < n; ++q) {
          for (std::size_t j = 0; j < counts[static_cast<std::size_t>(q)]; ++j, ++k) {
            ASSERT_EQ(recv[static_cast<std::size_t>(r)][k], q * 1000000 + static_cast<int>(j)) << "rank " << r;
          }
        }
        EXPECT_EQ(recv[static_cast<std::size_t>(r)][total], -1) << "rank " << r << " wrote past its output";
      }
    }
  }
}

// Contributions beyond the 4 KiB inline areas, and outputs past
// kStreamBytes (streaming stores).
TEST(GatherLargeTest, BeyondInlineAndStreaming) {
  const int n = 3;
  const std::size_t streaming = SharedMemoryCommunicator::kStreamBytes / sizeof(std::int32_t) / n + 1;
  for (std::size_t per_member : {std::size_t{3000}, streaming}) {
    auto group = std::make_shared<LocalGroup>(n);
    std::vector<std::size_t> counts(n, per_member);
    std::vector<std::vector<std::int32_t>> recv(n, std::vector<std::int32_t>(per_member * n));
    auto errors = run_threads(n, [&](int r) {
      std::vector<std::int32_t> send(per_member);
      for (std::size_t j = 0; j < per_member; ++j)
        send[j] = static_cast<std::int32_t>(r * 1000000 + static_cast<int>(j));
      SharedMemoryCommunicator comm(group, r);
      comm.all_gather_v(send.data(), recv[static_cast<std::size_t>(r)].data(), counts, 1, DType::kInt32,
                        call("all_gather"));
    });
    for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) {
        for (std::size_t j = 0; j < per_member; j += 997) {
          ASSERT_EQ(recv[static_cast<std::size_t>(r)][static_cast<std::size_t>(q) * per_member + j],
                    q * 1000000 + static_cast<int>(j));
        }
      }
    }
  }
}

// Every row empty, however many rows (the 2^62 of shape (2^62, 0)): the
// gather returns at once instead of walking them.
TEST(GatherLargeTest, ManyEmptyRowsReturnAtOnce) {
  const int n = 2;
  auto group = std::make_shared<LocalGroup>(n);
  const std::vector<std::size_t> counts(n, 0);
  auto errors = run_threads(n, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    std::int32_t send = 0, recv = -1;
    comm.all_gather_v(&send, &recv, counts, std::size_t{1} << 62, DType::kInt32, call("all_gather"));
    EXPECT_EQ(recv, -1);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
}

// all_gather_v_shared against the same reference as all_gather_v, for every
// member count, ragged and empty contributions, outer rows, and the
// contributions on either side of the sharing threshold (kInlineBytes) and
// past kStreamBytes: from the threshold up every member holds one output
// (the same storage), below it each its own. Each size runs twice on one
// group: the second call reuses the first call's block.
class SharedGatherTest : public ::testing::TestWithParam<int> {};

TEST_P(SharedGatherTest, EveryMemberGetsTheGatherSharedFromTheThresholdOn) {
  const int n = GetParam();
  constexpr std::size_t kInlineInts = LocalGroup::kInlineBytes / sizeof(std::int32_t);
  // An output just past kStreamBytes, whatever the member count.
  const std::size_t streaming =
      SharedMemoryCommunicator::kStreamBytes / sizeof(std::int32_t) / static_cast<std::size_t>(n) + 1;
  struct Case {
    std::size_t largest;  // elements of the largest contribution's row
    std::size_t outer;
    bool member0_empty;  // member 0 contributes nothing
  };
  const Case cases[] = {{kInlineInts, 1, false},        {kInlineInts + 1, 1, false},
                        {kInlineInts + 1, 1, true},     {kInlineInts / 3 + 1, 3, false},
                        {kInlineInts / 3 + 1, 3, true}, {3000, 2, false},
                        {streaming, 1, false}};
  auto group = std::make_shared<LocalGroup>(n);
  for (const Case& c : cases) {
    // The last member's contribution is the largest; the others' ragged.
    std::vector<std::size_t> counts;
    std::size_t row = 0;
    for (int r = 0; r < n; ++r) {
      std::size_t k = c.largest - static_cast<std::size_t>(n - 1 - r) * 7 % (c.largest + 1);
      if (r == 0 && c.member0_empty && n > 1) k = 0;
      if (r == n - 1) k = c.largest;
      counts.push_back(k);
      row += k;
    }
    const std::size_t largest_bytes = c.largest * c.outer * sizeof(std::int32_t);
    const bool shared = n > 1 && SharedMemoryCommunicator::shares_gather(largest_bytes);
    SCOPED_TRACE(std::to_string(n) + " members, largest row " + std::to_string(c.largest) + " x " +
                 std::to_string(c.outer) + (shared ? ", shared" : ", not shared"));
    const std::byte* first_block = nullptr;
    for (int repeat = 0; repeat < 2; ++repeat) {
      std::vector<std::shared_ptr<std::byte>> out(static_cast<std::size_t>(n));
      auto errors = run_threads(n, [&](int r) {
        std::vector<std::int32_t> send;
        for (std::size_t o = 0; o < c.outer; ++o) {
          for (std::size_t j = 0; j < counts[static_cast<std::size_t>(r)]; ++j) {
            send.push_back(
                static_cast<std::int32_t>(r * 10000000 + static_cast<int>(o) * 100000 + static_cast<int>(j)));
          }
        }
        SharedMemoryCommunicator comm(group, r);
        out[static_cast<std::size_t>(r)] =
            comm.all_gather_v_shared(send.data(), counts, c.outer, DType::kInt32, call("all_gather"));
      });
      for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(out[static_cast<std::size_t>(r)]);
        if (r > 0) {
          EXPECT_EQ(out[static_cast<std::size_t>(r)] == out[0], shared) << "member " << r;
        }
        const auto* got = reinterpret_cast<const std::int32_t*>(out[static_cast<std::size_t>(r)].get());
        std::size_t k = 0;
        for (std::size_t o = 0; o < c.outer; ++o) {
          for (int q = 0; q < n; ++q) {
            for (std::size_t j = 0; j < counts[static_cast<std::size_t>(q)]; ++j, ++k) {
              const int want = q * 10000000 + static_cast<int>(o) * 100000 + static_cast<int>(j);
              if (got[k] != want) {  // (no assertion per element: millions of them)
                FAIL() << "member " << r << " outer " << o << " from " << q << " j " << j << ": " << got[k] << ", not "
                       << want;
              }
            }
          }
        }
        ASSERT_EQ(k, row * c.outer);
      }
      // The first call's block, let go, comes back from the shared cache.
      if (shared && repeat == 1) {
        EXPECT_EQ(out[0].get(), first_block);
      }
      first_block = out[0].get();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, SharedGatherTest, ::testing::Values(1, 2, 3, 4, 7, 8));

// A member whose tag differs fails every member before anything is written
// or handed out; the group goes on.
TEST(SharedGatherTest, DifferentTagsThrowMismatchOnEveryMember) {
  const int n = 3;
  auto group = std::make_shared<LocalGroup>(n);
  const std::vector<std::size_t> counts(n, 2000);
  for (const bool mismatch : {true, false}) {
    auto errors = run_threads(n, [&](int r) {
      const std::vector<float> send(2000, static_cast<float>(r));
      SharedMemoryCommunicator comm(group, r);
      CollectiveCall c = call("all_gather");
      c.signature_tag = mismatch && r == 1 ? 0x30 : 0x40;
      const auto out = comm.all_gather_v_shared(send.data(), counts, 1, DType::kFloat32, c);
      const auto* got = reinterpret_cast<const float*>(out.get());
      for (int q = 0; q < n; ++q) EXPECT_EQ(got[static_cast<std::size_t>(q) * 2000 + 1999], static_cast<float>(q));
    });
    for (auto& e : errors) {
      if (mismatch) {
        ASSERT_TRUE(e);
        EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
      } else {
        EXPECT_FALSE(e) << message_of(e);
      }
    }
  }
}

// A shared call (member r's input: kSharedCallCount floats of r + 1) on 3
// members whose member 1 brings another tag: every member throws
// SignatureMismatch and nothing is made; then the same call agrees, every
// member holds one output and its last element is `want_last`.
// (80 KB: past where each shared form starts to share.)
constexpr std::size_t kSharedCallCount = 20000;
using SharedCall =
    std::function<std::shared_ptr<std::byte>(SharedMemoryCommunicator&, const float*, const CollectiveCall&)>;
void expect_mismatch_then_one_output(const char* op, const SharedCall& shared_call, float want_last) {
  const int n = 3;
  auto group = std::make_shared<LocalGroup>(n);
  const auto blocks_taken = [] { return storage_stats().fresh_blocks + storage_stats().reused_blocks; };
  for (const bool mismatch : {true, false}) {
    std::vector<std::shared_ptr<std::byte>> out(n);
    const std::uint64_t taken_before = blocks_taken();
    auto errors = run_threads(n, [&](int r) {
      const std::vector<float> send(kSharedCallCount, static_cast<float>(r + 1));
      SharedMemoryCommunicator comm(group, r);
      CollectiveCall c = call(op);
      c.signature_tag = mismatch && r == 1 ? 0x30 : 0x40;
      out[static_cast<std::size_t>(r)] = shared_call(comm, send.data(), c);
    });
    for (int r = 0; r < n; ++r) {
      const auto& e = errors[static_cast<std::size_t>(r)];
      if (mismatch) {
        ASSERT_TRUE(e);
        EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
      } else {
        ASSERT_FALSE(e) << message_of(e);
        EXPECT_EQ(out[static_cast<std::size_t>(r)], out[0]);
        EXPECT_EQ(reinterpret_cast<const float*>(out[0].get())[kSharedCallCount - 1], want_last);
      }
    }
    EXPECT_EQ(blocks_taken() - taken_before, mismatch ? 0u : 1u) << "one output, and none on a mismatch";
  }
}

// The same for all_reduce_shared: nothing is made or handed out on a
// mismatch, and the group goes on to share the next one.
TEST(SharedAllReduceTest, DifferentTagsThrowMismatchOnEveryMember) {
  expect_mismatch_then_one_output(
      "all_reduce",
      [](SharedMemoryCommunicator& comm, const float* send, const CollectiveCall& c) {
        const Communicator::Segment whole{.send = send, .count = kSharedCallCount};
        return comm.all_reduce_shared({&whole, 1}, DType::kFloat32, ReduceOp::kSum, c);
      },
      6.f);
}

// An output that cannot be allocated (here 2^63 bytes) fails every member
// alike with std::bad_alloc, before any input is read, and the group stays
// in step: the next call works. The same for the shared gather and broadcast.
TEST(SharedAllReduceTest, AnOutputThatCannotBeAllocatedFailsEveryMemberAlike) {
  const int n = 3;
  auto group = std::make_shared<LocalGroup>(n);
  const std::size_t huge = std::size_t{1} << 61;  // float32 elements: 2^63 bytes
  auto errors = run_threads(n, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    const float never_read = 0;  // the call fails before reading any input
    const Communicator::Segment whole{.send = &never_read, .count = huge};
    EXPECT_THROW(comm.all_reduce_shared({&whole, 1}, DType::kFloat32, ReduceOp::kSum, call("all_reduce")),
                 std::bad_alloc);
    const std::vector<std::size_t> counts(n, huge / n);
    EXPECT_THROW(comm.all_gather_v_shared(&never_read, counts, 1, DType::kFloat32, call("all_gather")), std::bad_alloc);
    EXPECT_THROW(comm.broadcast_shared(&never_read, huge, DType::kFloat32, 1, call("broadcast")), std::bad_alloc);
    const std::vector<float> send(2000, 1.f);
    const Communicator::Segment fine{.send = send.data(), .count = send.size()};
    const auto out = comm.all_reduce_shared({&fine, 1}, DType::kFloat32, ReduceOp::kSum, call("all_reduce"));
    EXPECT_EQ(reinterpret_cast<const float*>(out.get())[1999], 3.f);
  });
  for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
}

// share_reduce_above (HierarchicalCommunicator gives its local step 1 KiB):
// 8000 bytes are shared above 1 KiB, and each member's own under the
// default 64 KiB; the same sums either way.
TEST(SharedAllReduceTest, ShareReduceAboveIsWhereTheOutputIsShared) {
  const int n = 2;
  for (const std::size_t above :
       {SharedMemoryCommunicator::kLatencyPathBytes, SharedMemoryCommunicator::kShareReduceBytes}) {
    SCOPED_TRACE("share_reduce_above " + std::to_string(above));
    auto group = std::make_shared<LocalGroup>(n);
    std::vector<std::shared_ptr<std::byte>> out(n);
    auto errors = run_threads(n, [&](int r) {
      const std::vector<float> send(2000, static_cast<float>(r + 1));
      SharedMemoryCommunicator comm(group, r, kNeverStream, above);
      const Communicator::Segment whole{.send = send.data(), .count = send.size()};
      out[static_cast<std::size_t>(r)] =
          comm.all_reduce_shared({&whole, 1}, DType::kFloat32, ReduceOp::kSum, call("all_reduce"));
    });
    for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
    EXPECT_EQ(out[0] == out[1], above < 8000);
    for (int r = 0; r < n; ++r) {
      const auto* got = reinterpret_cast<const float*>(out[static_cast<std::size_t>(r)].get());
      EXPECT_EQ(got[0], 3.f) << "member " << r;
      EXPECT_EQ(got[1999], 3.f) << "member " << r;
    }
  }
}

// A loop that lets go of its last result before the next call gets the same
// block back every time, from the cache every thread shares.
TEST(SharedAllReduceTest, TheBlockComesBackOnceLetGo) {
  const int n = 2;
  auto group = std::make_shared<LocalGroup>(n);
  std::vector<const std::byte*> blocks(5);
  auto errors = run_threads(n, [&](int r) {
    const std::vector<float> send(300000, 1.f);
    SharedMemoryCommunicator comm(group, r);
    const Communicator::Segment whole{.send = send.data(), .count = send.size()};
    std::shared_ptr<std::byte> out;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      out.reset();
      out = comm.all_reduce_shared({&whole, 1}, DType::kFloat32, ReduceOp::kSum, call("all_reduce"));
      if (r == 0) blocks[i] = out.get();
    }
  });
  for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
  for (std::size_t i = 1; i < blocks.size(); ++i) EXPECT_EQ(blocks[i], blocks[0]) << "call " << i;
}

// In place (broadcast), out of place (broadcast_out_of_place: the others
// pass no send), and out of place with the root's recv its send.
enum class BroadcastForm { kInPlace, kOutOfPlace, kRootInPlace };

// `values` on pages that cannot be written: a write into them crashes the test.
class ReadOnlyCopy {
 public:
  explicit ReadOnlyCopy(const std::vector<double>& values) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = std::max<std::size_t>(page, (values.size() * sizeof(double) + page - 1) / page * page);
    mapped_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped_ == MAP_FAILED) throw std::bad_alloc();
    if (!values.empty()) std::memcpy(mapped_, values.data(), values.size() * sizeof(double));
    if (mprotect(mapped_, bytes_, PROT_READ) != 0) throw std::bad_alloc();
  }
  ~ReadOnlyCopy() { munmap(mapped_, bytes_); }
  ReadOnlyCopy(const ReadOnlyCopy&) = delete;
  ReadOnlyCopy& operator=(const ReadOnlyCopy&) = delete;
  double* data() const { return static_cast<double*>(mapped_); }

 private:
  void* mapped_ = nullptr;
  std::size_t bytes_ = 0;
};

class BroadcastTest : public ::testing::TestWithParam<BroadcastForm> {};

TEST_P(BroadcastTest, EveryRankGetsTheRootsBytesAndNoSendChanges) {
  const BroadcastForm form = GetParam();
  // 6 and 7 doubles: a small round's first line and one more; the most a
  // small round carries, and one more (the inline path); the most the
  // inline path carries, and one more (two rounds); 10000; past
  // kStreamBytes: streaming stores.
  const std::size_t small = LocalGroup::kSmallBytes / sizeof(double);
  const std::size_t inline_count = LocalGroup::kInlineBytes / sizeof(double);
  const std::size_t streaming = SharedMemoryCommunicator::kStreamBytes / sizeof(double) + 3;
  for (std::size_t count : {std::size_t{0}, std::size_t{6}, std::size_t{7}, small, small + 1, inline_count,
                            inline_count + 1, std::size_t{10000}, streaming}) {
    for (int n : {1, 2, 3, 7}) {
      for (int root = 0; root < n; ++root) {
        if (count > 10000 && (n > 2 || root > 0)) continue;  // one large case is enough
        SCOPED_TRACE(std::to_string(n) + " ranks, root " + std::to_string(root) + ", " + std::to_string(count) +
                     " doubles");
        auto group = std::make_shared<LocalGroup>(n);
        const auto value = [](int r, std::size_t i) { return r * 1000 + static_cast<double>(i); };
        std::vector<std::vector<double>> send(static_cast<std::size_t>(n), std::vector<double>(count));
        for (int r = 0; r < n; ++r) {
          for (std::size_t i = 0; i < count; ++i) send[static_cast<std::size_t>(r)][i] = value(r, i);
        }
        const std::vector<std::vector<double>> sent = send;
        // The root's buffer is only read, in every form (in place too): it
        // lies on pages that cannot be written.
        const ReadOnlyCopy root_send(sent[static_cast<std::size_t>(root)]);
        std::vector<std::vector<double>> recv(static_cast<std::size_t>(n), std::vector<double>(count, -1.0));
        auto errors = run_threads(n, [&](int r) {
          SharedMemoryCommunicator comm(group, r);
          double* mine = r == root ? root_send.data() : send[static_cast<std::size_t>(r)].data();
          double* out = recv[static_cast<std::size_t>(r)].data();
          if (form == BroadcastForm::kInPlace) {
            comm.broadcast(mine, count, DType::kFloat64, root, call("broadcast"));
          } else if (form == BroadcastForm::kRootInPlace && r == root) {
            comm.broadcast_out_of_place(mine, mine, count, DType::kFloat64, root, call("broadcast"));
          } else {
            comm.broadcast_out_of_place(r == root ? mine : nullptr, out, count, DType::kFloat64, root,
                                        call("broadcast"));
          }
          comm.barrier(call("barrier"));
        });
        for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
        const std::vector<double>& want = sent[static_cast<std::size_t>(root)];
        for (int r = 0; r < n; ++r) {
          const auto u = static_cast<std::size_t>(r);
          if (form == BroadcastForm::kInPlace) {
            EXPECT_EQ(send[u], want) << "rank " << r;
          } else if (form == BroadcastForm::kRootInPlace && r == root) {
            EXPECT_EQ(send[u], want) << "rank " << r;
            EXPECT_EQ(recv[u], std::vector<double>(count, -1.0)) << "rank " << r << ": its recv was not passed";
          } else {
            EXPECT_EQ(recv[u], want) << "rank " << r;
            EXPECT_EQ(send[u], sent[u]) << "rank " << r << ": a send changed";
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, BroadcastTest,
                         ::testing::Values(BroadcastForm::kInPlace, BroadcastForm::kOutOfPlace,
                                           BroadcastForm::kRootInPlace),
                         [](const ::testing::TestParamInfo<BroadcastForm>& param) {
                           return param.param == BroadcastForm::kInPlace      ? std::string("InPlace")
                                  : param.param == BroadcastForm::kOutOfPlace ? std::string("OutOfPlace")
                                                                              : std::string("RootInPlace");
                         });

// A root that is not a member is refused by every member, before any
// round, by each form: the group goes on.
TEST(BroadcastRootTest, ARootOutsideTheGroupIsRefusedByEveryMember) {
  constexpr int kRanks = 2;
  auto group = std::make_shared<LocalGroup>(kRanks);
  for (const int root : {-1, kRanks}) {
    for (const std::size_t count : {std::size_t{4}, std::size_t{20000}}) {
      std::vector<float> buffers[kRanks] = {std::vector<float>(count, 1.f), std::vector<float>(count, 2.f)};
      auto errors = run_threads(kRanks, [&](int r) {
        SharedMemoryCommunicator comm(group, r);
        float* mine = buffers[r].data();
        EXPECT_THROW(comm.broadcast(mine, count, DType::kFloat32, root, call("broadcast")), InvalidArgumentError);
        EXPECT_THROW(comm.broadcast_out_of_place(mine, mine, count, DType::kFloat32, root, call("broadcast")),
                     InvalidArgumentError);
        EXPECT_THROW(comm.broadcast_shared(mine, count, DType::kFloat32, root, call("broadcast")),
                     InvalidArgumentError);
        comm.broadcast(mine, count, DType::kFloat32, 1, call("broadcast"));
      });
      for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
      EXPECT_EQ(buffers[0], std::vector<float>(count, 2.f)) << "root " << root;
    }
  }
}

// A rank whose tag differs fails every rank of an out-of-place broadcast
// before any recv is written, the root's included, on every path.
TEST(BroadcastMismatchTest, OutOfPlaceWritesNoRecv) {
  constexpr int kRanks = 3;
  auto group = std::make_shared<LocalGroup>(kRanks);
  for (const std::size_t count : {std::size_t{4}, LocalGroup::kInlineBytes / sizeof(float), std::size_t{20000}}) {
    SCOPED_TRACE(std::to_string(count) + " floats");
    const std::vector<float> send(count, 5.f);
    std::vector<std::vector<float>> recv(kRanks, std::vector<float>(count, -1.f));
    auto errors = run_threads(kRanks, [&](int r) {
      SharedMemoryCommunicator comm(group, r);
      CollectiveCall c = call("broadcast");
      c.signature_tag = r == 2 ? 0x1234 : 0x5678;
      comm.broadcast_out_of_place(r == 1 ? send.data() : nullptr, recv[static_cast<std::size_t>(r)].data(), count,
                                  DType::kFloat32, 1, c);
    });
    for (auto& e : errors) {
      ASSERT_TRUE(e);
      EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
    }
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(recv[static_cast<std::size_t>(r)], std::vector<float>(count, -1.f)) << "rank " << r;
    }
  }
}

// broadcast_shared: every member gets the root's bytes, from every root,
// on either side of the sharing threshold (kInlineBytes), on a small round,
// with no elements and past kStreamBytes; from the threshold up every member
// holds one output (the same storage), below it each its own. Each size
// runs twice on one group: the second call reuses the first call's block.
class SharedBroadcastTest : public ::testing::TestWithParam<int> {};

TEST_P(SharedBroadcastTest, EveryMemberGetsTheRootsBytesSharedFromTheThresholdOn) {
  const int n = GetParam();
  constexpr std::size_t kInlineInts = LocalGroup::kInlineBytes / sizeof(std::int32_t);
  const std::size_t streaming = SharedMemoryCommunicator::kStreamBytes / sizeof(std::int32_t) + 5;
  auto group = std::make_shared<LocalGroup>(n);
  for (const std::size_t count :
       {std::size_t{0}, std::size_t{3}, kInlineInts, kInlineInts + 1, std::size_t{3001}, streaming}) {
    for (const int root : {0, n / 2, n - 1}) {
      if (count == streaming && root != n - 1) continue;  // one large case per member count is enough
      const std::size_t bytes = count * sizeof(std::int32_t);
      const bool shared = n > 1 && SharedMemoryCommunicator::shares_broadcast(bytes);
      SCOPED_TRACE(std::to_string(n) + " members, root " + std::to_string(root) + ", " + std::to_string(bytes) + " B" +
                   (shared ? ", shared" : ", not shared"));
      const std::byte* first_block = nullptr;
      for (int repeat = 0; repeat < 2; ++repeat) {
        std::vector<std::shared_ptr<std::byte>> out(static_cast<std::size_t>(n));
        auto errors = run_threads(n, [&](int r) {
          std::vector<std::int32_t> send(count);
          for (std::size_t j = 0; j < count; ++j) send[j] = r * 100000000 + static_cast<std::int32_t>(j);
          SharedMemoryCommunicator comm(group, r);
          out[static_cast<std::size_t>(r)] =
              comm.broadcast_shared(r == root ? send.data() : nullptr, count, DType::kInt32, root, call("broadcast"));
        });
        for (auto& e : errors) ASSERT_FALSE(e) << message_of(e);
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(out[static_cast<std::size_t>(r)] != nullptr, count > 0) << "member " << r;
          if (r > 0 && count > 0) {
            EXPECT_EQ(out[static_cast<std::size_t>(r)] == out[0], shared) << "member " << r;
          }
          const auto* got = reinterpret_cast<const std::int32_t*>(out[static_cast<std::size_t>(r)].get());
          for (std::size_t j = 0; j < count; ++j) {
            if (got[j] != root * 100000000 + static_cast<std::int32_t>(j)) {  // (no assertion per element)
              FAIL() << "member " << r << " element " << j << ": " << got[j];
            }
          }
        }
        if (shared && repeat == 1) {
          EXPECT_EQ(out[0].get(), first_block);
        }
        first_block = out[0].get();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, SharedBroadcastTest, ::testing::Values(1, 2, 3, 4, 7, 8));

// A member whose tag differs fails every member before anything is made or
// read; the group goes on to share the next one (member 2's value).
TEST(SharedBroadcastTest, DifferentTagsThrowMismatchOnEveryMember) {
  expect_mismatch_then_one_output(
      "broadcast",
      [](SharedMemoryCommunicator& comm, const float* send, const CollectiveCall& c) {
        return comm.broadcast_shared(send, kSharedCallCount, DType::kFloat32, 2, c);
      },
      3.f);
}

TEST(SignatureTagTest, DifferentTagsThrowMismatchOnEveryRankBeforeDataMoves) {
  auto group = std::make_shared<LocalGroup>(3);
  std::vector<float> out(3, -1.f);
  auto errors = run_threads(3, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    CollectiveCall c = call("all_reduce");
    c.signature_tag = r == 2 ? 0x1234 : 0x5678;
    float in = 1.f;
    comm.all_reduce(&in, &out[static_cast<std::size_t>(r)], 1, DType::kFloat32, ReduceOp::kSum, c);
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
  }
  EXPECT_EQ(out, std::vector<float>(3, -1.f));  // nothing was written
  // Equal tags with the error bit (bit 0) set fail too.
  auto flagged = run_threads(3, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    CollectiveCall c = call("barrier");
    c.signature_tag = 0x5679;
    comm.barrier(c);
  });
  for (auto& e : flagged) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), SignatureMismatch);
  }
  // A mismatch does not fail the group: the next collective works.
  auto again = run_threads(3, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    CollectiveCall c = call("barrier");
    c.signature_tag = 0x5678;
    comm.barrier(c);
  });
  for (auto& e : again) EXPECT_FALSE(e) << message_of(e);
}

TEST(ExchangeTest, ReturnsEveryPayloadInRankOrderRepeatedly) {
  const int n = 4;
  auto group = std::make_shared<LocalGroup>(n);
  auto errors = run_threads(n, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.size(), n);
    EXPECT_EQ(comm.backend_name(), "threads");
    for (int round = 0; round < 100; ++round) {
      auto all = comm.exchange(std::string(static_cast<std::size_t>(r + 1), static_cast<char>('a' + round % 26)),
                               call("exchange"));
      ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(all[static_cast<std::size_t>(q)],
                  std::string(static_cast<std::size_t>(q + 1), static_cast<char>('a' + round % 26)));
      }
    }
  });
  for (auto& e : errors) EXPECT_FALSE(e) << message_of(e);
}

TEST(AllReduceAbortTest, AbortReleasesRanksWaitingInAllReduce) {
  auto group = std::make_shared<LocalGroup>(3);
  std::vector<float> data(16, 1.f);
  auto errors = run_threads(2, [&](int r) {
    SharedMemoryCommunicator comm(group, r);
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      comm.abort(ErrorCode::kAborted, "stop", 1);
      return;
    }
    std::vector<float> out(16);
    CollectiveCall c = call("all_reduce");
    c.timeout_seconds = 0;
    comm.all_reduce(data.data(), out.data(), 16, DType::kFloat32, ReduceOp::kSum, c);
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), AbortedError);
}

// A member that leaves a collective with an error must not leave while
// another still writes into its buffers (all_reduce and broadcast copy into
// the other members' outputs between their two rounds; all_gather reads
// their inputs). Members arrive at random moments and an abort lands at a
// random moment: before the data round completes (every member must then
// raise, and nobody may go on to copy) or during the copies (everyone
// finishes them, and the abort is raised by the next call). A member that
// raised fills its output with a canary at once; once every member has
// returned, the canary must be intact. (When members left the last round on
// an abort without waiting for the others, most runs wrote into a returned
// member's output.)
// One test per op (each a process of its own under ctest, with the hang
// watchdog's 50 s to itself: the five ops in one test took 39 s under TSan
// in a CI run, when they were five). 16 runs each, 12 under TSan.
#if defined(__SANITIZE_THREAD__)
constexpr int kRunsPerOp = 12;
#else
constexpr int kRunsPerOp = 16;
#endif

class AbortTest : public ::testing::TestWithParam<const char*> {};

TEST_P(AbortTest, NoMemberLeavesWhileAnotherStillUsesItsBuffers) {
  constexpr int kMembers = 3;
  constexpr std::size_t kCount = 1 << 20;  // 4 MiB of float32: the bandwidth paths
  constexpr float kCanary = -7.f;
  std::mt19937 rng(12345);
  int raised_in_call = 0, raised_after = 0;
  const char* const op = GetParam();
  {
    std::vector<std::vector<float>> out(kMembers, std::vector<float>(kCount * kMembers, 0.f));
    auto run_call = [&](SharedMemoryCommunicator& comm, int r, const float* in) {
      auto& mine = out[static_cast<std::size_t>(r)];
      if (std::string_view(op) == "all_reduce_shared") {
        // The members read each other's inputs (ASan catches a late reader
        // of a freed one); the output is the call's own.
        const Communicator::Segment whole{.send = in, .count = kCount};
        const auto result = comm.all_reduce_shared({&whole, 1}, DType::kFloat32, ReduceOp::kSum, call(op));
        std::memcpy(mine.data(), result.get(), kCount * sizeof(float));
      } else if (std::string_view(op) == "all_reduce") {
        comm.all_reduce(in, mine.data(), kCount, DType::kFloat32, ReduceOp::kSum, call(op));
      } else if (std::string_view(op) == "broadcast") {
        comm.broadcast(mine.data(), kCount * kMembers, DType::kFloat32, 0, call(op));
      } else if (std::string_view(op) == "broadcast_out_of_place") {
        // Every member writes into the root's output too, and reads the
        // root's input (ASan catches a late reader of a freed one).
        comm.broadcast_out_of_place(r == 0 ? in : nullptr, mine.data(), kCount, DType::kFloat32, 0, call(op));
      } else if (std::string_view(op) == "broadcast_shared") {
        // The members read the root's input (ASan catches a late reader of a freed one).
        const auto result = comm.broadcast_shared(in, kCount, DType::kFloat32, 0, call(op));
        std::memcpy(mine.data(), result.get(), kCount * sizeof(float));
      } else {
        std::vector<std::size_t> counts(kMembers, kCount);
        comm.all_gather_v(in, mine.data(), counts, 1, DType::kFloat32, call(op));
      }
    };
    // The moments are drawn relative to how long one call takes in this
    // build (sanitizers are many times slower).
    const std::vector<float> ones(kCount, 1.f);
    auto calibration_group = std::make_shared<LocalGroup>(kMembers);
    std::vector<double> seconds(kMembers);
    run_threads(kMembers, [&](int r) {
      SharedMemoryCommunicator comm(calibration_group, r);
      for (int i = 0; i < 3; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        run_call(comm, r, ones.data());
        seconds[static_cast<std::size_t>(r)] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    });
    const auto one_call = std::chrono::duration<double>(*std::max_element(seconds.begin(), seconds.end()));
    for (int run = 0; run < kRunsPerOp; ++run) {
      SCOPED_TRACE(std::string(op) + " run " + std::to_string(run));
      auto group = std::make_shared<LocalGroup>(kMembers);
      std::uniform_real_distribution<double> fraction(0, 1);
      // Both kinds of moment in every op, whatever the draws: run 0 aborts
      // before any member arrives (a quarter of a call or more before the
      // first), run 1 a call and a half after the last has arrived (each has
      // finished); the others at random moments.
      const double abort_calls = run == 0 ? 0.0 : run == 1 ? 2.0 : 1.5 * fraction(rng);
      const auto abort_at = std::chrono::duration_cast<std::chrono::microseconds>(abort_calls * one_call);
      std::vector<std::chrono::microseconds> arrive_at;
      for (int r = 0; r < kMembers; ++r) {
        const double arrive_calls = run == 0 ? 0.25 + 0.25 * fraction(rng) : 0.5 * fraction(rng);
        arrive_at.push_back(std::chrono::duration_cast<std::chrono::microseconds>(arrive_calls * one_call));
      }
      std::vector<std::vector<float>> in(kMembers, ones);
      std::vector<int> raised(kMembers, 0);
      std::atomic<bool> aborted{false};
      std::atomic<int> returned{0};
      std::thread aborter([&] {
        std::this_thread::sleep_for(abort_at);
        group->abort(ErrorCode::kAborted, "stop", 0);
        aborted = true;
      });
      auto errors = run_threads(kMembers, [&](int r) {
        SharedMemoryCommunicator comm(group, r);
        auto& mine = out[static_cast<std::size_t>(r)];
        std::this_thread::sleep_for(arrive_at[static_cast<std::size_t>(r)]);
        try {
          run_call(comm, r, in[static_cast<std::size_t>(r)].data());
        } catch (const AbortedError&) {
          raised[static_cast<std::size_t>(r)] = 1;
          std::fill(mine.begin(), mine.end(), kCanary);
          // Under ASan a late reader of this input is caught too.
          in[static_cast<std::size_t>(r)] = std::vector<float>();
        }
        ++returned;
        while (returned.load() < kMembers) std::this_thread::yield();
        // The abort is never lost: a member that finished the call raises it in the next.
        while (!aborted.load()) std::this_thread::yield();
        if (!raised[static_cast<std::size_t>(r)]) {
          EXPECT_THROW(comm.barrier(call("barrier")), AbortedError);
          raised[static_cast<std::size_t>(r)] = 2;
        }
      });
      aborter.join();
      for (auto& e : errors) EXPECT_FALSE(e) << message_of(e);
      // One verdict for the call: all raised in it, or none did.
      EXPECT_EQ(std::count(raised.begin(), raised.end(), 1) % kMembers, 0);
      for (int r = 0; r < kMembers; ++r) {
        if (raised[static_cast<std::size_t>(r)] != 1) {
          ++raised_after;
          continue;
        }
        ++raised_in_call;
        const auto& mine = out[static_cast<std::size_t>(r)];
        const auto wrong = std::count_if(mine.begin(), mine.end(), [&](float v) { return v != kCanary; });
        EXPECT_EQ(wrong, 0) << "member " << r << " raised, yet its output was written after it returned";
      }
    }
  }
  // Both kinds of moment happened.
  EXPECT_GT(raised_in_call, 0);
  EXPECT_GT(raised_after, 0);
}

INSTANTIATE_TEST_SUITE_P(EveryBandwidthPath, AbortTest,
                         ::testing::Values("all_reduce", "all_reduce_shared", "broadcast", "broadcast_out_of_place",
                                           "broadcast_shared", "all_gather"),
                         [](const ::testing::TestParamInfo<const char*>& param) { return std::string(param.param); });

}  // namespace
}  // namespace distribute::internal
