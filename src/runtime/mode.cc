#include "runtime/mode.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "comm/backend.h"
#include "distribute/context.h"
#include "distribute/mirrored_strategy.h"
#include "runtime/replica_channel.h"

namespace distribute {
namespace internal {

namespace {
// Trivially destructible, so that it can be read while thread-locals are
// being destroyed: set once this thread's mode stack is gone.
thread_local bool mode_stack_gone = false;
struct ModeStack {
  std::vector<ModeEntry> entries;
  ~ModeStack() { mode_stack_gone = true; }
};
}  // namespace

std::vector<ModeEntry>& mode_stack() {
  thread_local ModeStack stack;
  return stack.entries;
}

namespace {
// Set once std::exit has begun running its handlers.
std::atomic<bool> exit_begun{false};
}  // namespace

void watch_for_exit() {
  // Registered once, as the process first enters a scope: exit runs the
  // handler before destroying the static objects made before that (every
  // strategy made at static initialisation, before main), and after those
  // made later.
  static const bool registered = std::atexit([] { exit_begun.store(true, std::memory_order_relaxed); }) == 0;
  (void)registered;
}

bool exiting() noexcept { return mode_stack_gone || exit_begun.load(std::memory_order_relaxed); }

namespace {
// A one-member group behind each thread's default replica context.
struct DefaultReplica {
  ReplicaGroup group = make_replica_group({.replicas = 1});  // one member copies nothing: it never streams
  ReplicaChannel channel;
  ReplicaContext context;
  DefaultReplica() : context(Access::replica_context_key(), default_strategy(), 0, 0, &channel) {
    channel.comm = group.members[0].get();
    channel.local = group.rendezvous.get();
  }
};
}  // namespace

ReplicaContext& default_replica_context() {
  thread_local DefaultReplica replica;
  return replica.context;
}

ModeEntry current_mode() {
  const auto& stack = mode_stack();
  if (!stack.empty()) return stack.back();
  return ModeEntry{&default_strategy(), nullptr, &default_replica_context(), 1, -1};
}

int current_merge_depth(const Strategy& s) {
  const auto& stack = mode_stack();
  if (stack.empty() || stack.back().cross_replica != &s) return -1;
  return stack.back().merge_depth;
}

namespace {
std::atomic<std::uint64_t> shared_tasks{0};
}  // namespace

std::uint64_t shared_merge_tasks() { return shared_tasks.load(std::memory_order_relaxed); }

bool share_with_paused_replicas(const Strategy& s, const std::shared_ptr<const MergeTask>& task) {
  const auto& stack = mode_stack();
  if (stack.empty() || stack.back().cross_replica != &s || stack.back().merge_helpers == nullptr) return false;
  shared_tasks.fetch_add(1, std::memory_order_relaxed);
  ReplicaRendezvous& group = *stack.back().merge_helpers;
  const CollectiveCall& rounds = *stack.back().merge_rounds;
  // The paused replicas see the task in the first round (ReplicaContext::
  // merge_call_impl), run their share, and arrive at the second.
  group.arrive(0, {.send = &kMergeTaskMark, .object = std::const_pointer_cast<MergeTask>(task)}, rounds);
  task->run(0, group.size());
  group.release(0, rounds);  // the paused replicas write into the destinations until then
  return true;
}

std::string strategies_apart(const Strategy& a, const Strategy& b, std::string_view between) {
  std::string first = a.describe();
  std::string second = b.describe();
  if (first == second) {
    char at[48];
    std::snprintf(at, sizeof at, " at %p", static_cast<const void*>(&a));
    first += at;
    std::snprintf(at, sizeof at, " at %p", static_cast<const void*>(&b));
    second += at;
  }
  return first + std::string(between) + second;
}

void require_replica_context(const ReplicaContext& ctx, std::string_view api) {
  const ModeEntry mode = current_mode();
  if (mode.replica == &ctx) return;
  const std::string replica = "replica " + std::to_string(ctx.replica_id_in_sync_group());
  const std::atomic<bool>* running = internal::Access::channel(ctx).running;
  if (running != nullptr && !running->load(std::memory_order_acquire)) {
    throw FailedPreconditionError("ReplicaContext::" + std::string(api) + " was called on the context of " + replica +
                                  " of " + ctx.strategy().describe() +
                                  " after its run returned: a ReplicaContext is valid only inside the run that "
                                  "gave it, on its replica's thread (get_replica_context() inside the next run "
                                  "gives that run's)");
  }
  if (mode.replica == nullptr) {
    throw FailedPreconditionError("Need to be inside `call_for_each_replica()`: ReplicaContext::" + std::string(api) +
                                  " was called in a cross-replica context (inside strategy.scope() or a merge_fn)");
  }
  if (&mode.replica->strategy() == &ctx.strategy()) {
    throw FailedPreconditionError("Mismatching ReplicaContext: ReplicaContext::" + std::string(api) +
                                  " was called on replica " + std::to_string(ctx.replica_id_in_sync_group()) +
                                  "'s context from replica " +
                                  std::to_string(mode.replica->replica_id_in_sync_group()) + "'s thread.");
  }
  if (is_default_strategy(mode.replica->strategy()) && mode_stack().empty()) {
    // This thread is in no run, no scope: not a replica's thread at all.
    throw FailedPreconditionError("ReplicaContext::" + std::string(api) + " was called on the context of " + replica +
                                  " of " + ctx.strategy().describe() +
                                  " from a thread that is not that replica's (one the replica started?): a "
                                  "replica's collectives must be called on the replica's own thread, which runs "
                                  "its replica function");
  }
  throw FailedPreconditionError("Mismatching tf.distribute.Strategy objects: " +
                                strategies_apart(mode.replica->strategy(), ctx.strategy()) + ".");
}

ReplicaContext* replica_context_of(const Strategy& s) {
  const auto& stack = mode_stack();
  if (stack.empty() || stack.back().replica == nullptr || stack.back().strategy != &s) return nullptr;
  return stack.back().replica;
}

}  // namespace internal

using internal::current_mode;
using internal::mode_stack;

ReplicaContext* get_replica_context() { return current_mode().replica; }

bool in_cross_replica_context() { return current_mode().cross_replica != nullptr; }

Strategy* get_cross_replica_context() { return current_mode().cross_replica; }

Strategy& get_strategy() { return *current_mode().strategy; }

bool has_strategy() { return !is_default_strategy(get_strategy()); }

namespace {
// This thread's strategy by experimental_set_strategy, or null. Trivially
// destructible, so that a strategy destroyed while thread-locals are (a
// static one, at exit) can still ask whether it is this thread's.
thread_local const Strategy* global_strategy_set = nullptr;

struct GlobalStrategy {
  std::optional<StrategyScope> scope;
  std::size_t depth = 0;  // mode-stack size just after the global scope was entered
  ~GlobalStrategy() {
    scope.reset();
    global_strategy_set = nullptr;
  }
};
GlobalStrategy& global_strategy() {
  // The mode stack first: thread-locals are destroyed in the reverse order
  // of their construction, and the global scope's destructor pops its entry.
  mode_stack();
  thread_local GlobalStrategy g;
  return g;
}
}  // namespace

void internal::unset_global_strategy_if(const Strategy& s) noexcept {
  if (global_strategy_set != &s) return;
  GlobalStrategy& g = global_strategy();
  const auto& stack = mode_stack();
  // Nothing entered on top: the global entry is the top, not re-entered.
  if (stack.size() == g.depth && stack.back().scope_count == 1) {
    g.scope.reset();
    global_strategy_set = nullptr;
  }
}

void experimental_set_strategy(Strategy* strategy) {
  GlobalStrategy& g = global_strategy();
  const std::size_t base = g.scope ? g.depth : 0;
  const auto& stack = mode_stack();
  const bool nested_in_global = g.scope && !stack.empty() && stack.size() == base && stack.back().scope_count > 1;
  if (stack.size() > base || nested_in_global || (!g.scope && has_strategy())) {
    throw FailedPreconditionError("Must not be called inside a `tf.distribute.Strategy` scope.");
  }
  g.scope.reset();
  global_strategy_set = nullptr;
  if (strategy != nullptr) {
    g.scope.emplace(strategy->scope());
    g.depth = mode_stack().size();
    global_strategy_set = strategy;
  }
}

// ---- StrategyScope ----------------------------------------------------------

StrategyScope::StrategyScope(Strategy* strategy, Kind kind) : strategy_(strategy), kind_(kind) {
  if (kind_ != Kind::kNone) strategy_->count_scope(+1);
}

StrategyScope::StrategyScope(StrategyScope&& other) noexcept : strategy_(other.strategy_), kind_(other.kind_) {
  other.kind_ = Kind::kNone;
}

StrategyScope::~StrategyScope() {
  if (kind_ == Kind::kNone) return;
  auto& stack = mode_stack();
  if (kind_ == Kind::kPushed && !stack.empty()) {
    stack.pop_back();
  } else if (kind_ == Kind::kCounted && !stack.empty()) {
    --stack.back().scope_count;
  }
  strategy_->count_scope(-1);
}

StrategyScope Strategy::scope() {
  auto& stack = mode_stack();
  if (!stack.empty()) {
    internal::ModeEntry& top = stack.back();
    if (top.cross_replica == this) {
      ++top.scope_count;
      return StrategyScope(this, StrategyScope::Kind::kCounted);
    }
    if (top.replica != nullptr && top.strategy == this) {
      throw FailedPreconditionError(
          "Method requires being in cross-replica context, use "
          "get_replica_context().merge_call(): scope() of " +
          describe() + " entered inside its own replica function");
    }
  }
  if (is_default_strategy(*this)) {
    if (has_strategy()) throw FailedPreconditionError("Must not nest tf.distribute.Strategy scopes.");
    return StrategyScope(this, StrategyScope::Kind::kNone);
  }
  if (has_strategy()) {
    throw FailedPreconditionError("Mixing different tf.distribute.Strategy objects: " +
                                  internal::strategies_apart(get_strategy(), *this));
  }
  internal::watch_for_exit();
  stack.push_back(internal::ModeEntry{this, this, nullptr, 1, -1});
  return StrategyScope(this, StrategyScope::Kind::kPushed);
}

void Strategy::require_cross_replica_or_default(std::string_view api) const {
  const internal::ModeEntry mode = current_mode();
  if (mode.cross_replica == this) return;
  if (mode_stack().empty()) return;  // the default mode
  if (mode.strategy == this) {
    if (api == "gather") {
      throw FailedPreconditionError(
          "tf.distribute.Strategy.gather method requires cross-replica context, use "
          "get_replica_context().all_gather() instead");
    }
    throw FailedPreconditionError(
        "Method requires being in cross-replica context, use "
        "get_replica_context().merge_call(): " +
        std::string(api) + " was called inside a replica function of " + describe());
  }
  if (!has_strategy()) {
    throw FailedPreconditionError("Need to be inside \"with strategy.scope()\" for " + describe() + ": " +
                                  std::string(api) + " was called in a context of the default strategy");
  }
  throw FailedPreconditionError("Mixing different tf.distribute.Strategy objects: " +
                                internal::strategies_apart(*mode.strategy, *this) + " (in " + std::string(api) + ")");
}

}  // namespace distribute
