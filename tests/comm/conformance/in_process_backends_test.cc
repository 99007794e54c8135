// The conformance suite against the backends of one process: the threads
// engine alone, and the hierarchical backend over a workers' link of
// threads (each worker a group of local replicas).
#include <memory>
#include <vector>

#include "comm/backend.h"
#include "comm/conformance/backend_conformance.h"

namespace distribute::testing {
namespace {

using internal::BackendKind;
using internal::make_replica_group;
using internal::ReplicaGroup;

// `workers` x `local` members, all in this process; workers == 0: the
// threads engine alone, with `local` members.
class InProcessGroup final : public BackendGroup {
 public:
  InProcessGroup(int workers, int local) {
    if (workers == 0) {
      groups_.push_back(make_replica_group({.replicas = local}));
      return;
    }
    link_ = make_replica_group({.replicas = workers});
    for (int w = 0; w < workers; ++w) {
      groups_.push_back(make_replica_group({.kind = BackendKind::kAcrossWorkers,
                                            .replicas = local,
                                            .workers = link_.members[static_cast<std::size_t>(w)].get()}));
    }
  }
  ~InProcessGroup() override {
    groups_.clear();  // (before the link they use)
  }
  std::vector<Communicator*> members() override {
    std::vector<Communicator*> all;
    for (const ReplicaGroup& g : groups_) {
      for (const auto& m : g.members) all.push_back(m.get());
    }
    return all;
  }

 private:
  ReplicaGroup link_;
  std::vector<ReplicaGroup> groups_;
};

BackendCase in_process(const char* name, int workers, int local) {
  return {name, [workers, local] { return std::make_unique<InProcessGroup>(workers, local); }};
}

INSTANTIATE_TEST_SUITE_P(InProcess, BackendConformance,
                         ::testing::Values(in_process("threads_1", 0, 1), in_process("threads_3", 0, 3),
                                           in_process("hierarchical_2x2", 2, 2), in_process("hierarchical_3x1", 3, 1)),
                         BackendConformance::name_of);

}  // namespace
}  // namespace distribute::testing
