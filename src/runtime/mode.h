// The per-thread mode stack behind get_replica_context() and friends
// (TensorFlow's _get_per_thread_mode). An empty stack is the default mode.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "distribute/replica_context.h"
#include "distribute/strategy.h"

namespace distribute::internal {

class ReplicaRendezvous;

struct ModeEntry {
  Strategy* strategy = nullptr;       // get_strategy()
  Strategy* cross_replica = nullptr;  // set in cross-replica mode (scope, merge_fn)
  ReplicaContext* replica = nullptr;  // set in replica mode (inside run)
  int scope_count = 1;                // re-entries of the same strategy's scope
  int merge_depth = -1;               // inside a merge_fn of a run at this nesting depth
  // Inside a merge_fn of a group of several local replicas: the group, whose
  // other members wait paused in merge_call, and the rounds' call.
  ReplicaRendezvous* merge_helpers = nullptr;
  const CollectiveCall* merge_rounds = nullptr;
};

// Work that the merge_fn's thread shares with the replicas paused in its
// merge_call: run(member, members) runs once on every member of the group
// (member 0: the merge_fn's thread). Each member holds the task while it
// runs its share, so whatever the task owns (the buffers it writes) outlives
// every share, even if the group fails before all are done.
class MergeTask {
 public:
  virtual ~MergeTask() = default;
  virtual void run(int member, int members) const noexcept = 0;
};
// Runs `task` on every member, and returns when all are done, if this thread
// is running a merge_fn of `s` for a group of several local replicas (two
// rounds of the group); returns false otherwise, and the caller does the
// work alone.
bool share_with_paused_replicas(const Strategy& s, const std::shared_ptr<const MergeTask>& task);
// Tasks shared so far in this process (for tests).
std::uint64_t shared_merge_tasks();
// The round entry that carries a MergeTask in its `object` (a merge_fn's
// result carries none).
inline const char kMergeTaskMark = 0;

std::vector<ModeEntry>& mode_stack();
// Whether the process is exiting, as far as can be told: this thread's mode
// stack has been destroyed (std::exit destroys the calling thread's
// thread-locals first; or this thread is ending), or exit has run its
// handlers (watch_for_exit).
bool exiting() noexcept;
// Registers the handler behind exiting(), once (Strategy::scope).
void watch_for_exit();
// ~Strategy: if `s` is this thread's strategy by experimental_set_strategy,
// and nothing is entered on top of it, unsets it.
void unset_global_strategy_if(const Strategy& s) noexcept;
// The top entry, or the default mode's entry when the stack is empty.
ModeEntry current_mode();
// This thread's default replica context (replica 0 of the default strategy).
ReplicaContext& default_replica_context();

// Pushes an entry for the lifetime of the guard.
class ModeGuard {
 public:
  explicit ModeGuard(const ModeEntry& entry) { mode_stack().push_back(entry); }
  ~ModeGuard() { mode_stack().pop_back(); }
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;
};

// The nesting depth of the run whose merge_fn this thread is executing for
// `s`, or -1 when not inside one of s's merge_fns.
int current_merge_depth(const Strategy& s);

// TensorFlow's require_replica_context(ctx): throws FailedPreconditionError
// unless `ctx` is this thread's current replica context.
void require_replica_context(const ReplicaContext& ctx, std::string_view api);
// "<a> is not <b>" (`between` in the middle), for messages about mixed
// strategies: two strategies that describe themselves alike are told apart
// by their addresses.
std::string strategies_apart(const Strategy& a, const Strategy& b, std::string_view between = " is not ");

}  // namespace distribute::internal
