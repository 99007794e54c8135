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
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agree.h"
#include "comm/backend.h"
#include "distribute/distribute.h"
#include "flags.h"
#include "output.h"

#ifdef DISTRIBUTE_HAVE_MPI
#include <distribute/mpi.h>
#endif

using namespace distribute;
using Clock = std::chrono::steady_clock;

namespace {

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

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
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

// The most replicas (threads) a run may ask for, and the most message sizes a sweep may have.
constexpr int kMaxReplicas = 4096;
constexpr std::size_t kMaxSizes = 1000;

// The message sizes of the sweep from -b to -e by -f (each at least one byte more than the last).
std::size_t next_size(std::size_t bytes, double factor) {
  const double grown = static_cast<double>(bytes) * factor;
  return grown >= 0x1p63 ? std::numeric_limits<std::size_t>::max()
                         : std::max(bytes + 1, static_cast<std::size_t>(grown));
}
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

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--op") o.op = value();
    else if (a == "--replicas" || a == "-t") o.replicas = flag_value([&] { return tools::parse_int32(a, value(), 1, kMaxReplicas); });
    else if (a == "--dtype" || a == "-d") o.dtype = parse_dtype(value());
    else if (a == "--redop" || a == "-o") {
      try {
        o.redop = reduce_op_from_string(value());
      } catch (const Error& e) {
        usage(e.message());
      }
    } else if (a == "-b" || a == "--minbytes") o.min_bytes = flag_value([&] { return tools::parse_bytes(a, value()); });
    else if (a == "-e" || a == "--maxbytes") o.max_bytes = flag_value([&] { return tools::parse_bytes(a, value()); });
    else if (a == "-f" || a == "--stepfactor") o.factor = flag_value([&] { return tools::parse_positive(a, value()); });
    else if (a == "--iters" || a == "-n") o.iters = flag_value([&] { return tools::parse_int32(a, value(), 1); });
    else if (a == "--warmup" || a == "-w") o.warmup = flag_value([&] { return tools::parse_int32(a, value(), 0); });
    else if (a == "--check" || a == "-c") o.check = true;
    else if (a == "--interleave-memcpy") o.interleave_memcpy = true;
    else if (a == "--shared-output") o.shared_output = true;
    else if (a == "--merge-call") o.merge_call = true;
    else if (a == "--in-place") o.in_place = true;
    else if (a == "--api") o.api = value();
    else if (a == "--csv") o.csv = value();
    else if (a == "--batch") o.batch = flag_value([&] { return tools::parse_int32(a, value(), 0, 1 << 20); });
    else usage("unknown flag '" + a + "'");
  }
  if (o.op != "all_reduce" && o.op != "all_gather" && o.op != "broadcast" && o.op != "reduce_scatter") {
    usage("unknown --op '" + o.op + "'");
  }
  if (o.op == "reduce_scatter" && o.api != "raw") {
    usage("--op reduce_scatter is measured with --api raw only (ReplicaContext has no reduce_scatter)");
  }
  if (o.api != "raw" && o.api != "tensor" && o.api != "both") usage("--api must be raw, tensor or both");
  if (o.shared_output && o.op == "reduce_scatter") usage("--shared-output is for --op all_reduce, all_gather and broadcast");
  if (o.merge_call && (o.op != "broadcast" || o.api == "raw")) usage("--merge-call is for --op broadcast with --api tensor or both");
  if (o.interleave_memcpy && o.api != "raw") usage("--interleave-memcpy is for --api raw");
  if (o.in_place && (o.op != "broadcast" || o.shared_output || o.api == "tensor")) {
    usage("--in-place is for the engine's --op broadcast into its own buffers (--api raw or both, no --shared-output)");
  }
  flag_value([&] {
    tools::check_writable("--csv", o.csv);  // before the sweep, not after it
    return 0;
  });
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
    std::snprintf(text, sizeof text, "%.3g GiB for its input and output on %d replicas, more than this machine's %.3g GiB",
                  needed / (1u << 30), o.replicas, memory / (1u << 30));
    usage("-e " + tools::grouped(static_cast<std::int64_t>(o.max_bytes)) + " bytes needs at least " + text +
          " of memory");
  }
  if (sweep_sizes(o.min_bytes, o.max_bytes, o.factor) > kMaxSizes) {
    usage("-f " + std::to_string(o.factor) + " from -b " + tools::grouped(static_cast<std::int64_t>(o.min_bytes)) +
          " to -e " + tools::grouped(static_cast<std::int64_t>(o.max_bytes)) + " bytes makes more than " +
          std::to_string(kMaxSizes) + " message sizes; use a larger -f");
  }
  return o;
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Input of replica r, element i: small integers, exact in every dtype.
double input_value(int r, std::size_t i) { return static_cast<double>((i % 5) + static_cast<std::size_t>(r)); }

