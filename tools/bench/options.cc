// distribute-bench's command line: the usage message, the flags parsed
// into Options and checked against each other and this machine's memory.
#include "options.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "distribute/errors.h"
#include "flags.h"
#include "output.h"

namespace distribute::bench {

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(
      stderr,
      "distribute-bench: %s\n"
      "usage: distribute-bench [--op all_reduce|all_gather|broadcast|reduce_scatter] [--replicas N]\n"
      "                        [--dtype float32|...]\n"
      "                        [--redop sum|mean|min|max|product] [-b MIN] [-e MAX] [-f FACTOR]\n"
      "                        [--iters N] [--warmup N] [--check] [--api raw|tensor|both] [--csv FILE]\n"
      "                        [--interleave-memcpy] [--shared-output] [--merge-call] [--in-place]\n"
      "                        [--batch K]  (all_reduce of K tensors of -b bytes: one packed call vs K calls)\n"
      "--api both: the engine and the API alternately in one run, with the API's overhead\n"
      "--interleave-memcpy: the memcpy reference measured alternately with the op, not after it\n"
      "--shared-output: the engine's all_reduce, all_gather or broadcast as the API's (all_reduce_shared,\n"
      "                 all_gather_v_shared, broadcast_shared): one output for every replica where they\n"
      "                 share it (all_reduce above 64 KiB, all_gather above 4 KiB of contribution,\n"
      "                 broadcast above 4 KiB), not into each replica's own buffer\n"
      "--merge-call: the API's broadcast as TensorFlow does it (merge_call and extended().broadcast_to),\n"
      "              not ReplicaContext::broadcast\n"
      "--in-place: the engine's broadcast in place, as MPI_Bcast: the root's buffer is its output and the\n"
      "            root's bytes are copied into the others' only; by default out of place, as ncclBroadcast\n"
      "            and the API: from the root's input into every replica's output, the root's too\n"
      "sizes take K, M, G suffixes (powers of 1024); reduce_scatter is measured on the engine only\n"
      "(--api raw): TensorFlow's ReplicaContext has no reduce_scatter\n",
      error.c_str());
  std::exit(2);
}

namespace {

// The most replicas (threads) a run may ask for, and the most message sizes a sweep may have.
constexpr int kMaxReplicas = 4096;
constexpr std::size_t kMaxSizes = 1000;

}  // namespace

// The message sizes of the sweep from -b to -e by -f (each at least one byte more than the last).
std::size_t next_size(std::size_t bytes, double factor) {
  const double grown = static_cast<double>(bytes) * factor;
  return grown >= 0x1p63 ? std::numeric_limits<std::size_t>::max()
                         : std::max(bytes + 1, static_cast<std::size_t>(grown));
}

namespace {

// How many sizes that sweep makes from -b to -e (counted up to kMaxSizes + 1).
std::size_t sweep_sizes(std::size_t min_bytes, std::size_t max_bytes, double factor) {
  std::size_t n = 0;
  for (std::size_t b = min_bytes; b <= max_bytes && n <= kMaxSizes; b = next_size(b, factor)) {
    ++n;
    if (b == std::numeric_limits<std::size_t>::max()) break;
  }
  return n;
}

// Flag values, range-checked before they are narrowed (tools/common/flags.h).
template <class Parse>
auto flag_value(Parse&& parse) {
  try {
    return parse();
  } catch (const tools::UsageError& e) {
    usage(e.what());
  }
}

DType parse_dtype(const std::string& name) {
  for (DType d : kAllDTypes) {
    if (to_string(d) == name) return d;
  }
  usage("unknown dtype '" + name + "'");
}

// The flags as given, each parsed and range-checked on its own.
Options parse_flags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--op")
      o.op = value();
    else if (a == "--replicas" || a == "-t")
      o.replicas = flag_value([&] { return tools::parse_int32(a, value(), 1, kMaxReplicas); });
    else if (a == "--dtype" || a == "-d")
      o.dtype = parse_dtype(value());
    else if (a == "--redop" || a == "-o") {
      try {
        o.redop = reduce_op_from_string(value());
      } catch (const Error& e) {
        usage(e.message());
      }
    } else if (a == "-b" || a == "--minbytes")
      o.min_bytes = flag_value([&] { return tools::parse_bytes(a, value()); });
    else if (a == "-e" || a == "--maxbytes")
      o.max_bytes = flag_value([&] { return tools::parse_bytes(a, value()); });
    else if (a == "-f" || a == "--stepfactor")
      o.factor = flag_value([&] { return tools::parse_positive(a, value()); });
    else if (a == "--iters" || a == "-n")
      o.iters = flag_value([&] { return tools::parse_int32(a, value(), 1); });
    else if (a == "--warmup" || a == "-w")
      o.warmup = flag_value([&] { return tools::parse_int32(a, value(), 0); });
    else if (a == "--check" || a == "-c")
      o.check = true;
    else if (a == "--interleave-memcpy")
      o.interleave_memcpy = true;
    else if (a == "--shared-output")
      o.shared_output = true;
    else if (a == "--merge-call")
      o.merge_call = true;
    else if (a == "--in-place")
      o.in_place = true;
    else if (a == "--api")
      o.api = value();
    else if (a == "--csv")
      o.csv = value();
    else if (a == "--batch")
      o.batch = flag_value([&] { return tools::parse_int32(a, value(), 0, 1 << 20); });
    else
      usage("unknown flag '" + a + "'");
  }
  return o;
}

