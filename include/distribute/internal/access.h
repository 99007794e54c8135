// File: internal/access.h
//
// Not part of the API: the one way the library's own code (its .cc files and
// the templates of its public headers) reaches the members of the public
// classes that users never call. Strategy, ReplicaContext, Variable and
// DistributedDataset befriend Access; each of its functions is defined
// inline after the class it opens (strategy.h, replica_context.h, input.h,
// variables.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace distribute {

class DistributedDataset;
class ReplicaContext;
class Strategy;
class Tensor;
class Variable;
struct CommunicationOptions;

namespace internal {

struct ReplicaChannel;
struct StrategyState;
struct DatasetSource;
struct Pack;

// Where a DistributedDataset stands, as a checkpoint keeps it.
struct DatasetPosition {
  std::int64_t pass = 0;   // passes begun before the current one
  std::int64_t steps = 0;  // get_next() calls of the current pass that gave batches
  bool ended = false;      // the current pass has returned nullopt
};

// Only Access makes one, so only the library makes a ReplicaContext (a
// constructor private to a friend could not be called by std::vector's
// emplace_back).
class ReplicaContextKey {
  friend struct Access;
  ReplicaContextKey() = default;
};

// The replica context of `s` if this thread is in s's replica mode (inside
// s.run), else nullptr: how the templates of StrategyExtended::update pick
// between a merge_call and a direct update.
ReplicaContext* replica_context_of(const Strategy& s);

struct Access {
  // Strategy (strategy.h).
  static void run_replicas(Strategy& s, const std::function<void(ReplicaContext&)>& body, std::string_view api);
  static void require_cross_replica_or_default(const Strategy& s, std::string_view api);
  static StrategyState& state(Strategy& s);
  static const CommunicationOptions& options(const Strategy& s);
  // ReplicaContext (replica_context.h).
  static ReplicaContextKey replica_context_key() { return {}; }
  static ReplicaChannel& channel(const ReplicaContext& ctx);
  // DistributedDataset (input.h).
  static DistributedDataset make_dataset(std::shared_ptr<DatasetSource> first,
                                         std::function<std::shared_ptr<DatasetSource>()> again, std::string api);
  static DatasetPosition dataset_position(const DistributedDataset& d);
  // Why `d` cannot be moved to `p` (empty if it can): it must not have been
  // read from, and a one-shot source has only one pass.
  static std::string why_not_restorable(const DistributedDataset& d, const DatasetPosition& p);
  // Moves an unread `d` to `p` in two steps, each done by every worker
  // alike: the passes before p's (each pass may be a collective among the
  // workers), then the batches p's pass took, drawn again from the source
  // and dropped (local to the worker; FailedPreconditionError if the source
  // holds fewer). `what` names the dataset in errors.
  static void restore_dataset_passes(DistributedDataset& d, const DatasetPosition& p);
  static void restore_dataset_steps(DistributedDataset& d, const DatasetPosition& p, std::string_view what);
  // Variable (variables.h).
  static void check_strategy(const Variable& v, const Strategy& s, std::string_view api);
  static Tensor& mutable_component(Variable& v, std::size_t i);
  static void check_component(Variable& v, std::size_t i, std::string_view api, const Tensor& before,
                              const Tensor* returned = nullptr);
};

}  // namespace internal
}  // namespace distribute
