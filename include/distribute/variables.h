// File: variables.h
//
// Distributed variables, as tf.Variable created under strategy.scope():
// one component per local replica, kept in step by the strategy.
//
//   MirroredStrategy strategy({"CPU:0", "CPU:1"});
//   auto scope = strategy.scope();
//   MirroredVariable w(constant(1.f), {.name = "w", .aggregation = VariableAggregation::kSum});
//   strategy.run([&] { w.assign_add(constant(1.f)); });   // one merge_call: w == 3 on both replicas
//   SyncOnReadVariable seen(constant(0), {.name = "seen", .aggregation = VariableAggregation::kSum});
//   strategy.run([&] { seen.assign_add(constant(5)); });  // each replica its own component
//   seen.read_value();                                    // 10: a cross-replica read sums them
//
// MirroredVariable (synchronization ON_WRITE): every component holds the same
// value. A write in a replica context aggregates the replicas' values
// through merge_call (aggregation SUM, MEAN or ONLY_FIRST_REPLICA) and then
// updates every component once; aggregation NONE is an error there. A write
// in a cross-replica context applies the value to every component.
//
// SyncOnReadVariable (ON_READ): each replica writes its own component; a read
// in a cross-replica context aggregates them (SUM, MEAN, ONLY_FIRST_REPLICA).
//
// Contexts follow TensorFlow: inside Strategy::run a variable reads and
// writes as its replica; inside strategy.scope(), a merge_fn, or outside any
// strategy it acts in its strategy's cross-replica context. Using it under
// another strategy is a FailedPreconditionError ("Mixing different
// tf.distribute.Strategy objects"). docs/semantics.md, "Variables", has the
// full table and the few places where this library is stricter than TF.
// The strategy must outlive its variables: a variable used after its
// strategy is destroyed raises FailedPreconditionError.
//
// A Variable is a handle: copies refer to the same variable, as Python
// references do. Reads and writes are not locked: as in TensorFlow, the
// replicas of one step coordinate through merge_call and collectives, and a
// program must not write one variable from two unrelated threads at once.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "distribute/distributed_values.h"
#include "distribute/internal/access.h"
#include "distribute/strategy.h"
#include "distribute/tensor.h"

namespace distribute {

// tf.VariableSynchronization.
enum class VariableSynchronization { kAuto, kNone, kOnWrite, kOnRead };
// tf.VariableAggregation.
enum class VariableAggregation { kNone, kSum, kMean, kOnlyFirstReplica };

// "AUTO", "NONE", "ON_WRITE", "ON_READ".
std::string_view to_string(VariableSynchronization s);
// "NONE", "SUM", "MEAN", "ONLY_FIRST_REPLICA".
std::string_view to_string(VariableAggregation a);
// ReduceOp.from_variable_aggregation: SUM -> kSum, MEAN -> kMean; anything
// else is an InvalidArgumentError (TensorFlow's ValueError).
ReduceOp reduce_op_from_variable_aggregation(VariableAggregation aggregation);

struct VariableOptions {
  // For messages and printing ("Variable" if empty).
  std::string name;
  // AUTO is ON_WRITE. NONE is refused by every strategy but the default one.
  VariableSynchronization synchronization = VariableSynchronization::kAuto;
  VariableAggregation aggregation = VariableAggregation::kNone;
  // Default: true, except for ON_READ variables, which cannot be trainable.
  std::optional<bool> trainable;
};

namespace internal {
struct VariableState;
}

class Variable {
 public:
  // A variable of the current strategy (get_strategy(): the one whose scope
  // is entered, else the default strategy) whose every component starts as a
  // copy of `initial_value`. Under MultiWorkerMirroredStrategy the creation
  // is collective: every worker creates its variables in the same order and
  // all start from worker 0's initial value, as TensorFlow broadcasts it.
  // Creating one inside Strategy::run is a FailedPreconditionError.
  explicit Variable(const Tensor& initial_value, const VariableOptions& options = {});

  const std::string& name() const;
  DType dtype() const;
  const Shape& shape() const;
  VariableSynchronization synchronization() const;  // ON_WRITE or ON_READ (NONE under the default strategy)
  VariableAggregation aggregation() const;
  bool trainable() const;
  Strategy& distribute_strategy() const;

  // The components, one per local replica, in replica order (TF's .values).
  // They share storage with the variable: later writes show through.
  const std::vector<Tensor>& values() const;
  std::size_t size() const;

  // The value this context reads: the replica's own component inside run; in
  // a cross-replica context the primary component of a MirroredVariable, or
  // a SyncOnReadVariable's components aggregated (SUM and MEAN reduce over
  // every replica in sync, a collective under several workers;
  // ONLY_FIRST_REPLICA reads the primary; NONE is an InvalidArgumentError).
  // A component comes back as a view that sees later writes;
  // read_value() always returns a snapshot.
  Tensor value() const;
  Tensor read_value() const;