// Flags that do not go together.
void check_combinations(const Options& o) {
  if (o.op != "all_reduce" && o.op != "all_gather" && o.op != "broadcast" && o.op != "reduce_scatter") {
    usage("unknown --op '" + o.op + "'");
  }
  if (o.op == "reduce_scatter" && o.api != "raw") {
    usage("--op reduce_scatter is measured with --api raw only (ReplicaContext has no reduce_scatter)");
  }
  if (o.api != "raw" && o.api != "tensor" && o.api != "both") usage("--api must be raw, tensor or both");
  if (o.shared_output && o.op == "reduce_scatter")
    usage("--shared-output is for --op all_reduce, all_gather and broadcast");
  if (o.merge_call && (o.op != "broadcast" || o.api == "raw"))
    usage("--merge-call is for --op broadcast with --api tensor or both");
  if (o.interleave_memcpy && o.api != "raw") usage("--interleave-memcpy is for --api raw");
  if (o.in_place && (o.op != "broadcast" || o.shared_output || o.api == "tensor")) {
    usage("--in-place is for the engine's --op broadcast into its own buffers (--api raw or both, no --shared-output)");
  }
}

// The sweep's sizes: -f, -b against -e, the largest message against this machine's memory, and
// the number of sizes.
void check_sizes(const Options& o) {
  if (o.factor <= 1) usage("-f must be > 1, got " + std::to_string(o.factor));
  if (o.min_bytes > o.max_bytes) {
    usage("-b (" + tools::grouped(static_cast<std::int64_t>(o.min_bytes)) + " bytes) must be <= -e (" +
          tools::grouped(static_cast<std::int64_t>(o.max_bytes)) + " bytes)");
  }
  // The largest message's buffers (each replica's input and output) must fit
  // in memory: a replica thread whose allocation fails cannot stop the others.
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const double needed = 2.0 * static_cast<double>(o.max_bytes) * o.replicas;
  if (memory > 0 && needed > memory) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "%.3g GiB for its input and output on %d replicas, more than this machine's %.3g GiB",
                  needed / (1u << 30), o.replicas, memory / (1u << 30));
    usage("-e " + tools::grouped(static_cast<std::int64_t>(o.max_bytes)) + " bytes needs at least " + text +
          " of memory");
  }
  if (sweep_sizes(o.min_bytes, o.max_bytes, o.factor) > kMaxSizes) {
    usage("-f " + std::to_string(o.factor) + " from -b " + tools::grouped(static_cast<std::int64_t>(o.min_bytes)) +
          " to -e " + tools::grouped(static_cast<std::int64_t>(o.max_bytes)) + " bytes makes more than " +
          std::to_string(kMaxSizes) + " message sizes; use a larger -f");
  }
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o = parse_flags(argc, argv);
  check_combinations(o);
  flag_value([&] {
    tools::check_writable("--csv", o.csv);  // before the sweep, not after it
    return 0;
  });
  check_sizes(o);
  return o;
}

}  // namespace distribute::bench
