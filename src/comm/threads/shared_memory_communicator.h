// SharedMemoryCommunicator: the Communicator of one replica thread among the
// threads of one process. Nothing goes through a kernel or a socket: members
// publish pointers to their buffers in a LocalGroup round and read each
// other's memory directly. docs/algorithms.md describes each algorithm and
// its cost.
//
// all_reduce, small messages (<= 1 KiB): one small round (LocalGroup::
// arrive_small): each member copies its input into the cache lines that
// announce its arrival, and every member reduces all of them (in member order)
// into its own output. One round, no second barrier: the lines stay valid
// until the round after next. With many members each member would read
// members x bytes; above one_round_read_bytes() of that, two small rounds:
// member r reduces slice r from every copy, the second round hands every
// slice to every member (each reads about 2 x bytes, whatever the group).
//
// all_reduce, large messages: one round publishes (send, recv); member r owns
// slice r of the elements and, chunk by cache-sized chunk, reduces it from
// every member's input (in member order) into its own output and copies the
// chunk, still in cache, into every other member's output; a second round
// keeps every buffer alive until all members are done with it. Each element
// is computed once, by one member, so all members receive the same bits.
// From the stream threshold up (default_all_reduce_stream_bytes), each chunk
// is reduced into a buffer of the thread's instead and streamed to every
// output.
#pragma once

#include <algorithm>
#include <memory>
#include <utility>

#include "comm/threads/local_group.h"
#include "distribute/communicator.h"

namespace distribute::internal {

class SharedMemoryCommunicator final : public Communicator {
 public:
  // Elements of one chunk of the large all_reduce path, in bytes.
  static constexpr std::size_t kChunkBytes = std::size_t{64} << 10;
  // Up to this size all_reduce takes the one-round latency path.
  static constexpr std::size_t kLatencyPathBytes = 1024;
  // On the latency path, one round while members x bytes (what each member
  // reads) is at most this; above it, two rounds that read about 2 x bytes
  // each. One cache-line transfer costs about as much as a member's arrival
  // in a small round, so one more round pays once it saves well over a
  // round's N first lines: 4 KiB (64 lines) keeps every group of up to 4 on
  // one round, and takes two above 512 B with 8 members, above 256 B with
  // 16 (where one round at 1 KiB took longer than the bandwidth path at
  // 4 KiB: docs/algorithms.md, "all_reduce").
  static constexpr std::size_t kOneRoundReadBytes = 4096;
  // kOneRoundReadBytes, or DISTRIBUTE_ONE_ROUND_READ_BYTES (a whole number
  // of bytes; InvalidArgumentError otherwise; creating a strategy checks it).
  // A communicator reads it when made, so the members of a group, made
  // together, take the same path; there a bad setting leaves the default (a
  // thread's default context makes a group, and nothing may throw there).
  static std::size_t default_one_round_read_bytes();
  // Whether an all_reduce of `bytes` per member among `members` takes the
  // two small rounds (bytes <= kLatencyPathBytes, members x bytes above
  // `one_round_read`).
  static bool two_small_rounds(int members, std::size_t bytes, std::size_t one_round_read = kOneRoundReadBytes) {
    return members > 1 && bytes <= kLatencyPathBytes && static_cast<std::size_t>(members) * bytes > one_round_read;
  }
  // The chunk when all_reduce streams: reduced into a buffer that stays in L1
  // (16 KiB was 1.1 to 1.2x faster than 64 KiB at 128 MiB, no slower at 256).
  static constexpr std::size_t kStreamChunkBytes = std::size_t{16} << 10;
  // From this message size up (all_gather's output, broadcast's buffer), the
  // copies of all_gather and broadcast use non-temporal stores: the data no
  // longer fits in cache, and streaming stores skip the read for ownership of
  // a normal store. Measured on the project's machines (32 MiB of L3;
  // docs/history/benchmarks.md, "Where streaming stores start"): with 2 replicas,
  // normal stores are 1.1 to 2.4x faster at 8 and 16 MiB for all_gather and
  // 1.7 to 3.4x for broadcast (the cache holds the data); streaming is 1.1
  // to 1.4x faster from 24 MiB for all_gather, 1.1 to 1.5x from 32 MiB for
  // broadcast (24 to 28 MiB went either way). all_reduce has its own
  // threshold (default_all_reduce_stream_bytes).
  static constexpr std::size_t kStreamBytes = 24 << 20;

