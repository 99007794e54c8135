// What every mode measures with: the clock, the page faults of the timed
// iterations, the median of the timings and nccl-tests' bus bandwidth factor.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace distribute::bench {

using Clock = std::chrono::steady_clock;

// Minor page faults of the whole process so far.
long minor_faults();

// Page faults of the whole process during the timed iterations, per operation.
struct FaultMeter {
  long start = 0;
  double per_op = 0;
  void begin() { start = minor_faults(); }
  void end(int ops) { per_op = static_cast<double>(minor_faults() - start) / ops; }
};

// The median of `v` (the upper one of an even count).
double median(std::vector<double> v);

// nccl-tests' factor from algorithm bandwidth to bus bandwidth of `op` on `n` replicas.
double bus_factor(const std::string& op, int n);

}  // namespace distribute::bench
