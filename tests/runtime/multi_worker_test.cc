// MultiWorkerMirroredStrategy with threads standing for the workers: each
// worker is a thread with its own strategy, and the workers talk through an
// in-process communicator (one member per worker) instead of MPI. The same
// cases run under mpirun in tests/mpi/multi_worker_mpi_test.cc; here they
// also run under ThreadSanitizer and AddressSanitizer.
#include <cstdlib>
#include <string>

#include "comm/threads/shared_memory_communicator.h"
#include "testing/multi_worker_cases.h"
#include "testing/threads.h"

namespace distribute::testing {
namespace {

struct Layout {
  int workers;
  int local;
};

void run_cluster(const Layout& layout, void (*body)(const WorkerEnv&)) {
  auto group = std::make_shared<internal::LocalGroup>(layout.workers);
  std::vector<std::shared_ptr<Communicator>> links;
  for (int w = 0; w < layout.workers; ++w) {
    links.push_back(std::make_shared<internal::SharedMemoryCommunicator>(group, w));
  }
  const auto errors = run_threads(layout.workers, [&](int w) {
    WorkerEnv env;
    env.worker = w;
    env.workers = layout.workers;
    env.local_replicas = layout.local;
    env.make = [&links, w](int local, CommunicationOptions options) {
      return std::make_unique<MultiWorkerMirroredStrategy>(local, links[static_cast<std::size_t>(w)], options);
    };
    body(env);
  });
  for (std::size_t w = 0; w < errors.size(); ++w) {
    if (errors[w]) ADD_FAILURE() << "worker " << w << " threw: " << message_of(errors[w]);
  }
}

class MultiWorkerTest : public ::testing::TestWithParam<Layout> {};

#define DISTRIBUTE_TEST_CASE(name) \
  TEST_P(MultiWorkerTest, name) { run_cluster(GetParam(), &name); }
DISTRIBUTE_MULTI_WORKER_CASES(DISTRIBUTE_TEST_CASE)
#undef DISTRIBUTE_TEST_CASE

INSTANTIATE_TEST_SUITE_P(Layouts, MultiWorkerTest,
                         ::testing::Values(Layout{1, 2}, Layout{2, 1}, Layout{2, 2}, Layout{3, 1}, Layout{3, 2}),
                         [](const auto& param_info) {
                           return std::to_string(param_info.param.workers) + "workers_x" +
                                  std::to_string(param_info.param.local) + "local";
                         });

TEST(MultiWorkerMirroredStrategyTest, WithoutWorkersItIsOneWorker) {
  MultiWorkerMirroredStrategy s(2, nullptr);
  EXPECT_EQ(s.num_workers(), 1);
  EXPECT_EQ(s.worker_rank(), 0);
  EXPECT_EQ(s.num_replicas_in_sync(), 2);
  EXPECT_EQ(s.extended().worker_devices()[1], "/job:localhost/replica:0/task:0/device:CPU:1");
  EXPECT_EQ(s.describe(), "MultiWorkerMirroredStrategy(2 replicas: CPU:0, CPU:1)");
  auto r = s.run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(2)); });
  EXPECT_EQ(r.values()[1].scalar<std::int32_t>(), 4);
}

// TF_CONFIG is not read yet: a one-worker strategy made where it is set says
// so once (on stderr), rather than running N separate one-worker jobs silently.
TEST(MultiWorkerMirroredStrategyTest, ATfConfigWithoutWorkersIsSaidOnce) {
  ::testing::internal::CaptureStderr();
  { MultiWorkerMirroredStrategy quiet(1, nullptr); }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // no TF_CONFIG, nothing said
  ::setenv("TF_CONFIG", R"({"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {"type": "worker", "index": 0}})",
           1);
  ::testing::internal::CaptureStderr();
  { MultiWorkerMirroredStrategy first(1, nullptr); }
  { MultiWorkerMirroredStrategy second(1, nullptr); }
  const std::string said = ::testing::internal::GetCapturedStderr();
  ::unsetenv("TF_CONFIG");
  EXPECT_NE(said.find("TF_CONFIG is set"), std::string::npos) << said;
  EXPECT_NE(said.find("single worker"), std::string::npos) << said;
  EXPECT_NE(said.find("mpirun -np N"), std::string::npos) << said;
  EXPECT_EQ(said.find("TF_CONFIG is set"), said.rfind("TF_CONFIG is set")) << "said more than once: " << said;
}

TEST(MultiWorkerMirroredStrategyTest, RejectsBadLocalReplicas) {
  EXPECT_THROW(MultiWorkerMirroredStrategy(0, nullptr), InvalidArgumentError);
  EXPECT_THROW(MultiWorkerMirroredStrategy(std::vector<std::string>{"CPU:0", "cpu:0"}, nullptr), InvalidArgumentError);
  EXPECT_THROW(
      MultiWorkerMirroredStrategy(std::vector<std::string>{"/job:worker/replica:0/task:1/device:CPU:0"}, nullptr),
      InvalidArgumentError);
}

TEST(MultiWorkerMirroredStrategyTest, DescribeNamesTheWorker) {
  auto group = std::make_shared<internal::LocalGroup>(2);
  std::vector<std::string> described(2);
  const auto errors = run_threads(2, [&](int w) {
    MultiWorkerMirroredStrategy s(1, std::make_shared<internal::SharedMemoryCommunicator>(group, w));
    described[static_cast<std::size_t>(w)] = s.describe();
  });
  for (const auto& e : errors) EXPECT_FALSE(e) << message_of(e);
  EXPECT_EQ(described[1], "MultiWorkerMirroredStrategy(2 replicas on 2 workers; worker 1 has: CPU:0)");
}

}  // namespace
}  // namespace distribute::testing
