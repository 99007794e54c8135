// File: strategy.h
//
// Strategy, as tf.distribute.Strategy: runs a function on every replica and
// combines per-replica values in the cross-replica context. Concrete
// strategies are in mirrored_strategy.h (default, OneDevice, Mirrored) and
// multi_worker_mirrored_strategy.h.
//
//   MirroredStrategy strategy({"CPU:0", "CPU:1"});
//   PerReplica<Tensor> r = strategy.run([](ReplicaContext& ctx) {
//     return ctx.all_reduce(ReduceOp::kSum, constant(1.f));
//   });
//   Tensor total = strategy.reduce(ReduceOp::kSum, r, std::nullopt);   // 4.0
//   std::vector<Tensor> locals = strategy.experimental_local_results(r);
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ranges>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "distribute/communicator.h"
#include "distribute/context.h"
#include "distribute/distributed_values.h"
#include "distribute/indexed_slices.h"
#include "distribute/internal/access.h"
#include "distribute/nest.h"
#include "distribute/options.h"
#include "distribute/reduce_op.h"
#include "distribute/replica_context.h"
#include "distribute/tensor.h"

namespace distribute {

class Strategy;
class Variable;
// The input pipeline (input.h): Strategy's dataset entry points return and
// take these; include input.h (or distribute.h) to use them.
class DistributedDataset;
class InputContext;
using BatchFn = std::function<std::optional<Nest<Tensor>>()>;
using DatasetFn = std::function<BatchFn()>;

// Where a reduce_to / broadcast_to result goes: one device, the devices of a
// distributed value (for an all-reduce, pass the value itself), or a list.
class Destinations {
 public:
  Destinations(const char* device);         // NOLINT: implicit, as TF accepts a device string
  Destinations(const std::string& device);  // NOLINT
  template <class D>
  requires is_distributed_values_v<D> && std::is_same_v<typename D::value_type, Tensor> Destinations(
      const D& value) {  // NOLINT
    for (const Tensor& t : value.values()) devices_.push_back(t.device());
    if (devices_.empty()) throw InvalidArgumentError("destinations can not be empty");
  }
  static Destinations of_devices(const std::vector<std::string>& devices);

  const std::vector<std::string>& devices() const { return devices_; }

 private:
  Destinations() = default;
  std::vector<std::string> devices_;
};

// tf.distribute.StrategyExtended: the lower-level cross-replica API.
class StrategyExtended {
 public:
  explicit StrategyExtended(Strategy& strategy) : strategy_(&strategy) {}

  // Reduces `value` across replicas and places the result on every
  // destination device. Cross-replica context only (also inside merge_fn).
  //
  // Placement (here and in broadcast_to), as TensorFlow's identity under each
  // destination's device: the first destination on the value's own device
  // gets the value itself (a Tensor copy: the same storage, no bytes copied);
  // every other destination gets a copy of its own. So a tensor written in
  // place later (through mutable_raw_data, or a variable's value(), a view
  // that sees the variable's writes) shows that write in the result on its
  // device: pass clone() (or read_value()) for a snapshot.
  Mirrored<Tensor> reduce_to(ReduceOp op, const PerReplica<Tensor>& value, const Destinations& destinations,
                             const CommunicationOptions& options = {});
  // A Mirrored value: MEAN returns it (placed on the destinations); SUM is an
  // InvalidArgumentError (TensorFlow asserts).
  Mirrored<Tensor> reduce_to(ReduceOp op, const Mirrored<Tensor>& value, const Destinations& destinations,
                             const CommunicationOptions& options = {});
  // A non-distributed value. One value for the whole sync group (every
  // strategy of one worker): MEAN, MIN and MAX return it; SUM and PRODUCT
  // with more than one replica are an InvalidArgumentError ("A
  // non-DistributedValues value ... cannot be reduced with the given reduce
  // op SUM."). Under MultiWorkerMirroredStrategy with several workers it is
  // one value per worker, as TensorFlow takes it: each worker's own, reduced
  // across the workers with `op` (SUM adds them, MEAN divides by the number
  // of workers); a collective of the workers (docs/semantics.md §5.5).
  Mirrored<Tensor> reduce_to(ReduceOp op, const Tensor& value, const Destinations& destinations,
                             const CommunicationOptions& options = {});
  // Per-replica IndexedSlices (sparse gradients): SUM concatenates every
  // replica's slices, values and indices, in replica order (every worker's
  // too), the dense shape kept; MEAN also divides the values by
  // num_replicas_in_sync; MIN, MAX and PRODUCT are an InvalidArgumentError.
  // Every destination gets the result (its own copy past the first).
  Mirrored<IndexedSlices> reduce_to(ReduceOp op, const PerReplica<IndexedSlices>& value,
                                    const Destinations& destinations, const CommunicationOptions& options = {});
  // Several reduce_to in one call; results in the same order.
  std::vector<Mirrored<Tensor>> batch_reduce_to(
      ReduceOp op, const std::vector<std::pair<PerReplica<Tensor>, Destinations>>& value_destination_pairs,
      const CommunicationOptions& options = {});
  // ... of non-distributed values (the rules of reduce_to's).
  std::vector<Mirrored<Tensor>> batch_reduce_to(
      ReduceOp op, const std::vector<std::pair<Tensor, Destinations>>& value_destination_pairs,
      const CommunicationOptions& options = {});
  // ... of per-replica IndexedSlices.
  std::vector<Mirrored<IndexedSlices>> batch_reduce_to(
      ReduceOp op, const std::vector<std::pair<PerReplica<IndexedSlices>, Destinations>>& value_destination_pairs,
      const CommunicationOptions& options = {});
  // `tensor` on every destination device (every local device when
  // `destinations` is nullopt), placed as reduce_to says.
  Mirrored<Tensor> broadcast_to(const Tensor& tensor, const std::optional<Destinations>& destinations = std::nullopt);

