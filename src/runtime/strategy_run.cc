// Strategy::run_replicas: one run of a function on every local replica, taking
// turns with the strategy's other runs; and the helpers that describe a run's
// errors, its results' structures and its merge_calls' types.
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

#include "core/seconds.h"
#include "distribute/internal/exception_text.h"
#include "distribute/replica_context.h"
#include "distribute/strategy.h"
#include "runtime/mode.h"
#include "runtime/replica_channel.h"
#include "runtime/replica_pool.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"
#include "runtime/strategy_internal.h"

namespace distribute {
namespace internal {

namespace {
std::atomic<ExceptionDescriber> exception_describer{nullptr};
}  // namespace

void set_exception_describer(ExceptionDescriber describer) noexcept { exception_describer.store(describer); }

std::string describe_exception(const std::exception_ptr& e) {
  if (const ExceptionDescriber describer = exception_describer.load()) {
    if (std::optional<std::string> text = describer(e)) return *std::move(text);
  }
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return std::string(to_string(err.code())) + ": " + err.message();
  } catch (const std::exception& ex) {
    int status = 0;
    char* name = abi::__cxa_demangle(typeid(ex).name(), nullptr, nullptr, &status);
    std::string type = status == 0 && name ? name : typeid(ex).name();
    std::free(name);
    return type + ": " + ex.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void throw_different_result_structures(std::string_view api, int first_replica,
                                       const std::vector<std::string>& structures) {
  std::size_t m = 1;
  while (m < structures.size() && structures[m] == structures[0]) ++m;
  const std::string a = "replica " + std::to_string(first_replica);
  const std::string b = "replica " + std::to_string(first_replica + static_cast<int>(m));
  std::string message = std::string(api) + ": the replicas returned results of different structures (" + a + ": " +
                        structures[0] + "; " + b + ": " + structures[m] + ")";
  if (const auto d = first_structure_difference(structures[0], structures[m])) {
    message += ". They first differ at" + d->path + ": " + a + " has " + d->a + ", " + b + " has " + d->b;
  }
  throw InvalidArgumentError(message +
                             ". Every replica must return a result of the same structure (TensorFlow's "
                             "regroup refuses others).");
}

}  // namespace internal

namespace {
// Takes the turn of a run at one depth (runs of one strategy take turns),
// within `timeout` seconds (0: none): DeadlineExceededError past it, a
// warning on stderr every `stall` seconds (0: none).
void take_turn(std::unique_lock<std::mutex>& run_lock, std::string_view api, const Strategy& strategy, double timeout,
               double stall) {
  if (run_lock.try_lock()) return;
  // Another run of this strategy is in progress on another thread. A thread
  // that one of its replicas started, and waits for, would wait here for
  // ever: that run holds every replica. The strategy's timeout bounds the
  // wait, and the stall warning names it.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = internal::deadline_after(start, timeout);
  Clock::time_point warn_at = internal::deadline_after(start, stall);
  const std::string waiting = std::string(api) + " of " + strategy.describe() +
                              " waits for another run of it, in progress on another thread, to end (runs of one "
                              "strategy take turns; a thread that a replica started cannot run the same strategy "
                              "while that replica waits for it: that run holds every replica)";
  // Polled, with sleeps growing to 1 ms: the wait is rare (a contended
  // strategy), and a timed lock (pthread_mutex_clocklock) is one that
  // ThreadSanitizer does not see taken.
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    if (deadline == Clock::time_point::max() && warn_at == Clock::time_point::max()) {
      run_lock.lock();
      return;
    }
    if (run_lock.try_lock()) return;
    const Clock::time_point now = Clock::now();
    const double waited = std::chrono::duration<double>(now - start).count();
    if (now >= deadline) {
      throw DeadlineExceededError(std::string(api) + " timed out after " + std::to_string(waited).substr(0, 5) +
                                  " s: " + waiting);
    }
    if (now >= warn_at) {
      std::fprintf(stderr, "distribute: warning: %s; waited %.1f s\n", waiting.c_str(), waited);
      warn_at = internal::deadline_after(now, stall);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(2 * pause, std::chrono::milliseconds(1));
  }
}
}  // namespace

// Kept whole: the run's turn (run_lock), its scope and the Running flag span
// every replica thread, and the errors replica_main records are chosen (the
// abort's origin first) only once the last thread has ended.
// NOLINTNEXTLINE(readability-function-size): the run's guards must visibly span its threads.
void Strategy::run_replicas(const std::function<void(ReplicaContext&)>& body, std::string_view api) {
  require_cross_replica_or_default(api);
  const int depth = internal::current_merge_depth(*this) + 1;
  const int n = num_local_replicas();
  internal::RunResources& res = state_->resources(depth, n, state_->stall_warning_seconds);
  // Runs of one strategy at one depth take turns: concurrent top-level runs from
  // several threads, or nested runs from merge_fns of default contexts on two threads.
  std::unique_lock<std::mutex> run_lock(res.mutex, std::defer_lock);
  take_turn(run_lock, api, *this, options_.timeout ? options_.timeout->count() : 0, state_->stall_warning_seconds);
  res.reset();
  StrategyScope scope_guard = scope();

  std::vector<ReplicaContext>& contexts = res.contexts;
  if (contexts.empty()) {
    contexts.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      contexts.emplace_back(internal::Access::replica_context_key(), *this, first_replica_id_ + i, i,
                            &res.channels[static_cast<std::size_t>(i)]);
    }
  }
  struct Running {
    std::atomic<bool>& flag;
    explicit Running(std::atomic<bool>& f) : flag(f) { flag.store(true, std::memory_order_release); }
    ~Running() { flag.store(false, std::memory_order_release); }
  } running(res.running);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  const std::function<void(int)> replica_main = [&](int i) {
    const auto idx = static_cast<std::size_t>(i);
    {
      internal::ModeGuard mode(internal::ModeEntry{this, nullptr, &contexts[idx], 1, -1});
      internal::DeviceScope device(devices_[idx]);
      internal::with_forced_unwind(
          [&] { body(contexts[idx]); },
          [&] {
            // pthread_exit (or a cancellation) in the replica function: its
            // thread ends, so must this replica's part. The others are told,
            // and the run raises this in its place.
            errors[idx] = std::make_exception_ptr(FailedPreconditionError(
                "Replica " + std::to_string(first_replica_id_ + i) +
                " called pthread_exit (or its thread was cancelled) inside its replica function: its thread ended "
                "there, and so did its part of the run"));
            res.abort(ErrorCode::kAborted,
                      "Replica " + std::to_string(first_replica_id_ + i) +
                          " ended its thread (pthread_exit) inside its replica function; the collectives of the other "
                          "replicas were aborted.",
                      i);
            res.local->mark_done(i);
          },
          [&] {
            errors[idx] = std::current_exception();
            // An error every replica raised alike leaves nobody waiting: the
            // workers' link stays usable. Anything else aborts the others.
            if (!res.channels[idx].agreed_failure) {
              res.abort(ErrorCode::kAborted,
                        "Replica " + std::to_string(first_replica_id_ + i) + " failed with " +
                            internal::describe_exception(errors[idx]) +
                            "; the collectives of the other replicas were aborted.",
                        i);
            }
          });
    }
    res.local->mark_done(i);
  };
  if (depth == 0) {
    state_->pool.run(replica_main);
  } else {
    // Made before any thread starts: the abort must not fail for want of memory.
    const std::string cannot_start =
        "A replica of a nested run could not start; the collectives of the other replicas were aborted.";
    internal::run_on_new_threads(n, replica_main, [&](int i, const std::exception_ptr& error) noexcept {
      try {
        res.abort(ErrorCode::kAborted,
                  "Replica " + std::to_string(first_replica_id_ + i) + " of a nested run could not start (" +
                      internal::describe_exception(error) + "); the collectives of the other replicas were aborted.",
                  i);
      } catch (...) {
        res.abort(ErrorCode::kAborted, cannot_start, i);
      }
    });
  }
  // The last merge_fn's result (and a copy job's tensors) would otherwise
  // stay in the group's entries until the next run.
  res.local->drop_objects();

  const int origin = res.local->abort_origin();
  if (origin >= 0 && errors[static_cast<std::size_t>(origin)]) {
    std::rethrow_exception(errors[static_cast<std::size_t>(origin)]);
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace distribute