Tensor make_input(DType dtype, int r, std::size_t count) {
  Tensor t = Tensor::uninitialized(dtype, Shape{static_cast<std::int64_t>(count)});
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.mutable_raw_data());
    for (std::size_t i = 0; i < count; ++i) {
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        p[i] = T(static_cast<float>(input_value(r, i)));
      } else {
        p[i] = static_cast<T>(input_value(r, i));
      }
    }
  });
  return t;
}

// Element i of the reduction over n replicas, by a plain loop in double,
// rounded to the dtype.
double reduced_value(const Options& o, std::size_t i, int n) {
  double acc = input_value(0, i);
  for (int q = 1; q < n; ++q) {
    const double x = input_value(q, i);
    if (o.redop == ReduceOp::kSum || o.redop == ReduceOp::kMean) acc += x;
    if (o.redop == ReduceOp::kProduct) acc *= x;
    if (o.redop == ReduceOp::kMin) acc = std::min(acc, x);
    if (o.redop == ReduceOp::kMax) acc = std::max(acc, x);
  }
  if (o.redop == ReduceOp::kMean) acc = is_floating(o.dtype) ? acc / n : std::trunc(acc / n);
  return o.dtype == DType::kBool ? (acc != 0) : scalar(o.dtype, acc).element_as_double(0);
}

// Elements of `out` (of replica `r`) that differ from the expected result
// (`count`: the elements of the operation; reduce_scatter gives each replica
// its count / n).
std::size_t count_wrong(const Options& o, const Tensor& out, std::size_t count, int n, int r) {
  std::size_t wrong = 0;
  if (o.op == "reduce_scatter") {
    const std::size_t per = count / static_cast<std::size_t>(n);
    for (std::size_t j = 0; j < per; ++j) {
      if (out.element_as_double(static_cast<std::int64_t>(j)) !=
          reduced_value(o, static_cast<std::size_t>(r) * per + j, n)) {
        ++wrong;
      }
    }
    return wrong;
  }
  for (std::size_t i = 0; i < count; ++i) {
    double want = 0;
    if (o.op == "all_reduce") {
      want = reduced_value(o, i, n);
    } else if (o.op == "all_gather") {
      const std::size_t per = count / static_cast<std::size_t>(n);
      want = scalar(o.dtype, input_value(static_cast<int>(i / per), i % per)).element_as_double(0);
    } else {
      want = scalar(o.dtype, input_value(0, i)).element_as_double(0);
    }
    if (out.element_as_double(static_cast<std::int64_t>(i)) != want) ++wrong;
  }
  return wrong;
}

struct Row {
  std::size_t bytes = 0, count = 0;
  double median_us = 0, min_us = 0, algbw = 0, busbw = 0, memcpy_bw = 0;
  double raw_median_us = 0;  // --api both: the raw engine's, alternating with the API's
  std::size_t wrong = 0;
  double faults_per_op = 0;
};

double bus_factor(const std::string& op, int n) {
  if (n == 1) return op == "broadcast" ? 1 : 0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1;
}