  // Runs fn(component_i, select_replica(i, args)...) for every component of
  // `var` (a mirrored value standing for a distributed variable); returns
  // Mirrored of the results (nothing for void fn). In this strategy's replica
  // context it goes through merge_call, so fn runs once per component, not
  // once per replica and component.
  template <class T, class Fn, class... Args>
  auto update(Mirrored<T>& var, Fn&& fn, const Args&... args);
  // The same for a distributed variable (variables.h): fn(Tensor& component,
  // select_replica(i, args)...) may write the component in place or replace
  // it with a tensor of the same dtype and shape. A type that brings its own
  // update (Variable does, in variables.h) is updated by the function
  // update_distributed(extended, var, fn, args...) that argument-dependent
  // lookup finds beside it, so that the runtime need not know the type.
  template <class V, class Fn, class... Args>
  requires requires(StrategyExtended& extended, V& var, Fn& fn, const Args&... args) {
    update_distributed(extended, var, fn, args...);
  }
  auto update(V& var, Fn&& fn, const Args&... args) { return update_distributed(*this, var, fn, args...); }

  // Runs fn once per local replica, as Strategy::run does (TensorFlow's V1
  // name); allowed inside merge_fn, where it runs a nested step.
  template <class Fn, class... Args>
  auto call_for_each_replica(Fn&& fn, const Args&... args);

  // Canonical names of the local devices, one per local replica.
  // The default strategy throws FailedPreconditionError, as TensorFlow.
  const std::vector<std::string>& worker_devices() const;

  Strategy& strategy() const { return *strategy_; }

 private:
  void check_update_target(std::size_t components) const;
  // update() in the cross-replica context: fn once per component.
  template <class T, class Fn, class... Args>
  auto update_components(Mirrored<T>& var, Fn& fn, const Args&... args);
  Strategy* strategy_;
};

// Entered by Strategy::scope(); leaves the scope when destroyed.
class [[nodiscard]] StrategyScope {
 public:
  StrategyScope(StrategyScope&& other) noexcept;
  StrategyScope& operator=(StrategyScope&&) = delete;
  ~StrategyScope();

 private:
  friend class Strategy;
  enum class Kind { kNone, kPushed, kCounted };
  StrategyScope(Strategy* strategy, Kind kind);
  Strategy* strategy_;
  Kind kind_;
};

class Strategy {
 public:
  // A strategy must outlive its scopes and runs: destroying it while a
  // scope() or run of it is still open, on any thread, ends the program with
  // a message that says so (as destroying a joinable std::thread ends it),
  // where the scope would otherwise leave a dangling current strategy; not
  // during std::exit. A strategy that this thread made current with
  // experimental_set_strategy is unset first.
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  // "MirroredStrategy", "OneDeviceStrategy", "_DefaultDistributionStrategy".
  virtual std::string_view name() const = 0;
  // e.g. "MirroredStrategy(2 replicas: CPU:0, CPU:1)", for messages.
  std::string describe() const;

