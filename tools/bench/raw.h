// The raw engine (--api raw, and the engine's half of --api both): the
// in-process backend's members called directly on their own buffers.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/backend.h"
#include "distribute/communicator.h"
#include "distribute/tensor.h"
#include "measure.h"
#include "options.h"

namespace distribute::bench {

// The raw engine's group of `replicas` threads of this process (the
// in-process backend, from the seam the strategies use).
internal::ReplicaGroup raw_group(const Options& o);

// One member of the raw engine: a member of raw_group on its own buffers,
// the output reused from call to call (--shared-output: the engine's shared
// output, let go before each call as the API's).
struct RawOp {
  const Options& o;
  Communicator& comm;
  std::size_t count;
  Tensor in, out;
  std::shared_ptr<std::byte> shared_out;
  std::vector<std::size_t> counts;
  CollectiveCall call{.op = "", .sequence = 0, .timeout_seconds = 600};

  RawOp(const Options& opts, internal::ReplicaGroup& group, int r, std::size_t n_elements);

  // Runs the operation once; returns its time in microseconds.
  double run_once();

  // The last call's result.
  Tensor result() const;
};

// Runs the collective `iters + warmup` times on `n` replicas; returns replica 0's
// timings in microseconds and the last results.
// `memcpy_times` (--interleave-memcpy): replica 0's memcpy of the op's bytes,
// made by every replica at once right after each op.
std::vector<double> run_raw(const Options& o, std::size_t count, std::vector<Tensor>& results, FaultMeter& faults,
                            std::vector<double>& memcpy_times);

}  // namespace distribute::bench
