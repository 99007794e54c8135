#include "distribute/strategy.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <typeinfo>

#include "comm/backend.h"
#include "core/axis_reduce.h"
#include "core/payload_list.h"
#include "core/reduce_kernels.h"
#include "core/seconds.h"
#include "core/storage.h"
#include "core/whole_number.h"
#include "distribute/mirrored_strategy.h"
#include "runtime/mode.h"
#include "runtime/packing.h"
#include "runtime/replica_channel.h"
#include "runtime/replica_pool.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"
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

struct StrategyState {
  explicit StrategyState(int replicas) : pool(replicas) {}
  // Multi-worker strategies: one member per worker process. Declared first,
  // so that it outlives the communicators built on it (by_depth).
  std::shared_ptr<Communicator> workers_owner;
  ReplicaPool pool;
  std::mutex resources_mutex;
  std::vector<std::unique_ptr<RunResources>> by_depth;
  double stall_warning_seconds = 0;
  // Where the in-process all_reduce streams (read once, when the strategy is made).
  std::size_t all_reduce_stream_bytes = kNeverStream;
  // workers_owner, and the state of the cross-replica collectives this
  // worker issues through it.
  Communicator* workers = nullptr;
  std::recursive_mutex worker_mutex;
  std::uint64_t worker_sequence = 0;
  // Expires with the strategy (StrategyRef).
  std::shared_ptr<const void> alive = std::make_shared<const char>('\0');
  // Scopes entered and not yet left, on every thread (Strategy::count_scope).
  std::atomic<int> open_scopes{0};

  RunResources& resources(int depth, int replicas, double stall) {
    std::lock_guard<std::mutex> lock(resources_mutex);
    while (static_cast<int>(by_depth.size()) <= depth) {
      auto res = std::make_unique<RunResources>();
      ReplicaGroup group = make_replica_group({.kind = workers != nullptr ? BackendKind::kAcrossWorkers
                                                                          : BackendKind::kInProcess,
                                               .replicas = replicas,
                                               .workers = workers,
                                               .all_reduce_stream_bytes = all_reduce_stream_bytes});
      res->local = std::move(group.rendezvous);
      res->comms = std::move(group.members);
      res->channels.resize(static_cast<std::size_t>(replicas));
      for (int r = 0; r < replicas; ++r) {
        ReplicaChannel& ch = res->channels[static_cast<std::size_t>(r)];
        ch.comm = res->comms[static_cast<std::size_t>(r)].get();
        ch.local = res->local.get();
        ch.merge_failure_agreed = &res->merge_failure_agreed;
        ch.merge_args_taken = &res->merge_args_taken;
        ch.running = &res->running;
        ch.depth = static_cast<int>(by_depth.size());
        ch.stall_warning_seconds = stall;
      }
      by_depth.push_back(std::move(res));
    }
    return *by_depth[static_cast<std::size_t>(depth)];
  }
};

std::string describe_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return std::string(to_string(err.code())) + ": " + err.message();
  } catch (const std::exception& ex) {
    int status = 0;
    char* name = abi::__cxa_demangle(typeid(ex).name(), nullptr, nullptr, &status);
    std::string type = status == 0 && name ? name : typeid(ex).name();
    std::free(name);
    return type + ": " + ex.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
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
  return stream_bytes;
}

void throw_different_result_structures(std::string_view api, int first_replica,
                                       const std::vector<std::string>& structures) {
  std::size_t m = 1;
  while (m < structures.size() && structures[m] == structures[0]) ++m;
  const std::string a = "replica " + std::to_string(first_replica);
  const std::string b = "replica " + std::to_string(first_replica + static_cast<int>(m));
  std::string message = std::string(api) + ": the replicas returned results of different structures (" + a + ": " +
                        structures[0] + "; " + b + ": " + structures[m] + ")";
  if (const auto d = first_structure_difference(structures[0], structures[m])) {
    message += ". They first differ at" + d->path + ": " + a + " has " + d->a + ", " + b + " has " + d->b;
  }
  throw InvalidArgumentError(message + ". Every replica must return a result of the same structure (TensorFlow's "
                                       "regroup refuses others).");
}

void check_components(std::size_t given, const Strategy& s, std::string_view what) {
  if (given != static_cast<std::size_t>(s.num_local_replicas())) {
    throw InvalidArgumentError(std::string(what) + ": a distributed value has " + std::to_string(given) +
                               " components but " + s.describe() + " has " +
                               std::to_string(s.num_local_replicas()) + " local replicas");
  }
}

MergeTypes merge_types(std::initializer_list<const std::type_info*> types) {
  MergeTypes out;
  for (const std::type_info* t : types) {
    int status = 0;
    char* name = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
    out.names += (out.names.empty() ? "" : ", ") + std::string(status == 0 && name ? name : t->name());
    std::free(name);
  }
  TagHasher digest("merge_call types");
  digest.field("names", out.names);
  out.digest = digest.finish(0, false);
  return out;
}

// A cross-replica collective among the workers (one member per worker).
CollectiveCall worker_call(StrategyState& st, const CommunicationOptions& options, std::string_view op) {
  CollectiveCall call;
  call.op = op;
  call.sequence = ++st.worker_sequence;
  call.timeout_seconds = options.timeout && options.timeout->count() > 0 ? options.timeout->count() : 0;
  call.stall_warning_seconds = st.stall_warning_seconds;
  return call;
}

// Every worker has checked its own arguments into `sig`; the workers exchange
// their signatures and raise the same error everywhere if any found a problem
// or they disagree. Returns every worker's signature, in worker order. With
// one worker, raises the local verdict. An `extra` payload travels with the
// signature in the same round; `extras` receives every worker's, in order.
namespace {
// The exception object this thread last threw from a failed agreement between
// workers: merge_call tells such an error, raised by every worker's merge_fn
// alike, from one raised by this worker alone. Compared by identity, so that
// a copy or another error with the same text does not pass for it.
thread_local std::exception_ptr t_agreed_worker_error;
}  // namespace