  // Cancels the run in progress, from another thread (a watchdog, the thread
  // that watches for Ctrl-C): every collective of that run, waiting or to
  // come, fails with CancelledError("Cancelled: " + reason) on every replica,
  // and run() raises it (or what a replica raised in its place). A replica
  // busy with its own computation is told at its next collective. Returns
  // whether a run was in progress. A call just as one run ends may cancel the
  // next one instead. (Under a multi-worker strategy the workers' link is
  // left unusable, as after any failure between workers.)
  bool cancel_run(const std::string& reason);

  // Replicas of every worker taking part in each collective.
  int num_replicas_in_sync() const { return num_replicas_in_sync_; }
  // Replicas run by this process.
  int num_local_replicas() const { return static_cast<int>(devices_.size()); }
  // Global id of local replica 0.
  int first_replica_id() const { return first_replica_id_; }
  // Canonical names of the local devices.
  const std::vector<std::string>& devices() const { return devices_; }
  // The options every collective starts from (per-call options override them).
  const CommunicationOptions& communication_options() const { return options_; }
  StrategyExtended& extended() { return extended_; }
  const StrategyExtended& extended() const { return extended_; }

  // Enters the cross-replica context of this strategy until the returned
  // object is destroyed. Re-entering the same strategy nests.
  StrategyScope scope();

  // Runs fn once per local replica, in parallel, in replica context. fn may
  // take ReplicaContext& first; the other parameters receive args, each
  // PerReplica/Mirrored argument split so replica i gets component i, a
  // Tensor shared by all read-only (select_replica).
  // Returns PerReplica<R> of the results (nothing for void). If a replica
  // throws, the others are aborted and run rethrows the first failure.
  template <class Fn, class... Args>
  auto run(Fn&& fn, const Args&... args);

  // Cross-replica reduce to the host. axis == nullopt: element-wise across
  // replicas. With an axis (or axes): also reduced along it, so MEAN is the
  // mean of all elements even when replicas hold different batch sizes.
  Tensor reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis);
  Tensor reduce(ReduceOp op, const PerReplica<Tensor>& value, const std::vector<int>& axes);
  Tensor reduce(ReduceOp op, const Mirrored<Tensor>& value, std::optional<int> axis);
  // A non-distributed value (see reduce_to for the rules; with an axis,
  // every replica is taken to hold it: SUM is refused, MEAN reduces it).
  Tensor reduce(ReduceOp op, const Tensor& value, std::optional<int> axis);
  // Per-replica IndexedSlices, as reduce_to: the concatenation of every
  // replica's slices (SUM; MEAN divides the values), on the host.
  IndexedSlices reduce(ReduceOp op, const PerReplica<IndexedSlices>& value);

  // ---- input (input.h) ----------------------------------------------------
  // One value per local replica: fn(ValueContext(global replica id,
  // num_replicas_in_sync)) under that replica's device. Returns PerReplica<R>.
  template <class Fn>
  auto experimental_distribute_values_from_function(Fn&& fn);
  // Splits each global batch of `global_batches` across every replica in
  // sync, along the batch dimension, as TensorFlow rebatches: replica g gets
  // floor(G / N) rows, plus one for the first G mod N replicas (G the
  // global batch size, N the replicas in sync), in replica order. A shorter
  // (last) batch fills the replicas in order, so later ones may get fewer
  // rows or none. Under several workers every worker must produce the same
  // global batches (the same seed) and keeps its own replicas' rows.
  // A BatchFn gives one pass; a DatasetFn one per begin() (input.h).
  DistributedDataset experimental_distribute_dataset(BatchFn global_batches, std::int64_t global_batch_size);
  DistributedDataset experimental_distribute_dataset(DatasetFn dataset, std::int64_t global_batch_size);
  // Calls dataset_fn for this worker's input pipeline, with
  // InputContext(num workers, this worker, num_replicas_in_sync); each step
  // every local replica takes the next batch of that source, in replica
  // order. The function shards and batches itself (per-replica batches).
  // Under several workers, making it is a collective (a failure of
  // dataset_fn on one worker is raised by all): every worker makes its
  // datasets in the same order, in a cross-replica or default context.
  // Each later pass over the dataset (begin() again) calls dataset_fn
  // again, on every worker.
  DistributedDataset distribute_datasets_from_function(const std::function<BatchFn(const InputContext&)>& dataset_fn);