// R threads each copying `bytes` between their own buffers at once; GB/s of one thread.
double memcpy_reference(int replicas, std::size_t bytes, int iters) {
  if (bytes == 0) return 0;
  std::vector<std::vector<std::byte>> src(static_cast<std::size_t>(replicas)), dst(static_cast<std::size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    src[static_cast<std::size_t>(r)].assign(bytes, std::byte{1});
    dst[static_cast<std::size_t>(r)].assign(bytes, std::byte{0});
  }
  std::vector<double> times;
  for (int it = 0; it < iters + 2; ++it) {
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    double t0_us = 0, t1_us = 0;
    for (int r = 0; r < replicas; ++r) {
      threads.emplace_back([&, r] {
        ++ready;
        while (!go.load()) std::this_thread::yield();
        const auto t0 = Clock::now();
        std::memcpy(dst[static_cast<std::size_t>(r)].data(), src[static_cast<std::size_t>(r)].data(), bytes);
        const auto t1 = Clock::now();
        if (r == 0) {
          t0_us = std::chrono::duration<double, std::micro>(t0.time_since_epoch()).count();
          t1_us = std::chrono::duration<double, std::micro>(t1.time_since_epoch()).count();
        }
      });
    }
    while (ready.load() < replicas) std::this_thread::yield();
    go = true;
    for (auto& t : threads) t.join();
    if (it >= 2) times.push_back(t1_us - t0_us);
  }
  std::sort(times.begin(), times.end());
  return static_cast<double>(bytes) / (times[times.size() / 2] * 1e3);
}

// One replica's share of the memcpy reference when it alternates with the op
// (--interleave-memcpy): its own buffers, touched before the first copy.
struct MemcpyProbe {
  std::vector<std::byte> src, dst;
  explicit MemcpyProbe(std::size_t bytes) : src(bytes, std::byte{1}), dst(bytes, std::byte{0}) {}
  double run_once() {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
};

// Runs the collective `iters + warmup` times on `n` replicas; returns replica 0's
// timings in microseconds and the last results.
// Page faults of the whole process during the timed iterations, per operation.
struct FaultMeter {
  long start = 0;
  double per_op = 0;
  void begin() { start = minor_faults(); }
  void end(int ops) { per_op = static_cast<double>(minor_faults() - start) / ops; }
};

// The raw engine's group of `replicas` threads of this process (the
// in-process backend, from the seam the strategies use).
internal::ReplicaGroup raw_group(const Options& o) {
  return internal::make_replica_group({.replicas = o.replicas, .all_reduce_stream_bytes = o.stream_bytes});
}

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

  RawOp(const Options& opts, internal::ReplicaGroup& group, int r, std::size_t n_elements)
      : o(opts), comm(*group.members[static_cast<std::size_t>(r)]), count(n_elements) {
    const std::size_t n = static_cast<std::size_t>(comm.size());
    const std::size_t per = count / n;
    in = make_input(o.dtype, r, o.op == "all_gather" ? per : count);
    out = o.op == "broadcast" && o.in_place
              ? in
              : Tensor::uninitialized(o.dtype, Shape{static_cast<std::int64_t>(o.op == "reduce_scatter" ? per : count)});
    counts.assign(n, per);
    call.op = o.op;
  }

  // Runs the operation once; returns its time in microseconds.
  double run_once() {
    ++call.sequence;
    const auto t0 = Clock::now();
    if (o.op == "all_reduce" && o.shared_output) {
      shared_out.reset();
      const Communicator::Segment whole{.send = in.raw_data(), .count = count};
      shared_out = comm.all_reduce_shared({&whole, 1}, o.dtype, o.redop, call);
    } else if (o.op == "all_reduce") {
      comm.all_reduce(in.raw_data(), out.mutable_raw_data(), count, o.dtype, o.redop, call);
    } else if (o.op == "all_gather" && o.shared_output) {
      shared_out.reset();
      shared_out = comm.all_gather_v_shared(in.raw_data(), counts, 1, o.dtype, call);
    } else if (o.op == "all_gather") {
      comm.all_gather_v(in.raw_data(), out.mutable_raw_data(), counts, 1, o.dtype, call);
    } else if (o.op == "reduce_scatter") {
      comm.reduce_scatter(in.raw_data(), out.mutable_raw_data(), counts, o.dtype, o.redop, call);
    } else if (o.shared_output) {
      shared_out.reset();
      shared_out = comm.broadcast_shared(in.raw_data(), count, o.dtype, 0, call);
    } else if (o.in_place) {
      comm.broadcast(out.mutable_raw_data(), count, o.dtype, 0, call);
    } else {
      comm.broadcast_out_of_place(in.raw_data(), out.mutable_raw_data(), count, o.dtype, 0, call);
    }
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }

  // The last call's result.
  Tensor result() const {
    return shared_out ? Tensor::from_shared(shared_out, o.dtype, Shape{static_cast<std::int64_t>(count)}) : out;
  }
};

