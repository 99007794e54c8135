#include "distribute/variables.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "core/elementwise.h"
#include "distribute/mirrored_strategy.h"
#include "runtime/mode.h"
#include "runtime/runtime_util.h"
#include "runtime/strategy_ref.h"
#include "runtime/worker_agreement.h"

namespace distribute {

std::string_view to_string(VariableSynchronization s) {
  switch (s) {
    case VariableSynchronization::kAuto: return "AUTO";
    case VariableSynchronization::kNone: return "NONE";
    case VariableSynchronization::kOnWrite: return "ON_WRITE";
    case VariableSynchronization::kOnRead: return "ON_READ";
  }
  return "?";
}

std::string_view to_string(VariableAggregation a) {
  switch (a) {
    case VariableAggregation::kNone: return "NONE";
    case VariableAggregation::kSum: return "SUM";
    case VariableAggregation::kMean: return "MEAN";
    case VariableAggregation::kOnlyFirstReplica: return "ONLY_FIRST_REPLICA";
  }
  return "?";
}

ReduceOp reduce_op_from_variable_aggregation(VariableAggregation aggregation) {
  if (aggregation == VariableAggregation::kSum) return ReduceOp::kSum;
  if (aggregation == VariableAggregation::kMean) return ReduceOp::kMean;
  throw InvalidArgumentError("Could not convert from `tf.VariableAggregation` VariableAggregation." +
                             std::string(to_string(aggregation)) + " to`tf.distribute.ReduceOp` type");
}

namespace internal {

struct VariableState {
  std::optional<StrategyRef> ref;  // set once the checks pass
  bool plain = false;              // made outside any strategy (the default strategy's)
  // The strategy; FailedPreconditionError once it is destroyed.
  Strategy& strategy() const { return ref->get("variable", name); }
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  VariableSynchronization synchronization = VariableSynchronization::kOnWrite;
  VariableAggregation aggregation = VariableAggregation::kNone;
  bool trainable = true;
  std::vector<Tensor> components;  // one per local replica, each on its replica's device
};

void check_same_variable(const PerReplica<Variable>& vars, std::string_view api) {
  const Variable& first = vars.primary();
  for (std::size_t i = 1; i < vars.size(); ++i) {
    if (!(vars.values()[i] == first)) {
      const int base = first.distribute_strategy().first_replica_id();
      throw InvalidArgumentError(
          std::string(api) + ": the replicas of one merge_call wrote different variables: replica " +
          std::to_string(base) + " wrote '" + first.name() + "', replica " +
          std::to_string(base + static_cast<int>(i)) + " wrote '" + vars.values()[i].name() + "'");
    }
  }
}

}  // namespace internal

namespace {

enum class Context { kReplica, kCrossReplica };

struct Where {
  Context context;
  ReplicaContext* replica = nullptr;
};

// The context a variable of `s` acts in on this thread (TensorFlow's
// enter_or_assert_strategy: outside any strategy, it enters its own).
Where where(const Strategy& s, const std::string& name, std::string_view api) {
  const internal::ModeEntry mode = internal::current_mode();
  if (internal::mode_stack().empty()) return {Context::kCrossReplica};
  if (mode.replica != nullptr && mode.strategy == &s) return {Context::kReplica, mode.replica};
  if (mode.cross_replica == &s) return {Context::kCrossReplica};
  throw FailedPreconditionError(
      "Mixing different tf.distribute.Strategy objects: " + internal::strategies_apart(*mode.strategy, s) +
      " (variable '" + name + "', " + std::string(api) + ")");
}

// A SUM assign in a replica context where every replica in sync passes the
// same value (the same bytes): TensorFlow takes the same object passed by
// every replica as one value, not a value per replica, and refuses to SUM it
// ("A non-DistributedValues value 5.0 cannot be reduced ..."); it never adds
// it N times. Checked across workers too (an exchange of each worker's
// verdict and a hash of its value); every worker raises it alike, so the
// workers' link stays usable.
void refuse_one_value_sum(Strategy& s, const Variable& var, const PerReplica<Tensor>& values) {
  if (s.num_replicas_in_sync() < 2) return;  // the SUM of one value is that value (the same on every worker)
  const Tensor& first = values.primary();
  bool same = true;
  for (const Tensor& t : values.values()) {
    same = same && (t.nbytes() == 0 || t.raw_data() == first.raw_data() ||
                    std::memcmp(t.raw_data(), first.raw_data(), first.nbytes()) == 0);
  }
  // This worker's verdict: its replicas' one value (hashed), or "differ".
  std::string verdict = "differ";
  if (same) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    const auto* p = static_cast<const unsigned char*>(first.raw_data());
    for (std::size_t i = 0; i < first.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    verdict = "same " + std::to_string(h);
  }
  const std::vector<std::string> all = internal::exchange_across_workers(s, verdict, "assign", nullptr);
  for (const std::string& v : all) {
    if (v != all[0] || v == "differ") return;  // per-replica values: their SUM
  }
  try {
    throw InvalidArgumentError(
        "A non-DistributedValues value " +
        (first.num_elements() <= 16 ? first.to_list_string() : "of shape " + first.shape().to_string()) +
        " cannot be reduced with the given reduce op SUM. (variable '" + var.name() +
        "': every replica assigned the same value to a SUM-aggregated MirroredVariable, which TensorFlow takes as "
        "one value, not one per replica: assign it in the cross-replica context, or aggregate with MEAN or "
        "ONLY_FIRST_REPLICA)");
  } catch (const Error&) {
    internal::note_agreed_worker_error();  // every worker raises it here alike
    throw;
  }
}

const char* write_name(int kind) {
  static const char* const kNames[] = {"assign", "assign_add", "assign_sub"};
  return kNames[kind];
}

// Whether the two tensors' bytes overlap (a value that views a component).
bool overlaps(const Tensor& a, const Tensor& b) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.raw_data());
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.raw_data());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void apply_write(int kind, Tensor& component, const Tensor& value) {
  switch (kind) {
    case 0:
      // Assigning a component its own value changes nothing; an empty
      // tensor has no bytes (and may have no buffer: memcpy's null is UB).
      if (component.nbytes() > 0 && component.raw_data() != value.raw_data()) {
        std::memcpy(component.mutable_raw_data(), value.raw_data(), component.nbytes());
      }
      return;
    case 1: internal::add_into(component, value); return;
    default: internal::sub_into(component, value); return;
  }
}

