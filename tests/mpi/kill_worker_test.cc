// A worker killed with SIGKILL in the middle of a collective: the survivors
// must end with an error within about a second, with no timeout set, not
// hang. Run by tests/mpi/kill_worker.sh under `mpirun --enable-recovery`
// (without it, mpirun kills the whole job when one process dies).
//
// Every worker loops on all_reduce of 1 MiB; the last worker's helper thread
// kills its own process 300 ms in. The survivors share its host, so they
// watch its process (a pidfd) and find it gone. Each survivor prints one line
//   SURVIVED rank R: <error> after S s
// if it ended with UnavailableError (or AbortedError, from another survivor
// that saw it first) within kLimitSeconds, and exits at once (_exit: MPI_Finalize
// could wait for the dead process).
#include <distribute/distribute.h>
#include <distribute/mpi.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "testing/hang_watchdog.h"

using namespace distribute;

int main() {
  // The death is seen within 10 ms, then given 100 ms to deliver what it
  // sent; the rest is slack for 2 oversubscribed cores.
  constexpr double kLimitSeconds = 0.3 + 2.0;
  CommunicationOptions options;  // no timeout
  std::shared_ptr<Communicator> link = mpi::cluster_from_launcher();
  if (link == nullptr) {
    std::fprintf(stderr, "kill_worker_test: run me under mpirun\n");
    return 2;
  }
  // A survivor that hangs anyway prints every thread's stack instead of
  // waiting for ctest's timeout.
  std::thread watchdog([] {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    distribute::testing::dump_every_thread_and_exit("kill_worker_test: still running after 60 s");
  });
  watchdog.detach();
  MultiWorkerMirroredStrategy strategy(2, link, options);
  const int rank = strategy.worker_rank();
  const bool victim = rank == strategy.num_workers() - 1;
  const Tensor value = fill(DType::kFloat32, Shape{256 * 1024}, 1);
  // Everybody is up and connected before the kill.
  strategy.run([&](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::kSum, value); });

  std::thread killer;
  if (victim) {
    killer = std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::raise(SIGKILL);
    });
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int step = 0; step < 1000000; ++step) {
      strategy.run([&](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::kSum, value); });
    }
    std::printf("rank %d: the loop ended without an error\n", rank);
  } catch (const Error& e) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool typed = e.code() == ErrorCode::kUnavailable || e.code() == ErrorCode::kAborted;
    const bool in_time = seconds < kLimitSeconds;
    std::printf("%s rank %d: %s after %.2f s: %s\n", typed && in_time ? "SURVIVED" : "FAILED", rank,
                std::string(to_string(e.code())).c_str(), seconds, e.message().c_str());
  }
  std::fflush(stdout);
  _exit(0);
}
