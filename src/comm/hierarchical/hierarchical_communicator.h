// HierarchicalCommunicator: the Communicator of one replica thread of one
// worker (process) among the replicas of every worker. Global rank =
// worker * local_size + local_id, so ranks follow TensorFlow's global replica
// ids.
//
// Every collective has three steps:
//   1. local:  the worker's replicas combine in shared memory (the threads
//              engine, one LocalGroup per worker);
//   2. cross:  the worker's replica 0 (the leader) alone runs one collective
//              with the leaders of the other workers, through `workers` (one
//              member per worker: MPI in production, threads in tests);
//   3. fan-out: the leader's result is copied to the other local replicas
//              (all_gather_v_shared hands them the leader's output instead,
//              from a contribution of over 4 KiB).
// With one local replica, steps 1 and 3 vanish and calls go straight to
// `workers`.
//
// All replicas of all workers get the same bits. An all_reduce combines each
// worker's replicas first, then the workers in rank order: for floating-point
// SUM and MEAN that is ((r0 + r1) + (r2 + r3)), not the flat order
// (((r0 + r1) + r2) + r3), so results may differ from a MirroredStrategy of
// the same size in the last bits. MEAN is a SUM followed by one division.
//
// Agreement: the signature tag is checked in the local step and again in the
// cross step. A mismatch found by either reaches every replica of every
// worker as SignatureMismatch: a local one is passed to the other workers
// as a tag that cannot agree, a cross one is passed to the local replicas in
// the fan-out. Any other failure of the leader aborts the local group with the
// same error; abort() also aborts `workers`, which tells the other workers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/threads/local_group.h"
#include "comm/threads/shared_memory_communicator.h"
#include "distribute/communicator.h"

namespace distribute::internal {

class HierarchicalCommunicator final : public Communicator {
 public:
  // `workers` is shared by the local replicas and used by local member 0 only;
  // it must outlive this communicator. `all_reduce_stream_bytes`: for the
  // local all_reduce (SharedMemoryCommunicator's).
  HierarchicalCommunicator(
      std::shared_ptr<LocalGroup> local, int local_id, Communicator* workers,
      std::size_t all_reduce_stream_bytes = SharedMemoryCommunicator::default_all_reduce_stream_bytes());

  // Above 1 KiB (the local latency path) and not the threads engine's
  // 64 KiB: sharing here also saves the fan-out's copies to every local
  // replica (measured 1.16-1.22x faster at 64 KiB with 2 workers x 2
  // replicas on the Intel machine; docs/history/benchmarks.md, "all_reduce into one
  // shared output"; 1 to 64 KiB not measured).
  static constexpr std::size_t kShareReduceBytes = SharedMemoryCommunicator::kLatencyPathBytes;

  int rank() const override { return workers_->rank() * local_size_ + local_id_; }
  int size() const override { return workers_->size() * local_size_; }
  std::string_view backend_name() const override { return "hierarchical"; }

  // The payloads of every replica of every worker, in global rank order.
  std::vector<std::string> exchange(std::string payload, const CollectiveCall& call) override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const CollectiveCall& call,
                  std::int64_t mean_divisor = 0) override;
  // Above kShareReduceBytes with several local replicas, the worker's
  // replicas share one output: the local step reduces into one shared
  // block, the leader reduces it across the workers in place, and the
  // fan-out only releases the local replicas (nothing is copied to them).
  // Otherwise each gets its own, and an integer MEAN gathers as all_reduce
  // does.
  std::shared_ptr<std::byte> all_reduce_shared(std::span<const Segment> segments, DType dtype, ReduceOp op,
                                               const CollectiveCall& call, std::int64_t mean_divisor = 0) override;
  void all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t outer, DType dtype,
                    const CollectiveCall& call) override;
  // From a contribution of over 4 KiB with several local replicas, the
  // worker's replicas share one output: the local step gathers into one
  // shared block, the leader gathers the workers' blocks into an output of
  // its own, and the fan-out hands that output to the local replicas instead
  // of copying it into each. Otherwise each gets its own (all_gather_v).
  std::shared_ptr<std::byte> all_gather_v_shared(const void* send, std::span<const std::size_t> counts,
                                                 std::size_t outer, DType dtype, const CollectiveCall& call) override;
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) override;
  // Above 4 KiB with several local replicas, the worker's replicas share one
  // output: on root's worker the local step copies root's bytes into one
  // shared block (broadcast_shared), the leaders broadcast it across the
  // workers (into a block of its own on the others), and the fan-out hands
  // the leader's block to the local replicas. Otherwise each gets its own.
  std::shared_ptr<std::byte> broadcast_shared(const void* send, std::size_t count, DType dtype, int root,
                                              const CollectiveCall& call) override;
  void barrier(const CollectiveCall& call) override;
  void abort(ErrorCode code, const std::string& message, int origin_rank) noexcept override;

 private:
  bool leader() const { return local_id_ == 0; }
  // Step 1 of a tagged collective went wrong locally with SignatureMismatch:
  // the leader passes it on to the other workers, then every local replica
  // rethrows it.
  [[noreturn]] void pass_on_local_mismatch(const CollectiveCall& call);
  // Step 2 on the leader: runs `cross`; returns true if the workers' tags
  // differed. Any other error aborts the local group and is rethrown.
  template <class Cross>
  bool run_cross(Cross&& cross);
  // The CollectiveCall of step 3: carries the leader's verdict as a tag that
  // cannot agree, and has no deadline (the leader's step 2 has one).
  static CollectiveCall fan_out_call(const CollectiveCall& call, bool mismatch);

  std::shared_ptr<LocalGroup> local_;
  const int local_id_;
  const int local_size_;
  Communicator* workers_;
  SharedMemoryCommunicator local_comm_;
};

}  // namespace distribute::internal
