#include "distribute/preemption.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>

#include "distribute/errors.h"
#include "runtime/worker_agreement.h"

namespace distribute::train {

namespace {

// The stop requests of the handlers alive (their strategies'), set by the
// signal handler: lock-free atomics only. Several handlers live together
// where several workers share a process (tests); a signal asks all of them.
constexpr int kMaxHandlers = 16;
std::atomic<std::atomic<bool>*> g_requests[kMaxHandlers];
std::mutex g_install_mutex;  // installs and removals (never the signal handler)
int g_installed = 0;
struct sigaction g_previous_term {};
struct sigaction g_previous_int {};

extern "C" void on_termination_signal(int signal_number) {
  bool first = false;
  for (auto& slot : g_requests) {
    if (std::atomic<bool>* request = slot.load()) first = !request->exchange(true) || first;
  }
  if (!first) {
    // A second signal: the usual end, at once.
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
  }
}

}  // namespace

PreemptionCheckpointHandler::PreemptionCheckpointHandler(Strategy& strategy, CheckpointManager& manager,
                                                         TerminationConfig config)
    : strategy_(&strategy),
      manager_(&manager),
      config_(std::move(config)),
      checkpointed_runs_(constant(std::int64_t{0}), VariableOptions{.name = "checkpointed_runs", .trainable = false}) {
  if (!(config_.exchange_budget > 0) || !(config_.max_stop_delay_seconds > 0) ||
      config_.max_steps_between_exchanges < 1) {
    throw InvalidArgumentError(
        "PreemptionCheckpointHandler: TerminationConfig needs exchange_budget > 0, max_stop_delay_seconds > 0 and "
        "max_steps_between_exchanges >= 1, got " +
        std::to_string(config_.exchange_budget) + ", " + std::to_string(config_.max_stop_delay_seconds) + " and " +
        std::to_string(config_.max_steps_between_exchanges));
  }
  // The workers that save together must be those that agree on the stop:
  // a handler on another strategy (the default one, outside any scope)
  // would stop its worker alone and leave the others waiting.
  if (Strategy* coord = manager.checkpoint().coordinator(); coord != nullptr && coord != &strategy) {
    throw InvalidArgumentError("PreemptionCheckpointHandler: the checkpoint's variables belong to " +
                               coord->describe() + ", whose workers save together, but the handler was given " +
                               strategy.describe() + ": pass the variables' strategy (in Python: strategy=...)");
  }
  manager.checkpoint().track("checkpointed_runs", checkpointed_runs_);
  manager.restore_or_initialize();
  runs_ = checkpointed_runs_.read_value().scalar<std::int64_t>();
  workers_ = internal::worker_place(strategy).count;
  agreements_ = internal::worker_agreements(strategy);
  last_agreed_run_ = runs_;
  last_mark_ = std::chrono::steady_clock::now();
  internal::clear_stop(strategy);
  // Every save of the checkpoint (not only the preemption's, as in TF) holds
  // the count, so that a run resumed from any restarts total_run_calls()
  // where it was; assigned as the save begins, not at every step.
  manager.checkpoint().before_write(this, [this] { checkpointed_runs_.assign(constant(runs_)); });
  const std::lock_guard<std::mutex> lock(g_install_mutex);
  int slot = 0;
  while (slot < kMaxHandlers && g_requests[slot].load() != nullptr) ++slot;
  if (slot == kMaxHandlers) {
    manager.checkpoint().before_write(this, {});
    throw FailedPreconditionError("PreemptionCheckpointHandler: " + std::to_string(kMaxHandlers) +
                                  " handlers are alive in this process already");
  }
  slot_ = slot;
  g_requests[slot].store(&internal::stop_request(strategy));
  if (g_installed++ == 0) {
    struct sigaction action {};
    action.sa_handler = on_termination_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // the library's system calls go on
    sigaction(SIGTERM, &action, &g_previous_term);
    sigaction(SIGINT, &action, &g_previous_int);
  }
}

PreemptionCheckpointHandler::~PreemptionCheckpointHandler() {
  manager_->checkpoint().before_write(this, {});
  const std::lock_guard<std::mutex> lock(g_install_mutex);
  g_requests[slot_].store(nullptr);
  if (--g_installed == 0) {
    sigaction(SIGTERM, &g_previous_term, nullptr);
    sigaction(SIGINT, &g_previous_int, nullptr);
  }
}

// Steps between exchanges such that one exchange costs at most the budget
// of their time, bounded by the delay a request may wait.
std::int64_t PreemptionCheckpointHandler::next_interval(double step) const {
  if (!(step > 0) || !(exchange_seconds_ > 0)) return 1;  // not measured yet
  const double for_budget = std::ceil(exchange_seconds_ / (config_.exchange_budget * step));
  const double for_delay = std::floor(config_.max_stop_delay_seconds / step);
  // (At most 1e15: a double past int64's range would not convert.)
  const double steps_between =
      std::min({for_budget, for_delay, static_cast<double>(config_.max_steps_between_exchanges), 1e15});
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(steps_between));
}

