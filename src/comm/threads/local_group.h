// LocalGroup: the rendezvous of the threads of one process that act as the
// replicas of one group. Each collective is one or more "rounds": every member
// arrives with an Entry (pointers to its buffers, a small payload); when the
// last one arrives, all see every member's Entry and go on.
//
// A round costs one atomic increment per member and one release store by the
// last to arrive; a small round (up to kSmallBytes per member) one release
// store per member, into the first line of a block of its own that the
// others watch, with the bytes in that block. Waiters spin for up
// to 1 ms (yielding their core instead when members outnumber cores) and
// then sleep on a condition variable, so idle replicas burn no CPU.
//
// A round's entries stay readable until the member starts its next round:
// entries are double-buffered by round parity, and round g+2 cannot begin
// before every member has arrived at round g+1. The same holds for each
// member's inline area, where small messages are staged. An entry's `object`
// is let go once round g+1 has completed (the last ones by drop_objects(),
// when the run ends).
//
// Waiting never hangs silently: a member that has finished its replica
// function can never arrive, which fails the round at once
// (FailedPreconditionError); a timeout fails it with DeadlineExceededError
// naming the members that did not arrive; abort() fails it with the given
// error. A failed group stays failed for every member until reset().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "distribute/communicator.h"
#include "distribute/errors.h"

namespace distribute::internal {

// The in-process implementation of the runtime's ReplicaRendezvous (final:
// the backends' own calls through a LocalGroup are direct).
class LocalGroup final : public ReplicaRendezvous {
 public:
  // Steps through an arrival by parts, to pin a race (tests only).
  friend class LocalGroupRaceTest;
  using Entry = RendezvousEntry;

  // Bytes of each member's inline area (per round parity).
  static constexpr std::size_t kInlineBytes = std::size_t{4} << 10;
  // Cache lines of a member's small-round block, and the bytes they carry:
  // 48 in the first, beside the round number and the tag, 64 in each other.
  static constexpr std::size_t kSmallLines = 17;
  static constexpr std::size_t kSmallBytes = 64 * kSmallLines - 16;

  // `shares_cores`: other processes on this host compete for the cores (a
  // worker of a multi-worker job), so waiters always yield their core rather
  // than spin.
  explicit LocalGroup(int size, bool shares_cores = false);
  ~LocalGroup() override;
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const override { return size_; }

  // Publishes `entry` for this round and waits for every member. Returns all
  // members' entries, in member order. If any entry carries a tag and the tags
  // differ (or one has bit 0 set), throws SignatureMismatch on every member.
  // A member that leaves a round on a failure (an abort, a timeout, a member
  // that is done) withdraws its arrival first, so that the round can no
  // longer complete behind its back; if every member had already arrived,
  // the round completed and it goes on as the others do.
  const std::vector<Entry>& arrive(int member, Entry entry, const CollectiveCall& call) override;

  // Makes what a round hands to every member (see arrive_making). Must not
  // throw: a failure is returned as null.
  using Maker = std::shared_ptr<void> (*)(const void* context) noexcept;
  // As arrive(), and the member whose arrival completes the round calls
  // make(context) before the others go on; every member gets the result in
  // `made`. What is made comes after every member's arrival: storage the
  // members let go just before they came is free again (an output that
  // member 0 allocated before its arrival could find another member still
  // holding the last one, and take a second block at any moment). The
  // group lets go of it once a later counted round completes. If the tags
  // disagree nothing is made, and every member throws SignatureMismatch
  // with `made` left as it was.
  const std::vector<Entry>& arrive_making(int member, Entry entry, const CollectiveCall& call, Maker make,
                                          const void* context, std::shared_ptr<void>& made);

  // A round whose entries are at most kSmallBytes of data each, copied into
  // the group: each member writes its bytes into a block of cache lines of
  // its own, then its arrival into the block's first line, and a waiter
  // watches those first lines, so that a member learns of the last arrival,
  // and reads its bytes, in one transfer between cores (up to 48 bytes: they
  // share the line) or two (the other lines, fetched together); an ordinary
  // round moves the arrival counter, the round's completion, the entries and
  // the data: three or four in a row. Returns every member's
  // bytes, in member order, readable until this member's next round.
  // Tags are checked as arrive() checks them; a member that meets another in
  // an ordinary round (another collective) throws SignatureMismatch, as the
  // other does. A member may leave as soon as every member's bytes are here:
  // it reads nothing a member owns, so a member that leaves the round on a
  // failure meanwhile takes nothing from under it. Such a round can end in
  // success for some members and in the failure for others (who saw it
  // first); the others meet the failure at their next round.
  std::span<const std::byte* const> arrive_small(int member, const void* data, std::size_t bytes,
                                                 const CollectiveCall& call);

  // The last round of a collective whose members read or write each other's
  // buffers after its data round: every member passed that round together
  // and comes here after a bounded amount of copying, so this waits for all
  // of them whatever happens meanwhile (no timeout; an abort is raised once
  // all are here). A member that left early could free a buffer that another
  // still writes into. Only a member that has returned from its replica
  // function (it can never come) ends the wait with an error.
  void release(int member, const CollectiveCall& call) override;

  // kInlineBytes that `member` may fill before its next arrive() and pass as
  // its entry's `send`; others may read it until the member's round after next.
  // Throws the group's failure if it has failed.
  std::byte* inline_area(int member);