  // The all_reduce size (each member's message, in bytes) from which the
  // bandwidth path writes its results with streaming stores: each chunk is
  // reduced into a buffer of the thread's and streamed to every output, so
  // no output line is read for ownership. The default depends on the CPU,
  // as measured (docs/history/benchmarks.md, "Streaming all_reduce on Intel"): on
  // Intel, 32 MiB (streaming was 1.1 to 1.65x faster at 64 to 256 MiB in 12
  // of 13 pairs of runs with 2 and 4 replicas, faster at 24 to 32 MiB in
  // most, up to 1.1x slower at 16 MiB);
  // elsewhere never (on the AMD EPYC machines it was 1.3 to 2.3x slower from
  // 4 to 256 MiB). DISTRIBUTE_STREAM_ALL_REDUCE_BYTES overrides it (0:
  // never); a value that is not a whole number of bytes is an
  // InvalidArgumentError. Every call reads the environment: a strategy calls
  // it once, when made, and hands the value to its communicators.
  static constexpr std::size_t kAllReduceStreamBytesIntel = 32 << 20;
  static constexpr std::size_t kNeverStream = internal::kNeverStream;
  static std::size_t default_all_reduce_stream_bytes();

  // Copies n bytes of a broadcast of `message_bytes` as the engine's
  // broadcast does (streaming, then fenced, from kStreamBytes): for the
  // copies other layers share among the replicas (broadcast_to in a merge_fn).
  static void copy_broadcast_part(void* dst, const void* src, std::size_t n, std::size_t message_bytes);

  // `all_reduce_stream_bytes`: where this member's all_reduce starts to
  // stream (the runtime passes its strategy's; tests set their own).
  // `share_reduce_above`: the size above which all_reduce_shared shares its
  // output (every member of a group passes the same).
  SharedMemoryCommunicator(std::shared_ptr<LocalGroup> group, int rank,
                           std::size_t all_reduce_stream_bytes = default_all_reduce_stream_bytes(),
                           std::size_t share_reduce_above = kShareReduceBytes);

  // Whether this member's all_reduce of `bytes` (bandwidth path) streams.
  bool streams(std::size_t bytes) const { return size() > 1 && bytes >= all_reduce_stream_bytes_; }

