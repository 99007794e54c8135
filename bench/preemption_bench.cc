// distribute-preemption-bench: what a PreemptionCheckpointHandler costs a
// training step when nothing is signalled (docs/benchmarks.md, "Preemption").
//
//   distribute-preemption-bench [--replicas 2] [--steps 20000] [--blocks 30] [--exchange-budget 0.001]
//                               [--max-steps-between-exchanges 10000]   (1: an exchange after every step)
//   mpirun -np 2 distribute-preemption-bench --replicas 1 ...   (2 workers x 1 replica)
//
// A step is one strategy.run of an 8-byte (2 x float32) all_reduce through
// the API; under mpirun, the strategy is a MultiWorkerMirroredStrategy. The
// ways, in blocks of --steps steps, alternating block by block (every worker
// runs the same sequence):
//   plain:      the step, no handler alive;
//   installed:  the step, a handler alive (its signal handlers in place), not called;
//   run:        handler.run(step);
//   reduce:     the step and a strategy.reduce of its result (an agreement among the workers);
//   run+reduce: handler.run of that.
// A handler is made for each block of the ways that have one, and its first
// steps (which measure what spaces its exchanges) are not timed; a block
// should hold several of its exchanges (the table's last line says how far
// apart they are). Each
// block's time per step; per way the median and min over the blocks
// (worker 0's clock), and the median's ratio to its plain counterpart.
#include <distribute/distribute.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_strategy.h"

using namespace distribute;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) { bench::die("distribute-preemption-bench", what); }

int positive(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || v < 1 || v > 1000000) die(flag + " must be a positive integer");
  return static_cast<int>(v);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int replicas = 2, steps = 20000, blocks = 30;
  train::TerminationConfig config;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc)
      die("usage: distribute-preemption-bench [--replicas N] [--steps N] [--blocks N] [--exchange-budget X] "
          "[--max-steps-between-exchanges N]");
    const std::string value = argv[++i];
    if (flag == "--replicas") {
      replicas = positive(flag, value);
    } else if (flag == "--steps") {
      steps = positive(flag, value);
    } else if (flag == "--blocks") {
      blocks = positive(flag, value);
    } else if (flag == "--exchange-budget") {
      config.exchange_budget = std::atof(value.c_str());
    } else if (flag == "--max-steps-between-exchanges") {
      config.max_steps_between_exchanges = positive(flag, value);
    } else {
      die("unknown flag " + flag);
    }
  }
  try {
    const std::unique_ptr<Strategy> owned = bench::make_bench_strategy(replicas);
    Strategy& strategy = *owned;
    const auto* mw = dynamic_cast<const MultiWorkerMirroredStrategy*>(&strategy);
    const bool workers = mw != nullptr && mw->num_workers() > 1;
    const bool chief = strategy.first_replica_id() == 0;
    const int n = strategy.num_replicas_in_sync();

    // One job, one directory: worker 0's pid names it (an all_reduce of it).
    auto from_worker_0 = [&](std::int64_t value) {
      auto r = strategy.run([&](ReplicaContext& ctx) {
        return ctx.all_reduce(ReduceOp::kSum, constant(ctx.replica_id_in_sync_group() == 0 ? value : std::int64_t{0}));
      });
      return strategy.experimental_local_results(r)[0].scalar<std::int64_t>();
    };
    const fs::path dir =
        fs::temp_directory_path() / ("distribute-preemption-bench-" + std::to_string(from_worker_0(::getpid())));
    // (Made in the scope: the checkpoint's workers are its variables' strategy's.)
    std::optional<Variable> tracked;
    {
      auto scope = strategy.scope();
      tracked.emplace(constant(std::int64_t{0}), VariableOptions{.name = "tracked"});
    }
    train::Checkpoint ckpt({{"tracked", *tracked}});
    train::CheckpointManager manager(ckpt, dir.string(), 1);

    // The step, checked after each block: every replica's sum is n x its input.
    const Tensor input = constant(std::vector<float>{1.f, 2.f}, Shape{2});
    std::int64_t wrong = 0;
    PerReplica<Tensor> last;
    auto step = [&] {
      last = strategy.run([&](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, input); });
    };
    auto step_and_reduce = [&] {
      step();
      const Tensor total = strategy.reduce(ReduceOp::kSum, last, std::nullopt);  // an agreement among the workers
      const auto t = total.flat<float>();
      if (t[0] != static_cast<float>(n * n) || t[1] != static_cast<float>(2 * n * n)) ++wrong;
    };
    auto check = [&] {
      for (const Tensor& r : strategy.experimental_local_results(last)) {
        const auto v = r.flat<float>();
        if (v[0] != static_cast<float>(n) || v[1] != static_cast<float>(2 * n)) ++wrong;
      }
    };
    // Microseconds per step of one block of `steps`.
    auto block = [&](const std::function<void()>& one) {
      const auto t0 = Clock::now();
      for (int k = 0; k < steps; ++k) one();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / steps;
      check();
      return us;
    };

    enum Way { kPlain, kInstalled, kRun, kReduce, kRunReduce, kWays };
    const char* names[kWays] = {"plain", "installed", "run", "reduce", "run+reduce"};
    const char* what[kWays] = {"the step, no handler alive", "the step, a handler alive, not called",
                               "handler.run(step)", "the step and a strategy.reduce of it",
                               "handler.run(step and reduce)"};
    const Way baseline[kWays] = {kPlain, kPlain, kPlain, kReduce, kReduce};
    std::vector<std::vector<double>> times(kWays);
    std::int64_t spacing = 1;            // the handler's steps between its own exchanges, at the end
    for (int b = -1; b < blocks; ++b) {  // block -1: the warm-up, not recorded
      double t[kWays];
      t[kPlain] = block(step);
      t[kReduce] = block(step_and_reduce);
      {
        train::PreemptionCheckpointHandler handler(strategy, manager, config);
        // Its first exchanges measure what spaces the later ones: untimed.
        for (int k = 0; k < 10; ++k) handler.run(step);
        t[kInstalled] = block(step);
        t[kRun] = block([&] { handler.run(step); });
        t[kRunReduce] = block([&] { handler.run(step_and_reduce); });
        spacing = handler.steps_between_exchanges();
      }
      if (b >= 0) {
        for (int w = 0; w < kWays; ++w) times[static_cast<std::size_t>(w)].push_back(t[w]);
      }
    }
    from_worker_0(0);  // every worker is done with the directory
    if (chief) {
      fs::remove_all(dir);
      std::printf("# distribute-preemption-bench: a step = one 8-byte all_reduce through the API; %s\n",
                  strategy.describe().c_str());
      std::printf(
          "# %d blocks of %d steps per way, the ways alternating block by block; exchange budget %g; us per step\n",
          blocks, steps, config.exchange_budget);
      std::printf("# %-11s %-40s %10s %10s %14s\n", "way", "what", "median", "min", "median / base");
      for (int w = 0; w < kWays; ++w) {
        const auto& v = times[static_cast<std::size_t>(w)];
        const double m = median(v);
        const double base = median(times[static_cast<std::size_t>(baseline[w])]);
        std::printf("  %-11s %-40s %10.2f %10.2f %8.3f (%s)\n", names[w], what[w], m,
                    *std::min_element(v.begin(), v.end()), m / base, names[baseline[w]]);
      }
      if (workers) {
        std::printf("# the handler's own exchanges (run): one per %lld steps\n", static_cast<long long>(spacing));
      } else {
        std::printf("# the handler's own exchanges: none (one worker reads its own request)\n");
      }
      std::printf("# wrong results: %lld\n", static_cast<long long>(wrong));
    }
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    die(e.what());
  }
}
