// The conformance suite against the backends between processes, under
// mpirun: MPI alone (one member a process), and the hierarchical backend
// over MPI (two local replicas a process).
#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/backend.h"
#include "comm/conformance/backend_conformance.h"
#include "comm/mpi/mpi_communicator.h"

namespace distribute::testing {
namespace {

using internal::BackendKind;
using internal::make_replica_group;
using internal::MpiCommunicator;
using internal::ReplicaGroup;

// A fresh communicator on MPI_COMM_WORLD (a collective: every process makes
// it in the same test); local > 0: the hierarchical backend over it.
class MpiGroup final : public BackendGroup {
 public:
  explicit MpiGroup(int local) : mpi_(std::make_unique<MpiCommunicator>(MPI_COMM_WORLD)) {
    if (local > 0)
      group_ = make_replica_group({.kind = BackendKind::kAcrossWorkers, .replicas = local, .workers = mpi_.get()});
  }
  ~MpiGroup() override {
    group_.members.clear();  // (before the link they use)
  }
  std::vector<Communicator*> members() override {
    if (group_.members.empty()) return {mpi_.get()};
    std::vector<Communicator*> all;
    for (const auto& m : group_.members) all.push_back(m.get());
    return all;
  }

 private:
  std::unique_ptr<MpiCommunicator> mpi_;
  ReplicaGroup group_;
};

BackendCase over_mpi(const char* name, int local) {
  return {name, [local] { return std::make_unique<MpiGroup>(local); }};
}

INSTANTIATE_TEST_SUITE_P(BetweenProcesses, BackendConformance,
                         ::testing::Values(over_mpi("mpi", 0), over_mpi("hierarchical_over_mpi_x2", 2)),
                         BackendConformance::name_of);

}  // namespace
}  // namespace distribute::testing
