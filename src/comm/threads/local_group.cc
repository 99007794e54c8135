#include "comm/threads/local_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include "core/host_cpus.h"
#include "core/seconds.h"
#include "core/whole_number.h"

namespace distribute::internal {
namespace {
using Clock = std::chrono::steady_clock;

Clock::time_point after(Clock::time_point start, double seconds) { return deadline_after(start, seconds); }

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
// DISTRIBUTE_SPIN_MICROSECONDS overrides the time, read when a group is
// made. A setting that is not a whole number leaves the default here (a
// thread's default context makes a group, and nothing may throw there);
// creating a strategy reports it.
int spin_microseconds() {
  return static_cast<int>(parse_whole_number(std::getenv("DISTRIBUTE_SPIN_MICROSECONDS"),
                                             static_cast<std::size_t>(std::numeric_limits<int>::max()))
                              .value_or(1000));
}

// With more members than cores a spinner would steal the core of the member
// it waits for, so the waiter yields its core instead of pausing: the
// scheduler runs the late member at once, without a sleep and a wake-up.
// (The CPUs this process may use, not the machine's: under taskset or a
// container's cpuset, 16 replicas on 2 allowed CPUs of 64 must yield.)
bool yield_while_waiting(int size) { return size > usable_cpus(); }
// A small arrival is ordered before the look at small_sleepers_ that follows it
// (wake_sleepers) by a seq_cst fence after the wait, so that the store itself
// need not wait for its cache line (a seq_cst store waits: measured 60% of a
// small round's own time). ThreadSanitizer does not model fences: there the
// store itself is seq_cst.
#if defined(__SANITIZE_THREAD__)
#define DISTRIBUTE_NO_FENCES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DISTRIBUTE_NO_FENCES 1
#endif
#endif
// A round's signature tags disagree: some differ, or one has bit 0 (a
// replica's own verdict on its arguments), unless all are 0 (untagged).
template <class TagOf>
bool tags_disagree(int members, const TagOf& tag_of) {
  bool tagged = false, differ = false;
  const std::uint64_t tag0 = tag_of(0);
  for (int q = 0; q < members; ++q) {
    const std::uint64_t tag = tag_of(q);
    tagged |= tag != 0;
    differ |= tag != tag0 || (tag & 1) != 0;
  }
  return tagged && differ;
}
#ifdef DISTRIBUTE_NO_FENCES
constexpr std::memory_order kSmallArrivalOrder = std::memory_order_seq_cst;
void order_small_arrival_before_sleepers() {}
#else
constexpr std::memory_order kSmallArrivalOrder = std::memory_order_release;
void order_small_arrival_before_sleepers() { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif
}  // namespace

LocalGroup::LocalGroup(int size, bool shares_cores)
    : size_(size > 0 ? size
                     : throw InvalidArgumentError("LocalGroup: size must be positive, got " + std::to_string(size))),
      spin_microseconds_(spin_microseconds()),
      yield_while_waiting_(shares_cores || yield_while_waiting(size)),
      members_(new Member[static_cast<std::size_t>(size)]),
      inline_storage_(new std::byte[2 * kInlineBytes * static_cast<std::size_t>(size)]) {
  slots_[0].resize(static_cast<std::size_t>(size));
  slots_[1].resize(static_cast<std::size_t>(size));
  for (int m = 0; m < size; ++m) {
    for (int parity = 0; parity < 2; ++parity) {
      std::byte* area =
          inline_storage_.get() + (2 * static_cast<std::size_t>(m) + static_cast<std::size_t>(parity)) * kInlineBytes;
      std::memset(area, 0, kInlineBytes);  // fault the pages in now, not in a collective
      members_[static_cast<std::size_t>(m)].inline_area[parity] = area;
    }
  }
  small_blocks_ = std::make_unique<SmallBlock[]>(2 * static_cast<std::size_t>(size));
  for (std::uint64_t parity = 0; parity < 2; ++parity) {
    for (int m = 0; m < size; ++m) small_data_[parity].push_back(small_block(m, parity).data);
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
  put_entry(member, round, std::move(entry));
  publish_member(me, round, call, std::memory_order_release);
  return round;
}

void LocalGroup::put_entry(int member, std::uint64_t round, Entry entry) {
  members_[static_cast<std::size_t>(member)].holds_object[round & 1] = entry.object != nullptr;
  slots_[round & 1][static_cast<std::size_t>(member)] = std::move(entry);
}

void LocalGroup::publish_member(Member& me, std::uint64_t round, const CollectiveCall& call, std::memory_order order) {
  me.last_op.store(call.op.data(), std::memory_order_relaxed);
  me.last_op_len.store(static_cast<std::uint32_t>(std::min<std::size_t>(call.op.size(), UINT32_MAX)),
                       std::memory_order_relaxed);
  me.last_sequence.store(call.sequence, std::memory_order_relaxed);
  me.rounds.store(round + 1, order);
}

void LocalGroup::wake_sleepers(const std::atomic<int>& sleepers) {
  // An arrival, made seq_cst (a small one's store, or its store and a seq_cst
  // fence; a counted one's increment of arrivals_; a completion's store of
  // generation_), and then this seq_cst load, against a sleeper's seq_cst
  // increment of its count and then its seq_cst loads of the same: either
  // the sleeper sees this arrival, or this sees it asleep.
  if (sleepers.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

void LocalGroup::count_arrival(int member, std::uint64_t round, const CollectiveCall& call, RoundKind kind,
                               const MakeRequest* make) {
  const std::uint64_t target = static_cast<std::uint64_t>(size_) * ++members_[static_cast<std::size_t>(member)].counted;
  // seq_cst: a sleeper in a small round looks at arrivals_ (see wake_sleepers).
  const std::uint64_t total = arrivals_.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (total == target) {
    // Every member took its copy of what an earlier round made before it
    // arrived here.
    if (made_) made_.reset();
    // Nothing is made for a round whose tags disagree: every member throws
    // SignatureMismatch (and the sizes may be another member's).
    const std::vector<Entry>& slots = slots_[round & 1];
    if (make != nullptr && !tags_disagree(size_, [&](int q) { return slots[static_cast<std::size_t>(q)].tag; })) {
      made_ = make->make(make->context);
    }
    generation_.store(round + 1, std::memory_order_seq_cst);
    wake_sleepers(sleepers_);
  } else {
    // A member asleep in a small round learns of this one (another
    // collective) only from its arrival.
    wake_sleepers(small_sleepers_);
    wait_for_round(member, round, call, kind, target);
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

const std::vector<LocalGroup::Entry>& LocalGroup::arrive_making(int member, Entry entry, const CollectiveCall& call,
                                                                Maker make, const void* context,
                                                                std::shared_ptr<void>& made) {
  const MakeRequest request{make, context};
  const std::vector<Entry>& slots = arrive_counted(member, std::move(entry), call, &request);
  made = made_;  // the next completion, which lets it go, needs this member's next arrival
  return slots;
}

const std::vector<LocalGroup::Entry>& LocalGroup::arrive(int member, Entry entry, const CollectiveCall& call) {
  return arrive_counted(member, std::move(entry), call, nullptr);
}

const std::vector<LocalGroup::Entry>& LocalGroup::arrive_counted(int member, Entry entry, const CollectiveCall& call,
                                                                 const MakeRequest* make) {
  if (failed_.load(std::memory_order_acquire)) throw_failure();
  const std::uint64_t round = publish_arrival(member, std::move(entry), call);
  count_arrival(member, round, call, RoundKind::kOrdinary, make);
  forget_round_before(member, round);
  // The signature tags of a collective's first round must all agree.
  const std::vector<Entry>& slots = slots_[round & 1];
  if (tags_disagree(size_, [&](int q) { return slots[static_cast<std::size_t>(q)].tag; })) throw SignatureMismatch();
  return slots;
}

void LocalGroup::release(int member, const CollectiveCall& call) {
  // No check of failed_ first: the others may be waiting for this arrival.
  const std::uint64_t round = publish_arrival(member, Entry{}, call);
  count_arrival(member, round, call, RoundKind::kRelease);
  forget_round_before(member, round);
}

bool LocalGroup::all_here_small(std::uint64_t round, bool& small, std::memory_order order) const {
  small = true;
  for (int q = 0; q < size_; ++q) {
    const SmallBlock& block = small_block(q, round);
    if (block.rounds.load(order) > round) continue;
    if (members_[static_cast<std::size_t>(q)].rounds.load(order) <= round) return false;
    // Here: its block, written before its arrival, is now visible if it came small.
    if (block.rounds.load(order) > round) continue;
    small = false;  // in an ordinary round: another collective
  }
  return true;
}

bool LocalGroup::small_blocks_here(std::uint64_t round) const {
  for (int q = 0; q < size_; ++q) {
    if (small_block(q, round).rounds.load(std::memory_order_acquire) <= round) return false;
  }
  return true;
}

std::span<const std::byte* const> LocalGroup::arrive_small(int member, const void* data, std::size_t bytes,
                                                           const CollectiveCall& call) {
  if (bytes > kSmallBytes) {
    throw InternalError("LocalGroup::arrive_small: " + std::to_string(bytes) + " bytes, more than " +
                        std::to_string(kSmallBytes));
  }
  if (failed_.load(std::memory_order_acquire)) throw_failure();
  Member& me = members_[static_cast<std::size_t>(member)];
  const std::uint64_t round = me.rounds.load(std::memory_order_relaxed);  // written by this thread only
  SmallBlock& block = small_block(member, round);
  if (bytes) std::memcpy(block.data, data, bytes);
  block.tag = call.signature_tag;
  block.rounds.store(round + 1, kSmallArrivalOrder);
  publish_member(me, round, call, std::memory_order_release);
  // A small round is not counted: its members learn of each other from
  // their lines alone.
  wait_for_round(member, round, call, RoundKind::kSmall, 0);
  // Sleepers are woken after the wait, not before: every small arrival wakes
  // them once its wait is over, and the last one does not wait; a sleeper
  // waits for every member, so that suffices. The fence is cheap once this
  // arrival's stores have left the core.
  order_small_arrival_before_sleepers();
  wake_sleepers(small_sleepers_);
  forget_round_before(member, round);
  bool small = true;
  all_here_small(round, small, std::memory_order_acquire);  // every member is here
  if (!small) {
    // Another member is in an ordinary round (another collective), which
    // completes once every member is counted: join it with an entry that
    // never agrees (bit 0), so that it throws SignatureMismatch too.
    put_entry(member, round, Entry{.tag = call.signature_tag | 1});
    count_arrival(member, round, call, RoundKind::kOrdinary);
    throw SignatureMismatch();
  }
  if (tags_disagree(size_, [&](int q) { return small_block(q, round).tag; })) throw SignatureMismatch();
  return small_data_[round & 1];
}

bool LocalGroup::withdraw(std::uint64_t target) {
  std::uint64_t seen = arrivals_.load(std::memory_order_acquire);
  while (seen < target) {
    if (arrivals_.compare_exchange_weak(seen, seen - 1, std::memory_order_acq_rel)) return true;
  }
  return false;  // the last member arrived: the round has completed
}

// Kept whole: the spin, the sleeper counts taken under mu_ and the sleep loop
// share the complete/leave lambdas, the lock and `completing`, and each
// check's memory order (acquire while spinning, seq_cst once counted among
// the sleepers) must be read against the others and wake_sleepers.
// NOLINTNEXTLINE(readability-function-size): spin and sleep share complete(): acquire in one, seq_cst in the other.
void LocalGroup::wait_for_round(int member, std::uint64_t round, const CollectiveCall& call, RoundKind kind,
                                std::uint64_t target) {
  const bool release = kind == RoundKind::kRelease;
  const bool small = kind == RoundKind::kSmall;
  // A counted round is over once its completion is published; a small one
  // once every member is here.
  const auto complete = [&](std::memory_order order) {
    bool all_small = true;
    if (!small) return generation_.load(order) > round;
    // Asleep (seq_cst), a counted arrival is seen through arrivals_: the
    // counting increment comes after the member's arrival (see wake_sleepers).
    // This load is what orders it: it must stay, and stay seq_cst.
    if (order == std::memory_order_seq_cst) static_cast<void>(arrivals_.load(std::memory_order_seq_cst));
    return all_here_small(round, all_small, order);
  };
  // Leaving on a failure: a counted arrival is taken back first, unless the
  // round has completed meanwhile (false: then go on with it). A small round
  // counts nothing, and its members read nothing of a member that left.
  const auto leave = [&] { return small || withdraw(target); };
  if (spin_microseconds_ > 0) {
    // The spin's deadline is set at its first check, not before it: most
    // waits end sooner, and reading the clock took 6% of a small round.
    Clock::time_point spin_until = Clock::time_point::max();
    const unsigned check_every = yield_while_waiting_ ? 1 : 64;
    for (unsigned i = 1;; ++i) {
      // A small round's spin reads the members' small blocks alone, and their
      // Member lines (where one in an ordinary round shows) only every
      // check_every turns: each member writes its Member line on every
      // arrival, so reading it on every turn moved that line between the
      // cores too.
      if (small && i % check_every != 0) {  // (never when yielding: check_every is 1)
        if (small_blocks_here(round)) return;
      } else if (complete(std::memory_order_acquire)) {
        return;
      }
      if (yield_while_waiting_) {
        std::this_thread::yield();
      } else {
        cpu_relax();
      }
      if (i % check_every == 0) {
        if (!release && failed_.load(std::memory_order_relaxed)) break;
        const Clock::time_point now = Clock::now();
        if (spin_until == Clock::time_point::max()) spin_until = now + std::chrono::microseconds(spin_microseconds_);
        if (now >= spin_until) break;
      }
    }
  }

  std::unique_lock<std::mutex> lock(mu_);
  // Counted among the sleepers (a completion wakes them all), and those of
  // small rounds among the small sleepers too (every arrival wakes them).
  struct SleeperGuard {
    std::atomic<int>* n;
    explicit SleeperGuard(std::atomic<int>* count) : n(count) {
      if (n != nullptr) n->fetch_add(1, std::memory_order_seq_cst);
    }
    SleeperGuard(const SleeperGuard&) = delete;
    SleeperGuard& operator=(const SleeperGuard&) = delete;
    ~SleeperGuard() {
      if (n != nullptr) n->fetch_sub(1, std::memory_order_seq_cst);
    }
  } const guard{&sleepers_}, small_guard{small ? &small_sleepers_ : nullptr};

  const Clock::time_point start = Clock::now();
  // A release round has no deadline: everyone comes after its copies.
  const Clock::time_point deadline = release ? Clock::time_point::max() : after(start, call.timeout_seconds);
  Clock::time_point stall_at = after(start, call.stall_warning_seconds);
  // Once the round is known to have completed (a withdrawal came too late),
  // only its generation is awaited: the last member is about to publish it.
  bool completing = false;
  while (true) {
    if (complete(std::memory_order_seq_cst)) return;
    if (!completing && !release && failed_.load(std::memory_order_acquire)) {
      if (leave()) throw_failure_locked();
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
    // A small round's member that arrived and has gone since: its block says so.
    if (!gone.empty() && small && complete(std::memory_order_seq_cst)) return;
    if (!gone.empty() && (!release || others_here)) {
      const std::string label = op_label(call.op, call.sequence);
      std::string msg;
      if (!call.count_mismatch.empty()) {
        msg = std::string(call.count_mismatch) + ": replica(s) " + gone +
              " returned from the replica function while replica(s) " + list_members(round, true) + " wait in " +
              label + ".";
      } else if (release) {
        msg = label + " can never complete: replica(s) " + gone +
              " returned from the replica function before the end of it, while replica(s) " +
              list_members(round, true) + " wait in it.";
      } else {
        msg = label + " can never complete: replica(s) " + gone +
              " returned from the replica function without calling it, while replica(s) " + list_members(round, true) +
              " wait in it. Every replica must call the same collectives in the same order.";
      }
      if (!leave()) {
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
    if (complete(std::memory_order_seq_cst) || (!release && failed_.load(std::memory_order_acquire))) continue;
    const Clock::time_point now = Clock::now();
    const std::string label = op_label(call.op, call.sequence);
    if (now >= deadline) {
      std::ostringstream msg;
      msg << label << " timed out after " << call.timeout_seconds << " s: replica(s) " << list_members(round, false)
          << " did not arrive (" << describe_missing(round) << "); replica(s) " << list_members(round, true)
          << " were waiting.";
      if (!leave()) {
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
  for (int i = 0; i < 2 * size_; ++i)
    small_blocks_[static_cast<std::size_t>(i)].rounds.store(0, std::memory_order_relaxed);
  for (int m = 0; m < size_; ++m) {
    Member& me = members_[static_cast<std::size_t>(m)];
    me.rounds.store(0, std::memory_order_relaxed);
    me.counted = 0;
    me.done.store(false, std::memory_order_relaxed);
    me.last_op.store(nullptr, std::memory_order_relaxed);
    me.last_op_len.store(0, std::memory_order_relaxed);
    me.last_sequence.store(0, std::memory_order_relaxed);
    me.holds_object[0] = me.holds_object[1] = false;
  }
  for (auto& slots : slots_) {
    for (auto& e : slots) e = Entry{};
  }
  made_.reset();
  failed_.store(false, std::memory_order_release);
  failure_message_.clear();
  failure_origin_ = -1;
  warned_round_ = ~std::uint64_t{0};
}

void LocalGroup::drop_objects() {
  std::vector<std::shared_ptr<void>> objects;  // destroyed after the lock is let go
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& slots : slots_) {
      for (auto& e : slots) {
        if (e.object) objects.push_back(std::move(e.object));  // leaves it empty
      }
    }
    for (int m = 0; m < size_; ++m) {
      Member& me = members_[static_cast<std::size_t>(m)];
      me.holds_object[0] = me.holds_object[1] = false;
    }
    if (made_) objects.push_back(std::move(made_));
  }
}

int LocalGroup::abort_origin() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_origin_;
}

}  // namespace distribute::internal
