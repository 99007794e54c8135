// The multi-worker mode: under an MPI launcher, MultiWorkerMirroredStrategy
// (the API or its engine) beside MPI's own collective on the same buffers.
#pragma once

#include "options.h"

namespace distribute::bench {

#ifdef DISTRIBUTE_HAVE_MPI
// One worker per process with --replicas local replicas; a row per message
// size on worker 0. Returns the exit status (1 if --check found wrong elements).
int run_multi_worker(const Options& o);
#endif

}  // namespace distribute::bench