void PreemptionCheckpointHandler::request_stop() noexcept { internal::stop_request(*strategy_).store(true); }

void PreemptionCheckpointHandler::save_checkpoint_if_preempted() {
  ++runs_;
  // What an ordinary step costs (no agreement, no exchange due): a count, a
  // load and two comparisons; no clock read, which at a step of half a
  // microsecond would show.
  using Clock = std::chrono::steady_clock;
  if (workers_ > 1) {
    if (internal::worker_agreements(*strategy_) != agreements_) {
      last_agreed_run_ = runs_;  // the step carried every request
      last_mark_ = Clock::now();
    } else if (runs_ - last_agreed_run_ >= interval_) {
      // Steps with no agreement: an exchange of the requests, which also
      // agrees on when the next one comes (the largest proposal).
      const auto now = Clock::now();
      const double step =
          std::chrono::duration<double>(now - last_mark_).count() / static_cast<double>(runs_ - last_agreed_run_);
      const std::string proposal = std::to_string(next_interval(step));
      const auto all = internal::exchange_across_workers(*strategy_, proposal, "PreemptionCheckpointHandler");
      std::int64_t agreed = 1;
      for (const std::string& p : all) agreed = std::max(agreed, static_cast<std::int64_t>(std::stoll(p)));
      interval_ = agreed;
      last_agreed_run_ = runs_;
      last_mark_ = Clock::now();
      exchange_seconds_ = std::chrono::duration<double>(last_mark_ - now).count();
    } else {
      return;  // no agreement since the last look, so no request either
    }
    agreements_ = internal::worker_agreements(*strategy_);
  }
  if (!internal::stop_agreed(*strategy_)) return;
  saved_ = manager_->save(std::nullopt, /*check_interval=*/false);
  manager_->sync();
  const internal::WorkerPlace place = internal::worker_place(*strategy_);
  // One write, so that the lines of workers sharing a terminal do not mix.
  const std::string line =
      "distribute: PreemptionCheckpointHandler: " +
      (place.count > 1 ? "worker " + std::to_string(place.rank) + " of " + std::to_string(place.count) + ": "
                       : std::string()) +
      "a worker was asked to stop; every worker stopped after step " + std::to_string(runs_) + " and saved " +
      saved_.value_or("(nothing)") + ". Exiting.\n";
  std::cerr << line << std::flush;
  if (config_.exit_fn) {
    config_.exit_fn();
  } else {
    std::exit(config_.exit_code);
  }
  throw CancelledError("PreemptionCheckpointHandler: stopped after step " + std::to_string(runs_) + ", saved " +
                       saved_.value_or("(nothing)") + "; its exit_fn returned");
}

}  // namespace distribute::train