void note_agreed_worker_error() { t_agreed_worker_error = std::current_exception(); }

void forget_agreed_worker_error() { t_agreed_worker_error = nullptr; }

bool take_agreed_worker_error(const std::exception_ptr& e) {
  const bool agreed = t_agreed_worker_error != nullptr && e == t_agreed_worker_error;
  t_agreed_worker_error = nullptr;
  return agreed;
}

std::vector<Signature> agree_workers(StrategyState& st, const CommunicationOptions& options, Signature& sig,
                                     ShapeRule rule, int axis, const std::string* extra = nullptr,
                                     std::vector<std::string>* extras = nullptr) {
  if (st.workers == nullptr || st.workers->size() == 1) {
    if (sig.error_code) throw_error(*sig.error_code, sig.error);
    if (extras != nullptr) extras->assign(1, extra != nullptr ? *extra : std::string());
    return {sig};
  }
  CollectiveCall call = worker_call(st, options, "agree");
  sig.sequence = call.sequence;
  call.op = sig.op;
  call.signature_tag = sig.tag(/*with_leaves=*/false);
  std::vector<std::string> payloads;
  bool agreed = true;
  try {
    payloads = st.workers->exchange(
        extra != nullptr ? encode_payload_list({sig.encode(), *extra}) : encode_payload_list({sig.encode()}), call);
  } catch (const SignatureMismatch&) {
    // Another worker is in a different collective: exchange signatures only
    // (whatever that collective sends to explain), to say which.
    agreed = false;
    call.signature_tag = 0;
    payloads = st.workers->exchange(encode_payload_list({sig.encode()}), call);
  }
  std::vector<Signature> sigs;
  if (extras != nullptr) extras->clear();
  for (const std::string& p : payloads) {
    const std::vector<std::string> list = decode_payload_list(p);
    if (agreed && extra != nullptr) {
      // Every worker is in this call: its signature, then its extra payload.
      sigs.push_back(Signature::decode(list.at(0)));
      if (extras != nullptr) extras->push_back(list.at(1));
      continue;
    }
    for (const std::string& one : list) sigs.push_back(Signature::decode(one));
  }
  try {
    check_signatures(sigs, 0, rule, axis, nullptr, "worker");
  } catch (const Error&) {
    note_agreed_worker_error();  // every worker raises it here alike
    throw;
  }
  return sigs;
}

void broadcast_from_first_worker(Strategy& s, Tensor& value, std::string_view api, const Error* local_error) {
  StrategyState& st = *s.state_;
  if (st.workers == nullptr || st.workers->size() == 1) return;  // (the caller raises its own error)
  Signature sig;
  sig.op = std::string(api);
  if (local_error != nullptr) sig.set_error(*local_error);
  sig.leaves.push_back({value.dtype(), value.shape().dims()});
  std::lock_guard<std::recursive_mutex> lock(st.worker_mutex);
  agree_workers(st, s.options_, sig, ShapeRule::kEqual, 0);
  const CollectiveCall call = worker_call(st, s.options_, api);
  st.workers->broadcast(value.mutable_raw_data(), static_cast<std::size_t>(value.num_elements()), value.dtype(),
                        /*root=*/0, call);
}

