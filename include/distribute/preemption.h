// File: preemption.h
//
// Surviving preemption, as tf.distribute.experimental.PreemptionCheckpointHandler:
// a SIGTERM (or Ctrl-C) to any worker makes every worker finish the same
// step, save a checkpoint and exit with one code (42, TensorFlow's).
//
//   train::CheckpointManager manager(ckpt, "/tmp/run", 1);
//   train::PreemptionCheckpointHandler handler(strategy, manager);  // restores the latest
//   for (auto step = handler.total_run_calls(); step < steps; ++step) {
//     handler.run([&] { strategy.run(train_step, dataset.get_next()); });
//   }
//
// The request travels in the agreements that the workers make anyway
// (an optimizer's first apply_gradients, a dataset's get_next, a
// cross-replica reduce): a step that makes one costs nothing more. Steps
// that make none get an exchange of the handler's own after some of them,
// spaced to cost at most 0.1% of their time (TerminationConfig). Every worker
// learns of the request in the same agreement, so every worker stops after
// the same step (docs/checkpoints.md, "Preemption").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "distribute/checkpoint.h"
#include "distribute/strategy.h"
#include "distribute/variables.h"

namespace distribute::train {

// tf.distribute.experimental.TerminationConfig, for a plain Linux host.
struct TerminationConfig {
  // Called on every worker once the checkpoint is saved; by default
  // std::exit(exit_code) (exit handlers run: MPI is finalised). One that
  // returns makes run() throw CancelledError.
  std::function<void()> exit_fn;
  int exit_code = 42;
  // Steps that make no agreement among the workers (only collectives inside
  // the step, which check their signatures in their data) carry no request:
  // the handler exchanges the requests after some of them. It spaces the
  // exchanges (the same steps on every worker, agreed in each exchange) so
  // that they cost at most `exchange_budget` of the steps' measured time,
  // and so that, at the steps' speed as measured, a request waits at most
  // `max_stop_delay_seconds`, and at most `max_steps_between_exchanges`
  // steps. 1 exchanges after every such step.
  double exchange_budget = 0.001;
  double max_stop_delay_seconds = 1.0;
  std::int64_t max_steps_between_exchanges = 10000;
};

class PreemptionCheckpointHandler {
 public:
  // Restores `manager`'s latest checkpoint on every worker (TF's
  // restore_or_initialize), after tracking the handler's step count in its
  // checkpoint as "checkpointed_runs"; then handles SIGTERM and SIGINT
  // (while any handler lives; a second signal ends the process at once, as
  // the default action). `strategy` must be the one whose workers save the
  // checkpoint (its variables'), else InvalidArgumentError. Made and used
  // in the cross-replica context, by
  // every worker alike.
  PreemptionCheckpointHandler(Strategy& strategy, CheckpointManager& manager, TerminationConfig config = {});
  // The last one alive puts the previous signal handlers back. A handler
  // must go before its manager and checkpoint (declare it after them).
  ~PreemptionCheckpointHandler();
  PreemptionCheckpointHandler(const PreemptionCheckpointHandler&) = delete;
  PreemptionCheckpointHandler& operator=(const PreemptionCheckpointHandler&) = delete;

  // Runs one step (`step()`, whose value it returns), counts it, and if a
  // request of any worker has reached an agreement among the workers (see
  // above: at once where steps make agreements, else at the next of the
  // handler's exchanges), saves and exits. A save made inside `step` holds
  // the count without that step (it is counted once the step returns).
  template <class Step>
  decltype(auto) run(Step&& step) {
    if constexpr (std::is_void_v<std::invoke_result_t<Step&>>) {
      step();
      save_checkpoint_if_preempted();
    } else {
      decltype(auto) result = step();
      save_checkpoint_if_preempted();
      return result;
    }
  }
  // What run() does after its step, for loops that do not wrap their step
  // in run(): call it once per step, after the step.
  void save_checkpoint_if_preempted();

  // Steps run, those of the runs before the restart included (restored
  // from the checkpoint as "checkpointed_runs", which every save of the
  // manager's checkpoint holds current, a periodic one too).
  std::int64_t total_run_calls() const { return runs_; }
  // The steps the workers last agreed to go, where steps make no agreement,
  // between the handler's own exchanges: how many steps a request may wait
  // (1 until the first exchanges are measured; always 1 for one worker).
  std::int64_t steps_between_exchanges() const { return interval_; }
  // The path the preemption's checkpoint was saved to (once it was).
  const std::optional<std::string>& saved_path() const { return saved_; }
  // As if this worker got SIGTERM now (tests, and programs with signals of
  // their own).
  void request_stop() noexcept;

 private:
  Strategy* strategy_;
  CheckpointManager* manager_;
  TerminationConfig config_;
  Variable checkpointed_runs_;
  std::int64_t runs_ = 0;
  int workers_ = 1;
  std::uint64_t agreements_ = 0;  // among the workers, at the end of the last step
  // The handler's own exchanges: the run of the last agreement (any) and
  // when it ended, the agreed steps between exchanges, the last one's time.
  std::int64_t last_agreed_run_ = 0;
  std::chrono::steady_clock::time_point last_mark_;
  std::int64_t interval_ = 1;
  double exchange_seconds_ = 0;
  // The steps between exchanges this worker proposes, for steps of `step` seconds.
  std::int64_t next_interval(double step) const;
  std::optional<std::string> saved_;
  int slot_ = 0;  // among the handlers the signal handler asks
};

}  // namespace distribute::train
