// The one-process sweep: each message size through the raw engine or the API
// (or both alternately), a table row per size with the memcpy reference, and the CSV.
#include "sweep.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api.h"
#include "check.h"
#include "core/host_cpus.h"
#include "distribute/dtype.h"
#include "distribute/mirrored_strategy.h"
#include "distribute/reduce_op.h"
#include "distribute/tensor.h"
#include "measure.h"
#include "multi_worker.h"
#include "output.h"
#include "raw.h"

#ifdef DISTRIBUTE_HAVE_MPI
#include <distribute/mpi.h>
#endif

namespace distribute::bench {
namespace {

struct Row {
  std::size_t bytes = 0, count = 0;
  double median_us = 0, min_us = 0, algbw = 0, busbw = 0, memcpy_bw = 0;
  double raw_median_us = 0;  // --api both: the raw engine's, alternating with the API's
  std::size_t wrong = 0;
  double faults_per_op = 0;
};

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
    threads.reserve(static_cast<std::size_t>(replicas));
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

// The comment lines above the table: the run, what each side measures, and the columns.
void print_header(const Options& o) {
  const bool both = o.api == "both";
  std::printf("# distribute-bench: %s %s %s, %d replicas, api=%s, iters=%d warmup=%d, %s\n", o.op.c_str(),
              std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.redop)).c_str(), o.replicas,
              o.api.c_str(), o.iters, o.warmup, internal::describe_host_cpus().c_str());
  if (o.api != "raw" && !o.merge_call) {
    std::printf("# api: every replica's result views one shared output (read-only) once %s\n",
                o.op == "all_gather"   ? "a contribution passes 4 KiB"
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
}

// The rows as CSV, into --csv's file.
void write_csv(const Options& o, const std::vector<Row>& rows) {
  std::ostringstream csv;
  csv << "op,replicas,api,dtype,redop,bytes,count,median_us,min_us,algbw_gbs,busbw_gbs,wrong,faults_per_op,"
         "memcpy_gbs,raw_median_us\n";
  for (const Row& r : rows) {
    csv << o.op << ',' << o.replicas << ',' << o.api << ',' << to_string(o.dtype) << ',' << to_string(o.redop) << ','
        << r.bytes << ',' << r.count << ',' << r.median_us << ',' << r.min_us << ',' << r.algbw << ',' << r.busbw << ','
        << r.wrong << ',' << r.faults_per_op << ',' << r.memcpy_bw << ',' << r.raw_median_us << '\n';
  }
  tools::write_file("CSV file", o.csv, csv.str());  // an error (a full disk) reaches main: exit 2
}

}  // namespace

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
    devices.reserve(static_cast<std::size_t>(o.replicas));
    for (int r = 0; r < o.replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
    strategy = std::make_unique<MirroredStrategy>(devices);
  }
  print_header(o);
  std::vector<Row> rows;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes = next_size(bytes, o.factor)) {
    std::size_t count = std::max<std::size_t>(1, bytes / esz);
    if (o.op == "all_gather" || o.op == "reduce_scatter") {
      count =
          std::max<std::size_t>(1, count / static_cast<std::size_t>(o.replicas)) * static_cast<std::size_t>(o.replicas);
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
                row.min_us, row.algbw, row.busbw, wrong_text.c_str(), row.faults_per_op, row.memcpy_bw,
                row.memcpy_bw > 0 ? row.busbw / row.memcpy_bw : 0.0);
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (!o.csv.empty()) write_csv(o, rows);
  std::size_t total_wrong = 0;
  for (const Row& r : rows) total_wrong += r.wrong;
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace distribute::bench