std::vector<std::string> exchange_across_workers(Strategy& s, std::string payload, std::string_view api,
                                                 const Error* local_error) {
  StrategyState& st = *s.state_;
  if (local_error != nullptr && (st.workers == nullptr || st.workers->size() == 1)) {
    throw_error(local_error->code(), local_error->message());
  }
  if (st.workers == nullptr || st.workers->size() == 1) return {std::move(payload)};
  std::lock_guard<std::recursive_mutex> lock(st.worker_mutex);
  // The payloads ride on the agreement that every worker is in this call
  // (else the usual mismatch error on every worker): one round. An error in
  // a worker's signature is raised by every worker.
  Signature sig;
  sig.op = std::string(api);
  if (local_error != nullptr) sig.set_error(*local_error);
  std::vector<std::string> all;
  agree_workers(st, s.options_, sig, ShapeRule::kEqual, 0, &payload, &all);
  return all;
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
    : devices_(std::move(devices)), num_replicas_in_sync_(num_replicas_in_sync),
      first_replica_id_(first_replica_id), options_(std::move(options)), extended_(*this) {
  // The mode stack of the making thread exists before the strategy does, so
  // that it is destroyed after a thread-local strategy, and before a static
  // one at exit (~Strategy).
  internal::mode_stack();
  options_.validate();
  const std::size_t stream_bytes =
      checks_settings ? internal::checked_engine_settings() : internal::kNeverStream;
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

internal::StrategyRef::StrategyRef(Strategy& s) : strategy_(&s), alive_(s.state_->alive), described_(s.describe()) {}

void internal::StrategyRef::throw_destroyed(std::string_view kind, std::string_view name) const {
  const std::string holder = name.empty() ? std::string(kind) : std::string(kind) + " '" + std::string(name) + "'";
  throw FailedPreconditionError(holder + " was used after its strategy, " + described_ +
                                ", was destroyed: a strategy must outlive its variables and distributed datasets");
}

void Strategy::set_workers(std::shared_ptr<Communicator> workers) {
  state_->workers = workers.get();
  state_->workers_owner = std::move(workers);
}


std::string Strategy::describe() const {
  return describe_strategy(name(), num_replicas_in_sync_, devices_, state_->workers);
}

namespace {
// Takes the turn of a run at one depth (runs of one strategy take turns),
// within `timeout` seconds (0: none): DeadlineExceededError past it, a
// warning on stderr every `stall` seconds (0: none).
void take_turn(std::unique_lock<std::mutex>& run_lock, std::string_view api, const Strategy& strategy,
               double timeout, double stall) {
  if (run_lock.try_lock()) return;
  // Another run of this strategy is in progress on another thread. A thread
  // that one of its replicas started, and waits for, would wait here for
  // ever: that run holds every replica. The strategy's timeout bounds the
  // wait, and the stall warning names it.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = internal::deadline_after(start, timeout);
  Clock::time_point warn_at = internal::deadline_after(start, stall);
  const std::string waiting = std::string(api) + " of " + strategy.describe() +
                              " waits for another run of it, in progress on another thread, to end (runs of one "
                              "strategy take turns; a thread that a replica started cannot run the same strategy "
                              "while that replica waits for it: that run holds every replica)";
  // Polled, with sleeps growing to 1 ms: the wait is rare (a contended
  // strategy), and a timed lock (pthread_mutex_clocklock) is one that
  // ThreadSanitizer does not see taken.
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    if (deadline == Clock::time_point::max() && warn_at == Clock::time_point::max()) {
      run_lock.lock();
      return;
    }
    if (run_lock.try_lock()) return;
    const Clock::time_point now = Clock::now();
    const double waited = std::chrono::duration<double>(now - start).count();
    if (now >= deadline) {
      throw DeadlineExceededError(std::string(api) + " timed out after " + std::to_string(waited).substr(0, 5) +
                                  " s: " + waiting);
    }
    if (now >= warn_at) {
      std::fprintf(stderr, "distribute: warning: %s; waited %.1f s\n", waiting.c_str(), waited);
      warn_at = internal::deadline_after(now, stall);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(2 * pause, std::chrono::milliseconds(1));
  }
}
}  // namespace

void Strategy::run_replicas(const std::function<void(ReplicaContext&)>& body, std::string_view api) {
  require_cross_replica_or_default(api);
  const int depth = internal::current_merge_depth(*this) + 1;
  const int n = num_local_replicas();
  internal::RunResources& res = state_->resources(depth, n, state_->stall_warning_seconds);
  // Runs of one strategy at one depth take turns: concurrent top-level runs from
  // several threads, or nested runs from merge_fns of default contexts on two threads.
  std::unique_lock<std::mutex> run_lock(res.mutex, std::defer_lock);
  take_turn(run_lock, api, *this, options_.timeout ? options_.timeout->count() : 0, state_->stall_warning_seconds);
  res.reset();
  StrategyScope scope_guard = scope();

  std::vector<ReplicaContext>& contexts = res.contexts;
  if (contexts.empty()) {
    contexts.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      contexts.emplace_back(*this, first_replica_id_ + i, i, &res.channels[static_cast<std::size_t>(i)]);
    }
  }
  struct Running {
    std::atomic<bool>& flag;
    explicit Running(std::atomic<bool>& f) : flag(f) { flag.store(true, std::memory_order_release); }
    ~Running() { flag.store(false, std::memory_order_release); }
  } running(res.running);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  const std::function<void(int)> replica_main = [&](int i) {
    const auto idx = static_cast<std::size_t>(i);
    {
      internal::ModeGuard mode(internal::ModeEntry{this, nullptr, &contexts[idx], 1, -1});
      internal::DeviceScope device(devices_[idx]);
      internal::with_forced_unwind(
          [&] { body(contexts[idx]); },
          [&] {
            // pthread_exit (or a cancellation) in the replica function: its
            // thread ends, so must this replica's part. The others are told,
            // and the run raises this in its place.
            errors[idx] = std::make_exception_ptr(FailedPreconditionError(
                "Replica " + std::to_string(first_replica_id_ + i) +
                " called pthread_exit (or its thread was cancelled) inside its replica function: its thread ended "
                "there, and so did its part of the run"));
            res.abort(ErrorCode::kAborted,
                      "Replica " + std::to_string(first_replica_id_ + i) +
                          " ended its thread (pthread_exit) inside its replica function; the collectives of the other "
                          "replicas were aborted.",
                      i);
            res.local->mark_done(i);
          },
          [&] {
            errors[idx] = std::current_exception();
            // An error every replica raised alike leaves nobody waiting: the
            // workers' link stays usable. Anything else aborts the others.
            if (!res.channels[idx].agreed_failure) {
              res.abort(ErrorCode::kAborted,
                        "Replica " + std::to_string(first_replica_id_ + i) + " failed with " +
                            internal::describe_exception(errors[idx]) +
                            "; the collectives of the other replicas were aborted.",
                        i);
            }
          });
    }
    res.local->mark_done(i);
  };
  if (depth == 0) {
    state_->pool.run(replica_main);
  } else {
    // Made before any thread starts: the abort must not fail for want of memory.
    const std::string cannot_start =
        "A replica of a nested run could not start; the collectives of the other replicas were aborted.";
    internal::run_on_new_threads(n, replica_main, [&](int i, const std::exception_ptr& error) noexcept {
      try {
        res.abort(ErrorCode::kAborted,
                  "Replica " + std::to_string(first_replica_id_ + i) + " of a nested run could not start (" +
                      internal::describe_exception(error) + "); the collectives of the other replicas were aborted.",
                  i);
      } catch (...) {
        res.abort(ErrorCode::kAborted, cannot_start, i);
      }
    });
  }
  // The last merge_fn's result (and a copy job's tensors) would otherwise
  // stay in the group's entries until the next run.
  res.local->drop_objects();

  const int origin = res.local->abort_origin();
  if (origin >= 0 && errors[static_cast<std::size_t>(origin)]) {
    std::rethrow_exception(errors[static_cast<std::size_t>(origin)]);
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

namespace {
void check_same_dtype_and_shape(const std::vector<Tensor>& components, std::string_view api, int first_replica_id_) {
  for (std::size_t i = 1; i < components.size(); ++i) {
    const Tensor& a = components[0];
    const Tensor& b = components[i];
    if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
      throw InvalidArgumentError(std::string(api) + ": the components must have the same dtype and shape: replica " +
                                 std::to_string(first_replica_id_) + " has " + std::string(to_string(a.dtype())) +
                                 a.shape().to_string() + ", replica " +
                                 std::to_string(first_replica_id_ + static_cast<int>(i)) + " has " +
                                 std::string(to_string(b.dtype())) + b.shape().to_string());
    }
  }
}
}  // namespace

void Strategy::check_and_agree(const std::vector<Tensor>& components, std::string_view api, ReduceOp op,
                               const CommunicationOptions& options) {
  check_and_agree_batch({&components}, api, op, options);
}

void Strategy::check_and_agree_batch(const std::vector<const std::vector<Tensor>*>& values, std::string_view api,
                                     ReduceOp op, const CommunicationOptions& options) {
  internal::Signature sig;
  sig.op = std::string(api);
  sig.fields = {{"reduce op", std::string(to_string(op))}, {"values", std::to_string(values.size())}};
  try {
    options.validate();
  } catch (const Error& e) {
    sig.set_error(e);
  }
  for (std::size_t k = 0; k < values.size() && !sig.error_code; ++k) {
    const std::vector<Tensor>& components = *values[k];
    try {
      internal::check_components(components.size(), *this, api);
      check_same_dtype_and_shape(components, api, first_replica_id_);
      sig.leaves.push_back({components[0].dtype(), components[0].shape().dims()});
    } catch (const Error& e) {
      sig.set_error(values.size() == 1 ? e : Error(e.code(), "value " + std::to_string(k) + ": " + e.message()));
      break;
    }
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  internal::agree_workers(*state_, options, sig, internal::ShapeRule::kEqual, 0);
}

Tensor Strategy::reduce_components(ReduceOp op, const std::vector<Tensor>& components,
                                   const CommunicationOptions& options, std::int64_t mean_divisor) {
  return reduce_components_batch(op, {&components}, options, mean_divisor)[0];
}

std::vector<Tensor> Strategy::reduce_components_batch(ReduceOp op,
                                                      const std::vector<const std::vector<Tensor>*>& values,
                                                      const CommunicationOptions& options,
                                                      std::int64_t mean_divisor) {
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : num_replicas_in_sync_;
  Communicator* workers = state_->workers;
  const bool across = workers != nullptr && workers->size() > 1;
  // Several workers: the local replicas first (MEAN as a SUM), then the workers, dividing once.
  const ReduceOp local_op = across && op == ReduceOp::kMean ? ReduceOp::kSum : op;
  std::vector<Tensor> firsts;
  firsts.reserve(values.size());
  for (const auto* v : values) firsts.push_back(v->front());
  std::vector<Tensor> out(values.size());
  for (const internal::Pack& pack : internal::plan_packs(firsts, options.bytes_per_pack)) {
    const std::size_t elem = size_of(pack.dtype);
    if (across && op == ReduceOp::kMean && !is_floating(pack.dtype)) {
      // An exact integer (or bool) MEAN cannot be split into per-worker sums
      // (they would wrap, and bool's "sum" is OR): gather every replica's
      // values of the pack and reduce them once, in replica order.
      reduce_exact_mean(pack, values, divisor, options, out);
      continue;
    }
    Tensor buffer = Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count)}, kHostDevice);
    auto* base = static_cast<std::byte*>(buffer.mutable_raw_data());
    std::size_t offset = 0;
    std::vector<const void*> srcs;
    for (std::size_t leaf : pack.leaves) {
      const std::vector<Tensor>& components = *values[leaf];
      const auto count = static_cast<std::size_t>(components.front().num_elements());
      srcs.clear();
      for (const Tensor& t : components) srcs.push_back(t.raw_data());
      internal::reduce_sources(base + offset * elem, srcs, count, pack.dtype, local_op, divisor);
      // A view of the pack: no copy out.
      out[leaf] = Tensor::from_shared(std::shared_ptr<std::byte>(buffer.storage(), base + offset * elem), pack.dtype,
                                      components.front().shape(), kHostDevice);
      offset += count;
    }
    if (across) {
      std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
      const CollectiveCall call = internal::worker_call(*state_, options, "reduce");
      workers->all_reduce(base, base, pack.count, pack.dtype, op, call, divisor);
    }
  }
  return out;
}

