// LocalGroup: the rendezvous of the threads of one process that act as the
// replicas of one group. Each collective is one or more "rounds": every member
// arrives with an Entry (pointers to its buffers, a small payload); when the
// last one arrives, all see every member's Entry and go on.
//
// A round's entries stay readable until the member starts its next round:
// entries are double-buffered by round parity, and round g+2 cannot begin
// before every member has arrived at round g+1.
//
// Waiting never hangs silently: a member that has finished its replica
// function can never arrive, which fails the round at once
// (FailedPreconditionError); a timeout fails it with DeadlineExceededError
// naming the members that did not arrive; abort() fails it with the given
// error. A failed group stays failed for every member until reset().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distribute/communicator.h"
#include "distribute/errors.h"

namespace distribute::internal {

class LocalGroup {
 public:
  struct Entry {
    const void* send = nullptr;
    void* recv = nullptr;
    std::string payload;
    std::shared_ptr<void> object;
  };

  explicit LocalGroup(int size);
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return size_; }

  // Publishes `entry` for this round and waits for every member. Returns all
  // members' entries, in member order.
  const std::vector<Entry>& arrive(int member, Entry entry, const CollectiveCall& call);

  // Fails the group (first call wins); wakes every waiter.
  void abort(ErrorCode code, const std::string& message, int origin) noexcept;
  // The member has returned from its replica function and will not arrive again.
  void mark_done(int member) noexcept;
  // Clears failure and progress; only when no member is inside arrive().
  void reset();

  // The member whose failure or timeout aborted the group, or -1.
  int abort_origin() const;

 private:
  [[noreturn]] void throw_failure_locked() const;
  void fail_locked(ErrorCode code, std::string message, int origin);
  std::string describe_missing_locked() const;
  std::string list_members_locked(bool arrived) const;

  const int size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  int arrived_count_ = 0;
  std::vector<char> arrived_;
  std::vector<char> done_;
  std::vector<std::string> last_op_;  // per member: the collective it last joined, for messages
  std::vector<Entry> slots_[2];
  std::uint64_t warned_generation_ = ~std::uint64_t{0};

  bool failed_ = false;
  ErrorCode failure_code_ = ErrorCode::kAborted;
  std::string failure_message_;
  int failure_origin_ = -1;
};

}  // namespace distribute::internal
