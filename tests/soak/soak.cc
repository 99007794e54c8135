// distribute-soak: runs many collectives of random kinds, dtypes, ops and
// sizes, checks every replica's every result against the reference model bit
// for bit, injects a fault now and then (a replica that throws, passes another
// dtype or shape, skips a collective or calls another one) and checks that it
// ends in the documented error, found and not waited out; at the end it
// compares memory, open file descriptors and threads with what they were
// after warm-up. Across workers, the last worker then leaves normally (it
// destroys its strategy, as a worker with fewer steps does), and every other
// worker's next run must raise FailedPreconditionError naming it at once.
// Exit code 0 only when everything held.
//
//   distribute-soak --collectives 1000000 --replicas 4
//   mpirun -np 2 distribute-soak --strategy multi_worker --replicas 2
//
// The figures of the long runs are in docs/reliability.md.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distribute/distribute.h"
#include "flags.h"
#include "testing/hang_watchdog.h"
#include "testing/reference_model.h"
#ifdef DISTRIBUTE_HAVE_MPI
#include "distribute/mpi.h"
#endif

namespace distribute::soak {
namespace {

using Clock = std::chrono::steady_clock;

// The exception a faulty replica throws.
struct InjectedFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::int64_t collectives = 100000;
  int replicas = 4;  // per worker
  std::int64_t max_bytes = 64 * 1024;
  std::int64_t fault_every = 2000;  // collectives; 0: no faults
  int per_run = 50;                 // collectives per Strategy::run
  std::uint64_t seed = 1;
  std::string strategy = "mirrored";
};

using tools::grouped;
using tools::parse_int;
using tools::UsageError;

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw UsageError("unknown flag or missing value: " + flag);
    const std::string value = argv[++i];
    if (flag == "--collectives") {
      a.collectives = parse_int(flag, value, 1);
    } else if (flag == "--replicas") {
      a.replicas = tools::parse_int32(flag, value, 1, 4096);
    } else if (flag == "--max-bytes") {
      a.max_bytes = parse_int(flag, value, 16, std::int64_t{1} << 30);
    } else if (flag == "--fault-every") {
      a.fault_every = parse_int(flag, value, 0);
    } else if (flag == "--per-run") {
      a.per_run = tools::parse_int32(flag, value, 1);
    } else if (flag == "--seed") {
      a.seed = static_cast<std::uint64_t>(parse_int(flag, value, 0));
    } else if (flag == "--strategy") {
      if (value != "mirrored" && value != "multi_worker") {
        throw UsageError("--strategy must be mirrored or multi_worker, got '" + value + "'");
      }
      a.strategy = value;
    } else {
      throw UsageError("unknown flag: " + flag);
    }
  }
  return a;
}

// ---- what each collective is --------------------------------------------------

enum class Kind { kAllReduce, kAllReduceNest, kAllGather, kMergeReduceTo };
constexpr const char* kKindNames[] = {"all_reduce", "all_reduce of a 3-leaf nest", "ragged all_gather",
                                      "merge_call + reduce_to"};

enum class Fault { kNone, kThrow, kOtherDType, kOtherShape, kSkip, kOtherCall };
constexpr const char* kFaultNames[] = {"none",
                                       "throws",
                                       "passes another dtype",
                                       "passes another shape",
                                       "skips the run's last collective",
                                       "calls another collective"};

struct Leaf {
  DType dtype = DType::kFloat32;
  std::int64_t elements = 0;  // all_reduce: per replica; all_gather: columns
};

// Everything every replica must agree on, drawn from the seed and the
// collective's global index alone, so that every replica of every worker
// draws the same.
struct Spec {
  std::int64_t index = 0;
  Kind kind = Kind::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  std::int64_t bytes_per_pack = 0;
  std::vector<Leaf> leaves;
  Fault fault = Fault::kNone;
  int faulty_replica = -1;
};

std::int64_t log_uniform_elements(std::mt19937_64& gen, std::int64_t max_elements) {
  // Sizes spread evenly over orders of magnitude, 0 included.
  const double e = std::uniform_real_distribution<double>(0.0, std::log2(static_cast<double>(max_elements) + 1))(gen);
  return static_cast<std::int64_t>(std::exp2(e)) - 1;
}

