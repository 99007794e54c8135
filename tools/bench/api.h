// The API modes: --api tensor and both (ReplicaContext with Tensors, the
// engine alternating with it under both) and --batch (one packed all_reduce vs K calls).
#pragma once

#include <cstddef>
#include <vector>

#include "distribute/mirrored_strategy.h"
#include "distribute/tensor.h"
#include "measure.h"
#include "options.h"

namespace distribute::bench {

// Through the API; with --api both, the raw engine too, on its own buffers and
// a group of its own, alternating with the API call iteration by iteration
// (so that both see the same moments of a noisy machine). Returns replica 0's
// API timings; `raw_times` gets the engine's.
std::vector<double> run_tensor(const Options& o, MirroredStrategy& strategy, std::size_t count,
                               std::vector<Tensor>& results, FaultMeter& faults, std::vector<double>& raw_times);

// One all_reduce of a list of K tensors (packed by dtype into one collective)
// against K separate all_reduce calls, through the API, on the same replicas.
int run_batch(const Options& o);

}  // namespace distribute::bench
