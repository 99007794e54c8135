// What the benchmarks that run alone or under mpirun share: the strategy
// they measure and how they give up.
#pragma once

#include <distribute/distribute.h>
#ifdef DIST_BENCH_HAVE_MPI
#include <distribute/mpi.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace distribute::bench {

// Prints "<program>: <what>" and exits with status 1.
[[noreturn]] inline void die(const char* program, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program, what.c_str());
  std::exit(1);
}

// Under an MPI launcher, a MultiWorkerMirroredStrategy of `replicas` per
// worker (one worker per process); else a MirroredStrategy of `replicas`.
inline std::unique_ptr<Strategy> make_bench_strategy(int replicas) {
  std::vector<std::string> devices;
  for (int r = 0; r < replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
#ifdef DIST_BENCH_HAVE_MPI
  if (mpi::started_by_launcher()) {
    return std::make_unique<MultiWorkerMirroredStrategy>(devices, mpi::cluster_from_launcher());
  }
#endif
  return std::make_unique<MirroredStrategy>(devices);
}

}  // namespace distribute::bench