  // Concatenates every replica's component along `axis` (ragged allowed).
  Tensor gather(const PerReplica<Tensor>& value, int axis);
  // A non-distributed value is returned as it is.
  Tensor gather(const Tensor& value, int axis);
  // Throws UnimplementedError("gather does not support IndexedSlices").
  Tensor gather(const IndexedSlices& value, int axis);

  // One value per local replica.
  template <class T>
  std::vector<T> experimental_local_results(const PerReplica<T>& value) const {
    return value.values();
  }
  template <class T>
  std::vector<T> experimental_local_results(const Mirrored<T>& value) const {
    return value.values();
  }
  template <class T>
  requires(!is_distributed_values_v<T>) std::vector<T> experimental_local_results(const T& value)
  const { return {value}; }

 protected:
  // `checks_settings`: whether creating it checks the environment's settings
  // of the engine (DISTRIBUTE_SPIN_MICROSECONDS, ..._STREAM_ALL_REDUCE_BYTES,
  // ..._STORAGE_CACHE_BYTES; README). The default strategy, made on first use
  // by whatever asks for the current strategy, does not: its one replica uses
  // none of them, and a bad setting is reported by the strategy that does.
  Strategy(std::vector<std::string> devices, int num_replicas_in_sync, int first_replica_id,
           CommunicationOptions options, bool checks_settings = true);

  // Multi-worker strategies, from their constructor: `workers` has one member
  // per worker process (this process is member workers->rank()); every
  // collective then spans all workers (see multi_worker_mirrored_strategy.h).
  // The strategy shares ownership of `workers`, so that the collectives built
  // on it are torn down before it.
  void set_workers(std::shared_ptr<Communicator> workers);

 private:
  friend class StrategyScope;
  friend class StrategyExtended;
  friend class ReplicaContext;
  friend struct internal::Access;
  // Throws the TensorFlow error unless this thread is in this strategy's
  // cross-replica context or in the default context.
  void require_cross_replica_or_default(std::string_view api) const;
  // Runs body(ctx) on every local replica (the engine behind run).
  void run_replicas(const std::function<void(ReplicaContext&)>& body, std::string_view api);
  // Reduces one component per local replica (same dtype and shape, agreed by
  // every worker) across every replica in sync; MEAN divides by
  // `mean_divisor` (num_replicas_in_sync if 0).
  Tensor reduce_components(ReduceOp op, const std::vector<Tensor>& components, const CommunicationOptions& options,
                           std::int64_t mean_divisor);
  // The same for several values at once (values[k] holds value k's
  // components): values of one dtype are packed by options.bytes_per_pack,
  // so many small values cost one cross-worker collective per pack. The
  // results are views into the packs' buffers, on the host device.
  std::vector<Tensor> reduce_components_batch(ReduceOp op, const std::vector<const std::vector<Tensor>*>& values,
                                              const CommunicationOptions& options, std::int64_t mean_divisor);
  // An integer or bool MEAN of one pack across workers: every replica's
  // values gathered and reduced once (sums per worker would wrap).
  void reduce_exact_mean(const internal::Pack& pack, const std::vector<const std::vector<Tensor>*>& values,
                         std::int64_t divisor, const CommunicationOptions& options, std::vector<Tensor>& out);
  Tensor reduce_along_axes(ReduceOp op, const std::vector<Tensor>& components, const std::vector<int>& axes);
  // Several workers: `value` is this worker's one value, reduced across the
  // workers with `op` (MEAN divides by the number of workers). A collective
  // of the workers, agreed first (dtype, shape, op, options).
  Tensor reduce_per_worker(ReduceOp op, const Tensor& value, const CommunicationOptions& options, std::string_view api);
  // Whether a non-distributed value is one per worker here (several workers).
  bool values_are_per_worker() const;
  // Per-replica IndexedSlices across the sync group: this worker's
  // replicas' slices concatenated, then every worker's, in replica order;
  // agreed first (dense shape, index dtype, values but their rows; SUM or MEAN).
  IndexedSlices reduce_slices(ReduceOp op, const std::vector<IndexedSlices>& components,
                              const CommunicationOptions& options, std::string_view api);
  // Checks the components of a cross-replica collective (count, dtype, shape)
  // and its options (the strategy's merged with the call's); with several
  // workers, the workers then agree on them, within the options' timeout, so
  // a bad argument raises the same error on every worker instead of leaving
  // the others waiting.
  void check_and_agree(const std::vector<Tensor>& components, std::string_view api, ReduceOp op,
                       const CommunicationOptions& options);
  // The same for several values in one agreement; messages name "value k".
  void check_and_agree_batch(const std::vector<const std::vector<Tensor>*>& values, std::string_view api, ReduceOp op,
                             const CommunicationOptions& options);
  // The scopes of this strategy entered and not yet left, on every thread
  // (StrategyScope counts them); the destructor checks there are none.
  void count_scope(int delta) noexcept;