Spec make_spec(const Args& a, std::int64_t index) {
  std::mt19937_64 gen(a.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(index));
  Spec s;
  s.index = index;
  const int k = static_cast<int>(gen() % 10);
  s.kind = k < 5 ? Kind::kAllReduce : k < 6 ? Kind::kAllReduceNest : k < 9 ? Kind::kAllGather : Kind::kMergeReduceTo;
  s.op = kAllReduceOps[gen() % std::size(kAllReduceOps)];
  static const std::int64_t kPacks[] = {0, 4096, 1 << 20};
  s.bytes_per_pack = kPacks[gen() % std::size(kPacks)];
  const int leaves = s.kind == Kind::kAllReduceNest ? 3 : 1;
  for (int l = 0; l < leaves; ++l) {
    Leaf leaf;
    leaf.dtype = kAllDTypes[gen() % std::size(kAllDTypes)];
    const std::int64_t max_elements = std::max<std::int64_t>(1, a.max_bytes / leaves / size_of(leaf.dtype));
    leaf.elements =
        s.kind == Kind::kAllGather ? 1 + static_cast<std::int64_t>(gen() % 8) : log_uniform_elements(gen, max_elements);
    s.leaves.push_back(leaf);
  }
  return s;
}

// A replica's input: for all_gather, rows of its own count (ragged) so that
// the gathered bytes stay within --max-bytes.
std::vector<Tensor> input_of(const Args& a, const Spec& s, int replica, int replicas) {
  std::mt19937_64 gen((a.seed + 1) * 0xD1B54A32D192ED03ull + static_cast<std::uint64_t>(s.index) * 131 +
                      static_cast<std::uint64_t>(replica));
  std::vector<Tensor> out;
  for (const Leaf& leaf : s.leaves) {
    if (s.kind == Kind::kAllGather) {
      const std::int64_t row_bytes = leaf.elements * size_of(leaf.dtype);
      const std::int64_t max_rows = std::max<std::int64_t>(1, a.max_bytes / replicas / row_bytes);
      const std::int64_t rows = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(max_rows + 1));
      out.push_back(testing::random_tensor(gen, leaf.dtype, Shape{rows, leaf.elements}));
    } else {
      out.push_back(testing::random_tensor(gen, leaf.dtype, Shape{leaf.elements}));
    }
  }
  return out;
}

// What the replica does; returns its results per leaf.
std::vector<Tensor> perform(ReplicaContext& ctx, const Spec& s, std::vector<Tensor> mine) {
  const int me = ctx.replica_id_in_sync_group();
  Kind kind = s.kind;
  if (me == s.faulty_replica) {
    switch (s.fault) {
      case Fault::kThrow: throw InjectedFault("replica " + std::to_string(me) + " failed on purpose");
      case Fault::kOtherDType:
        mine[0] = Tensor(mine[0].dtype() == DType::kInt8 ? DType::kInt16 : DType::kInt8, mine[0].shape());
        break;
      case Fault::kOtherShape: {
        std::vector<std::int64_t> dims = mine[0].shape().dims();
        dims.back() += 1;
        mine[0] = Tensor(mine[0].dtype(), Shape(dims));
        break;
      }
      case Fault::kSkip: return {};
      case Fault::kOtherCall: kind = kind == Kind::kAllGather ? Kind::kAllReduce : Kind::kAllGather; break;
      case Fault::kNone: break;
    }
  }
  CommunicationOptions options;
  options.bytes_per_pack = s.bytes_per_pack;
  switch (kind) {
    case Kind::kAllReduce: return {ctx.all_reduce(s.op, mine[0], options)};
    case Kind::kAllReduceNest: return ctx.all_reduce(s.op, mine, options);
    case Kind::kAllGather: return {ctx.all_gather(mine[0], 0, options)};
    case Kind::kMergeReduceTo: {
      const ReduceOp op = s.op;
      return {ctx.merge_call(
          [op, options](Strategy& strategy, const PerReplica<Tensor>& v) {
            return strategy.extended().reduce_to(op, v, v, options);
          },
          mine[0])};
    }
  }
  return {};
}

// ---- the process's resources ------------------------------------------------------

struct Resources {
  double rss_mib = 0;
  int fds = 0;
  int threads = 0;
};

