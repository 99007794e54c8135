// The one seam between the runtime and the communication backends: the
// runtime, the tools and anything above them reach a backend only through
// this header and the Communicator interface (distribute/communicator.h).
//
// A strategy asks for one replica group per run depth: the communicators of
// this process's replicas (one each, all of the whole sync group) and the
// rendezvous of their threads that merge_call pauses them in. Which backend
// serves it is chosen here, by what the strategy needs:
//   kInProcess     the replicas are threads of this process, nothing else
//                  (comm/threads: SharedMemoryCommunicator over a LocalGroup);
//   kAcrossWorkers each worker process runs the same number of replicas and
//                  `workers` links the processes, one member each (MPI:
//                  distribute::mpi::cluster); the replicas of a worker meet
//                  in process, their leader crosses workers
//                  (comm/hierarchical).
// A device backend (CUDA devices with NCCL) adds a kind here, chosen by the
// kind of the strategy's devices; docs/algorithms.md ("How a backend
// plugs in") says what it implements. Nothing above this header changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distribute/communicator.h"
#include "distribute/errors.h"

namespace distribute::internal {

// What a replica brings to a rendezvous, and sees of every other one.
struct RendezvousEntry {
  const void* send = nullptr;    // read by the others until the member's round after next
  void* recv = nullptr;          // written by the others, where a collective says so
  std::string payload;           // a copy, for small exchanges (signatures)
  std::shared_ptr<void> object;  // something handed to all (a merge_fn's result)
  std::uint64_t tag = 0;         // CollectiveCall::signature_tag, on a collective's first round
};

// The rendezvous of the threads of one process that run the replicas of one
// run, in the runtime's terms: what merge_call pauses the replicas in, and
// what a run marks its replicas' progress on. A failed rendezvous stays
// failed for every member until reset().
class ReplicaRendezvous {
 public:
  using Entry = RendezvousEntry;
  virtual ~ReplicaRendezvous() = default;

  // The replicas that meet (this process's replicas of the run).
  virtual int size() const = 0;
  // Publishes `entry` and waits for every member; returns every member's
  // entry, in member order, readable until this member's round after next.
  // If any entry carries a tag and the tags differ (or one has bit 0 set),
  // throws SignatureMismatch on every member. Fails as a collective does: a
  // timeout, an abort, a member that returned from the replica function
  // (its message then starts with call.count_mismatch, if set).
  virtual const std::vector<Entry>& arrive(int member, Entry entry, const CollectiveCall& call) = 0;
  // The closing round of work the members did on each other's buffers after
  // an arrive(): waits for every member whatever happens meanwhile, so that
  // no buffer is freed while another member still writes into it.
  virtual void release(int member, const CollectiveCall& call) = 0;
  // Fails the rendezvous (first call wins): every waiter wakes with the error.
  virtual void abort(ErrorCode code, const std::string& message, int origin) noexcept = 0;

  // The run's lifecycle. The member returned from its replica function and
  // will not arrive again (whoever waits for it fails at once).
  virtual void mark_done(int member) noexcept = 0;
  // Before a run: clears failure and progress (no member may be inside).
  virtual void reset() = 0;
  // After a run: lets go of what entries still hold (the last merge_fn's result).
  virtual void drop_objects() = 0;
  // The member whose failure or timeout aborted the rendezvous, or -1.
  virtual int abort_origin() const = 0;
};

enum class BackendKind {
  kInProcess,
  kAcrossWorkers,
};

struct ReplicaGroupSpec {
  BackendKind kind = BackendKind::kInProcess;
  int replicas = 1;                 // this process's replicas, >= 1
  Communicator* workers = nullptr;  // kAcrossWorkers: the workers' link (outlives the group)
  // Where the replicas' buffers live: host memory is what every backend
  // here serves; a device backend will be chosen by the device's kind.
  MemoryKind memory = MemoryKind::kHost;
  // Where the in-process all_reduce starts to stream its results
  // (default_all_reduce_stream_bytes(), read once by the strategy).
  std::size_t all_reduce_stream_bytes = ~std::size_t{0};
};

struct ReplicaGroup {
  std::shared_ptr<ReplicaRendezvous> rendezvous;
  std::vector<std::unique_ptr<Communicator>> members;  // [local replica]; rank: the replica's place in the sync group
};

// Makes the group that `spec` asks for; InternalError for a spec that no
// backend serves (kAcrossWorkers without workers, replicas < 1), and
// UnimplementedError for memory no backend reaches yet (CUDA devices).
ReplicaGroup make_replica_group(const ReplicaGroupSpec& spec);

// ---- engine settings and the engine's copies, for the layers above --------

// all_reduce_stream_bytes that never streams.
inline constexpr std::size_t kNeverStream = ~std::size_t{0};
// The in-process all_reduce's streaming threshold for this CPU, or
// DISTRIBUTE_STREAM_ALL_REDUCE_BYTES (InvalidArgumentError if that is not a
// whole number of bytes). Reads the environment on every call.
std::size_t default_all_reduce_stream_bytes();
// Copies n bytes of a broadcast of `message_bytes` as the in-process
// broadcast does (streaming stores for large messages): for copies the
// runtime shares among paused replicas (broadcast_to inside a merge_fn).
void copy_broadcast_part(void* dst, const void* src, std::size_t n, std::size_t message_bytes);

}  // namespace distribute::internal
