// The tests of the conformance suite (backend_conformance.h). Each member
// checks its own results against the plain reference (reduce_reference.h)
// and throws at the first difference, so a failure names the member, the
// call and the element.
#include "comm/conformance/backend_conformance.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distribute/dtype.h"
#include "distribute/errors.h"
#include "distribute/reduce_op.h"
#include "testing/reduce_reference.h"
#include "testing/threads.h"

namespace distribute::testing {

std::vector<std::exception_ptr> BackendConformance::on_every_member(const std::function<void(Communicator&)>& body) {
  const std::vector<Communicator*> members = group_->members();
  return run_threads(static_cast<int>(members.size()), [&](int i) { body(*members[static_cast<std::size_t>(i)]); });
}

namespace {

constexpr std::byte kGuard{0xA5};
constexpr double kTimeout = 30;  // seconds: a call that hangs fails

// A member's calls, numbered as every member numbers them.
class Calls {
 public:
  CollectiveCall next(std::string_view op) {
    return CollectiveCall{.op = op, .sequence = ++sequence_, .timeout_seconds = kTimeout};
  }

 private:
  std::uint64_t sequence_ = 0;
};

// `count` elements of rank `rank`'s input, from element `first` on, then a guard byte.
std::vector<std::byte> input(DType dtype, int rank, std::size_t count, std::size_t first = 0) {
  std::vector<std::byte> bytes(count * size_of(dtype) + 1, kGuard);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* p = reinterpret_cast<T*>(bytes.data());
    for (std::size_t i = 0; i < count; ++i) p[i] = to_dtype<T>(input_value(dtype, rank, first + i));
  });
  return bytes;
}

std::string describe(const Communicator& c, const CollectiveCall& call, DType dtype, std::size_t count) {
  return "rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()) + ", " + std::string(call.op) + " #" +
         std::to_string(call.sequence) + " of " + std::to_string(count) + " " + std::string(to_string(dtype));
}

// Throws at the first of `count` elements at `got` that differs from
// want(i), naming `what`.
template <class Want>
void expect_elements(const std::byte* got, std::size_t count, DType dtype, const std::string& what, Want&& want) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = reinterpret_cast<const T*>(got);
    for (std::size_t i = 0; i < count; ++i) {
      const T w = want(T{}, i);
      if (!same_bits(p[i], w)) {
        throw std::runtime_error(what + ": element " + std::to_string(i) + " differs from the reference");
      }
    }
  });
}

void expect_guard(const std::vector<std::byte>& bytes, const std::string& what) {
  if (bytes.back() != kGuard) throw std::runtime_error(what + ": wrote past the end of a buffer");
}

// The element counts that cross the algorithms' thresholds: the threads
// engine's latency path (1 KiB) and stream (64 KiB), MPI's inline messages
// (64 KiB) and its posted gathers (16 KiB).
const std::vector<std::size_t> kCounts = {0, 1, 5, 300, 5000, 20000};

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (std::size_t i = 0; i < errors.size(); ++i)
    EXPECT_FALSE(errors[i]) << "member " << i << ": " << message_of(errors[i]);
}

}  // namespace

TEST_P(BackendConformance, AllReduceEveryOpDTypeAndSizeInAndOutOfPlace) {
  expect_no_errors(on_every_member([&](Communicator& c) {
    Calls calls;
    for (const DType dtype : kAllDTypes) {
      for (const ReduceOp op : kAllReduceOps) {
        for (const std::size_t count : kCounts) {
          for (const bool in_place : {false, true}) {
            std::vector<std::byte> send = input(dtype, c.rank(), count);
            std::vector<std::byte> recv(send.size(), kGuard);
            const CollectiveCall call = calls.next("all_reduce");
            std::byte* out = in_place ? send.data() : recv.data();
            c.all_reduce(send.data(), out, count, dtype, op, call);
            const std::string what = describe(c, call, dtype, count) + " " + std::string(to_string(op)) +
                                     (in_place ? " in place" : " out of place");
            expect_elements(out, count, dtype, what,
                            [&](auto t, std::size_t i) { return expected_value<decltype(t)>(op, c.size(), i, dtype); });
            expect_guard(send, what);
            expect_guard(recv, what);
            if (!in_place && send != input(dtype, c.rank(), count)) throw std::runtime_error(what + ": input changed");
          }
        }
      }
    }
  }));
}

