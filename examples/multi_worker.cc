// The README's multi-worker example: every worker runs this program.
//
//   mpirun -np 2 ./multi_worker           (one process per host: --hostfile, srun, ...)
//   ./multi_worker                        (no launcher: a one-worker cluster)
#include <distribute/distribute.h>
#include <distribute/mpi.h>

#include <chrono>
#include <iostream>

using namespace distribute;

int main() {
  CommunicationOptions options;
  options.timeout = std::chrono::seconds(60);  // a dead worker is an error, not a hang
  MultiWorkerMirroredStrategy strategy(2, mpi::cluster_from_launcher(), options);  // 2 replicas here
  auto mean = strategy.run([](ReplicaContext& ctx) {
    const float mine = static_cast<float>(ctx.replica_id_in_sync_group());
    return ctx.all_reduce(ReduceOp::kMean, constant(mine));  // the same on every replica of every worker
  });
  if (strategy.worker_rank() == 0) {
    std::cout << strategy.num_workers() << " workers, " << strategy.num_replicas_in_sync()
              << " replicas in sync, mean replica id " << mean.values()[0].scalar<float>() << "\n";
  }
}
