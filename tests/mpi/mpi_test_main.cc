// GoogleTest main for tests run under mpirun: every rank runs every test
// (each test is collective), rank 0 prints the usual report, the other ranks
// print only their failures, and the process exit code is the worst of all
// ranks', so a failure on any rank fails the run.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "testing/hang_watchdog.h"

namespace {
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would deadlock in OnTestPartResult: the
  // name is kept from OnTestStart.)
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  // ctest gives the whole binary 300 s; one test that hangs is reported well before.
  distribute::testing::install_hang_watchdog(120);
  int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