void Strategy::reduce_exact_mean(const internal::Pack& pack, const std::vector<const std::vector<Tensor>*>& values,
                                 std::int64_t divisor, const CommunicationOptions& options, std::vector<Tensor>& out) {
  const std::size_t elem = size_of(pack.dtype);
  const auto local = static_cast<std::size_t>(num_local_replicas());
  const auto workers = static_cast<std::size_t>(state_->workers->size());
  // This worker's block: replica i's values of the pack, one replica after another.
  Tensor block = Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count * local)}, kHostDevice);
  auto* at = static_cast<std::byte*>(block.mutable_raw_data());
  for (std::size_t i = 0; i < local; ++i) {
    for (std::size_t leaf : pack.leaves) {
      const Tensor& t = (*values[leaf])[i];
      std::memcpy(at, t.raw_data(), t.nbytes());
      at += t.nbytes();
    }
  }
  Tensor all = Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count * local * workers)},
                                     kHostDevice);
  {
    std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
    const std::vector<std::size_t> counts(workers, pack.count * local);
    state_->workers->all_gather_v(block.raw_data(), all.mutable_raw_data(), counts, 1, pack.dtype,
                                  internal::worker_call(*state_, options, "reduce"));
  }
  Tensor buffer = Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count)}, kHostDevice);
  auto* base = static_cast<std::byte*>(buffer.mutable_raw_data());
  const auto* gathered = static_cast<const std::byte*>(all.raw_data());
  std::vector<const void*> srcs(local * workers);
  std::size_t offset = 0;
  for (std::size_t leaf : pack.leaves) {
    const Tensor& first = values[leaf]->front();
    const auto count = static_cast<std::size_t>(first.num_elements());
    for (std::size_t r = 0; r < srcs.size(); ++r) srcs[r] = gathered + (r * pack.count + offset) * elem;
    internal::reduce_sources(base + offset * elem, srcs, count, pack.dtype, ReduceOp::kMean, divisor);
    out[leaf] = Tensor::from_shared(std::shared_ptr<std::byte>(buffer.storage(), base + offset * elem), pack.dtype,
                                    first.shape(), kHostDevice);
    offset += count;
  }
}

