// ReplicaContext itself: its construction and accessors. Its collectives are in
// all_reduce.cc, all_gather.cc, broadcast.cc and merge_call.cc, and what they
// share in collective_pipeline.h.
#include "distribute/replica_context.h"

#include <cstddef>
#include <string>
#include <vector>

#include "distribute/strategy.h"
#include "runtime/mode.h"

namespace distribute {

ReplicaContext::ReplicaContext(internal::ReplicaContextKey, Strategy& strategy, int replica_id, int local_id,
                               internal::ReplicaChannel* channel)
    : strategy_(&strategy), replica_id_(replica_id), local_id_(local_id), channel_(channel) {}

int ReplicaContext::num_replicas_in_sync() const { return strategy_->num_replicas_in_sync(); }

std::vector<std::string> ReplicaContext::devices() const {
  internal::require_replica_context(*this, "devices");
  return {strategy_->devices()[static_cast<std::size_t>(local_id_)]};
}

}  // namespace distribute
