#include "comm/threads/local_group.h"

#include <chrono>
#include <cstdio>
#include <sstream>

namespace distribute::internal {
namespace {
using Clock = std::chrono::steady_clock;

std::string op_label(const CollectiveCall& call) {
  return std::string(call.op) + " #" + std::to_string(call.sequence);
}

Clock::time_point after(Clock::time_point start, double seconds) {
  if (seconds <= 0) return Clock::time_point::max();
  return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}
}  // namespace

LocalGroup::LocalGroup(int size)
    : size_(size), arrived_(static_cast<std::size_t>(size)), done_(static_cast<std::size_t>(size)),
      last_op_(static_cast<std::size_t>(size)) {
  if (size <= 0) throw InvalidArgumentError("LocalGroup: size must be positive, got " + std::to_string(size));
  slots_[0].resize(static_cast<std::size_t>(size));
  slots_[1].resize(static_cast<std::size_t>(size));
}

std::string LocalGroup::list_members_locked(bool arrived) const {
  std::string s;
  for (int m = 0; m < size_; ++m) {
    if ((arrived_[static_cast<std::size_t>(m)] != 0) == arrived) s += (s.empty() ? "" : ", ") + std::to_string(m);
  }
  return s.empty() ? "none" : s;
}

std::string LocalGroup::describe_missing_locked() const {
  std::string s;
  for (int m = 0; m < size_; ++m) {
    if (arrived_[static_cast<std::size_t>(m)]) continue;
    const std::string& last = last_op_[static_cast<std::size_t>(m)];
    s += (s.empty() ? "" : "; ") + std::string("replica ") + std::to_string(m) + " last joined " +
         (last.empty() ? std::string("no collective") : last);
  }
  return s;
}

void LocalGroup::throw_failure_locked() const { throw_error(failure_code_, failure_message_); }

void LocalGroup::fail_locked(ErrorCode code, std::string message, int origin) {
  if (failed_) return;
  failed_ = true;
  failure_code_ = code;
  failure_message_ = std::move(message);
  failure_origin_ = origin;
  cv_.notify_all();
}

const std::vector<LocalGroup::Entry>& LocalGroup::arrive(int member, Entry entry, const CollectiveCall& call) {
  const auto m = static_cast<std::size_t>(member);
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_) throw_failure_locked();
  const std::uint64_t gen = generation_;
  std::vector<Entry>& slots = slots_[gen & 1];
  slots[m] = std::move(entry);
  arrived_[m] = 1;
  last_op_[m] = op_label(call);
  if (++arrived_count_ == size_) {
    arrived_count_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), 0);
    ++generation_;
    cv_.notify_all();
    return slots;
  }

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = after(start, call.timeout_seconds);
  Clock::time_point stall_at = after(start, call.stall_warning_seconds);
  while (true) {
    if (generation_ != gen) return slots;
    if (failed_) throw_failure_locked();
    // A member that has returned from its replica function can never arrive.
    std::string gone;
    for (int q = 0; q < size_; ++q) {
      const auto qs = static_cast<std::size_t>(q);
      if (!arrived_[qs] && done_[qs]) gone += (gone.empty() ? "" : ", ") + std::to_string(q);
    }
    if (!gone.empty()) {
      std::string msg;
      if (call.op == "merge_call") {
        msg = "Some replicas made a different number of replica_context().merge_call() calls: replica(s) " + gone +
              " returned from the replica function while replica(s) " + list_members_locked(true) + " wait in " +
              op_label(call) + ".";
      } else {
        msg = op_label(call) + " can never complete: replica(s) " + gone +
              " returned from the replica function without calling it, while replica(s) " +
              list_members_locked(true) +
              " wait in it. Every replica must call the same collectives in the same order.";
      }
      fail_locked(ErrorCode::kFailedPrecondition, std::move(msg), member);
      throw_failure_locked();
    }
    const Clock::time_point wake = std::min(deadline, stall_at);
    if (wake == Clock::time_point::max()) {
      cv_.wait(lock);
      continue;
    }
    if (cv_.wait_until(lock, wake) != std::cv_status::timeout) continue;
    if (generation_ != gen || failed_) continue;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      std::ostringstream msg;
      msg << op_label(call) << " timed out after " << call.timeout_seconds << " s: replica(s) "
          << list_members_locked(false) << " did not arrive (" << describe_missing_locked()
          << "); replica(s) " << list_members_locked(true) << " were waiting.";
      fail_locked(ErrorCode::kDeadlineExceeded, msg.str(), member);
      throw_failure_locked();
    }
    if (now >= stall_at) {
      if (warned_generation_ != gen) {
        warned_generation_ = gen;
        std::fprintf(stderr,
                     "distribute: warning: %s has waited %.1f s; replica(s) %s have not joined it (%s); "
                     "replica(s) %s are waiting.\n",
                     op_label(call).c_str(), call.stall_warning_seconds, list_members_locked(false).c_str(),
                     describe_missing_locked().c_str(), list_members_locked(true).c_str());
      }
      stall_at = Clock::time_point::max();
    }
  }
}

void LocalGroup::abort(ErrorCode code, const std::string& message, int origin) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(code, message, origin);
  } catch (...) {
    // Only a failed allocation for the message can land here; the group then
    // stays as it is and waiters fall back to their timeouts.
  }
}

void LocalGroup::mark_done(int member) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  done_[static_cast<std::size_t>(member)] = 1;
  cv_.notify_all();
}

void LocalGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  arrived_count_ = 0;
  std::fill(arrived_.begin(), arrived_.end(), 0);
  std::fill(done_.begin(), done_.end(), 0);
  for (auto& s : last_op_) s.clear();
  for (auto& slots : slots_) {
    for (auto& e : slots) e = Entry{};
  }
  failed_ = false;
  failure_message_.clear();
  failure_origin_ = -1;
  warned_generation_ = ~std::uint64_t{0};
}

int LocalGroup::abort_origin() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_origin_;
}

}  // namespace distribute::internal