Tensor Strategy::reduce_along_axes(ReduceOp op, const std::vector<Tensor>& components, const std::vector<int>& axes) {
  const ReduceOp partial = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  std::vector<Tensor> partials;
  std::vector<Tensor> counts;
  internal::Signature sig;
  sig.op = "reduce";
  std::string axes_text;
  for (int a : axes) axes_text += (axes_text.empty() ? "" : ", ") + std::to_string(a);
  sig.fields = {{"reduce op", std::string(to_string(op))}, {"axes", "[" + axes_text + "]"}};
  try {
    internal::check_components(components.size(), *this, "reduce");
    for (std::size_t i = 0; i < components.size(); ++i) {
      const Tensor& c = components[i];
      if (c.dtype() != components[0].dtype()) {
        throw InvalidArgumentError("reduce: replica " + std::to_string(first_replica_id_ + static_cast<int>(i)) +
                                   " has dtype " + std::string(to_string(c.dtype())) + ", replica " +
                                   std::to_string(first_replica_id_) + " has " +
                                   std::string(to_string(components[0].dtype())));
      }
      const std::vector<int> norm = internal::normalize_axes(axes, c.rank());
      std::int64_t count = 1;
      for (int a : norm) count *= c.shape()[a];
      partials.push_back(internal::reduce_axes(c, norm, partial));  // identity of c's dtype on empty axes
      counts.push_back(scalar(DType::kInt64, static_cast<double>(count)));
    }
    check_same_dtype_and_shape(partials, "reduce (after reducing along the axis)", first_replica_id_);
    sig.leaves.push_back({partials[0].dtype(), partials[0].shape().dims()});
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  internal::agree_workers(*state_, options_, sig, internal::ShapeRule::kEqual, 0);
  Tensor total = reduce_components(partial, partials, options_, 0);
  if (op == ReduceOp::kMean) {
    const std::int64_t n = reduce_components(ReduceOp::kSum, counts, options_, 0).scalar<std::int64_t>();
    if (n == 0 && !is_floating(components[0].dtype())) {
      throw InvalidArgumentError("reduce: the MEAN of zero elements of dtype " +
                                 std::string(to_string(components[0].dtype())) + " is undefined");
    }
    if (n == 0) {
      total = fill(total.dtype(), total.shape(), std::nan(""));
    } else {
      const void* src[1] = {total.raw_data()};
      internal::reduce_sources(total.mutable_raw_data(), src, static_cast<std::size_t>(total.num_elements()),
                               total.dtype(), ReduceOp::kMean, n);
    }
  }
  return cast(total, components[0].dtype()).with_device(kHostDevice);
}

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis) {
  require_cross_replica_or_default("reduce");
  if (axis) return reduce_along_axes(op, value.values(), {*axis});
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  check_and_agree(value.values(), "reduce", op, options_);
  return reduce_components(op, value.values(), options_, 0);
}

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value, const std::vector<int>& axes) {
  require_cross_replica_or_default("reduce");
  return reduce_along_axes(op, value.values(), axes);
}

namespace {
// TensorFlow's reduce_non_distributed_value: a value that is the same on every
// replica keeps its value under MEAN (and MIN, MAX); SUM and PRODUCT would
// need to know it was meant once per replica, which is an error for N > 1.
void check_non_distributed(ReduceOp op, const Strategy& s, const std::string& value_text, bool mirrored) {
  if (op == ReduceOp::kMean || op == ReduceOp::kMin || op == ReduceOp::kMax || s.num_replicas_in_sync() == 1) {
    return;
  }
  if (mirrored) {
    throw InvalidArgumentError("A Mirrored value " + value_text + " cannot be reduced with " +
                               std::string(to_string(op)) + ": its components are already identical");
  }
  throw InvalidArgumentError("A non-DistributedValues value " + value_text +
                             " cannot be reduced with the given reduce op " + std::string(to_string(op)) + ".");
}

std::string short_text(const Tensor& t) {
  return t.num_elements() <= 16 ? t.to_list_string() : "of shape " + t.shape().to_string();
}
}  // namespace

Tensor Strategy::reduce(ReduceOp op, const Mirrored<Tensor>& value, std::optional<int> axis) {
  require_cross_replica_or_default("reduce");
  internal::check_components(value.size(), *this, "reduce");
  check_non_distributed(op, *this, short_text(value.primary()), /*mirrored=*/true);
  if (!axis) return value.primary().clone().with_device(kHostDevice);
  // Every component is the same: reducing N copies gives the right MEAN (and MIN, MAX).
  return reduce_along_axes(op, value.values(), {*axis});
}

Tensor Strategy::reduce(ReduceOp op, const Tensor& value, std::optional<int> axis) {
  require_cross_replica_or_default("reduce");
  if (!axis && values_are_per_worker()) return reduce_per_worker(op, value, options_, "reduce");
  check_non_distributed(op, *this, short_text(value), /*mirrored=*/false);
  if (!axis) return value;
  return reduce_along_axes(op, std::vector<Tensor>(static_cast<std::size_t>(num_local_replicas()), value), {*axis});
}