// `memcpy_times` (--interleave-memcpy): replica 0's memcpy of the op's bytes,
// made by every replica at once right after each op.
std::vector<double> run_raw(const Options& o, std::size_t count, std::vector<Tensor>& results, FaultMeter& faults,
                            std::vector<double>& memcpy_times) {
  const int n = o.replicas;
  internal::ReplicaGroup group = raw_group(o);
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(o.iters));
  std::vector<std::thread> threads;
  results.assign(static_cast<std::size_t>(n), Tensor());
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RawOp raw(o, group, r, count);
      std::optional<MemcpyProbe> probe;
      if (o.interleave_memcpy) probe.emplace(count * size_of(o.dtype));
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        if (r == 0 && it == o.warmup) faults.begin();
        const double us = raw.run_once();
        if (r == 0 && it >= o.warmup) times.push_back(us);
        if (probe) {
          const double copy_us = probe->run_once();
          if (r == 0 && it >= o.warmup) memcpy_times.push_back(copy_us);
        }
      }
      if (r == 0) faults.end(o.iters);
      results[static_cast<std::size_t>(r)] = raw.result();
    });
  }
  for (auto& t : threads) t.join();
  return times;
}

// One operation through the API (ReplicaContext with Tensors).
Tensor api_op(const Options& o, ReplicaContext& ctx, const Tensor& in) {
  if (o.op == "all_reduce") return ctx.all_reduce(o.redop, in);
  if (o.op == "all_gather") return ctx.all_gather(in, 0);
  if (!o.merge_call) return ctx.broadcast(in, 0);
  // TensorFlow's way, from replica 0: merge_call and the cross-replica broadcast_to.
  return ctx.merge_call([](Strategy& s, const PerReplica<Tensor>& v) { return s.extended().broadcast_to(v[0]); }, in);
}

// Through the API; with --api both, the raw engine too, on its own buffers and
// a group of its own, alternating with the API call iteration by iteration
// (so that both see the same moments of a noisy machine). Returns replica 0's
// API timings; `raw_times` gets the engine's.
std::vector<double> run_tensor(const Options& o, MirroredStrategy& strategy, std::size_t count,
                               std::vector<Tensor>& results, FaultMeter& faults, std::vector<double>& raw_times) {
  const int n = o.replicas;
  const bool both = o.api == "both";
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(o.iters));
  internal::ReplicaGroup group = raw_group(o);
  std::vector<Tensor> raw_results(static_cast<std::size_t>(n));
  auto per_replica = strategy.run([&](ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const std::size_t in_count = o.op == "all_gather" ? count / static_cast<std::size_t>(n) : count;
    Tensor in = make_input(o.dtype, r, in_count);
    Tensor out;
    std::optional<RawOp> raw;
    if (both) raw.emplace(o, group, r, count);
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      if (r == 0 && it == o.warmup) faults.begin();
      if (raw) {
        const double us = raw->run_once();
        if (r == 0 && it >= o.warmup) raw_times.push_back(us);
      }
      // The last result is dropped first, as a training step drops its
      // gradients: the output comes back from the storage cache, as the
      // engine's reused output (held across the call, two outputs alternate).
      // The drop is timed with the call: freeing is part of the API's cost.
      const auto t0 = Clock::now();
      out = Tensor();
      out = api_op(o, ctx, in);
      const auto t1 = Clock::now();
      if (r == 0 && it >= o.warmup) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    if (r == 0) faults.end(o.iters);  // --api both: per iteration, the engine's call and the API's together
    if (raw) raw_results[static_cast<std::size_t>(r)] = raw->result();
    return out;
  });
  results = per_replica.values();
  if (both) results.insert(results.end(), raw_results.begin(), raw_results.end());
  return times;
}