// Larger than any threshold, and than one stream step: 1 Mi + 3 elements.
TEST_P(BackendConformance, AllReduceOfMegabytes) {
  expect_no_errors(on_every_member([&](Communicator& c) {
    Calls calls;
    const std::size_t count = (std::size_t{1} << 20) + 3;
    for (const ReduceOp op : kAllReduceOps) {
      std::vector<std::byte> send = input(DType::kFloat32, c.rank(), count);
      std::vector<std::byte> recv(send.size(), kGuard);
      const CollectiveCall call = calls.next("all_reduce");
      c.all_reduce(send.data(), recv.data(), count, DType::kFloat32, op, call);
      expect_elements(
          recv.data(), count, DType::kFloat32, describe(c, call, DType::kFloat32, count),
          [&](auto t, std::size_t i) { return expected_value<decltype(t)>(op, c.size(), i, DType::kFloat32); });
      expect_guard(recv, describe(c, call, DType::kFloat32, count));
    }
    // MEAN by another divisor than the group's size.
    std::vector<std::byte> v = input(DType::kFloat64, c.rank(), 10);
    const CollectiveCall call = calls.next("all_reduce");
    c.all_reduce(v.data(), v.data(), 10, DType::kFloat64, ReduceOp::kMean, call, /*mean_divisor=*/7);
    expect_elements(v.data(), 10, DType::kFloat64, describe(c, call, DType::kFloat64, 10), [&](auto t, std::size_t i) {
      return to_dtype<decltype(t)>(expected_value<double>(ReduceOp::kSum, c.size(), i, DType::kFloat64) / 7);
    });
  }));
}

// Segments reduce as one buffer: element i of the concatenation is the
// reference's element i.
TEST_P(BackendConformance, AllReduceSegmentsAndSharedAsOneBuffer) {
  const std::vector<std::size_t> counts = {3, 0, 1000, 17, 30000};
  expect_no_errors(on_every_member([&](Communicator& c) {
    Calls calls;
    for (const DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16, DType::kUInt8}) {
      for (const ReduceOp op : kAllReduceOps) {
        for (const int way : {0, 1, 2}) {  // out of place, in place, into shared storage
          std::vector<std::vector<std::byte>> send, recv;
          std::vector<Communicator::Segment> segments;
          std::size_t first = 0, total = 0;
          for (const std::size_t n : counts) {
            send.push_back(input(dtype, c.rank(), n, first));
            recv.emplace_back(send.back().size(), kGuard);
            first += n;
          }
          total = first;
          for (std::size_t s = 0; s < counts.size(); ++s) {
            segments.push_back(
                {.send = send[s].data(), .recv = way == 1 ? send[s].data() : recv[s].data(), .count = counts[s]});
          }
          const CollectiveCall call = calls.next("all_reduce");
          const std::string what =
              describe(c, call, dtype, total) + " " + std::string(to_string(op)) + " way " + std::to_string(way);
          auto want = [&](std::size_t base) {
            return
                [&, base](auto t, std::size_t i) { return expected_value<decltype(t)>(op, c.size(), base + i, dtype); };
          };
          if (way == 2) {
            const std::shared_ptr<std::byte> out = c.all_reduce_shared(segments, dtype, op, call);
            if (out == nullptr) throw std::runtime_error(what + ": no storage for a non-empty result");
            expect_elements(out.get(), total, dtype, what, want(0));
            continue;
          }
          c.all_reduce_segments(segments, dtype, op, call);
          std::size_t base = 0;
          for (std::size_t s = 0; s < counts.size(); ++s) {
            expect_elements(way == 1 ? send[s].data() : recv[s].data(), counts[s], dtype,
                            what + ", segment " + std::to_string(s), want(base));
            expect_guard(send[s], what);
            expect_guard(recv[s], what);
            base += counts[s];
          }
        }
      }
    }
    // No elements at all: null storage.
    const Communicator::Segment none{};
    if (c.all_reduce_shared({&none, 1}, DType::kFloat32, ReduceOp::kSum, calls.next("all_reduce")) != nullptr) {
      throw std::runtime_error("all_reduce_shared of no elements returned storage");
    }
  }));
}