  std::vector<std::string> devices_;
  int num_replicas_in_sync_;
  int first_replica_id_;
  CommunicationOptions options_;
  StrategyExtended extended_;
  std::unique_ptr<internal::StrategyState> state_;
};

// ---- templates ----------------------------------------------------------------

template <class Fn>
auto Strategy::experimental_distribute_values_from_function(Fn&& fn) {
  using R = std::decay_t<std::invoke_result_t<Fn&, const ValueContext&>>;
  std::vector<R> values;
  values.reserve(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    internal::DeviceScope device(devices_[i]);
    values.push_back(fn(ValueContext(first_replica_id_ + static_cast<int>(i), num_replicas_in_sync_)));
  }
  return PerReplica<R>(std::move(values));
}

namespace internal {
inline void Access::run_replicas(Strategy& s, const std::function<void(ReplicaContext&)>& body, std::string_view api) {
  s.run_replicas(body, api);
}
inline void Access::require_cross_replica_or_default(const Strategy& s, std::string_view api) {
  s.require_cross_replica_or_default(api);
}
inline StrategyState& Access::state(Strategy& s) { return *s.state_; }
inline const CommunicationOptions& Access::options(const Strategy& s) { return s.options_; }
}  // namespace internal

}  // namespace distribute

// The templates behind run, call_for_each_replica and update: they call
// the members of the classes above, so they come after them.
#include "distribute/internal/run_on_replicas.h"  // IWYU pragma: export

namespace distribute {

template <class Fn, class... Args>
auto Strategy::run(Fn&& fn, const Args&... args) {
  return internal::run_on_replicas(*this, "run", fn, args...);
}

template <class Fn, class... Args>
auto StrategyExtended::call_for_each_replica(Fn&& fn, const Args&... args) {
  return internal::run_on_replicas(*strategy_, "call_for_each_replica", fn, args...);
}

template <class T, class Fn, class... Args>
auto StrategyExtended::update(Mirrored<T>& var, Fn&& fn, const Args&... args) {
  using R = std::decay_t<std::invoke_result_t<Fn&, T&, select_replica_t<Args>...>>;
  if (ReplicaContext* ctx = internal::replica_context_of(*strategy_)) {
    // Replica context: one merge_call, in which every component is updated once
    // with its own replica's arguments. Every replica gets the whole Mirrored
    // result, its tensors read-only.
    if constexpr (std::is_void_v<R>) {
      ctx->merge_call(
          [&var, &fn](Strategy& s, const PerReplica<Args>&... grouped) {
            s.extended().update_components(var, fn, grouped...);
          },
          args...);
      return;
    } else {
      return internal::replica_copy_of_update_result(*ctx->merge_call(
          [&var, &fn](Strategy& s, const PerReplica<Args>&... grouped) {
            return std::make_shared<const Mirrored<R>>(s.extended().update_components(var, fn, grouped...));
          },
          args...));
    }
  } else {
    strategy_->require_cross_replica_or_default("update");
    return update_components(var, fn, args...);
  }
}

template <class T, class Fn, class... Args>
auto StrategyExtended::update_components(Mirrored<T>& var, Fn& fn, const Args&... args) {
  check_update_target(var.size());
  // Before any component is touched: an argument with too few components
  // would fail part-way, leaving the mirrors apart, and one with too many
  // would pass unnoticed.
  internal::check_component_counts(*strategy_, "update", args...);
  using R = std::decay_t<std::invoke_result_t<Fn&, T&, select_replica_t<Args>...>>;
  if constexpr (std::is_void_v<R>) {
    for (std::size_t i = 0; i < var.size(); ++i) fn(var.mutable_values()[i], select_replica(i, args)...);
  } else {
    std::vector<R> out;
    out.reserve(var.size());
    for (std::size_t i = 0; i < var.size(); ++i) out.push_back(fn(var.mutable_values()[i], select_replica(i, args)...));
    return Mirrored<R>(std::move(out));
  }
}

}  // namespace distribute