int count_entries(const char* dir_path) {
  int n = 0;
  if (DIR* dir = ::opendir(dir_path)) {
    while (const dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
    ::closedir(dir);
  }
  return n;
}

Resources resources() {
  Resources r;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) r.rss_mib = std::stod(line.substr(6)) / 1024.0;
  }
  r.fds = count_entries("/proc/self/fd") - 1;  // less the descriptor that lists them
  r.threads = count_entries("/proc/self/task");
  return r;
}

// ---- the run ----------------------------------------------------------------------

struct Tally {
  std::int64_t collectives = 0;      // all, in runs with a fault too
  std::int64_t checked = 0;          // in runs without a fault: every result checked
  std::int64_t by_kind[4] = {};      // of those checked
  std::int64_t bytes = 0;            // input bytes of every replica
  std::int64_t results_checked = 0;  // one per replica per leaf
  std::int64_t wrong = 0;
  std::int64_t faults[6] = {};
  std::int64_t documented = 0;
  std::int64_t undocumented = 0;
  double slowest_fault_ms = 0;
  std::int64_t hangs = 0;
};

// The error a fault must end in (docs/errors.md).
bool documented(Fault fault, const std::exception& e) {
  switch (fault) {
    case Fault::kThrow: return dynamic_cast<const InjectedFault*>(&e) != nullptr;
    case Fault::kOtherDType:
    case Fault::kOtherShape: return dynamic_cast<const InvalidArgumentError*>(&e) != nullptr;
    case Fault::kSkip:
    case Fault::kOtherCall: return dynamic_cast<const FailedPreconditionError*>(&e) != nullptr;
    case Fault::kNone: return false;
  }
  return false;
}

// Watches a progress counter; if it stands still for `limit`, dumps every
// thread's stack and exits (tests/testing/hang_watchdog.h).
class HangMonitor {
 public:
  HangMonitor(std::chrono::seconds limit, const std::atomic<std::int64_t>& progress)
      : limit_(limit), progress_(progress), thread_([this] { watch(); }) {}
  ~HangMonitor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  HangMonitor(const HangMonitor&) = delete;
  HangMonitor& operator=(const HangMonitor&) = delete;

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    std::int64_t seen = progress_.load();
    while (!cv_.wait_for(lock, limit_, [this] { return stopping_; })) {
      const std::int64_t now = progress_.load();
      if (now == seen) {
        testing::dump_every_thread_and_exit("distribute-soak: run " + std::to_string(now) + " has not finished in " +
                                            std::to_string(limit_.count()) + " s");
      }
      seen = now;
    }
  }

  const std::chrono::seconds limit_;
  const std::atomic<std::int64_t>& progress_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the state above exists
};

class Soak {
 public:
  Soak(const Args& a, Strategy& s, int workers) : a_(a), s_(s), workers_(workers) {}

  Tally run() {
    // A run that never ends (a hang the collective timeout cannot see) becomes
    // a stack dump of every thread, not a silent ctest timeout.
    HangMonitor monitor(3 * timeout(), runs_done_);
    const std::int64_t runs = (a_.collectives + a_.per_run - 1) / a_.per_run;
    const std::int64_t warmup_runs = std::max<std::int64_t>(1, runs / 50);
    const auto started = Clock::now();
    auto last_report = started;
    for (std::int64_t r = 0; r < runs; ++r) {
      if (r == warmup_runs) after_warmup_ = resources();
      const std::int64_t first = r * a_.per_run;
      const int count = static_cast<int>(std::min<std::int64_t>(a_.per_run, a_.collectives - first));
      step(first, count);
      runs_done_.fetch_add(1, std::memory_order_relaxed);
      const auto now = Clock::now();
      if (chief() && now - last_report > std::chrono::seconds(10)) {
        last_report = now;
        std::fprintf(stderr, "  %s collectives, %s faults, %s wrong, %.0f s\n", grouped(t_.collectives).c_str(),
                     grouped(t_.documented + t_.undocumented).c_str(), grouped(t_.wrong).c_str(),
                     std::chrono::duration<double>(now - started).count());
      }
    }
    seconds_ = std::chrono::duration<double>(Clock::now() - started).count();
    if (runs <= warmup_runs) after_warmup_ = resources();
    at_end_ = resources();
    return t_;
  }