// One all_reduce of a list of K tensors (packed by dtype into one collective)
// against K separate all_reduce calls, through the API, on the same replicas.
int run_batch(const Options& o) {
  std::vector<std::string> devices;
  for (int r = 0; r < o.replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
  MirroredStrategy strategy(devices);
  const std::size_t count = std::max<std::size_t>(1, o.min_bytes / size_of(o.dtype));
  std::vector<double> packed, separate;
  std::size_t wrong = 0;
  strategy.run([&](ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<Tensor> grads;
    for (int k = 0; k < o.batch; ++k) grads.push_back(make_input(o.dtype, r, count));
    // Each way in its own loop, so each is measured in its steady state.
    // Each way drops its last results first, as a training step drops its
    // gradients and as run_tensor does (timed with the call): the outputs
    // come back from the storage cache, one set of them.
    std::vector<Tensor> out;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      const auto t0 = Clock::now();
      out.clear();
      out = ctx.all_reduce(o.redop, grads);
      const auto t1 = Clock::now();
      if (r == 0 && it >= o.warmup) packed.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::vector<Tensor> single(grads.size());
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      const auto t0 = Clock::now();
      for (int k = 0; k < o.batch; ++k) {
        Tensor& result = single[static_cast<std::size_t>(k)];
        result = Tensor();
        result = ctx.all_reduce(o.redop, grads[static_cast<std::size_t>(k)]);
      }
      const auto t1 = Clock::now();
      if (r == 0 && it >= o.warmup) separate.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    if (o.check && r == 0) {
      for (const Tensor& t : out) wrong += count_wrong(o, t, count, o.replicas, 0);
      for (const Tensor& t : single) wrong += count_wrong(o, t, count, o.replicas, 0);
    }
  });
  std::sort(packed.begin(), packed.end());
  std::sort(separate.begin(), separate.end());
  const double p = packed[packed.size() / 2], q = separate[separate.size() / 2];
  std::printf("# distribute-bench --batch: all_reduce of %d x %zu B %s tensors, %d replicas, iters=%d\n", o.batch,
              count * size_of(o.dtype), std::string(to_string(o.dtype)).c_str(), o.replicas, o.iters);
  std::printf("# %16s %16s %10s %7s\n", "one call (us)", "K calls (us)", "speed-up", "#wrong");
  std::printf("  %16.1f %16.1f %10.2f %7s\n", p, q, q / p, o.check ? std::to_string(wrong).c_str() : "N/A");
  return wrong == 0 ? 0 : 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#ifdef DISTRIBUTE_HAVE_MPI
// ---- under an MPI launcher: MultiWorkerMirroredStrategy beside MPI itself ------------

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_OP_NULL;  // MEAN: MPI has none
  }
}