bool Strategy::values_are_per_worker() const { return state_->workers != nullptr && state_->workers->size() > 1; }

Tensor Strategy::reduce_per_worker(ReduceOp op, const Tensor& value, const CommunicationOptions& options,
                                   std::string_view api) {
  internal::Signature sig;
  sig.op = std::string(api);
  sig.fields = {{"reduce op", std::string(to_string(op))}, {"value", "one per worker (not distributed)"}};
  sig.leaves.push_back({value.dtype(), value.shape().dims()});
  try {
    options.validate();
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  internal::agree_workers(*state_, options, sig, internal::ShapeRule::kEqual, 0);
  Tensor out = value.clone().with_device(kHostDevice);
  const CollectiveCall call = internal::worker_call(*state_, options, api);
  // MEAN over the workers: each element is reduced from every worker's at
  // once (integers exactly, truncated toward zero).
  state_->workers->all_reduce(out.raw_data(), out.mutable_raw_data(), static_cast<std::size_t>(out.num_elements()),
                              out.dtype(), op, call, state_->workers->size());
  return out;
}

namespace {
std::string slices_text(const IndexedSlices& s) {
  return "dense_shape " + s.dense_shape().to_string() + ", indices " + std::string(to_string(s.indices().dtype()));
}

// The rows of values of `s`, as a shape with its first dimension dropped: "(?, 4)".
std::string row_shape(const Tensor& values) {
  std::string text = "(?";
  for (int d = 1; d < values.rank(); ++d) text += ", " + std::to_string(values.shape()[d]);
  return text + (values.rank() == 1 ? ",)" : ")");
}
}  // namespace

IndexedSlices Strategy::reduce_slices(ReduceOp op, const std::vector<IndexedSlices>& components,
                                      const CommunicationOptions& options, std::string_view api) {
  internal::Signature sig;
  sig.op = std::string(api);
  sig.fields = {{"reduce op", std::string(to_string(op))}};
  Tensor values, indices;
  try {
    options.validate();
    internal::check_components(components.size(), *this, api);
    if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
      throw InvalidArgumentError(std::string(api) + " of IndexedSlices supports SUM and MEAN only, not " +
                                 std::string(to_string(op)));
    }
    const IndexedSlices& first = components.front();
    for (std::size_t i = 1; i < components.size(); ++i) {
      const IndexedSlices& c = components[i];
      if (slices_text(c) != slices_text(first) || c.dtype() != first.dtype() ||
          row_shape(c.values()) != row_shape(first.values())) {
        throw InvalidArgumentError(
            std::string(api) + ": the IndexedSlices of the replicas differ: replica " +
            std::to_string(first_replica_id_) + " has " + std::string(to_string(first.dtype())) +
            row_shape(first.values()) + ", " + slices_text(first) + "; replica " +
            std::to_string(first_replica_id_ + static_cast<int>(i)) + " has " + std::string(to_string(c.dtype())) +
            row_shape(c.values()) + ", " + slices_text(c));
      }
    }
    std::vector<Tensor> local_values, local_indices;
    for (const IndexedSlices& c : components) {
      local_values.push_back(c.values());
      local_indices.push_back(c.indices());
    }
    values = concat(local_values, 0).with_device(kHostDevice);
    indices = concat(local_indices, 0).with_device(kHostDevice);
    sig.fields.emplace_back("IndexedSlices", slices_text(first));
    sig.leaves.push_back({values.dtype(), values.shape().dims()});
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  const std::vector<internal::Signature> blocks =
      internal::agree_workers(*state_, options, sig, internal::ShapeRule::kAllButFirst, 0);
  const IndexedSlices& first = components.front();
  if (blocks.size() > 1) {
    // Every worker's rows, in worker order: replica order.
    std::int64_t row = 1;
    for (int d = 1; d < values.rank(); ++d) row *= values.shape()[d];
    std::vector<std::size_t> value_counts, index_counts;
    std::int64_t rows = 0;
    for (const internal::Signature& b : blocks) {
      value_counts.push_back(static_cast<std::size_t>(b.leaves[0].dims[0] * row));
      index_counts.push_back(static_cast<std::size_t>(b.leaves[0].dims[0]));
      rows += b.leaves[0].dims[0];
    }
    std::vector<std::int64_t> dims = values.shape().dims();
    dims[0] = rows;
    Tensor all_values = Tensor::uninitialized(values.dtype(), Shape(dims), kHostDevice);
    Tensor all_indices = Tensor::uninitialized(indices.dtype(), Shape{rows}, kHostDevice);
    state_->workers->all_gather_v(values.raw_data(), all_values.mutable_raw_data(), value_counts, 1, values.dtype(),
                                  internal::worker_call(*state_, options, api));
    state_->workers->all_gather_v(indices.raw_data(), all_indices.mutable_raw_data(), index_counts, 1,
                                  indices.dtype(), internal::worker_call(*state_, options, api));
    values = all_values;
    indices = all_indices;
  }
  if (op == ReduceOp::kMean) {
    values = values.clone();
    const void* src[1] = {values.raw_data()};
    internal::reduce_sources(values.mutable_raw_data(), src, static_cast<std::size_t>(values.num_elements()),
                             values.dtype(), ReduceOp::kMean, num_replicas_in_sync_);
  }
  return IndexedSlices(values, indices, first.dense_shape());
}

IndexedSlices Strategy::reduce(ReduceOp op, const PerReplica<IndexedSlices>& value) {
  require_cross_replica_or_default("reduce");
  return reduce_slices(op, value.values(), options_, "reduce");
}

Tensor Strategy::gather(const PerReplica<Tensor>& value, int axis) {
  require_cross_replica_or_default("gather");
  const auto& comps = value.values();
  // This worker's replicas, concatenated; then (several workers) the workers' blocks.
  Tensor block;
  internal::Signature sig;
  sig.op = "gather";
  sig.fields = {{"axis", std::to_string(axis)}};
  try {
    internal::check_components(comps.size(), *this, "gather");
    std::vector<internal::Signature> sigs(comps.size());
    for (std::size_t i = 0; i < comps.size(); ++i) {
      sigs[i].op = "gather";
      sigs[i].sequence = 0;
      sigs[i].leaves.push_back({comps[i].dtype(), comps[i].shape().dims()});
      internal::validate_gather_leaf(comps[i], axis, sigs[i]);
    }
    internal::check_signatures(sigs, first_replica_id_, internal::ShapeRule::kAllButAxis, axis, nullptr);
    block = concat(comps, axis).with_device(kHostDevice);
    sig.leaves.push_back({block.dtype(), block.shape().dims()});
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  const std::vector<internal::Signature> blocks =
      internal::agree_workers(*state_, options_, sig, internal::ShapeRule::kAllButAxis, axis);
  if (blocks.size() == 1) return block;
  const auto a = static_cast<std::size_t>(axis < 0 ? axis + block.rank() : axis);
  const internal::GatherLayout layout = internal::gather_layout(
      block, axis, blocks.size(), [&](std::size_t w) { return blocks[w].leaves[0].dims[a]; });
  Tensor out = Tensor::uninitialized(block.dtype(), layout.shape, kHostDevice);
  const CollectiveCall call = internal::worker_call(*state_, options_, "gather");
  state_->workers->all_gather_v(block.raw_data(), out.mutable_raw_data(), layout.counts, layout.outer, block.dtype(),
                                call);
  return out;
}

Tensor Strategy::gather(const Tensor& value, int) {
  require_cross_replica_or_default("gather");
  return value;
}

Tensor Strategy::gather(const IndexedSlices&, int) {
  require_cross_replica_or_default("gather");
  throw UnimplementedError("gather does not support IndexedSlices");
}

// ---- StrategyExtended -------------------------------------------------------------

Destinations::Destinations(const char* device) : Destinations(std::string(device)) {}

Destinations::Destinations(const std::string& device) {
  if (device.empty()) throw InvalidArgumentError("destinations can not be empty");
  devices_.push_back(canonical_device_name(device));
}

Destinations Destinations::of_devices(const std::vector<std::string>& devices) {
  if (devices.empty()) throw InvalidArgumentError("destinations can not be empty");
  Destinations d;
  for (const auto& name : devices) d.devices_.push_back(canonical_device_name(name));
  return d;
}

namespace {
// Copies are shared with the replicas paused in merge_call from this many
// bytes per destination for each replica that helps. Below it the two
// rounds that takes cost more than they save; with more replicas the rounds
// cost more (measured: with 2 replicas sharing pays from 128 KiB and ties at
// 64 KiB; with 3 it pays from 256 KiB and loses at 128 KiB; with 4 it ties
// at 256-512 KiB; docs/benchmarks.md, "broadcast_to through merge_call").
constexpr std::size_t kShareCopiesBytesPerHelper = std::size_t{128} << 10;

bool worth_sharing(const Strategy& strategy, std::size_t bytes) {
  const auto helpers = static_cast<std::size_t>(strategy.num_local_replicas() - 1);
  return helpers > 0 && bytes >= kShareCopiesBytesPerHelper * helpers;
}

// The copies of one place_on, seen as one run of bytes (every destination
// after the other) that the members of the group split evenly. It holds the
// source and the destinations, so that a member still copying never writes
// into freed memory.
struct CopyJob final : internal::MergeTask {
  CopyJob(Tensor from, std::vector<Tensor> to) : source(std::move(from)), destinations(std::move(to)) {}
  Tensor source;
  std::vector<Tensor> destinations;

  void run(int member, int members) const noexcept override {
    const std::size_t bytes = source.nbytes();
    const std::size_t total = bytes * destinations.size();
    std::size_t at = total * static_cast<std::size_t>(member) / static_cast<std::size_t>(members);
    const std::size_t end = total * static_cast<std::size_t>(member + 1) / static_cast<std::size_t>(members);
    const auto* from = static_cast<const std::byte*>(source.raw_data());
    while (at < end) {
      const std::size_t k = at / bytes, offset = at % bytes;
      const std::size_t n = std::min(end - at, bytes - offset);
      internal::copy_broadcast_part(
          static_cast<std::byte*>(destinations[k].mutable_raw_data()) + offset, from + offset, n, bytes);
      at += n;
    }
  }
};

// One tensor of `value` per destination device. The destination on the
// value's own device gets the value itself, sharing its storage, as
// TensorFlow's identity on the same device does; a `fresh` value (a result
// nobody else holds) goes to the first destination when none is on its
// device. Every other destination gets a copy. Inside a merge_fn, large
// copies are shared with the paused replicas (each copies its part at once),
// as the engine's broadcast shares its copies.
Mirrored<Tensor> place_on(const Strategy& strategy, const Tensor& value, const std::vector<std::string>& devices,
                          bool fresh = false) {
  const auto own = std::find(devices.begin(), devices.end(), value.device());
  const std::size_t kept = own != devices.end() ? static_cast<std::size_t>(own - devices.begin())
                           : fresh              ? 0
                                                : devices.size();
  std::vector<Tensor> copies;
  copies.reserve(devices.size());
  std::vector<Tensor> to_fill;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (i == kept) {
      copies.push_back(value.with_device(devices[i]));
    } else {
      copies.push_back(Tensor::uninitialized(value.dtype(), value.shape(), devices[i]));
      to_fill.push_back(copies.back());
    }
  }
  if (to_fill.empty()) return Mirrored<Tensor>(std::move(copies));
  if (worth_sharing(strategy, value.nbytes())) {
    const auto job = std::make_shared<const CopyJob>(value, std::move(to_fill));
    if (!internal::share_with_paused_replicas(strategy, job)) job->run(0, 1);
  } else {
    CopyJob(value, std::move(to_fill)).run(0, 1);  // alone, no heap
  }
  return Mirrored<Tensor>(std::move(copies));
}
}  // namespace

Mirrored<Tensor> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<Tensor>& value,
                                             const Destinations& destinations, const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  std::lock_guard<std::recursive_mutex> lock(strategy_->state_->worker_mutex);
  strategy_->check_and_agree(value.values(), "reduce_to", op, merged);
  return place_on(*strategy_, strategy_->reduce_components(op, value.values(), merged, 0), destinations.devices(),
                  /*fresh=*/true);
}