  // Whether this member's all_reduce of `bytes` takes two small rounds.
  bool two_small_rounds(std::size_t bytes) const { return two_small_rounds(size(), bytes, one_round_read_bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string_view backend_name() const override { return "threads"; }

  std::vector<std::string> exchange(std::string payload, const CollectiveCall& call) override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const CollectiveCall& call,
                  std::int64_t mean_divisor = 0) override;
  // The bandwidth path straight from and into every segment: no staging copy.
  void all_reduce_segments(std::span<const Segment> segments, DType dtype, ReduceOp op, const CollectiveCall& call,
                           std::int64_t mean_divisor = 0) override;
  // Above share_reduce_above (kShareReduceBytes unless the constructor was
  // given another) with more than one member (shares_reduce), every member
  // returns one output, allocated by
  // the member that completes the data round: each reduces its slice into
  // it once, where all_reduce copies each slice into every output. Up to
  // it, each member's own output from its thread's storage cache, filled by
  // all_reduce.
  std::shared_ptr<std::byte> all_reduce_shared(std::span<const Segment> segments, DType dtype, ReduceOp op,
                                               const CollectiveCall& call, std::int64_t mean_divisor = 0) override;
  // Where one shared output starts to pay among the threads of a process
  // (docs/history/benchmarks.md, "all_reduce: own outputs up to 64 KiB"). It saves
  // writes (S/n bytes per member instead of S), but costs an allocation
  // inside the round, from the cache every thread shares, and a reference
  // count every member changes: measured on the AMD EPYC machines, own
  // outputs were no slower up to 64 KiB, the shared one clearly faster from
  // 512 KiB. (HierarchicalCommunicator shares above 1 KiB: there it also
  // saves the fan-out's copies.)
  static constexpr std::size_t kShareReduceBytes = std::size_t{64} << 10;
  // Whether all_reduce_shared shares its output among `members`, by the
  // message's bytes: above `above`, the members' share_reduce_above.
  static bool shares_reduce(int members, std::size_t bytes, std::size_t above = kShareReduceBytes) {
    return members > 1 && bytes > above;
  }
  // Whether this member's all_reduce_shared of `bytes` shares its output.
  bool shares_reduce(std::size_t bytes) const { return shares_reduce(size(), bytes, share_reduce_above_); }
  // Each member reduces its own block straight from every member's send
  // buffer into its recv: no staging, nothing copied to the others.
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype, ReduceOp op,
                      const CollectiveCall& call, std::int64_t mean_divisor = 0) override;
  void all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t outer, DType dtype,
                    const CollectiveCall& call) override;
  // From a contribution of more than kInlineBytes (shares_gather), every
  // member returns one output, allocated by the member that completes the
  // data round: each copies its own block into it, where all_gather_v
  // copies every block into every output.
  std::shared_ptr<std::byte> all_gather_v_shared(const void* send, std::span<const std::size_t> counts,
                                                 std::size_t outer, DType dtype, const CollectiveCall& call) override;
  // Whether all_gather_v_shared shares its output, by the largest member's
  // contribution in bytes (a group of one never does).
  static bool shares_gather(std::size_t largest_bytes) { return largest_bytes > LocalGroup::kInlineBytes; }
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) override;
  // Above kInlineBytes every member, the root too, copies its slice of the
  // root's send into every member's recv (the root's, unless in place).
  void broadcast_out_of_place(const void* send, void* recv, std::size_t count, DType dtype, int root,
                              const CollectiveCall& call) override;
  // Above kInlineBytes with more than one member (shares_broadcast), every
  // member returns one output, allocated by the member that completes the
  // round: each copies its slice of root's buffer into it, where broadcast
  // copies each slice into every other member's buffer.
  std::shared_ptr<std::byte> broadcast_shared(const void* send, std::size_t count, DType dtype, int root,
                                              const CollectiveCall& call) override;
  // Whether broadcast_shared shares its output, by the message's bytes (a
  // group of one never does).
  static bool shares_broadcast(std::size_t bytes) { return bytes > LocalGroup::kInlineBytes; }
  void barrier(const CollectiveCall& call) override;
  void abort(ErrorCode code, const std::string& message, int origin_rank) noexcept override;

 private:
  // Where member `member` of `members` starts its slice of `count` elements
  // (the bandwidth path's and the two small rounds' split).
  static std::size_t slice_begin(std::size_t count, int member, int members) {
    return count * static_cast<std::size_t>(member) / static_cast<std::size_t>(members);
  }
  // Elements [owned_begin, owned_end) of `count`: this member's slice.
  std::size_t owned_begin(std::size_t count) const { return slice_begin(count, rank_, size()); }
  std::size_t owned_end(std::size_t count) const { return slice_begin(count, rank_ + 1, size()); }
  // Throws InvalidArgumentError for a root that is not a member.
  void check_root(int root, const CollectiveCall& call) const;
  // all_reduce's latency path in two small rounds (two_small_rounds).
  void all_reduce_two_rounds(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                             std::int64_t divisor, const CollectiveCall& call, const void** srcs);
  // Bytes [first, second) of a `bytes`-byte message: this member's share of
  // a copy split N ways, in whole cache lines (no line written by two).
  std::pair<std::size_t, std::size_t> line_slice(std::size_t bytes) const {
    const std::size_t lines = (bytes + 63) / 64;
    const auto n = static_cast<std::size_t>(size());
    const auto r = static_cast<std::size_t>(rank_);
    return {std::min(bytes, lines * r / n * 64), std::min(bytes, lines * (r + 1) / n * 64)};
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::size_t all_reduce_stream_bytes_;
  std::size_t share_reduce_above_;
  std::size_t one_round_read_bytes_;
};

}  // namespace distribute::internal
