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
// (an optimizer's apply_gradients, a dataset's get_next, a cross-replica
// reduce): a step that makes one costs nothing more; a step that makes
// none gets one exchange of its own, after the step. Every worker learns
// of the request in the same agreement, so every worker stops after the
// same step (docs/checkpoints.md, "Preemption").
#pragma once

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
};

class PreemptionCheckpointHandler {
 public:
  // Restores `manager`'s latest checkpoint on every worker (TF's
  // restore_or_initialize), after tracking the handler's step count in its
  // checkpoint as "checkpointed_runs"; then handles SIGTERM and SIGINT
  // (while any handler lives; a second signal ends the process at once, as
  // the default action). Made and used in the cross-replica context, by
  // every worker alike.
  PreemptionCheckpointHandler(Strategy& strategy, CheckpointManager& manager, TerminationConfig config = {});
  // The last one alive puts the previous signal handlers back.
  ~PreemptionCheckpointHandler();
  PreemptionCheckpointHandler(const PreemptionCheckpointHandler&) = delete;
  PreemptionCheckpointHandler& operator=(const PreemptionCheckpointHandler&) = delete;

  // Runs one step (`step()`, whose value it returns), counts it, and if any
  // worker was asked to stop before the step's end, saves and exits.
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
  // from the checkpoint).
  std::int64_t total_run_calls() const { return runs_; }
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
  std::uint64_t agreements_ = 0;  // among the workers, at the end of the last step
  std::optional<std::string> saved_;
  int slot_ = 0;  // among the handlers the signal handler asks
};

}  // namespace distribute::train