Mirrored<Tensor> StrategyExtended::reduce_to(ReduceOp op, const Mirrored<Tensor>& value,
                                             const Destinations& destinations, const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  strategy_->options_.merge(options).validate();
  internal::check_components(value.size(), *strategy_, "reduce_to");
  check_non_distributed(op, *strategy_, short_text(value.primary()), /*mirrored=*/true);
  return place_on(*strategy_, value.primary(), destinations.devices());
}

Mirrored<Tensor> StrategyExtended::reduce_to(ReduceOp op, const Tensor& value, const Destinations& destinations,
                                             const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  if (strategy_->values_are_per_worker()) {
    return place_on(*strategy_, strategy_->reduce_per_worker(op, value, merged, "reduce_to"), destinations.devices(),
                    /*fresh=*/true);
  }
  merged.validate();
  check_non_distributed(op, *strategy_, short_text(value), /*mirrored=*/false);
  return place_on(*strategy_, value, destinations.devices());
}

namespace {
// batch_reduce_to of values that are not per-replica Tensors: one reduce_to
// each, in order (each its own agreement; no packing).
template <class Result, class Value, class ReduceOne>
std::vector<Result> reduce_each(const std::vector<std::pair<Value, Destinations>>& pairs, ReduceOne&& one) {
  std::vector<Result> out;
  out.reserve(pairs.size());
  for (const auto& [value, destinations] : pairs) out.push_back(one(value, destinations));
  return out;
}

// `slices` on every destination device: values and indices placed as a
// Tensor result is (its own copy for each destination past the first).
Mirrored<IndexedSlices> place_slices_on(const Strategy& strategy, const IndexedSlices& slices,
                                        const std::vector<std::string>& devices) {
  const Mirrored<Tensor> values = place_on(strategy, slices.values(), devices, /*fresh=*/true);
  const Mirrored<Tensor> indices = place_on(strategy, slices.indices(), devices, /*fresh=*/true);
  std::vector<IndexedSlices> out;
  out.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out.emplace_back(values.component(i), indices.component(i), slices.dense_shape());
  }
  return Mirrored<IndexedSlices>(std::move(out));
}
}  // namespace