std::string component_name(const std::string& name, std::size_t i) {
  return i == 0 ? name + ":0" : name + "/replica_" + std::to_string(i) + ":0";
}

}  // namespace

Tensor internal::value_apart_from(const Variable& var, const Tensor& value) {
  for (const Tensor& c : var.values()) {
    if (overlaps(c, value)) return value.clone();
  }
  return value;
}

// ---- creation ---------------------------------------------------------------

Variable::Variable(const Tensor& initial_value, const VariableOptions& options)
    : Variable(initial_value, options, VariableSynchronization::kAuto) {}

Variable::Variable(const Tensor& initial_value, const VariableOptions& options, VariableSynchronization required) {
  auto st = std::make_shared<internal::VariableState>();
  st->name = options.name.empty() ? "Variable" : options.name;
  const internal::ModeEntry mode = internal::current_mode();
  if (!internal::mode_stack().empty() && mode.replica != nullptr) {
    throw FailedPreconditionError("Variable '" + st->name + "' was created inside Strategy::run (replica " +
                                  std::to_string(mode.replica->replica_id_in_sync_group()) +
                                  "); create variables in strategy.scope() before running the step");
  }
  Strategy& s = get_strategy();
  const bool distributed = !is_default_strategy(s);
  VariableSynchronization sync = options.synchronization;
  bool trainable = false;
  // The checks of the options and dtype. Under several workers one worker's
  // refusal is carried into the creation broadcast, so that every worker
  // raises it: a worker that raised it alone would leave the others waiting
  // in the broadcast.
  std::optional<InvalidArgumentError> refused;
  try {
    if (required != VariableSynchronization::kAuto && sync != VariableSynchronization::kAuto && sync != required) {
      throw InvalidArgumentError(
          std::string(required == VariableSynchronization::kOnRead ? "SyncOnReadVariable" : "MirroredVariable") + " '" +
          st->name + "' needs synchronization " + std::string(to_string(required)) + " (or AUTO), not " +
          std::string(to_string(sync)));
    }
    if (sync == VariableSynchronization::kAuto) {
      sync = required == VariableSynchronization::kAuto ? VariableSynchronization::kOnWrite : required;
    }
    if (sync == VariableSynchronization::kNone && distributed) {
      throw InvalidArgumentError(
          "`NONE` variable synchronization mode is not supported with tf.distribute strategy. "
          "Please change the `synchronization` for variable: " +
          st->name);
    }
    trainable = options.trainable.value_or(sync != VariableSynchronization::kOnRead);
    if (trainable && sync == VariableSynchronization::kOnRead) {
      throw InvalidArgumentError(
          "Synchronization value can be set to VariableSynchronization.ON_READ only for "
          "non-trainable variables. You have specified trainable=True and "
          "synchronization=VariableSynchronization.ON_READ (variable '" +
          st->name + "').");
    }
    if (distributed && options.aggregation == VariableAggregation::kMean && !is_floating(initial_value.dtype())) {
      throw InvalidArgumentError(
          "creating distributed tf.Variable with aggregation=MEAN and a non-floating dtype is "
          "not supported, please use a different aggregation or dtype (variable '" +
          st->name + "' has dtype " + std::string(to_string(initial_value.dtype())) + ")");
    }
  } catch (const InvalidArgumentError& e) {
    refused = e;
  }
  // Every component starts from replica 0's value; under several workers,
  // from worker 0's.
  Tensor first = initial_value.clone();
  internal::broadcast_from_first_worker(s, first, "variable creation", refused ? &*refused : nullptr);
  if (refused) throw *refused;  // (one worker: the broadcast did nothing)
  st->ref.emplace(s);
  st->plain = !distributed;
  st->dtype = initial_value.dtype();
  st->shape = initial_value.shape();
  st->synchronization = sync;
  st->aggregation = options.aggregation;
  st->trainable = trainable;
  for (std::size_t i = 0; i < s.devices().size(); ++i) {
    st->components.push_back((i == 0 ? first : first.clone()).with_device(s.devices()[i]));
  }
  state_ = std::move(st);
}

