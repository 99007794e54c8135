#include "comm/threads/local_group.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

namespace distribute::internal {
namespace {
using Clock = std::chrono::steady_clock;

Clock::time_point after(Clock::time_point start, double seconds) {
  if (seconds <= 0) return Clock::time_point::max();
  return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

std::string op_label(std::string_view op, std::uint64_t sequence) {
  return std::string(op) + " #" + std::to_string(sequence);
}

// How long a waiter spins before it sleeps. Waking a sleeping thread costs
// 3 us typically here but up to 250 us when its core has gone idle (measured:
// p50 3 us, p90 58 us, max 254 us); a spin shorter than that lets two
// replicas fall into a convoy where each wait ends in a slow wake-up. 1 ms of
// spinning outlasts the slowest wake-up, and only inside a collective.
// DISTRIBUTE_SPIN_MICROSECONDS overrides the time.
int spin_microseconds() {
  if (const char* text = std::getenv("DISTRIBUTE_SPIN_MICROSECONDS"); text && *text) return std::atoi(text);
  return 1000;
}

// With more members than cores a spinner would steal the core of the member
// it waits for, so the waiter yields its core instead of pausing: the
// scheduler runs the late member at once, without a sleep and a wake-up.
bool yield_while_waiting(int size) {
  return static_cast<unsigned>(size) > std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

LocalGroup::LocalGroup(int size, bool shares_cores)
    : size_(size > 0 ? size : throw InvalidArgumentError("LocalGroup: size must be positive, got " +
                                                         std::to_string(size))),
      spin_microseconds_(spin_microseconds()),
      yield_while_waiting_(shares_cores || yield_while_waiting(size)),
      members_(new Member[static_cast<std::size_t>(size)]),
      inline_storage_(new std::byte[2 * kInlineBytes * static_cast<std::size_t>(size)]) {
  slots_[0].resize(static_cast<std::size_t>(size));
  slots_[1].resize(static_cast<std::size_t>(size));
  for (int m = 0; m < size; ++m) {
    for (int parity = 0; parity < 2; ++parity) {
      std::byte* area = inline_storage_.get() + (2 * static_cast<std::size_t>(m) + static_cast<std::size_t>(parity)) * kInlineBytes;
      std::memset(area, 0, kInlineBytes);  // fault the pages in now, not in a collective
      members_[static_cast<std::size_t>(m)].inline_area[parity] = area;
    }
  }
}

LocalGroup::~LocalGroup() = default;

std::byte* LocalGroup::inline_area(int member) {
  // A member that withdrew from a failed round may still be read from in the
  // round before it, through the area of that parity: a failed group hands
  // out no area (the failure comes first, as from arrive()).
  if (failed_.load(std::memory_order_acquire)) throw_failure();
  Member& me = members_[static_cast<std::size_t>(member)];
  return me.inline_area[me.rounds.load(std::memory_order_relaxed) & 1];
}

std::string LocalGroup::list_members(std::uint64_t round, bool arrived) const {
  std::string s;
  for (int m = 0; m < size_; ++m) {
    const bool here = members_[static_cast<std::size_t>(m)].rounds.load(std::memory_order_acquire) > round;
    if (here == arrived) s += (s.empty() ? "" : ", ") + std::to_string(m);
  }
  return s.empty() ? "none" : s;
}

std::string LocalGroup::describe_missing(std::uint64_t round) const {
  std::string s;
  for (int m = 0; m < size_; ++m) {
    const Member& q = members_[static_cast<std::size_t>(m)];
    if (q.rounds.load(std::memory_order_acquire) > round) continue;
    const char* op = q.last_op.load(std::memory_order_acquire);
    s += (s.empty() ? "" : "; ") + std::string("replica ") + std::to_string(m) + " last joined " +
         (op ? op_label(std::string_view(op, q.last_op_len.load(std::memory_order_acquire)),
                        q.last_sequence.load(std::memory_order_acquire))
             : std::string("no collective"));
  }
  return s;
}

void LocalGroup::throw_failure_locked() const { throw_error(failure_code_, failure_message_); }

void LocalGroup::throw_failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  throw_failure_locked();
}

void LocalGroup::fail_locked(ErrorCode code, std::string message, int origin) {
  if (failed_.load(std::memory_order_relaxed)) return;
  failure_code_ = code;
  failure_message_ = std::move(message);
  failure_origin_ = origin;
  failed_.store(true, std::memory_order_release);
  cv_.notify_all();
}

std::uint64_t LocalGroup::publish_arrival(int member, Entry entry, const CollectiveCall& call) {
  Member& me = members_[static_cast<std::size_t>(member)];
  const std::uint64_t round = me.rounds.load(std::memory_order_relaxed);  // written by this thread only
  me.holds_object[round & 1] = entry.object != nullptr;
  slots_[round & 1][static_cast<std::size_t>(member)] = std::move(entry);
  me.last_op.store(call.op.data(), std::memory_order_relaxed);
  me.last_op_len.store(call.op.size(), std::memory_order_relaxed);
  me.last_sequence.store(call.sequence, std::memory_order_relaxed);
  me.rounds.store(round + 1, std::memory_order_release);
  return round;
}

void LocalGroup::count_arrival(int member, std::uint64_t round, const CollectiveCall& call, bool release) {
  const std::uint64_t total = arrivals_.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (total == static_cast<std::uint64_t>(size_) * (round + 1)) {
    generation_.store(round + 1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  } else {
    wait_for_round(member, round, call, release);
  }
}

void LocalGroup::forget_round_before(int member, std::uint64_t round) {
  // Every member has arrived at `round`, so none reads the round before it
  // any more: what this member's entry there holds (a merge_fn's result, a
  // copy job and its tensors) is let go now, not two rounds later. A result
  // kept that long made the next step allocate its outputs afresh instead of
  // reusing the blocks it had just freed.
  if (round == 0) return;
  Member& me = members_[static_cast<std::size_t>(member)];
  const std::uint64_t parity = (round - 1) & 1;
  if (me.holds_object[parity]) {
    slots_[parity][static_cast<std::size_t>(member)].object.reset();
    me.holds_object[parity] = false;
  }
}

const std::vector<LocalGroup::Entry>& LocalGroup::arrive(int member, Entry entry, const CollectiveCall& call) {
  if (failed_.load(std::memory_order_acquire)) throw_failure();
  const std::uint64_t round = publish_arrival(member, std::move(entry), call);
  count_arrival(member, round, call, /*release=*/false);
  forget_round_before(member, round);
  // The signature tags of a collective's first round must all agree.
  const std::vector<Entry>& slots = slots_[round & 1];
  bool tagged = false, differ = false;
  const std::uint64_t tag0 = slots[0].tag;
  for (const Entry& e : slots) {
    tagged |= e.tag != 0;
    differ |= e.tag != tag0 || (e.tag & 1) != 0;
  }
  if (tagged && differ) throw SignatureMismatch();
  return slots;
}

void LocalGroup::release(int member, const CollectiveCall& call) {
  // No check of failed_ first: the others may be waiting for this arrival.
  const std::uint64_t round = publish_arrival(member, Entry{}, call);
  count_arrival(member, round, call, /*release=*/true);
  forget_round_before(member, round);
}

bool LocalGroup::withdraw(std::uint64_t round) {
  const std::uint64_t complete = static_cast<std::uint64_t>(size_) * (round + 1);
  std::uint64_t seen = arrivals_.load(std::memory_order_acquire);
  while (seen < complete) {
    if (arrivals_.compare_exchange_weak(seen, seen - 1, std::memory_order_acq_rel)) return true;
  }
  return false;  // the last member arrived: the round has completed
}

void LocalGroup::wait_for_round(int member, std::uint64_t round, const CollectiveCall& call, bool release) {
  if (spin_microseconds_ > 0) {
    const Clock::time_point spin_until = Clock::now() + std::chrono::microseconds(spin_microseconds_);
    const unsigned check_every = yield_while_waiting_ ? 1 : 64;
    for (unsigned i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) > round) return;
      if (yield_while_waiting_) {
        std::this_thread::yield();
      } else {
        cpu_relax();
      }
      if (i % check_every == 0 &&
          ((!release && failed_.load(std::memory_order_relaxed)) || Clock::now() >= spin_until)) {
        break;
      }
    }
  }

  std::unique_lock<std::mutex> lock(mu_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  struct SleeperGuard {
    std::atomic<int>& n;
    ~SleeperGuard() { n.fetch_sub(1, std::memory_order_seq_cst); }
  } guard{sleepers_};

  const Clock::time_point start = Clock::now();
  // A release round has no deadline: everyone comes after its copies.
  const Clock::time_point deadline = release ? Clock::time_point::max() : after(start, call.timeout_seconds);
  Clock::time_point stall_at = after(start, call.stall_warning_seconds);
  // Once the round is known to have completed (a withdrawal came too late),
  // only its generation is awaited: the last member is about to publish it.
  bool completing = false;
  while (true) {
    if (generation_.load(std::memory_order_seq_cst) > round) return;
    if (!completing && !release && failed_.load(std::memory_order_acquire)) {
      if (withdraw(round)) throw_failure_locked();
      completing = true;
      continue;
    }
    // A member that has returned from its replica function can never arrive.
    // (In a release round, only once every other member is here: the ones on
    // their way may still be writing into this member's buffers.)
    std::string gone;
    bool others_here = true;
    for (int q = 0; q < size_ && !completing; ++q) {
      const Member& other = members_[static_cast<std::size_t>(q)];
      if (other.rounds.load(std::memory_order_acquire) > round) continue;
      if (other.done.load(std::memory_order_acquire)) {
        gone += (gone.empty() ? "" : ", ") + std::to_string(q);
      } else {
        others_here = false;
      }
    }
    if (!gone.empty() && (!release || others_here)) {
      const std::string label = op_label(call.op, call.sequence);
      std::string msg;
      if (call.op == "merge_call") {
        msg = "Some replicas made a different number of replica_context().merge_call() calls: replica(s) " + gone +
              " returned from the replica function while replica(s) " + list_members(round, true) + " wait in " +
              label + ".";
      } else if (release) {
        msg = label + " can never complete: replica(s) " + gone +
              " returned from the replica function before the end of it, while replica(s) " +
              list_members(round, true) + " wait in it.";
      } else {
        msg = label + " can never complete: replica(s) " + gone +
              " returned from the replica function without calling it, while replica(s) " +
              list_members(round, true) + " wait in it. Every replica must call the same collectives in the same order.";
      }
      if (!withdraw(round)) {
        completing = true;
        continue;
      }
      fail_locked(ErrorCode::kFailedPrecondition, std::move(msg), member);
      throw_failure_locked();
    }
    const Clock::time_point wake = completing ? Clock::time_point::max() : std::min(deadline, stall_at);
    if (wake == Clock::time_point::max()) {
      cv_.wait(lock);
      continue;
    }
    if (cv_.wait_until(lock, wake) != std::cv_status::timeout) continue;
    if (generation_.load(std::memory_order_seq_cst) > round || (!release && failed_.load(std::memory_order_acquire))) {
      continue;
    }
    const Clock::time_point now = Clock::now();
    const std::string label = op_label(call.op, call.sequence);
    if (now >= deadline) {
      std::ostringstream msg;
      msg << label << " timed out after " << call.timeout_seconds << " s: replica(s) " << list_members(round, false)
          << " did not arrive (" << describe_missing(round) << "); replica(s) " << list_members(round, true)
          << " were waiting.";
      if (!withdraw(round)) {
        completing = true;
        continue;
      }
      fail_locked(ErrorCode::kDeadlineExceeded, msg.str(), member);
      throw_failure_locked();
    }
    if (now >= stall_at) {
      if (warned_round_ != round) {
        warned_round_ = round;
        std::fprintf(stderr,
                     "distribute: warning: %s has waited %.1f s; replica(s) %s have not joined it (%s); "
                     "replica(s) %s are waiting.\n",
                     label.c_str(), call.stall_warning_seconds, list_members(round, false).c_str(),
                     describe_missing(round).c_str(), list_members(round, true).c_str());
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
  members_[static_cast<std::size_t>(member)].done.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

void LocalGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  arrivals_.store(0, std::memory_order_relaxed);
  generation_.store(0, std::memory_order_relaxed);
  for (int m = 0; m < size_; ++m) {
    Member& me = members_[static_cast<std::size_t>(m)];
    me.rounds.store(0, std::memory_order_relaxed);
    me.done.store(false, std::memory_order_relaxed);
    me.last_op.store(nullptr, std::memory_order_relaxed);
    me.last_op_len.store(0, std::memory_order_relaxed);
    me.last_sequence.store(0, std::memory_order_relaxed);
    me.holds_object[0] = me.holds_object[1] = false;
  }
  for (auto& slots : slots_) {
    for (auto& e : slots) e = Entry{};
  }
  failed_.store(false, std::memory_order_release);
  failure_message_.clear();
  failure_origin_ = -1;
  warned_round_ = ~std::uint64_t{0};
}

int LocalGroup::abort_origin() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_origin_;
}

}  // namespace distribute::internal
