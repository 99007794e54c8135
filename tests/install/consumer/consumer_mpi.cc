// A program of another project using distribute::mpi: one worker without a launcher.
#include <distribute/distribute.h>
#include <distribute/mpi.h>

#include <iostream>

int main() {
  distribute::MultiWorkerMirroredStrategy strategy(2, distribute::mpi::cluster_from_launcher());
  auto r = strategy.run([](distribute::ReplicaContext& ctx) {
    return ctx.all_reduce(distribute::ReduceOp::kSum, distribute::constant(1.f));
  });
  std::cout << "consumer_mpi: " << strategy.num_workers() << " worker, " << r[0].to_list_string() << "\n";
  return r[0] == distribute::constant(2.f) ? 0 : 1;
}