MirroredVariable::MirroredVariable(const Tensor& initial_value, const VariableOptions& options)
    : Variable(initial_value, options, VariableSynchronization::kOnWrite) {}

SyncOnReadVariable::SyncOnReadVariable(const Tensor& initial_value, const VariableOptions& options)
    : Variable(initial_value, options, VariableSynchronization::kOnRead) {}

// ---- accessors ----------------------------------------------------------------

const std::string& Variable::name() const { return state_->name; }
DType Variable::dtype() const { return state_->dtype; }
const Shape& Variable::shape() const { return state_->shape; }
VariableSynchronization Variable::synchronization() const { return state_->synchronization; }
VariableAggregation Variable::aggregation() const { return state_->aggregation; }
bool Variable::trainable() const { return state_->trainable; }
Strategy& Variable::distribute_strategy() const { return state_->strategy(); }
const std::vector<Tensor>& Variable::values() const { return state_->components; }
std::size_t Variable::size() const { return state_->components.size(); }

void Variable::check_strategy(const Strategy& s, std::string_view api) const {
  if (!state_->ref->is(s)) {
    throw FailedPreconditionError("Mixing different tf.distribute.Strategy objects: variable '" + state_->name +
                                  "' belongs to " + internal::strategies_apart(state_->strategy(), s, ", not ") + " (" +
                                  std::string(api) + ")");
  }
}

Tensor& Variable::mutable_component(std::size_t i) { return state_->components.at(i); }

