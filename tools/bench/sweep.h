// The benchmark's entry: the one-process sweep of message sizes (--api raw,
// tensor or both), its table and CSV; --batch and mpirun go to their own modes.
#pragma once

#include "options.h"

namespace distribute::bench {

// Runs the benchmark `o` asks for and prints its table; returns the exit
// status (1 if --check found wrong elements).
int run_benchmark(const Options& o);

}  // namespace distribute::bench
