// The seam (comm/backend.h): make_replica_group picks the backend a spec asks
// for, ranks its members in the whole sync group, and refuses a spec that no
// backend serves.
#include "comm/backend.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "testing/threads.h"

namespace distribute::internal {
namespace {

CollectiveCall test_call(std::uint64_t sequence) {
  return CollectiveCall{.op = "all_reduce", .sequence = sequence, .timeout_seconds = 20};
}

TEST(BackendTest, InProcessGroupHasOneThreadsMemberPerReplica) {
  ReplicaGroup group = make_replica_group({.kind = BackendKind::kInProcess, .replicas = 3});
  ASSERT_EQ(group.members.size(), 3u);
  ASSERT_NE(group.rendezvous, nullptr);
  EXPECT_EQ(group.rendezvous->size(), 3);
  for (int r = 0; r < 3; ++r) {
    const Communicator& m = *group.members[static_cast<std::size_t>(r)];
    EXPECT_EQ(m.rank(), r);
    EXPECT_EQ(m.size(), 3);
    EXPECT_EQ(m.backend_name(), "threads");
  }
  // The members reduce together, and the rendezvous is the one they meet in:
  // an abort through it fails their next call.
  std::vector<float> out(3, 0);
  const auto errors = testing::run_threads(3, [&](int r) {
    const float in = static_cast<float>(r + 1);
    group.members[static_cast<std::size_t>(r)]->all_reduce(&in, &out[static_cast<std::size_t>(r)], 1, DType::kFloat32,
                                                           ReduceOp::kSum, test_call(1));
  });
  for (const auto& e : errors) EXPECT_FALSE(e) << testing::message_of(e);
  EXPECT_EQ(out, (std::vector<float>{6, 6, 6}));
  group.rendezvous->abort(ErrorCode::kAborted, "test: aborted through the rendezvous", 1);
  float in = 1, one = 0;
  EXPECT_THROW(group.members[0]->all_reduce(&in, &one, 1, DType::kFloat32, ReduceOp::kSum, test_call(2)), AbortedError);
}

// Two workers, threads standing for processes, linked by an in-process
// group: each worker's group of 2 replicas spans the 4 replicas of the sync
// group, worker w's replica r at rank 2w + r.
TEST(BackendTest, GroupAcrossWorkersRanksReplicasInTheWholeSyncGroup) {
  ReplicaGroup link = make_replica_group({.replicas = 2});
  std::vector<ReplicaGroup> workers(2);
  for (int w = 0; w < 2; ++w) {
    workers[static_cast<std::size_t>(w)] =
        make_replica_group({.kind = BackendKind::kAcrossWorkers,
                            .replicas = 2,
                            .workers = link.members[static_cast<std::size_t>(w)].get()});
  }
  std::vector<float> out(4, 0);
  const auto errors = testing::run_threads(4, [&](int g) {
    const int w = g / 2, r = g % 2;
    Communicator& m = *workers[static_cast<std::size_t>(w)].members[static_cast<std::size_t>(r)];
    EXPECT_EQ(m.rank(), g);
    EXPECT_EQ(m.size(), 4);
    EXPECT_EQ(m.backend_name(), "hierarchical");
    const float in = static_cast<float>(g + 1);
    m.all_reduce(&in, &out[static_cast<std::size_t>(g)], 1, DType::kFloat32, ReduceOp::kSum, test_call(1));
  });
  for (const auto& e : errors) EXPECT_FALSE(e) << testing::message_of(e);
  EXPECT_EQ(out, (std::vector<float>{10, 10, 10, 10}));
  EXPECT_EQ(workers[0].rendezvous->size(), 2);
}

TEST(BackendTest, RefusesASpecNoBackendServes) {
  EXPECT_THROW(make_replica_group({.kind = BackendKind::kAcrossWorkers, .replicas = 2}), InternalError);
  EXPECT_THROW(make_replica_group({.replicas = 0}), InternalError);
  try {
    make_replica_group({.replicas = 2, .memory = MemoryKind::kCuda});
    ADD_FAILURE() << "a group on CUDA memory was made, though no backend reaches it";
  } catch (const UnimplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device 0 memory"), std::string::npos) << e.what();
  }
}

// Every backend says which memory it works on: host memory, and no device's.
TEST(BackendTest, BackendsReachHostMemoryOnly) {
  const BufferPlace host{};
  const BufferPlace cuda{.kind = MemoryKind::kCuda, .device_index = 1};
  ReplicaGroup in_process = make_replica_group({.replicas = 2});
  ReplicaGroup across =
      make_replica_group({.kind = BackendKind::kAcrossWorkers, .replicas = 1, .workers = in_process.members[0].get()});
  for (const Communicator* m : {in_process.members[0].get(), across.members[0].get()}) {
    EXPECT_TRUE(m->reaches(host)) << m->backend_name();
    EXPECT_FALSE(m->reaches(cuda)) << m->backend_name();
  }
  EXPECT_EQ(to_string(host), "host");
  EXPECT_EQ(to_string(cuda), "CUDA device 1");
  EXPECT_EQ(CollectiveCall{}.place, host);
}

}  // namespace
}  // namespace distribute::internal