  bool chief() const { return s_.first_replica_id() == 0; }
  double seconds() const { return seconds_; }
  const Resources& after_warmup() const { return after_warmup_; }
  const Resources& at_end() const { return at_end_; }

 private:
  // One Strategy::run of `count` collectives from global index `first`; the
  // last of them may carry a fault.
  void step(std::int64_t first, int count) {
    std::vector<Spec> specs;
    for (int i = 0; i < count; ++i) specs.push_back(make_spec(a_, first + i));
    Fault fault = Fault::kNone;
    if (a_.fault_every > 0 && (first / a_.fault_every) != ((first + count) / a_.fault_every)) {
      std::mt19937_64 gen(a_.seed ^ static_cast<std::uint64_t>(first));
      // Across workers only the faults every worker sees alike are injected:
      // a replica that throws or skips closes the workers' link by design.
      static const Fault kLocal[] = {Fault::kThrow, Fault::kOtherDType, Fault::kOtherShape, Fault::kSkip,
                                     Fault::kOtherCall};
      static const Fault kAcross[] = {Fault::kOtherDType, Fault::kOtherShape, Fault::kOtherCall};
      fault = workers_ > 1 ? kAcross[gen() % std::size(kAcross)] : kLocal[gen() % std::size(kLocal)];
      // A skipped collective is the run's last: an earlier one would make the
      // skipping replica's next call meet the others' skipped one, a mismatch
      // of kinds or dtypes (a different documented error) or none at all.
      Spec& victim = fault == Fault::kSkip ? specs.back() : specs[gen() % specs.size()];
      if (fault == Fault::kOtherCall && victim.kind != Kind::kAllReduce && victim.kind != Kind::kAllGather) {
        victim.kind = Kind::kAllReduce;  // all_reduce <-> all_gather
        victim.leaves.resize(1);
      }
      victim.fault = fault;
      victim.faulty_replica = static_cast<int>(gen() % static_cast<std::uint64_t>(s_.num_replicas_in_sync()));
    }
    const int local = s_.num_local_replicas();
    std::vector<std::vector<std::vector<Tensor>>> results(static_cast<std::size_t>(local));
    const int n = s_.num_replicas_in_sync();
    const auto started = Clock::now();
    try {
      s_.run([&](ReplicaContext& ctx) {
        auto& mine = results[static_cast<std::size_t>(ctx.local_replica_id())];
        for (const Spec& spec : specs) {
          mine.push_back(perform(ctx, spec, input_of(a_, spec, ctx.replica_id_in_sync_group(), n)));
        }
      });
    } catch (const std::exception& e) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
      t_.collectives += count;
      if (fault == Fault::kNone) {
        ++t_.undocumented;
        std::fprintf(stderr, "distribute-soak: collectives %lld..%lld failed without a fault: %s\n",
                     static_cast<long long>(first), static_cast<long long>(first + count - 1), e.what());
        return;
      }
      ++t_.faults[static_cast<int>(fault)];
      t_.slowest_fault_ms = std::max(t_.slowest_fault_ms, ms);
      // Found, not waited out: well inside the collective timeout.
      const bool prompt = ms < 0.5 * 1000 * static_cast<double>(timeout().count());
      if (documented(fault, e) && prompt) {
        ++t_.documented;
      } else {
        ++t_.undocumented;
        std::fprintf(stderr, "distribute-soak: a replica that %s: the run ended in %s after %.0f ms: %s\n",
                     kFaultNames[static_cast<int>(fault)], typeid(e).name(), ms, e.what());
      }
      if (ms > 1000.0 * static_cast<double>(timeout().count())) ++t_.hangs;
      return;
    }
    if (fault != Fault::kNone) {
      ++t_.undocumented;
      std::fprintf(stderr, "distribute-soak: a replica that %s went unnoticed (collectives %lld..%lld)\n",
                   kFaultNames[static_cast<int>(fault)], static_cast<long long>(first),
                   static_cast<long long>(first + count - 1));
    }
    check(specs, results);
  }

  // Every local replica's result of every collective against the reference.
  void check(const std::vector<Spec>& specs, const std::vector<std::vector<std::vector<Tensor>>>& results) {
    const int n = s_.num_replicas_in_sync();
    const int local = s_.num_local_replicas();
    for (std::size_t c = 0; c < specs.size(); ++c) {
      const Spec& spec = specs[c];
      std::vector<std::vector<Tensor>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(input_of(a_, spec, r, n));
      ++t_.collectives;
      ++t_.checked;
      ++t_.by_kind[static_cast<int>(spec.kind)];
      for (std::size_t l = 0; l < spec.leaves.size(); ++l) {
        std::vector<Tensor> column;
        for (const auto& per : inputs) {
          column.push_back(per[l]);
          t_.bytes += static_cast<std::int64_t>(per[l].nbytes());
        }
        const Tensor expected = spec.kind == Kind::kAllGather ? testing::reference_gather(column, 0)
                                : workers_ > 1 ? testing::reference_reduce_multi_worker(spec.op, column, local)
                                               : testing::reference_reduce(spec.op, column);
        for (int r = 0; r < local; ++r) {
          const auto& got = results[static_cast<std::size_t>(r)][c];
          ++t_.results_checked;
          if (l >= got.size() || !testing::bitwise_equal(got[l], expected)) {
            if (++t_.wrong <= 5) {
              std::fprintf(stderr, "distribute-soak: collective %lld (%s, %s), local replica %d, leaf %zu: wrong\n",
                           static_cast<long long>(spec.index), kKindNames[static_cast<int>(spec.kind)],
                           std::string(to_string(spec.op)).c_str(), r, l);
            }
          }
        }
      }
    }
  }

  std::chrono::seconds timeout() const {
    return std::chrono::duration_cast<std::chrono::seconds>(
        s_.communication_options().timeout.value_or(std::chrono::seconds(60)));
  }

  const Args& a_;
  Strategy& s_;
  int workers_;
  std::atomic<std::int64_t> runs_done_{0};
  Tally t_;
  double seconds_ = 0;
  Resources after_warmup_;
  Resources at_end_;
};

