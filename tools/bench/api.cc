// The API modes: one operation through ReplicaContext (merge_call's
// broadcast_to included), run_tensor (--api tensor and both) and run_batch (--batch).
#include "api.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "check.h"
#include "comm/backend.h"
#include "distribute/distributed_values.h"
#include "distribute/replica_context.h"
#include "distribute/strategy.h"
#include "raw.h"

namespace distribute::bench {
namespace {

// One operation through the API (ReplicaContext with Tensors).
Tensor api_op(const Options& o, ReplicaContext& ctx, const Tensor& in) {
  if (o.op == "all_reduce") return ctx.all_reduce(o.redop, in);
  if (o.op == "all_gather") return ctx.all_gather(in, 0);
  if (!o.merge_call) return ctx.broadcast(in, 0);
  // TensorFlow's way, from replica 0: merge_call and the cross-replica broadcast_to.
  return ctx.merge_call([](Strategy& s, const PerReplica<Tensor>& v) { return s.extended().broadcast_to(v[0]); }, in);
}

}  // namespace

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

int run_batch(const Options& o) {
  std::vector<std::string> devices;
  devices.reserve(static_cast<std::size_t>(o.replicas));
  for (int r = 0; r < o.replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
  MirroredStrategy strategy(devices);
  const std::size_t count = std::max<std::size_t>(1, o.min_bytes / size_of(o.dtype));
  std::vector<double> packed, separate;
  std::size_t wrong = 0;
  strategy.run([&](ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<Tensor> grads;
    grads.reserve(static_cast<std::size_t>(o.batch));
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

}  // namespace distribute::bench
