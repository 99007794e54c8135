// Randomized faults that close the workers' link (docs/errors.md §6.1), one
// case per mpirun: `link_faults_test SEED LOCAL_REPLICAS`, run by
// tests/mpi/link_faults.sh under `mpirun --enable-recovery`.
//
// Every worker draws the same plan from SEED: a few runs of random
// collectives (all_reduce, ragged all_gather, merge_call + reduce_to, random
// sizes), then, at a random collective of a random run, one replica of one
// worker
//   - throws (its worker raises that exception, every other worker
//     AbortedError naming it),
//   - returns early, skipping collectives the other replicas of its worker
//     joined (its worker FailedPreconditionError, the others AbortedError), or
//   - kills its process with SIGKILL (the survivors UnavailableError, or
//     AbortedError from a survivor that saw it first, at once: its process
//     is watched; DeadlineExceededError within the timeout otherwise), or
//   - leaves normally: its whole worker stops the run there (as a worker
//     with fewer steps does), destroys its strategy and exits, finalising
//     MPI (the survivors FailedPreconditionError naming it, at once, with
//     no timeout set).
// Then every surviving worker checks that the link stays closed (the next run
// raises an error at once), and that the strategy is destroyed, its threads
// joined, within seconds. Each survivor prints one line:
//   CASE <seed> rank <r>: PASS|FAIL <what happened>
#include <distribute/distribute.h>
#include <distribute/mpi.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "testing/hang_watchdog.h"

using namespace distribute;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kTimeoutSeconds = 3;
constexpr double kSlackSeconds = 10;  // oversubscribed cores, MPI start-up

struct InjectedFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Fault { kThrow, kSkipRest, kDie, kLeave };
constexpr const char* kFaultNames[] = {"throws", "returns early", "is killed", "leaves"};

enum class Kind { kAllReduce, kAllGather, kMergeReduceTo };

struct Plan {
  std::vector<std::vector<Kind>> runs;  // collectives of each run; the fault is in the last run
  std::vector<std::vector<std::int64_t>> sizes;
  int fault_collective = 0;
  int faulty_replica = 0;  // global id
  Fault fault = Fault::kThrow;
};

Plan make_plan(std::uint64_t seed, int replicas, int local) {
  std::mt19937_64 gen(seed);
  Plan p;
  const int runs = 1 + static_cast<int>(gen() % 4);
  for (int r = 0; r < runs; ++r) {
    const int count = 1 + static_cast<int>(gen() % 4);
    std::vector<Kind> kinds;
    std::vector<std::int64_t> sizes;
    for (int c = 0; c < count; ++c) {
      kinds.push_back(static_cast<Kind>(gen() % 3));
      sizes.push_back(static_cast<std::int64_t>(1) << (gen() % 17));  // 1 to 64 Ki elements
    }
    p.runs.push_back(kinds);
    p.sizes.push_back(sizes);
  }
  p.fault_collective = static_cast<int>(gen() % p.runs.back().size());
  p.faulty_replica = static_cast<int>(gen() % static_cast<std::uint64_t>(replicas));
  // Every kind in turn as the seeds go; returning early is only a fault the
  // worker can see when another local replica is left waiting.
  p.fault = static_cast<Fault>(seed % 4);
  if (p.fault == Fault::kSkipRest && local < 2) p.fault = Fault::kThrow;
  return p;
}

Tensor collective(ReplicaContext& ctx, Kind kind, std::int64_t size) {
  const int g = ctx.replica_id_in_sync_group();
  switch (kind) {
    case Kind::kAllReduce: return ctx.all_reduce(ReduceOp::kSum, fill(DType::kFloat32, Shape{size}, g));
    case Kind::kAllGather: return ctx.all_gather(fill(DType::kInt32, Shape{1 + g % 3, size}, g), 0);
    case Kind::kMergeReduceTo:
      return ctx.merge_call(
          [](Strategy& s, const PerReplica<Tensor>& v) { return s.extended().reduce_to(ReduceOp::kMean, v, v); },
          fill(DType::kFloat64, Shape{size}, g));
  }
  return {};
}