int soak(const Args& a) {
  CommunicationOptions options;
  options.timeout = std::chrono::seconds(20);
  std::unique_ptr<Strategy> strategy;
  int workers = 1;
  if (a.strategy == "mirrored") {
    std::vector<std::string> devices;
    for (int i = 0; i < a.replicas; ++i) devices.push_back("CPU:" + std::to_string(i));
    strategy = std::make_unique<MirroredStrategy>(devices, options);
  } else {
#ifdef DISTRIBUTE_HAVE_MPI
    auto cluster = mpi::cluster_from_launcher();
    workers = cluster ? cluster->size() : 1;
    strategy = std::make_unique<MultiWorkerMirroredStrategy>(a.replicas, cluster, options);
#else
    throw UsageError("--strategy multi_worker needs a build with MPI");
#endif
  }
  const int worker = strategy->first_replica_id() / a.replicas;
  Soak soak(a, *strategy, workers);
  if (soak.chief()) {
    std::printf("distribute-soak: %s, %s collectives, sizes up to %s bytes, a fault every %s collectives, seed %llu\n",
                strategy->describe().c_str(), grouped(a.collectives).c_str(), grouped(a.max_bytes).c_str(),
                a.fault_every > 0 ? grouped(a.fault_every).c_str() : "(none)", static_cast<unsigned long long>(a.seed));
    std::fflush(stdout);
  }
  const Tally t = soak.run();
  const Resources& w = soak.after_warmup();
  const Resources& e = soak.at_end();
  // A worker that leaves normally: the last one destroys its strategy; the
  // others' next run has no partner and must say so at once.
  std::string leave_row;
  bool leave_ok = true;
  if (workers > 1) {
    if (worker == workers - 1) {
      strategy.reset();
      leave_row = "this worker left";
    } else {
      const auto started = Clock::now();
      std::string what = "the run completed without it";
      leave_ok = false;
      try {
        strategy->run([](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::kSum, constant(1.f)); });
      } catch (const Error& error) {
        what = std::string(to_string(error.code())) + ": " + error.message();
        leave_ok = error.code() == ErrorCode::kFailedPrecondition &&
                   error.message().find("worker " + std::to_string(workers - 1) + " has") != std::string::npos;
      }
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
      leave_ok = leave_ok && ms < 2000;
      char buf[64];
      std::snprintf(buf, sizeof buf, "seen after %.1f ms", ms);
      leave_row = buf;
      if (!leave_ok) std::fprintf(stderr, "distribute-soak: the last worker left: %s\n", what.c_str());
    }
  }
  // Memory may settle after warm-up (caches of each size class fill); it must
  // not keep growing with the number of collectives.
  const double kRssSlackMib = 64;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers' allocators keep freed memory in quarantine (ASan holds up
  // to 256 MiB): resident memory says nothing here; LeakSanitizer checks at exit.
  constexpr bool kJudgeMemory = false;
