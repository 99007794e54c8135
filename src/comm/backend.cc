#include "comm/backend.h"

#include "comm/hierarchical/hierarchical_communicator.h"
#include "comm/threads/local_group.h"
#include "comm/threads/shared_memory_communicator.h"

namespace distribute::internal {

ReplicaGroup make_replica_group(const ReplicaGroupSpec& spec) {
  if (spec.replicas < 1) {
    throw InternalError("make_replica_group: a group needs at least one replica, asked for " +
                        std::to_string(spec.replicas));
  }
  if (spec.memory != MemoryKind::kHost) {
    throw UnimplementedError("make_replica_group: no backend serves replicas whose buffers are in " +
                             to_string(BufferPlace{.kind = spec.memory}) +
                             " memory yet (the in-process and across-workers backends reach host memory only)");
  }
  const bool across = spec.kind == BackendKind::kAcrossWorkers;
  if (across && spec.workers == nullptr) {
    throw InternalError("make_replica_group: a group across workers needs the workers' communicator");
  }
  // A worker's replicas share the host's cores with the other workers on it,
  // and their leader with MPI's progress: waiters yield rather than spin.
  auto local = std::make_shared<LocalGroup>(spec.replicas, /*shares_cores=*/across);
  ReplicaGroup group;
  group.members.reserve(static_cast<std::size_t>(spec.replicas));
  for (int r = 0; r < spec.replicas; ++r) {
    if (across) {
      group.members.push_back(
          std::make_unique<HierarchicalCommunicator>(local, r, spec.workers, spec.all_reduce_stream_bytes));
    } else {
      group.members.push_back(std::make_unique<SharedMemoryCommunicator>(local, r, spec.all_reduce_stream_bytes));
    }
  }
  group.rendezvous = std::move(local);
  return group;
}

std::size_t default_all_reduce_stream_bytes() { return SharedMemoryCommunicator::default_all_reduce_stream_bytes(); }

void copy_broadcast_part(void* dst, const void* src, std::size_t n, std::size_t message_bytes) {
  SharedMemoryCommunicator::copy_broadcast_part(dst, src, n, message_bytes);
}

}  // namespace distribute::internal
