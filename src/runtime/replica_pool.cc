#include "runtime/replica_pool.h"

#include <pthread.h>

#include <cerrno>
#include <cstdio>
#include <system_error>
#include <utility>

namespace distribute::internal {
namespace {

// fail_thread_starts_for_testing: this thread's pool thread starts left
// before one fails (negative: none fails).
thread_local int starts_before_failure = -1;

// Names the thread "dist replica N" (what top, gdb and the tests' hang
// watchdog show). Linux allows 15 characters; longer names are cut.
void name_replica_thread(int replica) {
  char name[16];
  std::snprintf(name, sizeof name, "dist replica %d", replica);
  ::pthread_setname_np(::pthread_self(), name);
}

// Where a replica thread starts: the injection point of
// fail_thread_starts_for_testing.
template <class Body>
void start_thread(std::vector<std::thread>& threads, Body&& body) {
  if (starts_before_failure >= 0 && starts_before_failure-- == 0) {
    throw std::system_error(EAGAIN, std::generic_category(), "could not start a replica thread (injected)");
  }
  threads.emplace_back(std::forward<Body>(body));
}

}  // namespace

void fail_thread_starts_for_testing(int starts) { starts_before_failure = starts; }

ReplicaPool::ReplicaPool(int replicas) : ended_(static_cast<std::size_t>(replicas > 1 ? replicas - 1 : 0), false) {
  workers_.reserve(static_cast<std::size_t>(replicas > 1 ? replicas - 1 : 0));
  try {
    for (int r = 1; r < replicas; ++r) start_thread(workers_, [this, r] { worker_loop(r); });
  } catch (...) {
    // The threads already started must be stopped and joined here: no
    // destructor runs for a half-made pool, and a joinable std::thread
    // destroyed unjoined ends the process.
    stop_workers();
    throw;
  }
}

ReplicaPool::~ReplicaPool() { stop_workers(); }

void ReplicaPool::replace_ended_workers() {
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    if (!ended_[w]) continue;
    if (workers_[w].joinable()) workers_[w].join();  // it has returned already
    const int r = static_cast<int>(w) + 1;
    // (If the start fails, the run raises it; the slot is tried again at the next.)
    workers_[w] = std::thread([this, r] { worker_loop(r); });
    ended_[w] = false;
  }
}

void ReplicaPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();  // (a slot whose replacement failed to start holds none)
  }
}

void ReplicaPool::worker_loop(int replica) {
  name_replica_thread(replica);
  std::uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    // The replica called pthread_exit: this thread ends (the unwinding goes
    // on); the next run starts another in its place.
    with_forced_unwind([&] { (*task)(replica); },
                       [&] {
                         std::lock_guard<std::mutex> lock(mu_);
                         ended_[static_cast<std::size_t>(replica - 1)] = true;
                         if (--pending_ == 0) done_cv_.notify_one();
                       });
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ReplicaPool::run(const std::function<void(int)>& task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    replace_ended_workers();
    task_ = &task;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  // Replica 0 calling pthread_exit: the workers still run `task`, which lives
  // in a frame this unwinding is about to leave; they are waited for first.
  with_forced_unwind([&] { task(0); }, [&] { wait_for_workers(); });
  wait_for_workers();
}

void ReplicaPool::wait_for_workers() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
}

void run_on_new_threads(int replicas, const std::function<void(int)>& task,
                        const std::function<void(int, const std::exception_ptr&)>& abort) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(replicas > 1 ? replicas - 1 : 0));
  try {
    for (int r = 1; r < replicas; ++r) {
      start_thread(threads, [&task, r] {
        name_replica_thread(r);
        task(r);
      });
    }
  } catch (...) {
    // The replicas started may be waiting in collectives for those that
    // never will be: abort their collectives, so that they return, and join
    // them (a joinable thread destroyed unjoined ends the process).
    abort(static_cast<int>(threads.size()) + 1, std::current_exception());
    for (auto& t : threads) t.join();
    throw;
  }
  // (On a forced unwind, they run `task`, in a frame the unwinding leaves.)
  with_forced_unwind([&] { task(0); },
                     [&] {
                       for (auto& t : threads) t.join();
                     });
  for (auto& t : threads) t.join();
}

}  // namespace distribute::internal
