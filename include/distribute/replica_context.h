// File: replica_context.h
//
// ReplicaContext, as tf.distribute.ReplicaContext: what a replica can do inside
// Strategy::run. Obtain it with get_replica_context() or take it as the
// replica function's parameter.
//
//   strategy.run([] {
//     auto* ctx = distribute::get_replica_context();
//     Tensor sum = ctx->all_reduce(ReduceOp::kSum, constant(1.f));   // 2.0 on 2 replicas
//     Tensor all = ctx->all_gather(constant({1, 2, 3}), /*axis=*/0);   // [1, 2, 3, 1, 2, 3]
//     return sum;
//   });
//
// Collective contract (the seed's words): every replica must call each
// collective, in the same order. Unlike TensorFlow, a replica that skips a
// collective, calls another one, or passes another dtype, structure or a
// shape that cannot be combined makes every replica throw the same error
// instead of hanging (docs/errors.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "distribute/distributed_values.h"
#include "distribute/indexed_slices.h"
#include "distribute/internal/access.h"
#include "distribute/internal/merge_types.h"
#include "distribute/nest.h"
#include "distribute/options.h"
#include "distribute/reduce_op.h"
#include "distribute/tensor.h"

namespace distribute {

class Strategy;

class ReplicaContext {
 public:
  // Global id of this replica, in [0, num_replicas_in_sync()). TensorFlow
  // returns it as an int32 Tensor; wrap it with constant() for that.
  int replica_id_in_sync_group() const { return replica_id_; }
  int num_replicas_in_sync() const;
  // This replica's place among this process's replicas, in [0,
  // strategy().num_local_replicas()): the index of its component in a
  // PerReplica value and in experimental_local_results (not in TensorFlow,
  // where a replica reads its component through the value itself). Equal to
  // replica_id_in_sync_group() under one process; under several workers,
  // replica_id_in_sync_group() minus the first replica of this worker.
  int local_replica_id() const { return local_id_; }
  Strategy& strategy() const { return *strategy_; }
  // The devices of this replica (one): e.g. {"/job:localhost/replica:0/task:0/device:CPU:1"}.
  std::vector<std::string> devices() const;

  // ---- all_reduce ----------------------------------------------------------
  // Every replica gets op over all replicas' values. Structure, dtypes and
  // shapes must match on every replica. A nest is packed per dtype into
  // buffers of about options.bytes_per_pack bytes: one collective per pack.
  // Results are read-only (the replicas of a process may share one; clone()
  // to write).
  Tensor all_reduce(ReduceOp op, const Tensor& value, const CommunicationOptions& options = {});
  std::vector<Tensor> all_reduce(ReduceOp op, const std::vector<Tensor>& value,
                                 const CommunicationOptions& options = {});
  Nest<Tensor> all_reduce(ReduceOp op, const Nest<Tensor>& value, const CommunicationOptions& options = {});
  // IndexedSlices: the concatenation of every replica's slices in replica
  // order (duplicates kept, as TensorFlow); MEAN divides the values by N.
  // Read-only too, though each replica's own.
  IndexedSlices all_reduce(ReduceOp op, const IndexedSlices& value, const CommunicationOptions& options = {});
  // A nest whose leaves are dense tensors or IndexedSlices, mixed (a list of
  // sparse gradients, or sparse and dense together): the same structure back,
  // each leaf reduced as it would be alone (the dense ones packed together
  // as a Nest<Tensor>'s; IndexedSlices concatenated, so SUM and MEAN only).
  // One collective: every replica's leaves agree (kinds, dtypes, shapes;
  // a sparse leaf's rows may differ) before any data moves.
  Nest<TensorOrSlices> all_reduce(ReduceOp op, const Nest<TensorOrSlices>& value,
                                  const CommunicationOptions& options = {});

  // ---- all_gather ----------------------------------------------------------
  // Concatenates every replica's value along `axis` in replica order. Shapes
  // may differ along `axis` only (ragged); rank must be >= 1; a negative axis
  // counts from the end.
  Tensor all_gather(const Tensor& value, int axis, const CommunicationOptions& options = {});
  std::vector<Tensor> all_gather(const std::vector<Tensor>& value, int axis, const CommunicationOptions& options = {});
  Nest<Tensor> all_gather(const Nest<Tensor>& value, int axis, const CommunicationOptions& options = {});
  // Always throws UnimplementedError ("all_gather does not support
  // IndexedSlices"), on every replica.
  IndexedSlices all_gather(const IndexedSlices& value, int axis, const CommunicationOptions& options = {});

