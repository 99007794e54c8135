// distribute-bench's flags: Options, the command line parsed and checked
// into them, usage (the message and exit 2 for a bad command line), and the
// steps of the sweep of message sizes.
#pragma once

#include <cstddef>
#include <string>

#include "comm/backend.h"
#include "distribute/dtype.h"
#include "distribute/reduce_op.h"

namespace distribute::bench {

struct Options {
  // Where the raw engine's all_reduce streams: the setting, read once by main.
  std::size_t stream_bytes = internal::kNeverStream;
  std::string op = "all_reduce";
  int replicas = 2;
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 64 << 20;
  double factor = 4;
  int iters = 20;
  int warmup = 5;
  bool check = false;
  bool interleave_memcpy = false;  // the memcpy reference alternating with the op (raw engine)
  bool shared_output = false;      // raw all_reduce/all_gather/broadcast: into one output for every replica, as the API
  bool merge_call = false;         // API broadcast through merge_call and broadcast_to, not ReplicaContext::broadcast
  bool in_place = false;           // raw broadcast: the root's buffer is its output (MPI_Bcast's form)
  std::string api = "raw";
  std::string csv;
  int batch = 0;  // > 0: compare one all_reduce of `batch` tensors with `batch` separate calls
};

// Prints `error` and the usage to stderr and exits with status 2.
[[noreturn]] void usage(const std::string& error);

// The next message size of the sweep from -b to -e by -f (at least one byte more than `bytes`).
std::size_t next_size(std::size_t bytes, double factor);

// The flags of the command line, checked; a bad one ends in usage().
Options parse(int argc, char** argv);

}  // namespace distribute::bench
