// What one replica of one run uses to talk to the others: the communicator of
// the whole sync group, the rendezvous of this process's replicas (for
// merge_call), and its count of collectives issued in the run.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/backend.h"
#include "distribute/communicator.h"
#include "distribute/replica_context.h"
#include "runtime/gather_layout.h"
#include "runtime/signature.h"

namespace distribute::internal {

// A line of its own: every collective writes its replica's counters, and the
// run's channels sit side by side in one vector (shared lines would bounce
// between the replicas' cores on every call).
struct alignas(64) ReplicaChannel {
  Communicator* comm = nullptr;
  ReplicaRendezvous* local = nullptr;  // this process's replicas of the run (merge_call)
  int depth = 0;                       // 0 for a top-level run, +1 per nested call_for_each_replica
  std::uint64_t sequence = 0;          // collectives issued by this replica in this run
  std::uint64_t data_calls = 0;        // communicator data calls (one per pack / gathered value), for tests and stats
  double stall_warning_seconds = 0;
  // The replica's last collective failed its signature check, which every
  // replica of every worker runs on the same signatures: all raised the same
  // error, nobody waits, so the run need not abort the others' collectives.
  bool agreed_failure = false;
  // Set by the replica whose merge_fn raised an error that every worker's
  // merge_fn raised alike (a cross-worker agreement inside it failed): the
  // other local replicas, released with AbortedError, need not abort the
  // workers' link either. Shared by the run's replicas; reset before each run.
  std::atomic<bool>* merge_failure_agreed = nullptr;
  // The sequence of the last merge_call whose arguments replica 0 has copied
  // (the others' arguments live on their stacks until then). Shared by the
  // run's replicas; reset before each run.
  std::atomic<std::uint64_t>* merge_args_taken = nullptr;
  // Whether the run this channel's context belongs to is in progress (the
  // contexts outlive their runs, so that one used after its run is told so);
  // null for a thread's default replica context, which is always in use.
  const std::atomic<bool>* running = nullptr;
  // What the last one-Tensor all_reduce, all_gather and broadcast worked out.
  CallMemo<> all_reduce_memo;
  CallMemo<std::optional<GatherLayout>> all_gather_memo;
  CallMemo<> broadcast_memo;
};

// Everything a run at one nesting depth needs, kept by the strategy between runs.
struct RunResources {
  std::mutex mutex;  // held for the whole run
  std::shared_ptr<ReplicaRendezvous> local;
  std::vector<std::unique_ptr<Communicator>> comms;  // [local replica]
  std::vector<ReplicaChannel> channels;
  // The replicas' contexts, made at the first run and kept: a pointer to one
  // kept past its run (get_replica_context()) stays valid as long as the
  // strategy, and raises FailedPreconditionError instead of dangling.
  std::vector<ReplicaContext> contexts;
  std::atomic<bool> running{false};
  std::atomic<bool> merge_failure_agreed{false};
  std::atomic<std::uint64_t> merge_args_taken{0};

  // Before a run: forget the failure and progress of the last one.
  void reset();
  // Fails the run's collectives on every replica.
  void abort(ErrorCode code, const std::string& message, int origin) noexcept;
};

}  // namespace distribute::internal
