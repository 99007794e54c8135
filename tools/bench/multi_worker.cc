// The multi-worker mode (mpirun): MultiWorkerMirroredStrategy through the
// API or its engine, alternating with MPI_Allreduce / MPI_Bcast / MPI_Allgatherv.
#include "multi_worker.h"

#ifdef DISTRIBUTE_HAVE_MPI
#include <distribute/mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "agree.h"
#include "check.h"
#include "comm/backend.h"
#include "distribute/communicator.h"
#include "distribute/multi_worker_mirrored_strategy.h"
#include "distribute/replica_context.h"
#include "distribute/tensor.h"
#include "measure.h"

namespace distribute::bench {

// ---- under an MPI launcher: MultiWorkerMirroredStrategy beside MPI itself ------------

namespace {

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

// What every message size's run shares: the flags, the engine (--api raw)
// and MPI's reference.
struct Sweep {
  const Options& o;
  const internal::ReplicaGroup& engine;  // --api raw: the strategy's backend; empty otherwise
  int workers;
  int n;  // the replicas in sync, on every worker
  MPI_Datatype type;
  bool with_mpi;  // MPI has the dtype (and the reduction): its reference is measured
};

// One message size's measurements, made by each worker's leader replica.
struct SizeResult {
  std::vector<double> ours, theirs;  // microseconds per call
  std::size_t wrong = 0;
};

// The comment lines above the leader's table.
void print_header(const Options& o, int workers, bool with_mpi) {
  std::printf("# distribute-bench under MPI: %s %s %s, %d workers x %d replicas, api=%s, iters=%d warmup=%d\n",
              o.op.c_str(), std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.redop)).c_str(), workers,
              o.replicas, o.api.c_str(), o.iters, o.warmup);
  std::printf("# MPI: MPI_%s on MPI_COMM_WORLD (one rank per worker), same buffers, alternating with ours%s\n",
              o.op == "all_reduce"  ? "Allreduce"
              : o.op == "broadcast" ? "Bcast"
                                    : "Allgatherv",
              with_mpi ? "" : "; not comparable for this dtype/op (N/A)");
  std::printf("# %12s %11s %11s %11s %8s %10s %11s %11s %7s\n", "size(B)", "count", "ours(us)", "MPI(us)", "ratio",
              "ours-MPI", "busbw ours", "busbw MPI", "#wrong");
}

// One replica's part of a message size: `count` elements out (`per_replica`
// in), each call of ours followed, on the worker's leader, by MPI's.
void measure_replica(const Sweep& s, ReplicaContext& ctx, std::size_t count, std::size_t per_replica,
                     SizeResult& result) {
  const Options& o = s.o;
  const int g = ctx.replica_id_in_sync_group();
  const bool timer = ctx.local_replica_id() == 0;  // the worker's leader also runs MPI's collective
  Communicator* engine_comm =
      s.engine.members.empty() ? nullptr : s.engine.members[static_cast<std::size_t>(ctx.local_replica_id())].get();
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
  std::vector<int> counts(static_cast<std::size_t>(s.workers), static_cast<int>(worker_count)), displs;
  for (int w = 0; w < s.workers; ++w) displs.push_back(w * static_cast<int>(worker_count));
  CollectiveCall call{.op = o.op, .sequence = 0, .timeout_seconds = 600};
  std::vector<std::size_t> gather_counts(static_cast<std::size_t>(s.n), per_replica);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    // The last result is dropped first, as a training step drops its
    // gradients: the output's storage comes back from the cache, as MPI's
    // reference writes into one buffer. (Held across the call, two outputs
    // alternate: at 4 MiB that cost 1.2-1.3x, docs/history/benchmarks.md.) The
    // drop is timed with the call: freeing is part of the API's cost.
    auto t0 = Clock::now();
    if (o.api == "tensor") {
      out = Tensor();
      out = o.op == "all_reduce"  ? ctx.all_reduce(o.redop, in)
            : o.op == "broadcast" ? ctx.broadcast(in, 0)
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
    if (timer && it >= o.warmup) result.ours.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (!timer || !s.with_mpi) continue;
    t0 = Clock::now();
    if (o.op == "all_reduce") {
      MPI_Allreduce(mpi_in.raw_data(), mpi_out.mutable_raw_data(), static_cast<int>(count), s.type, mpi_op(o.redop),
                    MPI_COMM_WORLD);
    } else if (o.op == "broadcast") {
      MPI_Bcast(mpi_out.mutable_raw_data(), static_cast<int>(count), s.type, 0, MPI_COMM_WORLD);
    } else {
      MPI_Allgatherv(mpi_in.raw_data(), static_cast<int>(worker_count), s.type, mpi_out.mutable_raw_data(),
                     counts.data(), displs.data(), s.type, MPI_COMM_WORLD);
    }
    t1 = Clock::now();
    if (it >= o.warmup) result.theirs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  if (o.check && timer) result.wrong = count_wrong(o, out, count, s.n, 0);
}

// The leader's table row for one message size.
void print_row(const Sweep& s, std::size_t count, const SizeResult& result) {
  const Options& o = s.o;
  const std::size_t esz = size_of(o.dtype);
  const double a = median(result.ours), b = s.with_mpi ? median(result.theirs) : 0;
  const double factor = bus_factor(o.op, s.n);
  char mpi_text[32] = "N/A", ratio_text[32] = "N/A", diff_text[32] = "N/A", mpi_bw[32] = "N/A";
  if (s.with_mpi) {
    std::snprintf(mpi_text, sizeof mpi_text, "%.2f", b);
    std::snprintf(ratio_text, sizeof ratio_text, "%.3f", a / b);
    std::snprintf(diff_text, sizeof diff_text, "%.2f", a - b);
    std::snprintf(mpi_bw, sizeof mpi_bw, "%.3f", static_cast<double>(count * esz) / (b * 1e3) * factor);
  }
  std::printf("  %12zu %11zu %11.2f %11s %8s %10s %11.3f %11s %7s\n", count * esz, count, a, mpi_text, ratio_text,
              diff_text, static_cast<double>(count * esz) / (a * 1e3) * factor, mpi_bw,
              o.check ? std::to_string(result.wrong).c_str() : "N/A");
  std::fflush(stdout);
}

}  // namespace

int run_multi_worker(const Options& o) {
  if (o.api == "both") usage("--api both is for one process; under mpirun the MPI collective is the reference");
  if (o.merge_call)
    usage("--merge-call is measured in one process only (merge_call's broadcast_to is local to a worker)");
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
  tools::agree_on_flags(strategy, {{"--op", o.op},
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
  const Sweep sweep{o, engine, workers, n, type, with_mpi};
  if (leader) print_header(o, workers, with_mpi);
  std::size_t total_wrong = 0;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes = next_size(bytes, o.factor)) {
    std::size_t count = std::max<std::size_t>(1, bytes / esz);
    if (o.op == "all_gather")
      count = std::max<std::size_t>(1, count / static_cast<std::size_t>(n)) * static_cast<std::size_t>(n);
    const std::size_t per_replica = o.op == "all_gather" ? count / static_cast<std::size_t>(n) : count;
    SizeResult result;
    strategy.run([&](ReplicaContext& ctx) { measure_replica(sweep, ctx, count, per_replica, result); });
    total_wrong += result.wrong;
    if (!leader) continue;
    print_row(sweep, count, result);
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace distribute::bench
#endif