  // Writes in the current context (see the top of this file). The value must
  // have the variable's dtype and shape; assign_add and assign_sub need a
  // numeric dtype. In a replica context, every replica must make the same
  // call on the same variable (it is a collective for a MirroredVariable).
  void assign(const Tensor& value);
  void assign_add(const Tensor& value);
  void assign_sub(const Tensor& value);

  // TensorFlow's repr, e.g. for two replicas:
  // MirroredVariable:{
  //   0: <tf.Variable 'w:0' shape=() dtype=float32, numpy=1.0>,
  //   1: <tf.Variable 'w/replica_1:0' shape=() dtype=float32, numpy=1.0>
  // }
  std::string repr() const;

  // Identifies the variable (all handles to it share it), e.g. as a map key.
  const void* id() const { return state_.get(); }

  // Same variable (not same value).
  friend bool operator==(const Variable& a, const Variable& b) { return a.state_ == b.state_; }

 protected:
  Variable(const Tensor& initial_value, const VariableOptions& options, VariableSynchronization required);

 private:
  friend struct internal::Access;
  // Throws unless this variable may be used under `s` by `api`.
  void check_strategy(const Strategy& s, std::string_view api) const;
  // Component i, writable; check_component after changing it.
  Tensor& mutable_component(std::size_t i);
  // Throws if component i lost its dtype or shape (an update fn replaced
  // it), putting back `before` (the component's tensor before the fn).
  // `returned`: fn's result, which may hold the component's new storage too.
  void check_component(std::size_t i, std::string_view api, const Tensor& before, const Tensor* returned = nullptr);

  enum class Write { kAssign, kAdd, kSub };
  void write(Write kind, const Tensor& value);
  std::shared_ptr<internal::VariableState> state_;
};

// An ON_WRITE variable: options.synchronization must be AUTO or ON_WRITE.
class MirroredVariable : public Variable {
 public:
  explicit MirroredVariable(const Tensor& initial_value, const VariableOptions& options = {});
};

// An ON_READ variable: options.synchronization must be AUTO or ON_READ.
class SyncOnReadVariable : public Variable {
 public:
  explicit SyncOnReadVariable(const Tensor& initial_value, const VariableOptions& options = {});
};

std::ostream& operator<<(std::ostream& os, const Variable& v);

namespace internal {
inline void Access::check_strategy(const Variable& v, const Strategy& s, std::string_view api) {
  v.check_strategy(s, api);
}
inline Tensor& Access::mutable_component(Variable& v, std::size_t i) { return v.mutable_component(i); }
inline void Access::check_component(Variable& v, std::size_t i, std::string_view api, const Tensor& before,
                                    const Tensor* returned) {
  v.check_component(i, api, before, returned);
}

}  // namespace internal

}  // namespace distribute

// The templates behind update_distributed: they call the members of the
// classes above, so they come after them.
#include "distribute/internal/variable_update.h"  // IWYU pragma: export

namespace distribute {

// StrategyExtended::update(Variable&, fn, args...) (strategy.h).
template <class Fn, class... Args>
auto update_distributed(StrategyExtended& extended, Variable& var, Fn& fn, const Args&... args) {
  Strategy& strategy = extended.strategy();
  internal::Access::check_strategy(var, strategy, "update");
  using R = std::decay_t<std::invoke_result_t<Fn&, Tensor&, select_replica_t<Args>...>>;
  constexpr bool kDistributedArgs = (ReplicaSelection<Args>::kDistributed || ...);
  ReplicaContext* ctx = internal::replica_context_of(strategy);
  if constexpr (kDistributedArgs) {
    if (ctx != nullptr) {
      throw InvalidArgumentError("update of variable '" + var.name() +
                                 "': PerReplica and Mirrored arguments belong to the cross-replica context; in a "
                                 "replica context pass the replica's own value");
    }
  } else if (ctx != nullptr) {
    // One merge_call; replica 0's fn updates every component once, each with
    // its own replica's arguments.
    auto merge_fn = [&fn](Strategy&, const PerReplica<Variable>& vars, const PerReplica<Args>&... grouped) {
      internal::check_same_variable(vars, "update");
      Variable v = vars.primary();
      if constexpr (std::is_void_v<R>) {
        internal::update_variable_components(v, fn, grouped...);
      } else {
        return std::make_shared<const Mirrored<R>>(internal::update_variable_components(v, fn, grouped...));
      }
    };
    if constexpr (std::is_void_v<R>) {
      ctx->merge_call(merge_fn, var, args...);
      return;
    } else {
      return internal::replica_copy_of_update_result(*ctx->merge_call(merge_fn, var, args...));
    }
  }
  internal::Access::require_cross_replica_or_default(strategy, "update");
  // Before any component changes: too few components would fail part way,
  // too many pass unnoticed.
  internal::check_component_counts(strategy, "update", args...);
  return internal::update_variable_components(var, fn, args...);
}

}  // namespace distribute
