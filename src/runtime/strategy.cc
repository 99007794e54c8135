// Strategy itself: its construction and destruction, its state between calls
// (RunResources), the engine settings it checks, and describe / set_workers / scope counting.
#include "distribute/strategy.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/backend.h"
#include "core/seconds.h"
#include "core/whole_number.h"
#include "runtime/mode.h"
#include "runtime/replica_channel.h"
#include "runtime/runtime_util.h"
#include "runtime/strategy_internal.h"
#include "runtime/strategy_ref.h"

namespace distribute {
namespace internal {

void RunResources::reset() {
  local->reset();
  merge_failure_agreed = false;
  merge_args_taken = 0;
  for (auto& ch : channels) {
    ch.sequence = 0;
    ch.data_calls = 0;
    ch.agreed_failure = false;
  }
}

void RunResources::abort(ErrorCode code, const std::string& message, int origin) noexcept {
  local->abort(code, message, origin);
  for (auto& c : comms) c->abort(code, message, origin);
}

double env_seconds(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  const std::optional<double> seconds = parse_seconds(text);
  if (!seconds) {
    throw InvalidArgumentError(std::string(name) + "='" + text +
                               "' is not a number of seconds >= 0 (decimal digits, or inf for no limit)");
  }
  return *seconds;
}

std::size_t checked_engine_settings() {
  const std::size_t stream_bytes = default_all_reduce_stream_bytes();
  // Read elsewhere (the in-process backend, the process's storage cache), checked
  // here so that a bad setting fails the strategy's creation.
  env_whole_number("DISTRIBUTE_SPIN_MICROSECONDS", "a whole number of microseconds", std::numeric_limits<int>::max());
  env_whole_number("DISTRIBUTE_STORAGE_CACHE_BYTES", "a whole number of bytes");
  env_whole_number("DISTRIBUTE_ONE_ROUND_READ_BYTES", "a whole number of bytes");
  return stream_bytes;
}

}  // namespace internal

// ---- Strategy -------------------------------------------------------------------

namespace {
// describe() with the strategy's name given: ~Strategy cannot ask for it.
std::string describe_strategy(std::string_view name, int replicas, const std::vector<std::string>& devices,
                              const Communicator* workers) {
  std::string s = std::string(name) + "(" + std::to_string(replicas) + (replicas == 1 ? " replica" : " replicas");
  if (workers != nullptr) {
    s += " on " + std::to_string(workers->size()) + " workers; worker " + std::to_string(workers->rank()) + " has";
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const std::string& d = devices[i];
    const auto pos = d.find("device:");
    s += (i ? ", " : ": ") + (pos == std::string::npos ? d : d.substr(pos + 7));
  }
  return s + ")";
}

}  // namespace

Strategy::Strategy(std::vector<std::string> devices, int num_replicas_in_sync, int first_replica_id,
                   CommunicationOptions options, bool checks_settings)
    : devices_(std::move(devices)),
      num_replicas_in_sync_(num_replicas_in_sync),
      first_replica_id_(first_replica_id),
      options_(options),
      extended_(*this) {
  // The mode stack of the making thread exists before the strategy does, so
  // that it is destroyed after a thread-local strategy, and before a static
  // one at exit (~Strategy).
  internal::mode_stack();
  options_.validate();
  const std::size_t stream_bytes = checks_settings ? internal::checked_engine_settings() : internal::kNeverStream;
  if (!options_.timeout) {
    const double t = internal::env_seconds("DISTRIBUTE_COLLECTIVE_TIMEOUT");
    if (t > 0) options_.timeout = std::chrono::duration<double>(t);
  }
  state_ = std::make_unique<internal::StrategyState>(num_local_replicas());
  state_->stall_warning_seconds = internal::env_seconds("DISTRIBUTE_STALL_WARNING_SECONDS");
  state_->all_reduce_stream_bytes = stream_bytes;
}

Strategy::~Strategy() {
  internal::unset_global_strategy_if(*this);
  const int open = state_->open_scopes.load(std::memory_order_acquire);
  // Not while the process exits (std::exit, or a return from main, destroying
  // a static strategy): exit unwinds nothing, so a scope entered where it was
  // called stays open, and scopes of threads still running end with the
  // process.
  if (open > 0 && !internal::exiting()) {
    // The open scopes' mode entries would point at freed memory, read by
    // every later get_strategy() on their threads: no exception can leave a
    // destructor, so this ends the program, as destroying a joinable
    // std::thread does. (Its own name is gone with the derived class.)
    const std::string described = describe_strategy("Strategy", num_replicas_in_sync_, devices_, state_->workers);
    std::fprintf(stderr,
                 "distribute: %s was destroyed while still in use: %d scope()%s or run%s of it entered and not "
                 "left (on this thread or another); a strategy must outlive its scopes and runs\n",
                 described.c_str(), open, open == 1 ? "" : "s", open == 1 ? "" : "s");
    std::fflush(stderr);
    std::abort();
  }
}

void Strategy::count_scope(int delta) noexcept { state_->open_scopes.fetch_add(delta, std::memory_order_acq_rel); }

internal::StrategyRef::StrategyRef(Strategy& s)
    : strategy_(&s), alive_(Access::state(s).alive), described_(s.describe()) {}

void internal::StrategyRef::throw_destroyed(std::string_view kind, std::string_view name) const {
  const std::string holder = name.empty() ? std::string(kind) : std::string(kind) + " '" + std::string(name) + "'";
  throw FailedPreconditionError(holder + " was used after its strategy, " + described_ +
                                ", was destroyed: a strategy must outlive its variables and distributed datasets");
}

void Strategy::set_workers(std::shared_ptr<Communicator> workers) {
  state_->workers = workers.get();
  state_->workers_owner = std::move(workers);
}

bool Strategy::cancel_run(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->resources_mutex);
  bool cancelled = false;
  for (const auto& res : state_->by_depth) {
    if (res->running.load(std::memory_order_acquire)) {
      res->abort(ErrorCode::kCancelled, "Cancelled: " + reason, /*origin=*/-1);
      cancelled = true;
    }
  }
  return cancelled;
}

std::string Strategy::describe() const {
  return describe_strategy(name(), num_replicas_in_sync_, devices_, state_->workers);
}

}  // namespace distribute