// Rank r gets block r of the reduction; a rank may have an empty block.
TEST_P(BackendConformance, ReduceScatterGivesEachRankItsBlock) {
  expect_no_errors(on_every_member([&](Communicator& c) {
    Calls calls;
    for (const bool small : {true, false}) {
      std::vector<std::size_t> counts;
      for (int r = 0; r < c.size(); ++r) {
        counts.push_back(r == 1 ? 0 : (small ? 3 + static_cast<std::size_t>(r) : 9000 + static_cast<std::size_t>(r)));
      }
      std::size_t offset = 0, total = 0;
      for (int r = 0; r < c.size(); ++r) {
        if (r < c.rank()) offset += counts[static_cast<std::size_t>(r)];
        total += counts[static_cast<std::size_t>(r)];
      }
      const std::size_t mine = counts[static_cast<std::size_t>(c.rank())];
      for (const DType dtype : {DType::kFloat32, DType::kInt32, DType::kFloat16, DType::kBool}) {
        for (const ReduceOp op : kAllReduceOps) {
          const std::vector<std::byte> send = input(dtype, c.rank(), total);
          std::vector<std::byte> recv(mine * size_of(dtype) + 1, kGuard);
          const CollectiveCall call = calls.next("reduce_scatter");
          c.reduce_scatter(send.data(), recv.data(), counts, dtype, op, call);
          const std::string what = describe(c, call, dtype, total) + " " + std::string(to_string(op));
          expect_elements(recv.data(), mine, dtype, what, [&](auto t, std::size_t j) {
            return expected_value<decltype(t)>(op, c.size(), offset + j, dtype);
          });
          expect_guard(recv, what);
        }
      }
    }
  }));
}

// Rows of every rank's block, in rank order; a rank may send nothing.
TEST_P(BackendConformance, AllGatherVInRowsAndIntoSharedStorage) {
  expect_no_errors(on_every_member([&](Communicator& c) {
    Calls calls;
    for (const std::size_t scale : {std::size_t{1}, std::size_t{3000}}) {
      std::vector<std::size_t> counts;
      for (int r = 0; r < c.size(); ++r) counts.push_back(r == 1 ? 0 : scale * (2 + static_cast<std::size_t>(r)));
      std::size_t row = 0;
      for (const std::size_t n : counts) row += n;
      for (const DType dtype : kAllDTypes) {
        for (const std::size_t outer : {std::size_t{1}, std::size_t{4}}) {
          for (const bool shared : {false, true}) {
            if (scale > 1 && (outer > 1 || dtype != DType::kFloat32)) continue;  // (large: one case)
            const std::size_t mine = counts[static_cast<std::size_t>(c.rank())];
            const std::vector<std::byte> send = input(dtype, c.rank(), outer * mine);
            std::vector<std::byte> recv(outer * row * size_of(dtype) + 1, kGuard);
            const CollectiveCall call = calls.next("all_gather");
            const std::byte* out = recv.data();
            std::shared_ptr<std::byte> storage;
            if (shared) {
              storage = c.all_gather_v_shared(send.data(), counts, outer, dtype, call);
              out = storage.get();
              if (out == nullptr && outer * row > 0) throw std::runtime_error("all_gather_v_shared gave no storage");
            } else {
              c.all_gather_v(send.data(), recv.data(), counts, outer, dtype, call);
            }
            const std::string what =
                describe(c, call, dtype, outer * row) + " outer " + std::to_string(outer) + (shared ? " shared" : "");
            expect_elements(out, outer * row, dtype, what, [&](auto t, std::size_t i) {
              // Element i: row i / row, then rank q's block within it.
              std::size_t at = i % row;
              int q = 0;
              while (at >= counts[static_cast<std::size_t>(q)]) at -= counts[static_cast<std::size_t>(q++)];
              return to_dtype<decltype(t)>(input_value(dtype, q, (i / row) * counts[static_cast<std::size_t>(q)] + at));
            });
            expect_guard(recv, what);
          }
        }
      }
    }
  }));
}

// From every root: in place, out of place (send read on root only), and
// into shared storage.
TEST_P(BackendConformance, BroadcastFromEveryRootThreeWays) {
  expect_no_errors(on_every_member([&](Communicator& c) {
    Calls calls;
    for (int root = 0; root < c.size(); ++root) {
      for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{700}, std::size_t{70000}}) {
        for (const DType dtype : {DType::kFloat32, DType::kInt8}) {
          for (const int way : {0, 1, 2}) {
            const bool is_root = c.rank() == root;
            // Not root's data anywhere but on root (rank + 100's is elsewhere).
            std::vector<std::byte> buffer = input(dtype, is_root ? root : c.rank() + 100, count);
            std::vector<std::byte> recv(buffer.size(), kGuard);
            const CollectiveCall call = calls.next("broadcast");
            const std::byte* out = buffer.data();
            std::shared_ptr<std::byte> storage;
            if (way == 0) {
              c.broadcast(buffer.data(), count, dtype, root, call);
            } else if (way == 1) {
              c.broadcast_out_of_place(is_root ? buffer.data() : nullptr, recv.data(), count, dtype, root, call);
              out = recv.data();
            } else {
              storage = c.broadcast_shared(is_root ? buffer.data() : nullptr, count, dtype, root, call);
              out = storage.get();
              if (out == nullptr && count > 0) throw std::runtime_error("broadcast_shared gave no storage");
            }
            const std::string what =
                describe(c, call, dtype, count) + " from root " + std::to_string(root) + " way " + std::to_string(way);
            expect_elements(out, count, dtype, what,
                            [&](auto t, std::size_t i) { return to_dtype<decltype(t)>(input_value(dtype, root, i)); });
            expect_guard(buffer, what);
            expect_guard(recv, what);
          }
        }
      }
    }
  }));
}