  // Fails the group (first call wins); wakes every waiter.
  void abort(ErrorCode code, const std::string& message, int origin) noexcept override;
  // The member has returned from its replica function and will not arrive again.
  void mark_done(int member) noexcept override;
  // Clears failure and progress; only when no member is inside arrive().
  void reset() override;
  // Lets go of the objects that entries still hold (the last merge_fn's
  // result, say), once every member is done; failure and progress are kept.
  void drop_objects() override;

  // The member whose failure or timeout aborted the group, or -1.
  int abort_origin() const override;

 private:
  // One cache line.
  struct alignas(64) Member {
    std::atomic<std::uint64_t> rounds{0};       // rounds this member has arrived at
    std::uint64_t counted = 0;                  // counted rounds among them (this member's thread only)
    std::atomic<const char*> last_op{nullptr};  // for messages: the collective it last joined
    std::atomic<std::uint64_t> last_sequence{0};
    std::byte* inline_area[2] = {nullptr, nullptr};
    std::atomic<std::uint32_t> last_op_len{0};
    std::atomic<bool> done{false};
    // Whether the member's entry of each parity holds an object (this
    // member's thread only): forget_round_before touches the slot, a line
    // the others are writing their next entries into, only when it must.
    bool holds_object[2] = {false, false};
  };
  static_assert(sizeof(Member) == 64);

  // A member's announcement of a small round, with its bytes (per parity):
  // an 8-byte all_reduce touches the first line alone, a 1 KiB one all 17.
  struct alignas(64) SmallBlock {
    std::atomic<std::uint64_t> rounds{0};  // the member's rounds once it holds that round's bytes
    std::uint64_t tag = 0;
    std::byte data[kSmallBytes] = {};
  };
  static_assert(sizeof(SmallBlock) == 64 * kSmallLines);
  // What kind of round a member waits in.
  enum class RoundKind { kOrdinary, kRelease, kSmall };

  // Publishes this member's arrival at its next round; returns that round.
  std::uint64_t publish_arrival(int member, Entry entry, const CollectiveCall& call);
  void put_entry(int member, std::uint64_t round, Entry entry);
  void publish_member(Member& me, std::uint64_t round, const CollectiveCall& call, std::memory_order order);
  // Wakes the members asleep in a round, if `sleepers` (sleepers_ or
  // small_sleepers_) counts any, after an arrival or a completion.
  void wake_sleepers(const std::atomic<int>& sleepers);
  struct MakeRequest {
    Maker make;
    const void* context;
  };
  // arrive(), and arrive_making() with `make`.
  const std::vector<Entry>& arrive_counted(int member, Entry entry, const CollectiveCall& call,
                                           const MakeRequest* make);
  // Counts the arrival; the last member completes the round (calling
  // `make`, if any, first), the others wait.
  void count_arrival(int member, std::uint64_t round, const CollectiveCall& call, RoundKind kind,
                     const MakeRequest* make = nullptr);
  // `target`: the count of arrivals that completes a counted round.
  void wait_for_round(int member, std::uint64_t round, const CollectiveCall& call, RoundKind kind,
                      std::uint64_t target);
  // Whether every member has arrived at small round `round` (then `small`:
  // whether all came with small entries).
  bool all_here_small(std::uint64_t round, bool& small, std::memory_order order) const;
  // Whether every member's small block holds round `round` (all came small).
  bool small_blocks_here(std::uint64_t round) const;
  SmallBlock& small_block(int member, std::uint64_t round) const {
    return small_blocks_[2 * static_cast<std::size_t>(member) + (round & 1)];
  }
  // After `round` completed: drops the object of the member's entry in the
  // round before it.
  void forget_round_before(int member, std::uint64_t round);
  // Takes back an arrival at the counted round that completes at `target`
  // arrivals, so that it can never complete; false if it already has (every
  // member arrived): then go on with it.
  bool withdraw(std::uint64_t target);
  [[noreturn]] void throw_failure_locked() const;
  [[noreturn]] void throw_failure() const;
  void fail_locked(ErrorCode code, std::string message, int origin);
  std::string list_members(std::uint64_t round, bool arrived) const;
  std::string describe_missing(std::uint64_t round) const;

  const int size_;
  const int spin_microseconds_;
  const bool yield_while_waiting_;
  std::unique_ptr<Member[]> members_;
  std::vector<Entry> slots_[2];
  std::unique_ptr<std::byte[]> inline_storage_;
  std::unique_ptr<SmallBlock[]> small_blocks_;   // [2 * member + parity]
  std::vector<const std::byte*> small_data_[2];  // every member's small bytes, by parity

  // Arrivals at counted rounds (every round but a small one whose members
  // all came small): the k-th counted round completes at size * k.
  alignas(64) std::atomic<std::uint64_t> arrivals_{0};
  alignas(64) std::atomic<std::uint64_t> generation_{0};  // rounds completed
  // What the member that completed the last round of arrive_making made,
  // in generation_'s line: written by the completer just before it, read by
  // the members after it, let go by the completer of the next counted round.
  std::shared_ptr<void> made_;
  alignas(64) std::atomic<bool> failed_{false};
  std::atomic<int> sleepers_{0};
  std::atomic<int> small_sleepers_{0};  // those of sleepers_ in small rounds

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t warned_round_ = ~std::uint64_t{0};
  ErrorCode failure_code_ = ErrorCode::kAborted;
  std::string failure_message_;
  int failure_origin_ = -1;
};

}  // namespace distribute::internal
