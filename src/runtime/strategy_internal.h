// The state a strategy keeps between calls, and the pieces of the strategy's
// implementation that its files (strategy.cc, strategy_run.cc,
// cross_replica.cc, strategy_extended.cc, worker_agreement.cc) share.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/backend.h"
#include "distribute/communicator.h"
#include "distribute/options.h"
#include "distribute/reduce_op.h"
#include "distribute/strategy.h"
#include "distribute/tensor.h"
#include "runtime/replica_channel.h"
#include "runtime/replica_pool.h"
#include "runtime/signature.h"

namespace distribute::internal {

struct StrategyState {
  explicit StrategyState(int replicas) : pool(replicas) {}
  // Multi-worker strategies: one member per worker process. Declared first,
  // so that it outlives the communicators built on it (by_depth).
  std::shared_ptr<Communicator> workers_owner;
  ReplicaPool pool;
  std::mutex resources_mutex;
  std::vector<std::unique_ptr<RunResources>> by_depth;
  double stall_warning_seconds = 0;
  // Where the in-process all_reduce streams (read once, when the strategy is made).
  std::size_t all_reduce_stream_bytes = kNeverStream;
  // workers_owner, and the state of the cross-replica collectives this
  // worker issues through it.
  Communicator* workers = nullptr;
  std::recursive_mutex worker_mutex;
  std::uint64_t worker_sequence = 0;
  // Preemption: this worker's stop request, carried by every agreement among
  // the workers; whether one carried any worker's; how many were made.
  std::atomic<bool> stop_request{false};
  std::atomic<bool> stop_agreed{false};
  std::atomic<std::uint64_t> worker_agreements{0};
  // Expires with the strategy (StrategyRef).
  std::shared_ptr<const void> alive = std::make_shared<const char>('\0');
  // Scopes entered and not yet left, on every thread (Strategy::count_scope).
  std::atomic<int> open_scopes{0};

  RunResources& resources(int depth, int replicas, double stall) {
    std::lock_guard<std::mutex> lock(resources_mutex);
    while (static_cast<int>(by_depth.size()) <= depth) {
      auto res = std::make_unique<RunResources>();
      ReplicaGroup group =
          make_replica_group({.kind = workers != nullptr ? BackendKind::kAcrossWorkers : BackendKind::kInProcess,
                              .replicas = replicas,
                              .workers = workers,
                              .all_reduce_stream_bytes = all_reduce_stream_bytes});
      res->local = std::move(group.rendezvous);
      res->comms = std::move(group.members);
      res->channels.resize(static_cast<std::size_t>(replicas));
      for (int r = 0; r < replicas; ++r) {
        ReplicaChannel& ch = res->channels[static_cast<std::size_t>(r)];
        ch.comm = res->comms[static_cast<std::size_t>(r)].get();
        ch.local = res->local.get();
        ch.merge_failure_agreed = &res->merge_failure_agreed;
        ch.merge_args_taken = &res->merge_args_taken;
        ch.running = &res->running;
        ch.depth = static_cast<int>(by_depth.size());
        ch.stall_warning_seconds = stall;
      }
      by_depth.push_back(std::move(res));
    }
    return *by_depth[static_cast<std::size_t>(depth)];
  }
};

// A cross-replica collective among the workers (one member per worker).
CollectiveCall worker_call(StrategyState& st, const CommunicationOptions& options, std::string_view op);

// Every worker has checked its own arguments into `sig`; the workers exchange
// their signatures and raise the same error everywhere if any found a problem
// or they disagree. Returns every worker's signature, in worker order. With
// one worker, raises the local verdict. An `extra` payload travels with the
// signature in the same round; `extras` receives every worker's, in order.
std::vector<Signature> agree_workers(StrategyState& st, const CommunicationOptions& options, Signature& sig,
                                     ShapeRule rule, int axis, const std::string* extra = nullptr,
                                     std::vector<std::string>* extras = nullptr);

// TensorFlow's reduce_non_distributed_value: a value that is the same on every
// replica keeps its value under MEAN (and MIN, MAX); SUM and PRODUCT would
// need to know it was meant once per replica, which is an error for N > 1.
void check_non_distributed(ReduceOp op, const Strategy& s, const std::string& value_text, bool mirrored);
// `t` as the errors of reduce and reduce_to show it: its elements (up to 16), else its shape.
std::string short_text(const Tensor& t);

}  // namespace distribute::internal