#else
  constexpr bool kJudgeMemory = true;
#endif
  const bool memory_ok = !kJudgeMemory || e.rss_mib - w.rss_mib <= kRssSlackMib;
  const bool handles_ok = e.fds == w.fds && e.threads == w.threads;
  const bool ok = t.wrong == 0 && t.undocumented == 0 && t.hangs == 0 && memory_ok && handles_ok && leave_ok;
  std::int64_t faults = 0;
  for (std::int64_t f : t.faults) faults += f;
  std::ostringstream out;
  out << "\n| " << (workers > 1 ? "worker " + std::to_string(worker) : "process") << " | |\n|---|---:|\n";
  out << "| collectives run | " << grouped(t.collectives) << " |\n";
  out << "| in runs without a fault: results checked | " << grouped(t.checked) << " |\n";
  for (int k = 0; k < 4; ++k) out << "| - " << kKindNames[k] << " | " << grouped(t.by_kind[k]) << " |\n";
  out << "| input bytes, all replicas | " << grouped(t.bytes) << " |\n";
  out << "| results compared bit for bit (local replicas x leaves) | " << grouped(t.results_checked) << " |\n";
  out << "| wrong results | " << grouped(t.wrong) << " |\n";
  out << "| faults injected | " << grouped(faults) << " |\n";
  for (int f = 1; f < 6; ++f) {
    if (t.faults[f] > 0) out << "| - a replica that " << kFaultNames[f] << " | " << grouped(t.faults[f]) << " |\n";
  }
  out << "| errors raised as documented (type, within half the timeout) | " << grouped(t.documented) << " |\n";
  out << "| errors not as documented | " << grouped(t.undocumented) << " |\n";
  out << "| slowest faulty run (ms) | " << static_cast<int>(t.slowest_fault_ms) << " |\n";
  out << "| hangs | " << t.hangs << " |\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "| RSS after warm-up / at end (MiB) | %.1f / %.1f |\n", w.rss_mib, e.rss_mib);
  out << buf;
  if (!kJudgeMemory) out << "| (RSS not judged: a sanitizer build) | |\n";
  out << "| open file descriptors after warm-up / at end | " << w.fds << " / " << e.fds << " |\n";
  out << "| threads after warm-up / at end | " << w.threads << " / " << e.threads << " |\n";
  if (!leave_row.empty()) out << "| the last worker leaves (its strategy destroyed) | " << leave_row << " |\n";
  std::snprintf(buf, sizeof buf, "| wall time (s) / collectives per second | %.1f / %s |\n", soak.seconds(),
                grouped(static_cast<std::int64_t>(static_cast<double>(t.collectives) / soak.seconds())).c_str());
  out << buf;
  out << (ok ? "distribute-soak: PASS\n" : "distribute-soak: FAIL\n");
  if (!memory_ok) out << "distribute-soak: RSS grew by more than " << kRssSlackMib << " MiB after warm-up\n";
  if (!handles_ok) out << "distribute-soak: file descriptors or threads changed after warm-up\n";
  if (!leave_ok) out << "distribute-soak: the others did not raise the documented error when the last worker left\n";
  std::cout << out.str() << std::flush;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace distribute::soak

int main(int argc, char** argv) {
  try {
    return distribute::soak::soak(distribute::soak::parse(argc, argv));
  } catch (const distribute::tools::UsageError& e) {
    std::fprintf(stderr,
                 "distribute-soak: %s\nusage: distribute-soak [--collectives N] [--replicas R] [--max-bytes B] "
                 "[--fault-every K] [--per-run M] [--seed S] [--strategy mirrored|multi_worker]\n",
                 e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distribute-soak: %s\n", e.what());
    return 1;
  }
}
