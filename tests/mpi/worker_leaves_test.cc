// A worker that leaves while the others still run collectives with it: the
// others must raise a typed error naming it within about a second, with no
// timeout set, and the job must end (no wait in MPI_Finalize). Run by
// tests/mpi/worker_leaves.sh, one mpirun per way of leaving:
//
//   worker_leaves_test MODE LOCAL_REPLICAS
//
// Every worker makes a MultiWorkerMirroredStrategy without a timeout and runs
// one step (an all_reduce); then the last worker ("the leaver"), per MODE:
//   return     returns from main (its strategy and link destroyed, MPI finalised)
//   exit       calls std::exit(0) with its strategy alive
//   exit_in_replica  calls std::exit(0) from a replica function, mid-run
//   exit_in_call  calls std::exit(0) while another of its threads waits in
//              a collective (the notice counts the calls before it)
//   finalize   calls MPI_Finalize() itself, then returns
//   destroy    destroys its strategy, keeps the link, and sleeps 3 s
//   second     makes a second strategy on the same link, the first alive
//   replace    destroys its strategy and makes another on the same link
//   sequence   (every worker) destroys its strategy and makes another on
//              the same link: nothing leaves, the next step must work
//   renew      (every worker) makes a new strategy on the same link before
//              the old one is destroyed (`strategy = make_unique<...>(...)`):
//              the old one's end must not end the new one
// while the others go on with more steps. Each worker that should see an
// error prints one line
//   RESULT rank R: OK|BAD <error class> after S s: <message>
// (OK: a distribute::Error of the expected class naming the leaver, within
// kLimitSeconds of the step that could not complete), and in `sequence` mode
// every worker prints OK once its steps are done.
#include <distribute/distribute.h>
#include <distribute/mpi.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "testing/hang_watchdog.h"

using namespace distribute;
using Clock = std::chrono::steady_clock;

namespace {

// "About a second": the notice arrives within microseconds; the rest is
// slack for 2 oversubscribed cores.
constexpr double kLimitSeconds = 2.0;

void print_result(int rank, bool ok, const std::string& kind, double seconds, const std::string& message) {
  std::printf("RESULT rank %d: %s %s after %.2f s: %s\n", rank, ok ? "OK" : "BAD", kind.c_str(), seconds,
              message.c_str());
  std::fflush(stdout);
}

void step(Strategy& s) {
  s.run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(1.f)); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: mpirun -np N worker_leaves_test MODE LOCAL_REPLICAS\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int local = std::atoi(argv[2]);
  std::thread watchdog([mode] {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    distribute::testing::dump_every_thread_and_exit("worker_leaves_test " + mode + ": still running after 30 s");
  });
  watchdog.detach();
  std::shared_ptr<Communicator> link = mpi::cluster_from_launcher();
  if (link == nullptr) {
    std::fprintf(stderr, "worker_leaves_test: run me under mpirun\n");
    return 2;
  }
  auto strategy = std::make_unique<MultiWorkerMirroredStrategy>(local, link, CommunicationOptions{});
  const int rank = strategy->worker_rank();
  const int leaver = strategy->num_workers() - 1;
  const std::string named = "worker " + std::to_string(leaver);
  step(*strategy);

  if (mode == "sequence" || mode == "renew") {
    if (mode == "sequence") strategy.reset();
    strategy = std::make_unique<MultiWorkerMirroredStrategy>(local, link, CommunicationOptions{});
    const auto start = Clock::now();
    try {
      for (int i = 0; i < 3; ++i) step(*strategy);
      print_result(rank, true, "-", std::chrono::duration<double>(Clock::now() - start).count(), "steps done");
    } catch (const std::exception& e) {
      print_result(rank, false, "exception", 0, e.what());
    }
    return 0;
  }

  if (rank == leaver) {
    if (mode == "return") return 0;  // (fewer steps than the others: different epoch counts, say)
    if (mode == "exit") std::exit(0);
    if (mode == "exit_in_call") {
      // Its leader waits in MPI for the others (late by 300 ms) when the
      // process ends: that call is given up, not made.
      std::thread in_call([&] {
        try {
          step(*strategy);
        } catch (const std::exception&) {
        }
      });
      in_call.detach();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::exit(0);
    }
    if (mode == "finalize") {
      MPI_Finalize();
      return 0;
    }
    if (mode == "exit_in_replica") {
      strategy->run([](ReplicaContext& ctx) {
        if (ctx.local_replica_id() == 0) std::exit(0);
        return ctx.all_reduce(ReduceOp::kSum, constant(1.f));
      });
      return 0;
    }
    if (mode == "destroy") {
      strategy.reset();
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return 0;
    }
    // second, replace: this worker raises an error too.
    const auto start = Clock::now();
    try {
      if (mode == "replace") strategy.reset();
      MultiWorkerMirroredStrategy another(local, link, CommunicationOptions{});
      print_result(rank, false, "-", 0, "a strategy was made while the others were in a collective");
    } catch (const Error& e) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      print_result(rank, e.code() == ErrorCode::kFailedPrecondition && seconds < kLimitSeconds,
                   std::string(to_string(e.code())), seconds, e.message());
    } catch (const std::exception& e) {
      print_result(rank, false, "exception", 0, e.what());
    }
    return 0;
  }

  // The others go on; the step the leaver never joins must fail, naming it.
  if (mode == "second" || mode == "replace" || mode == "exit_in_call") {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  Clock::time_point start = Clock::now();
  try {
    for (int i = 0; i < 3; ++i) {
      start = Clock::now();
      step(*strategy);
    }
    print_result(rank, false, "-", 0, "every step completed without the leaver");
  } catch (const Error& e) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    // The worker that made a new strategy while its first was alive
    // (`second`) is still in this group: the error is the collective
    // mismatch, naming the calls. One that destroyed its first (`replace`)
    // is named as gone, unless its new strategy's meeting was seen first.
    const bool names_leaver = e.message().find(named + " has") != std::string::npos;
    const bool names_meeting = e.message().find("MultiWorkerMirroredStrategy() #0") != std::string::npos;
    const bool named_right = mode == "second"    ? names_meeting
                             : mode == "replace" ? names_leaver || names_meeting
                                                 : names_leaver;
    const bool ok = e.code() == ErrorCode::kFailedPrecondition && seconds < kLimitSeconds && named_right;
    print_result(rank, ok, std::string(to_string(e.code())), seconds, e.message());
  } catch (const std::exception& e) {
    print_result(rank, false, "exception", 0, e.what());
  }
  return 0;  // then MPI_Finalize at exit: the job must end
}