std::string describe(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) {
    return std::string(to_string(error->code())) + ": " + error->message();
  }
  return std::string("exception: ") + e.what();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: mpirun --enable-recovery -np N link_faults_test SEED LOCAL_REPLICAS\n");
    return 2;
  }
  const std::uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const int local = std::atoi(argv[2]);
  std::shared_ptr<Communicator> link = mpi::cluster_from_launcher();
  if (link == nullptr) {
    std::fprintf(stderr, "link_faults_test: run me under mpirun\n");
    return 2;
  }
  const Plan plan = make_plan(seed, link->size() * local, local);
  // A worker that leaves is found without a timeout.
  CommunicationOptions options;
  if (plan.fault != Fault::kLeave) options.timeout = std::chrono::duration<double>(kTimeoutSeconds);
  // The whole case has a minute; a hang past it prints every thread's stack.
  std::thread case_watchdog([seed] {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    distribute::testing::dump_every_thread_and_exit("link_faults_test: case " + std::to_string(seed) +
                                                    " is still running after 60 s");
  });
  case_watchdog.detach();
  auto strategy = std::make_unique<MultiWorkerMirroredStrategy>(local, link, options);
  const int rank = strategy->worker_rank();
  const int faulty_worker = plan.faulty_replica / local;
  const auto report = [&](bool pass, const std::string& what) {
    std::printf("CASE %llu rank %d: %s %s\n", static_cast<unsigned long long>(seed), rank, pass ? "PASS" : "FAIL",
                what.c_str());
    std::fflush(stdout);
  };
  const std::string where = "replica " + std::to_string(plan.faulty_replica) + " (worker " +
                            std::to_string(faulty_worker) + ") " + kFaultNames[static_cast<int>(plan.fault)] +
                            " at collective " + std::to_string(plan.fault_collective) + " of run " +
                            std::to_string(plan.runs.size() - 1);

  // The runs before the fault must simply work.
  for (std::size_t r = 0; r + 1 < plan.runs.size(); ++r) {
    try {
      strategy->run([&](ReplicaContext& ctx) {
        for (std::size_t c = 0; c < plan.runs[r].size(); ++c) collective(ctx, plan.runs[r][c], plan.sizes[r][c]);
      });
    } catch (const std::exception& e) {
      report(false, "run " + std::to_string(r) + " failed before any fault: " + describe(e));
      _exit(0);
    }
  }

  const auto start = Clock::now();
  std::string first_error;
  bool right_error = false;
  try {
    const bool leaving = plan.fault == Fault::kLeave && rank == faulty_worker;
    strategy->run([&](ReplicaContext& ctx) {
      const auto& kinds = plan.runs.back();
      for (std::size_t c = 0; c < kinds.size(); ++c) {
        if (leaving && static_cast<int>(c) == plan.fault_collective) return;  // the whole worker stops here
        if (ctx.replica_id_in_sync_group() == plan.faulty_replica && static_cast<int>(c) == plan.fault_collective) {
          if (plan.fault == Fault::kThrow) throw InjectedFault("replica failed on purpose");
          if (plan.fault == Fault::kSkipRest) return;
          std::raise(SIGKILL);
        }
        collective(ctx, kinds[c], plan.sizes.back()[c]);
      }
    });
    if (leaving) {
      // Out of the run without an error (its replicas agree); the worker
      // leaves for good: strategy and link destroyed, MPI finalised at exit.
      report(true, where + ": left");
      strategy.reset();
      link.reset();
      std::exit(0);
    }
    report(false, where + ": the run ended without an error");
    _exit(0);
  } catch (const InjectedFault& e) {
    first_error = describe(e);
    right_error = plan.fault == Fault::kThrow && rank == faulty_worker;
  } catch (const Error& e) {
    first_error = describe(e);
    if (plan.fault == Fault::kDie) {
      right_error = e.code() == ErrorCode::kDeadlineExceeded || e.code() == ErrorCode::kUnavailable ||
                    e.code() == ErrorCode::kAborted;
    } else if (plan.fault == Fault::kLeave) {
      right_error = e.code() == ErrorCode::kFailedPrecondition &&
                    e.message().find("worker " + std::to_string(faulty_worker) + " has") != std::string::npos;
    } else if (rank == faulty_worker) {
      right_error = plan.fault == Fault::kSkipRest && e.code() == ErrorCode::kFailedPrecondition;
    } else {
      right_error = e.code() == ErrorCode::kAborted &&
                    e.message().find("Worker " + std::to_string(faulty_worker) + " failed") != std::string::npos;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // A throw, an early return or a departure is reported to the other
  // workers at once; a death is seen on this host at once too (elsewhere
  // the timeout finds it).
  const double limit = plan.fault == Fault::kDie     ? kTimeoutSeconds + kSlackSeconds
                       : plan.fault == Fault::kLeave ? 2.0
                                                     : kSlackSeconds;
  char timing[64];
  std::snprintf(timing, sizeof timing, " after %.2f s", seconds);
  if (!right_error || seconds > limit) {
    report(false, where + ": " + first_error + timing);
    _exit(0);
  }

  // Closed: the next run fails at once, on every survivor.
  const auto again_start = Clock::now();
  std::string again;
  try {
    strategy->run([&](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::kSum, constant(1.f)); });
  } catch (const std::exception& e) {
    again = describe(e);
  }
  const double again_seconds = std::chrono::duration<double>(Clock::now() - again_start).count();
  if (again.empty() || again_seconds > 3.0) {
    report(false, where + ": after " + first_error + ", the next run " +
                      (again.empty() ? std::string("succeeded") : "took " + std::to_string(again_seconds) + " s"));
    _exit(0);
  }

  // Nothing left running: the strategy's threads join promptly.
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    report(false, where + ": destroying the strategy hung");
    distribute::testing::dump_every_thread_and_exit("link_faults_test: destroying the strategy");
  });
  watchdog.detach();
  strategy.reset();
  report(true, where + ": " + first_error + timing + "; next run: " + again);
  _exit(0);  // MPI_Finalize could wait for a dead process or a request MPI cannot cancel
}