Mirrored<IndexedSlices> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<IndexedSlices>& value,
                                                    const Destinations& destinations,
                                                    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  return place_slices_on(*strategy_, strategy_->reduce_slices(op, value.values(), merged, "reduce_to"),
                         destinations.devices());
}

std::vector<Mirrored<Tensor>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<Tensor, Destinations>>& value_destination_pairs,
    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("batch_reduce_to");
  if (value_destination_pairs.empty()) strategy_->options_.merge(options).validate();
  return reduce_each<Mirrored<Tensor>>(value_destination_pairs, [&](const Tensor& v, const Destinations& d) {
    return reduce_to(op, v, d, options);
  });
}

std::vector<Mirrored<IndexedSlices>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<PerReplica<IndexedSlices>, Destinations>>& value_destination_pairs,
    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("batch_reduce_to");
  if (value_destination_pairs.empty()) strategy_->options_.merge(options).validate();
  return reduce_each<Mirrored<IndexedSlices>>(
      value_destination_pairs,
      [&](const PerReplica<IndexedSlices>& v, const Destinations& d) { return reduce_to(op, v, d, options); });
}

std::vector<Mirrored<Tensor>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<PerReplica<Tensor>, Destinations>>& value_destination_pairs,
    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("batch_reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  std::vector<Mirrored<Tensor>> out;
  if (value_destination_pairs.empty()) {
    merged.validate();
    return out;
  }
  std::vector<const std::vector<Tensor>*> values;
  values.reserve(value_destination_pairs.size());
  for (const auto& pair : value_destination_pairs) values.push_back(&pair.first.values());
  // One agreement and one reduction per pack, for the whole batch.
  std::lock_guard<std::recursive_mutex> lock(strategy_->state_->worker_mutex);
  strategy_->check_and_agree_batch(values, "batch_reduce_to", op, merged);
  std::vector<Tensor> reduced = strategy_->reduce_components_batch(op, values, merged, 0);
  out.reserve(reduced.size());
  for (std::size_t k = 0; k < reduced.size(); ++k) {
    out.push_back(place_on(*strategy_, reduced[k], value_destination_pairs[k].second.devices(), /*fresh=*/true));
  }
  return out;
}

Mirrored<Tensor> StrategyExtended::broadcast_to(const Tensor& tensor, const std::optional<Destinations>& destinations) {
  strategy_->require_cross_replica_or_default("broadcast_to");
  // The strategy's devices are canonical names already.
  return place_on(*strategy_, tensor, destinations ? destinations->devices() : strategy_->devices());
}

const std::vector<std::string>& StrategyExtended::worker_devices() const {
  if (is_default_strategy(*strategy_)) {
    throw FailedPreconditionError("worker_devices() method unsupported by default tf.distribute.Strategy.");
  }
  return strategy_->devices();
}

void StrategyExtended::check_update_target(std::size_t components) const {
  internal::check_components(components, *strategy_, "update");
}

}  // namespace distribute
