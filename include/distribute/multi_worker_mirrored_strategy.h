// File: multi_worker_mirrored_strategy.h
//
// MultiWorkerMirroredStrategy, as tf.distribute.MultiWorkerMirroredStrategy:
// the same run / ReplicaContext program, run by one process ("worker") per
// host, with the replicas of every worker in one sync group. Each worker runs
// the same number of local replicas (threads, as MirroredStrategy); global
// replica id = worker * local_replicas + local id.
//
//   // Under `mpirun -np 2 prog`: 2 workers x 2 local replicas = 4 in sync.
//   MultiWorkerMirroredStrategy strategy(2, distribute::mpi::cluster_from_launcher());
//   auto r = strategy.run([](ReplicaContext& ctx) {
//     return ctx.all_reduce(ReduceOp::kSum, constant(1.f));   // 4.0 everywhere
//   });
//
// The workers talk through a Communicator with one member per worker:
// distribute::mpi (distribute/mpi.h) makes one from the MPI launcher; nullptr
// is a one-worker cluster (nothing leaves the process). Every collective is
// hierarchical: local replicas combine in shared memory, worker replica 0
// runs one collective with the other workers, the result fans out locally.
//
// What works as in MirroredStrategy, across workers: all_reduce, all_gather,
// Strategy::reduce and gather, reduce_to / batch_reduce_to (also inside
// merge_fn), with the same errors on every worker. merge_call pauses the local
// replicas and runs merge_fn once per worker, on that worker's values, as
// TensorFlow does. broadcast_to and experimental_local_results are local.
//
// Failures: a replica that throws, a worker that times out, or an MPI error
// aborts the collectives of every worker, and the communicator between the
// workers is then unusable (an MPI collective cannot be cancelled): every
// later collective raises the first failure. docs/errors.md has the details.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distribute/communicator.h"
#include "distribute/strategy.h"

namespace distribute {

namespace internal {
struct ClusterSetup;
}

class MultiWorkerMirroredStrategy final : public Strategy {
 public:
  // `local_devices`: this worker's replicas, CPU devices as MirroredStrategy
  // takes them. `workers`: one member per worker (this process is member
  // workers->rank()); nullptr for a one-worker cluster. Every worker must
  // construct the strategy (it is a collective: the workers check that they
  // run the same number of local replicas and raise InvalidArgumentError on
  // every worker if not). A worker whose own arguments or settings are bad,
  // or whose strategy cannot be made (no thread for a replica, out of
  // memory), still meets the others: it raises its error, and every other
  // worker an error naming it (of the same kind, or InternalError for one
  // that is not a distribute::Error), instead of waiting for it.
  MultiWorkerMirroredStrategy(const std::vector<std::string>& local_devices, std::shared_ptr<Communicator> workers,
                              CommunicationOptions options = {});
  // `local_replicas` replicas on devices CPU:0 ... CPU:local_replicas-1.
  MultiWorkerMirroredStrategy(int local_replicas, std::shared_ptr<Communicator> workers,
                              CommunicationOptions options = {});
  ~MultiWorkerMirroredStrategy() override;

  std::string_view name() const override { return "MultiWorkerMirroredStrategy"; }
  int worker_rank() const { return worker_rank_; }
  int num_workers() const { return num_workers_; }

 private:
  explicit MultiWorkerMirroredStrategy(internal::ClusterSetup setup);

  std::shared_ptr<Communicator> workers_;
  int worker_rank_;
  int num_workers_;
  std::uint64_t session_ = 0;  // of the workers' link, begun by this strategy's meeting
};

}  // namespace distribute