void Variable::check_component(std::size_t i, std::string_view api, const Tensor& before, const Tensor* returned) {
  Tensor& c = state_->components.at(i);
  if (c.dtype() != state_->dtype || c.shape() != state_->shape) {
    const Tensor bad = c;
    c = before;  // the component's own tensor (what fn wrote into it, if anything, stays)
    throw InvalidArgumentError(std::string(api) + " of variable '" + state_->name + "' replaced component " +
                               std::to_string(i) + " (" + std::string(to_string(state_->dtype)) +
                               state_->shape.to_string() + ") with a tensor of " + std::string(to_string(bad.dtype())) +
                               bad.shape().to_string() + "; the component keeps its tensor from before the update");
  }
  // A replacement held elsewhere too: read-only (an argument every replica
  // received whole), or storage someone else also holds (a writable
  // argument, a tensor fn captured, another variable's component). The
  // component takes a copy of its own, so that the variable's later writes
  // neither fail nor reach anything else, and no two components share one
  // storage. (A fresh result, or the component written in place, is kept;
  // so is one that fn also returns, which then views the variable.)
  const std::shared_ptr<std::byte>& mine = c.storage();
  const bool returned_too = returned != nullptr && mine != nullptr && !returned->storage().owner_before(mine) &&
                            !mine.owner_before(returned->storage());
  if (c.is_read_only() || (mine != before.storage() && mine.use_count() > (returned_too ? 2 : 1))) c = c.clone();
  if (const std::string& d = state_->strategy().devices()[i]; c.device() != d) c = c.with_device(d);
}

// ---- reads ----------------------------------------------------------------------

Tensor Variable::value() const {
  const internal::VariableState& st = *state_;
  const Where w = where(st.strategy(), st.name, "read");
  if (w.context == Context::kReplica) return st.components[static_cast<std::size_t>(w.replica->local_replica_id())];
  // Outside any strategy a SyncOnRead variable is a plain variable: nothing to aggregate.
  if (st.synchronization != VariableSynchronization::kOnRead || st.plain ||
      st.aggregation == VariableAggregation::kOnlyFirstReplica) {
    return st.components[0];
  }
  const ReduceOp op = reduce_op_from_variable_aggregation(st.aggregation);
  return st.strategy().reduce(op, PerReplica<Tensor>(st.components), std::nullopt);
}

Tensor Variable::read_value() const {
  Tensor v = value();
  // An aggregated read is already a fresh tensor; a component is copied.
  for (const Tensor& c : state_->components) {
    if (c.storage() == v.storage()) return v.clone();
  }
  return v;
}

// ---- writes ---------------------------------------------------------------------

void Variable::assign(const Tensor& value) { write(Write::kAssign, value); }
void Variable::assign_add(const Tensor& value) { write(Write::kAdd, value); }
void Variable::assign_sub(const Tensor& value) { write(Write::kSub, value); }