  // ---- broadcast (not in TensorFlow) ---------------------------------------
  // Every replica gets replica `root_replica`'s value. TensorFlow's
  // ReplicaContext has none: there it takes a merge_call around
  // extended().broadcast_to, two pauses of every replica; this is one
  // collective, as Horovod's or NCCL's broadcast. Every replica passes a
  // value of the same structure, dtypes and shapes (only the root's
  // elements are read) and names the same root. A nest is packed per dtype
  // into buffers of about options.bytes_per_pack bytes (one collective per
  // pack), as all_reduce's. Results are read-only (the replicas of a process
  // share one above 4 KiB; clone() to write).
  Tensor broadcast(const Tensor& value, int root_replica = 0, const CommunicationOptions& options = {});
  std::vector<Tensor> broadcast(const std::vector<Tensor>& value, int root_replica = 0,
                                const CommunicationOptions& options = {});
  Nest<Tensor> broadcast(const Nest<Tensor>& value, int root_replica = 0, const CommunicationOptions& options = {});

  // ---- merge_call ----------------------------------------------------------
  // Pauses every local replica; runs merge_fn(strategy, PerReplica<Args>...)
  // once, in a cross-replica context, with each argument grouped across the
  // local replicas (in replica order); then gives each replica its share of
  // the result: a PerReplica or Mirrored result (also inside std::tuple,
  // std::pair, std::vector, std::optional or a std::map's values) gives each
  // replica its own component, anything else is shared (a Tensor, a
  // Nest<Tensor>'s leaves and an IndexedSlices' tensors read-only:
  // select_replica). Only replica 0's merge_fn runs, as in TensorFlow; all
  // replicas must pass a merge_fn and arguments of the same types.
  template <class MergeFn, class... Args>
  auto merge_call(MergeFn&& merge_fn, const Args&... args);

  // Made by the strategy for each of its replicas (only the library has a key).
  ReplicaContext(internal::ReplicaContextKey, Strategy& strategy, int replica_id, int local_id,
                 internal::ReplicaChannel* channel);

 private:
  friend struct internal::Access;
  // Told by a merge body once it has copied every replica's arguments: the
  // other replicas, whose stacks hold them, may leave merge_call from then on.
  struct ArgsTaken {
    virtual void operator()() const noexcept = 0;

   protected:
    ~ArgsTaken() = default;
  };
  using MergeBody = std::function<std::shared_ptr<void>(std::span<const void* const>, const ArgsTaken&)>;
  std::shared_ptr<void> merge_call_impl(const internal::MergeTypes& types, const void* args, const MergeBody& body);

  Strategy* strategy_;
  int replica_id_;
  int local_id_;
  internal::ReplicaChannel* channel_;
};

namespace internal {
inline ReplicaChannel& Access::channel(const ReplicaContext& ctx) { return *ctx.channel_; }
}  // namespace internal

template <class MergeFn, class... Args>
auto ReplicaContext::merge_call(MergeFn&& merge_fn, const Args&... args) {
  using R = std::decay_t<std::invoke_result_t<MergeFn&, Strategy&, const PerReplica<Args>&...>>;
  using Pointers = std::tuple<const Args*...>;
  const Pointers mine(&args...);
  static const internal::MergeTypes types = internal::merge_types({&typeid(MergeFn), &typeid(Args)...});
  const MergeBody body = [this, &merge_fn](std::span<const void* const> all,
                                           const ArgsTaken& args_taken) -> std::shared_ptr<void> {
    auto grouped = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<PerReplica<Args>...>(PerReplica<Args>([&] {
        std::vector<Args> values;
        values.reserve(all.size());
        for (const void* p : all) values.push_back(*std::get<I>(*static_cast<const Pointers*>(p)));
        return values;
      }())...);
    }
    (std::index_sequence_for<Args...>{});
    args_taken();
    Strategy& strategy = *strategy_;
    if constexpr (std::is_void_v<R>) {
      std::apply([&](const auto&... a) { merge_fn(strategy, a...); }, grouped);
      return nullptr;
    } else {
      return std::make_shared<R>(std::apply([&](const auto&... a) { return merge_fn(strategy, a...); }, grouped));
    }
  };
  std::shared_ptr<void> result = merge_call_impl(types, &mine, body);
  if constexpr (std::is_void_v<R>) {
    return;
  } else {
    return select_replica_t<R>(
        select_replica(static_cast<std::size_t>(local_id_), *static_cast<const R*>(result.get())));
  }
}

}  // namespace distribute
