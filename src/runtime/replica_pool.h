// ReplicaPool: the threads a strategy owns to run its replicas. Replica 0 runs
// on the thread that called run(); replica i > 0 always runs on worker i, so
// a replica keeps its thread (and its caches) from one step to the next.
// Idle workers sleep on a condition variable: they burn no CPU between steps.
#pragma once

#include <cxxabi.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace distribute::internal {

// Calls body(). If it ends in a forced unwind (pthread_exit, or a thread
// cancellation), calls forced() and lets the unwinding go on: one caught and
// not rethrown ends the process. Any other exception calls other() (when
// given) and goes no further. (The catch binds a reference to
// abi::__forced_unwind, which the unwinding carries no C++ object for:
// UBSan's null check, which takes it for a null reference, is off here.)
template <class Body, class Forced, class Other>
__attribute__((no_sanitize("null"))) void with_forced_unwind(Body&& body, Forced&& forced, Other&& other) {
  try {
    body();
  } catch (abi::__forced_unwind&) {
    forced();
    throw;
  } catch (...) {
    other();
  }
}
template <class Body, class Forced>
__attribute__((no_sanitize("null"))) void with_forced_unwind(Body&& body, Forced&& forced) {
  try {
    body();
  } catch (abi::__forced_unwind&) {
    forced();
    throw;
  }
}

class ReplicaPool {
 public:
  explicit ReplicaPool(int replicas);
  ~ReplicaPool();
  ReplicaPool(const ReplicaPool&) = delete;
  ReplicaPool& operator=(const ReplicaPool&) = delete;

  // Calls task(i) for every replica i (task(0) on this thread) and returns
  // when all have returned. `task` must not throw, except the forced unwind
  // of pthread_exit: that thread ends (a worker is replaced at the next run;
  // on this thread the unwinding goes on once every worker has returned).
  // Not reentrant.
  void run(const std::function<void(int)>& task);

 private:
  void worker_loop(int replica);
  void stop_workers();
  void wait_for_workers();
  // Starts a new thread for each worker that ended in pthread_exit (mu_ held).
  void replace_ended_workers();

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<bool> ended_;  // per worker: it ended in pthread_exit (mu_)
  std::vector<std::thread> workers_;
};

// Tests: on this thread, the thread start that comes after `starts` more
// (in the pools it makes from now, and in run_on_new_threads) fails with std::system_error, as when
// the system has no thread to give; then the injection is off. -1 turns it
// off at once.
void fail_thread_starts_for_testing(int starts);

// Runs task(i) for i in [0, replicas) with task(0) on this thread and the
// others on new threads (for nested runs from inside a merge_fn). If replica
// r's thread cannot start, abort(r, error) must make the replicas already
// started return (they may be waiting for r), and must not throw; they are
// joined and the error is raised, before task(0) runs.
void run_on_new_threads(int replicas, const std::function<void(int)>& task,
                        const std::function<void(int, const std::exception_ptr&)>& abort);

}  // namespace distribute::internal
