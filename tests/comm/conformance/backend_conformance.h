// The conformance suite of the backends: every collective of the
// Communicator interface, every op and dtype, in and out of place, sizes
// across the algorithms' thresholds, an abort from another thread and a
// member that never comes, run alike against every backend. A backend
// joins by instantiating the suite with a BackendCase (see
// docs/architecture.md, "How a backend plugs in"):
//
//   INSTANTIATE_TEST_SUITE_P(Threads, BackendConformance,
//                            ::testing::Values(BackendCase{"threads3", [] { return ...; }}),
//                            BackendConformance::name_of);
//
// A group may span processes (MPI under mpirun): each process holds some of
// its members, runs the same tests in the same order, and checks what its
// own members see.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "distribute/communicator.h"

namespace distribute::testing {

// The members of one group that this process holds, made fresh for a test.
class BackendGroup {
 public:
  virtual ~BackendGroup() = default;
  // This process's members, in rank order.
  virtual std::vector<Communicator*> members() = 0;
};

struct BackendCase {
  std::string name;  // for test names: letters, digits and '_'
  std::function<std::unique_ptr<BackendGroup>()> make;
};

// Test names and failures print a case by its name.
inline void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

class BackendConformance : public ::testing::TestWithParam<BackendCase> {
 public:
  static std::string name_of(const ::testing::TestParamInfo<BackendCase>& info) { return info.param.name; }

 protected:
  void SetUp() override { group_ = GetParam().make(); }
  void TearDown() override { group_.reset(); }

  // Runs body(member, member's next call) on a thread per local member;
  // returns each one's error, in the order of members().
  std::vector<std::exception_ptr> on_every_member(const std::function<void(Communicator&)>& body);

  std::unique_ptr<BackendGroup> group_;
};

}  // namespace distribute::testing
