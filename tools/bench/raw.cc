// The raw engine: RawOp (one member's operation, --shared-output and
// --in-place included), run_raw on `--replicas` threads, and the memcpy probe.
#include "raw.h"

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "check.h"
#include "distribute/dtype.h"

namespace distribute::bench {
namespace {

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

}  // namespace

RawOp::RawOp(const Options& opts, internal::ReplicaGroup& group, int r, std::size_t n_elements)
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

double RawOp::run_once() {
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

Tensor RawOp::result() const {
  return shared_out ? Tensor::from_shared(shared_out, o.dtype, Shape{static_cast<std::int64_t>(count)}) : out;
}

internal::ReplicaGroup raw_group(const Options& o) {
  return internal::make_replica_group({.replicas = o.replicas, .all_reduce_stream_bytes = o.stream_bytes});
}

std::vector<double> run_raw(const Options& o, std::size_t count, std::vector<Tensor>& results, FaultMeter& faults,
                            std::vector<double>& memcpy_times) {
  const int n = o.replicas;
  internal::ReplicaGroup group = raw_group(o);
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(o.iters));
  std::vector<std::thread> threads;
  results.assign(static_cast<std::size_t>(n), Tensor());
  threads.reserve(static_cast<std::size_t>(n));
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

}  // namespace distribute::bench