int run_multi_worker(const Options& o) {
  if (o.api == "both") usage("--api both is for one process; under mpirun the MPI collective is the reference");
  if (o.merge_call) usage("--merge-call is measured in one process only (merge_call's broadcast_to is local to a worker)");
  if (o.op == "reduce_scatter") usage("--op reduce_scatter is measured in one process only (the threads engine)");
  if (o.shared_output) usage("--shared-output is the threads engine's, measured in one process only");
  if (o.in_place) usage("--in-place is for one process: under mpirun the engine's broadcast is in place, as MPI_Bcast");
  std::shared_ptr<Communicator> link = mpi::cluster_from_launcher();
  MultiWorkerMirroredStrategy strategy(o.replicas, link);
  // --api raw: the backend the strategy runs on, made by the same seam on
  // the same link, called from the strategy's replica threads.
  internal::ReplicaGroup engine;
  if (o.api == "raw") {
    engine = internal::make_replica_group(
        {.kind = link != nullptr ? internal::BackendKind::kAcrossWorkers : internal::BackendKind::kInProcess,
         .replicas = o.replicas,
         .workers = link.get(),
         .all_reduce_stream_bytes = o.stream_bytes});
  }
  // Workers that sweep other sizes or ops would meet in different calls.
  tools::agree_on_flags(strategy,
                        {{"--op", o.op},
                         {"--dtype", std::string(to_string(o.dtype))},
                         {"--redop", std::string(to_string(o.redop))},
                         {"-b", std::to_string(o.min_bytes)},
                         {"-e", std::to_string(o.max_bytes)},
                         {"-f", std::to_string(o.factor)},
                         {"--iters", std::to_string(o.iters)},
                         {"--warmup", std::to_string(o.warmup)},
                         {"--check", o.check ? "on" : "off"},
                         {"--api", o.api}});
  const int workers = strategy.num_workers(), n = strategy.num_replicas_in_sync();
  const bool leader = strategy.worker_rank() == 0;
  const MPI_Datatype type = mpi_type(o.dtype);
  const bool with_mpi = type != MPI_DATATYPE_NULL && (o.op != "all_reduce" || mpi_op(o.redop) != MPI_OP_NULL);
  const std::size_t esz = size_of(o.dtype);
  if (leader) {
    std::printf("# distribute-bench under MPI: %s %s %s, %d workers x %d replicas, api=%s, iters=%d warmup=%d\n",
                o.op.c_str(), std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.redop)).c_str(),
                workers, o.replicas, o.api.c_str(), o.iters, o.warmup);
    std::printf("# MPI: MPI_%s on MPI_COMM_WORLD (one rank per worker), same buffers, alternating with ours%s\n",
                o.op == "all_reduce" ? "Allreduce" : o.op == "broadcast" ? "Bcast" : "Allgatherv",
                with_mpi ? "" : "; not comparable for this dtype/op (N/A)");
    std::printf("# %12s %11s %11s %11s %8s %10s %11s %11s %7s\n", "size(B)", "count", "ours(us)", "MPI(us)",
                "ratio", "ours-MPI", "busbw ours", "busbw MPI", "#wrong");
  }
  std::size_t total_wrong = 0;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = next_size(bytes, o.factor)) {
    std::size_t count = std::max<std::size_t>(1, bytes / esz);
    if (o.op == "all_gather") count = std::max<std::size_t>(1, count / static_cast<std::size_t>(n)) * static_cast<std::size_t>(n);
    const std::size_t per_replica = o.op == "all_gather" ? count / static_cast<std::size_t>(n) : count;
    std::vector<double> ours, theirs;
    std::size_t wrong = 0;
    strategy.run([&](ReplicaContext& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      const bool timer = ctx.local_replica_id() == 0;  // the worker's leader also runs MPI's collective
      Communicator* engine_comm =
          engine.members.empty() ? nullptr : engine.members[static_cast<std::size_t>(ctx.local_replica_id())].get();
      Tensor in = make_input(o.dtype, g, per_replica);
      Tensor out = Tensor::uninitialized(o.dtype, Shape{static_cast<std::int64_t>(count)});
      // MPI's reference moves this worker's share: its replicas' inputs, reduced or concatenated.
      const std::size_t worker_count = o.op == "all_gather" ? per_replica * static_cast<std::size_t>(o.replicas) : count;
      Tensor mpi_in = make_input(o.dtype, g, worker_count);
      Tensor mpi_out = Tensor::uninitialized(o.dtype, Shape{static_cast<std::int64_t>(count)});
      if (o.op == "broadcast" && g == 0) {  // the roots' buffers hold what they send
        out = in.clone();
        mpi_out = in.clone();
      }
      std::vector<int> counts(static_cast<std::size_t>(workers), static_cast<int>(worker_count)), displs;
      for (int w = 0; w < workers; ++w) displs.push_back(w * static_cast<int>(worker_count));
      CollectiveCall call{.op = o.op, .sequence = 0, .timeout_seconds = 600};
      std::vector<std::size_t> gather_counts(static_cast<std::size_t>(n), per_replica);
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        // The last result is dropped first, as a training step drops its
        // gradients: the output's storage comes back from the cache, as MPI's
        // reference writes into one buffer. (Held across the call, two outputs
        // alternate: at 4 MiB that cost 1.2-1.3x, docs/benchmarks.md.) The
        // drop is timed with the call: freeing is part of the API's cost.
        auto t0 = Clock::now();
        if (o.api == "tensor") {
          out = Tensor();
          out = o.op == "all_reduce" ? ctx.all_reduce(o.redop, in)
                : o.op == "broadcast"  ? ctx.broadcast(in, 0)
                                       : ctx.all_gather(in, 0);
        } else {
          ++call.sequence;
          if (o.op == "all_reduce") {
            engine_comm->all_reduce(in.raw_data(), out.mutable_raw_data(), count, o.dtype, o.redop, call);
          } else if (o.op == "broadcast") {
            engine_comm->broadcast(out.mutable_raw_data(), count, o.dtype, 0, call);
          } else {
            engine_comm->all_gather_v(in.raw_data(), out.mutable_raw_data(), gather_counts, 1, o.dtype, call);
          }
        }
        auto t1 = Clock::now();
        if (timer && it >= o.warmup) ours.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        if (!timer || !with_mpi) continue;
        t0 = Clock::now();
        if (o.op == "all_reduce") {
          MPI_Allreduce(mpi_in.raw_data(), mpi_out.mutable_raw_data(), static_cast<int>(count), type,
                        mpi_op(o.redop), MPI_COMM_WORLD);
        } else if (o.op == "broadcast") {
          MPI_Bcast(mpi_out.mutable_raw_data(), static_cast<int>(count), type, 0, MPI_COMM_WORLD);
        } else {
          MPI_Allgatherv(mpi_in.raw_data(), static_cast<int>(worker_count), type, mpi_out.mutable_raw_data(),
                         counts.data(), displs.data(), type, MPI_COMM_WORLD);
        }
        t1 = Clock::now();
        if (it >= o.warmup) theirs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      if (o.check && timer) wrong = count_wrong(o, out, count, n, 0);
    });
    total_wrong += wrong;
    if (!leader) continue;
    const double a = median(ours), b = with_mpi ? median(theirs) : 0;
    const double factor = bus_factor(o.op, n);
    char mpi_text[32] = "N/A", ratio_text[32] = "N/A", diff_text[32] = "N/A", mpi_bw[32] = "N/A";
    if (with_mpi) {
      std::snprintf(mpi_text, sizeof mpi_text, "%.2f", b);
      std::snprintf(ratio_text, sizeof ratio_text, "%.3f", a / b);
      std::snprintf(diff_text, sizeof diff_text, "%.2f", a - b);
      std::snprintf(mpi_bw, sizeof mpi_bw, "%.3f", static_cast<double>(count * esz) / (b * 1e3) * factor);
    }
    std::printf("  %12zu %11zu %11.2f %11s %8s %10s %11.3f %11s %7s\n", count * esz, count, a, mpi_text, ratio_text,
                diff_text, static_cast<double>(count * esz) / (a * 1e3) * factor, mpi_bw,
                o.check ? std::to_string(wrong).c_str() : "N/A");
    std::fflush(stdout);
  }
  return total_wrong == 0 ? 0 : 1;
}
#endif

