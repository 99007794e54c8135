// MultiWorkerMirroredStrategy under a real launcher: one worker per MPI
// process, DISTRIBUTE_TEST_LOCAL_REPLICAS local replicas each (ctest runs
// this with -np 2 and 3, 1 and 2 local replicas). The cases are those of
// tests/runtime/multi_worker_test.cc (testing/multi_worker_cases.h).
#include <distribute/mpi.h>

#include <cstdlib>

#include "testing/multi_worker_cases.h"

namespace distribute::testing {
namespace {

WorkerEnv mpi_env() {
  WorkerEnv env;
  MPI_Comm_rank(MPI_COMM_WORLD, &env.worker);
  MPI_Comm_size(MPI_COMM_WORLD, &env.workers);
  const char* local = std::getenv("DISTRIBUTE_TEST_LOCAL_REPLICAS");
  env.local_replicas = local != nullptr ? std::atoi(local) : 1;
  env.make = [](int local_replicas, CommunicationOptions options) {
    return std::make_unique<MultiWorkerMirroredStrategy>(local_replicas, mpi::cluster_from_launcher(), options);
  };
  return env;
}

#define DISTRIBUTE_TEST_CASE(name) \
  TEST(MultiWorkerMpiTest, name) { name(mpi_env()); }
DISTRIBUTE_MULTI_WORKER_CASES(DISTRIBUTE_TEST_CASE)
#undef DISTRIBUTE_TEST_CASE

TEST(MultiWorkerMpiTest, TheLauncherIsSeen) {
  EXPECT_TRUE(mpi::started_by_launcher());
  auto link = mpi::cluster_from_launcher();
  ASSERT_NE(link, nullptr);
  EXPECT_EQ(link->backend_name(), "mpi");
}

}  // namespace
}  // namespace distribute::testing