void Variable::write(Write kind_enum, const Tensor& value) {
  internal::VariableState& st = *state_;
  const int kind = static_cast<int>(kind_enum);
  const std::string api = write_name(kind);
  if (value.dtype() != st.dtype || value.shape() != st.shape) {
    throw InvalidArgumentError(api + " to variable '" + st.name + "' of " + std::string(to_string(st.dtype)) +
                               st.shape.to_string() + ": the value is " + std::string(to_string(value.dtype())) +
                               value.shape().to_string());
  }
  if (kind != 0 && st.dtype == DType::kBool) {
    throw InvalidArgumentError(api + " to variable '" + st.name + "': bool is not a numeric dtype");
  }
  const Where w = where(st.strategy(), st.name, api);
  if (w.context == Context::kReplica && st.synchronization == VariableSynchronization::kOnRead) {
    apply_write(kind, st.components[static_cast<std::size_t>(w.replica->local_replica_id())], value);
    return;
  }
  if (w.context == Context::kCrossReplica || st.plain) {
    // The value is read whole before any component is written: a value that
    // views a component (w.assign_add(w.value())) would change as the first
    // write lands and give the other components another value.
    Tensor v = internal::value_apart_from(*this, value);
    // Outside any strategy a SyncOnRead variable is a plain variable (one
    // component, aggregation ignored).
    if (st.synchronization == VariableSynchronization::kOnRead && st.aggregation == VariableAggregation::kSum &&
        !st.plain) {
      if (kind != 0) {
        throw InvalidArgumentError("SyncOnReadVariable does not support `" + api +
                                   "` in cross-replica context when aggregation is set to "
                                   "`tf.VariableAggregation.SUM` (variable '" +
                                   st.name + "').");
      }
      // So that the cross-replica read (a SUM) gives back the value assigned.
      v = internal::divided(value, st.strategy().num_replicas_in_sync());
    }
    for (Tensor& c : st.components) apply_write(kind, c, v);
    return;
  }
  // A MirroredVariable written in a replica context: one merge_call
  // aggregates the replicas' values, then every component is written once.
  if (st.aggregation == VariableAggregation::kNone) {
    throw InvalidArgumentError(
        "You must specify an aggregation method to update a MirroredVariable in Replica Context. You can do so by "
        "passing an explicit value for argument `aggregation` to tf.Variable(..).e.g. `tf.Variable(..., "
        "aggregation=tf.VariableAggregation.SUM)` (variable '" +
        st.name + "', " + api + ")");
  }
  // (MEAN of a non-float variable cannot reach here: creation refuses it.)
  w.replica->merge_call(
      [](Strategy& s, const PerReplica<Variable>& vars, const PerReplica<int>& kinds,
         const PerReplica<Tensor>& values) {
        const int k = kinds.primary();
        internal::check_same_variable(vars, write_name(k));
        for (std::size_t i = 1; i < kinds.size(); ++i) {
          if (kinds.values()[i] != k) {
            throw InvalidArgumentError("variable '" + vars.primary().name() + "': replica " +
                                       std::to_string(s.first_replica_id()) + " called " + write_name(k) +
                                       ", replica " + std::to_string(s.first_replica_id() + static_cast<int>(i)) +
                                       " called " + write_name(kinds.values()[i]));
          }
        }
        Variable var = vars.primary();
        if (k == 0 && var.aggregation() == VariableAggregation::kSum) refuse_one_value_sum(s, var, values);
        Tensor aggregated;
        if (var.aggregation() == VariableAggregation::kOnlyFirstReplica) {
          // The first replica in sync: worker 0's, so mirrors stay equal across workers.
          aggregated = values.primary().clone();
          internal::broadcast_from_first_worker(s, aggregated, write_name(k));
        } else {
          aggregated = s.extended()
                           .reduce_to(reduce_op_from_variable_aggregation(var.aggregation()), values,
                                      Destinations(var.values()[0].device()))
                           .primary();
        }
        for (std::size_t i = 0; i < var.size(); ++i) apply_write(k, var.mutable_component(i), aggregated);
      },
      *this, kind, value);
}

// ---- printing -------------------------------------------------------------------

std::string Variable::repr() const {
  const internal::VariableState& st = *state_;
  auto one = [&](std::size_t i) {
    const Tensor& c = st.components[i];
    return "<tf.Variable '" + component_name(st.name, i) + "' shape=" + c.shape().to_string() +
           " dtype=" + std::string(to_string(c.dtype())) + ", numpy=" + c.numpy_repr() + ">";
  };
  if (st.plain) return one(0);
  std::string s =
      st.synchronization == VariableSynchronization::kOnRead ? "SyncOnReadVariable:{\n" : "MirroredVariable:{\n";
  for (std::size_t i = 0; i < st.components.size(); ++i) {
    s += "  " + std::to_string(i) + ": " + one(i) + (i + 1 < st.components.size() ? ",\n" : "\n");
  }
  return s + "}";
}

std::ostream& operator<<(std::ostream& os, const Variable& v) { return os << v.repr(); }

}  // namespace distribute