int run_benchmark(const Options& o) {
#ifdef DISTRIBUTE_HAVE_MPI
  if (mpi::started_by_launcher()) return run_multi_worker(o);
#endif
  if (o.batch > 0) return run_batch(o);
  const std::size_t esz = size_of(o.dtype);
  std::unique_ptr<MirroredStrategy> strategy;
  const bool both = o.api == "both";
  if (o.api != "raw") {
    std::vector<std::string> devices;
    for (int r = 0; r < o.replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
    strategy = std::make_unique<MirroredStrategy>(devices);
  }
  std::printf("# distribute-bench: %s %s %s, %d replicas, api=%s, iters=%d warmup=%d, %u cores\n", o.op.c_str(),
              std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.redop)).c_str(), o.replicas,
              o.api.c_str(), o.iters, o.warmup, std::thread::hardware_concurrency());
  if (o.api != "raw" && !o.merge_call) {
    std::printf("# api: every replica's result views one shared output (read-only) once %s\n",
                o.op == "all_gather" ? "a contribution passes 4 KiB"
                : o.op == "all_reduce" ? "the message passes 64 KiB (1 KiB among a worker's replicas)"
                                       : "the message passes 4 KiB");
  }
  if (o.merge_call) std::printf("# api: merge_call and extended().broadcast_to, as TensorFlow\n");
  if (o.shared_output) {
    std::printf("# raw: %s, one output for every replica where it shares one, as the API's\n",
                o.op == "all_reduce"   ? "all_reduce_shared"
                : o.op == "all_gather" ? "all_gather_v_shared"
                                       : "broadcast_shared");
  }
  if (o.op == "broadcast" && !o.shared_output && o.api != "tensor") {
    std::printf("# raw: broadcast %s\n", o.in_place ? "in place (MPI_Bcast's form): the root's buffer is its output"
                                                    : "out of place (ncclBroadcast's form, as the API's): from the "
                                                      "root's input into every replica's output, the root's too");
  }
  if (both) {
    std::printf("# raw: the engine on %s, alternating with the API call iteration by iteration\n",
                o.shared_output ? "the API's shared forms" : "its own buffers");
    std::printf("# faults/iter: page faults of one iteration (the engine's call and the API's together)\n");
    std::printf("# %12s %11s %8s %7s %11s %11s %12s %8s %7s %11s\n", "size(B)", "count", "type", "redop", "raw(us)",
                "api(us)", "api-raw(us)", "api/raw", "#wrong", "faults/iter");
  } else {
    if (o.interleave_memcpy) {
      std::printf("# memcpy: every replica copies the op's bytes right after each op; replica 0's median\n");
    }
    std::printf("# %12s %11s %8s %7s %11s %10s %11s %11s %7s %9s %12s %9s\n", "size(B)", "count", "type", "redop",
                "median(us)", "min(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "faults/op", "memcpy(GB/s)",
                "bus/memcpy");
  }
  std::vector<Row> rows;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = next_size(bytes, o.factor)) {
    std::size_t count = std::max<std::size_t>(1, bytes / esz);
    if (o.op == "all_gather" || o.op == "reduce_scatter") {
      count = std::max<std::size_t>(1, count / static_cast<std::size_t>(o.replicas)) *
              static_cast<std::size_t>(o.replicas);
    }
    Row row;
    row.count = count;
    row.bytes = count * esz;
    std::vector<Tensor> results;
    FaultMeter faults;
    std::vector<double> raw_times, memcpy_times;
    std::vector<double> times = o.api == "raw" ? run_raw(o, count, results, faults, memcpy_times)
                                               : run_tensor(o, *strategy, count, results, faults, raw_times);
    if (both) row.raw_median_us = median(raw_times);
    std::sort(times.begin(), times.end());
    row.median_us = times[times.size() / 2];
    row.min_us = times.front();
    row.algbw = static_cast<double>(row.bytes) / (row.median_us * 1e3);
    row.busbw = row.algbw * bus_factor(o.op, o.replicas);
    row.faults_per_op = faults.per_op;
    if (o.check) {
      for (std::size_t i = 0; i < results.size(); ++i) {  // --api both: the API's results, then the engine's
        const int r = static_cast<int>(i % static_cast<std::size_t>(o.replicas));
        row.wrong += count_wrong(o, results[i], count, o.replicas, r);
      }
    }
    const std::string wrong_text = o.check ? std::to_string(row.wrong) : "N/A";
    if (both) {
      std::printf("  %12zu %11zu %8s %7s %11.2f %11.2f %12.2f %8.3f %7s %11.1f\n", row.bytes, row.count,
                  std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.redop)).c_str(), row.raw_median_us,
                  row.median_us, row.median_us - row.raw_median_us, row.median_us / row.raw_median_us,
                  wrong_text.c_str(), row.faults_per_op);
      std::fflush(stdout);
      rows.push_back(row);
      continue;
    }
    row.memcpy_bw = o.interleave_memcpy ? static_cast<double>(row.bytes) / (median(memcpy_times) * 1e3)
                                        : memcpy_reference(o.replicas, row.bytes, std::min(o.iters, 10));
    std::printf("  %12zu %11zu %8s %7s %11.2f %10.2f %11.3f %11.3f %7s %9.1f %12.3f %9.2f\n", row.bytes, row.count,
                std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.redop)).c_str(), row.median_us,
                row.min_us, row.algbw, row.busbw, wrong_text.c_str(),
                row.faults_per_op, row.memcpy_bw, row.memcpy_bw > 0 ? row.busbw / row.memcpy_bw : 0.0);
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (!o.csv.empty()) {
    std::ostringstream csv;
    csv << "op,replicas,api,dtype,redop,bytes,count,median_us,min_us,algbw_gbs,busbw_gbs,wrong,faults_per_op,"
           "memcpy_gbs,raw_median_us\n";
    for (const Row& r : rows) {
      csv << o.op << ',' << o.replicas << ',' << o.api << ',' << to_string(o.dtype) << ',' << to_string(o.redop) << ','
          << r.bytes << ',' << r.count << ',' << r.median_us << ',' << r.min_us << ',' << r.algbw << ',' << r.busbw
          << ',' << r.wrong << ',' << r.faults_per_op << ',' << r.memcpy_bw << ',' << r.raw_median_us << '\n';
    }
    tools::write_file("CSV file", o.csv, csv.str());  // an error (a full disk) reaches main: exit 2
  }
  std::size_t total_wrong = 0;
  for (const Row& r : rows) total_wrong += r.wrong;
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

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
