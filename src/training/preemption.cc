#include "distribute/preemption.h"

#include <signal.h>

#include <atomic>
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
  manager.checkpoint().track("checkpointed_runs", checkpointed_runs_);
  manager.restore_or_initialize();
  runs_ = checkpointed_runs_.read_value().scalar<std::int64_t>();
  agreements_ = internal::worker_agreements(strategy);
  internal::clear_stop(strategy);
  const std::lock_guard<std::mutex> lock(g_install_mutex);
  int slot = 0;
  while (slot < kMaxHandlers && g_requests[slot].load() != nullptr) ++slot;
  if (slot == kMaxHandlers) {
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
  const std::lock_guard<std::mutex> lock(g_install_mutex);
  g_requests[slot_].store(nullptr);
  if (--g_installed == 0) {
    sigaction(SIGTERM, &g_previous_term, nullptr);
    sigaction(SIGINT, &g_previous_int, nullptr);
  }
}

void PreemptionCheckpointHandler::request_stop() noexcept { internal::stop_request(*strategy_).store(true); }

void PreemptionCheckpointHandler::save_checkpoint_if_preempted() {
  ++runs_;
  // A step that made no agreement among the workers carries no request:
  // one exchange, of nothing but the requests.
  if (internal::worker_place(*strategy_).count > 1 && internal::worker_agreements(*strategy_) == agreements_) {
    internal::exchange_across_workers(*strategy_, std::string(), "PreemptionCheckpointHandler");
  }
  agreements_ = internal::worker_agreements(*strategy_);
  if (!internal::stop_agreed(*strategy_)) return;
  checkpointed_runs_.assign(constant(runs_));
  saved_ = manager_->save(std::nullopt, /*check_interval=*/false);
  manager_->sync();
  std::cerr << "distribute: PreemptionCheckpointHandler: a worker was asked to stop; every worker stopped after step "
            << runs_ << " and saved " << saved_.value_or("(nothing)") << ". Exiting." << std::endl;
  if (config_.exit_fn) {
    config_.exit_fn();
  } else {
    std::exit(config_.exit_code);
  }
  throw CancelledError("PreemptionCheckpointHandler: stopped after step " + std::to_string(runs_) + ", saved " +
                       saved_.value_or("(nothing)") + "; its exit_fn returned");
}

}  // namespace distribute::train
