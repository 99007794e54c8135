// The training equivalence under a real launcher: 2 workers x 2 local
// replicas (ctest: train_equivalence_np2) reach, after 50 steps, the
// parameters one replica reaches alone, to the documented tolerance.
#include <distribute/mpi.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "blas.h"
#include "train/equivalence.h"

namespace distribute::train {
namespace {

TEST(TrainEquivalenceMpiTest, WorkersTimesReplicasMatchOneReplica) {
  set_blas_threads(1);
  MultiWorkerMirroredStrategy strategy(2, mpi::cluster_from_launcher(),
                                       CommunicationOptions{.timeout = std::chrono::seconds(60)});
  const std::vector<Tensor> distributed = testing::train_parameters(strategy);
  const std::vector<Tensor> one = testing::train_parameters(default_strategy());
  const double diff = testing::max_abs_difference(distributed, one);
  EXPECT_LE(diff, testing::kEquivalenceTolerance) << strategy.describe();
  if (strategy.worker_rank() == 0) {
    std::printf("%s: max |difference| from 1 replica after %d steps: %.3g\n", strategy.describe().c_str(),
                testing::kEquivalenceSteps, diff);
  }
}

}  // namespace
}  // namespace distribute::train