// Payloads of any size, every rank's in rank order; and a barrier between.
TEST_P(BackendConformance, ExchangeGivesEveryPayloadInRankOrder) {
  expect_no_errors(on_every_member([&](Communicator& c) {
    Calls calls;
    for (const std::size_t size : {std::size_t{0}, std::size_t{5}, std::size_t{100000}}) {
      auto payload_of = [&](int r) {
        return std::string(size + static_cast<std::size_t>(r), static_cast<char>('a' + r));
      };
      const CollectiveCall call = calls.next("exchange");
      const std::vector<std::string> all = c.exchange(payload_of(c.rank()), call);
      if (all.size() != static_cast<std::size_t>(c.size())) throw std::runtime_error("exchange: wrong count");
      for (int r = 0; r < c.size(); ++r) {
        if (all[static_cast<std::size_t>(r)] != payload_of(r)) {
          throw std::runtime_error(describe(c, call, DType::kUInt8, size) + ": rank " + std::to_string(r) +
                                   "'s payload differs");
        }
      }
      c.barrier(calls.next("barrier"));
    }
  }));
}

// An abort from a thread that is not in a call fails the call every other
// member waits in, and the aborting member's own later call, with the
// abort's message (on its own process, its code too).
TEST_P(BackendConformance, AnAbortFromAnotherThreadFailsEveryMember) {
  const std::string message = "conformance: aborted from another thread";
  std::vector<std::string> seen;
  std::vector<bool> own_code;
  std::mutex mutex;
  const auto errors = on_every_member([&](Communicator& c) {
    Calls calls;
    const bool aborts = c.rank() == c.size() - 1;
    std::thread aborter;
    if (aborts) {
      aborter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        c.abort(ErrorCode::kUnavailable, message, c.rank());
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the others wait meanwhile
    }
    std::vector<std::byte> v = input(DType::kFloat32, c.rank(), 1000);
    try {
      c.all_reduce(v.data(), v.data(), 1000, DType::kFloat32, ReduceOp::kSum, calls.next("all_reduce"));
    } catch (const Error& e) {
      const std::lock_guard<std::mutex> lock(mutex);
      seen.emplace_back(e.what());
      own_code.push_back(!aborts || e.code() == ErrorCode::kUnavailable);
    }
    if (aborter.joinable()) aborter.join();
  });
  expect_no_errors(errors);
  EXPECT_EQ(seen.size(), group_->members().size()) << "a member's call did not fail";
  for (const std::string& s : seen) EXPECT_NE(s.find(message), std::string::npos) << s;
  for (const bool ok : own_code) EXPECT_TRUE(ok) << "the aborting member's call failed with another code";
}

// A member that never makes the call: every other member raises
// DeadlineExceededError after the call's timeout, naming the call.
TEST_P(BackendConformance, AMemberThatNeverComesTimesTheOthersOut) {
  if (group_->members().front()->size() < 2) GTEST_SKIP() << "one member: nobody waits for another";
  std::vector<std::string> seen;
  std::mutex mutex;
  const auto errors = on_every_member([&](Communicator& c) {
    if (c.rank() == c.size() - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // stays, without calling
      return;
    }
    CollectiveCall call{.op = "all_reduce", .sequence = 1, .timeout_seconds = 0.5};
    std::vector<std::byte> v = input(DType::kFloat32, c.rank(), 10);
    try {
      c.all_reduce(v.data(), v.data(), 10, DType::kFloat32, ReduceOp::kSum, call);
    } catch (const DeadlineExceededError& e) {
      const std::lock_guard<std::mutex> lock(mutex);
      seen.emplace_back(e.what());
    }
  });
  expect_no_errors(errors);
  const std::vector<Communicator*> members = group_->members();
  std::size_t waiting = 0;
  for (const Communicator* m : members) waiting += m->rank() == m->size() - 1 ? 0 : 1;
  EXPECT_EQ(seen.size(), waiting);
  for (const std::string& s : seen) EXPECT_NE(s.find("all_reduce"), std::string::npos) << s;
}

}  // namespace distribute::testing
