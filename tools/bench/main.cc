// distribute-bench: collective performance on one host, in the manner of
// nccl-tests. One row per message size: time (median and min over the timed
// iterations, measured on replica 0), algorithm and bus bandwidth (nccl-tests
// factors, 1 GB = 1e9 bytes), wrong elements when --check is on, minor page
// faults per operation, and the memcpy reference (R threads each copying the
// same number of bytes at once) with our bus bandwidth as a fraction of it.
//
//   distribute-bench --op all_reduce --replicas 2 -b 8 -e 64M -f 4 --check
//
// --api tensor measures ReplicaContext with Tensors instead of the engine
// (broadcast: ReplicaContext::broadcast; with --merge-call, TensorFlow's
// merge_call and extended().broadcast_to); --api both runs the two
// alternately, iteration by iteration, and prints the API's overhead over
// the engine measured at the same moments. The engine's broadcast is
// measured out of place (ncclBroadcast's form, and the API's: the root's
// result is not its value); --in-place measures MPI_Bcast's.
//
// Under an MPI launcher it measures MultiWorkerMirroredStrategy instead: one
// worker per process with --replicas local replicas, and beside each of our
// figures the same operation by MPI itself (MPI_Allreduce / MPI_Allgatherv on
// MPI_COMM_WORLD) on the same buffers, alternating iteration by iteration.
//
//   mpirun -np 2 distribute-bench --op all_reduce --replicas 1 -b 8 -e 64M -f 4 --check
//
// This file holds main(); the flags are in options.cc, the one-process sweep
// in sweep.cc, the modes in raw.cc, api.cc and multi_worker.cc, and what they
// share in check.cc (inputs, --check) and measure.cc (faults, median, bus factor).
#include <cstdio>
#include <exception>
#include <new>

#include "comm/backend.h"
#include "distribute/errors.h"
#include "options.h"
#include "sweep.h"

using namespace distribute;
using namespace distribute::bench;

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  try {
    // Read here, where a bad setting can be reported (the raw engine's
    // members are made on their own threads).
    o.stream_bytes = internal::default_all_reduce_stream_bytes();
    return run_benchmark(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "distribute-bench: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "distribute-bench: out of memory (use a smaller -e or fewer --replicas)\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distribute-bench: %s\n", e.what());
    return 2;
  }
}
