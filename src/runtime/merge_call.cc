// ReplicaContext::merge_call: a check of the call across workers, a round of the
// local replicas' arguments, and replica 0's merge_fn handing its result to all.
#include <cxxabi.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

#include "comm/backend.h"
#include "distribute/communicator.h"
#include "distribute/errors.h"
#include "distribute/options.h"
#include "distribute/replica_context.h"
#include "distribute/strategy.h"
#include "runtime/collective_pipeline.h"
#include "runtime/mode.h"
#include "runtime/replica_channel.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"

namespace distribute {

using internal::explain_mismatch;
using internal::first_replica_of_group;
using internal::ReplicaChannel;
using internal::Signature;

namespace internal {
MergeTypes merge_types(std::initializer_list<const std::type_info*> types) {
  MergeTypes out;
  out.types.assign(types.begin(), types.end());
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
}  // namespace internal

namespace {
constexpr const char* kMergeTypesField = "merge_fn and argument types";

bool same_types(const internal::MergeTypes& a, const internal::MergeTypes& b) {
  if (&a == &b) return true;  // one instantiation: the common case
  if (a.types.size() != b.types.size()) return false;
  for (std::size_t i = 0; i < a.types.size(); ++i) {
    if (*a.types[i] != *b.types[i]) return false;
  }
  return true;
}

// After a first round whose digests agreed: types of the same names that are
// not the same types. Every replica sees every replica's types, so all find
// the same first pair and raise the same error, and replica 0 runs no merge_fn
// on arguments of another type.
void check_same_types(const std::vector<internal::RendezvousEntry>& entries, const CollectiveCall& call,
                      int first_replica) {
  auto types_of = [&](std::size_t r) { return static_cast<const internal::MergeTypes*>(entries[r].object.get()); };
  std::size_t other = 1;
  while (other < entries.size() && same_types(*types_of(0), *types_of(other))) ++other;
  if (other == entries.size()) return;
  throw FailedPreconditionError(
      "merge_call #" + std::to_string(call.sequence) + ": the replicas passed different " + kMergeTypesField +
      ": replica " + std::to_string(first_replica) + " and replica " +
      std::to_string(first_replica + static_cast<int>(other)) + " passed types of the same names (" +
      types_of(0)->names +
      ") that are not the same types (a lambda, or a type in an unnamed namespace, is a type of its own in each "
      "file). Every replica must call merge_call with the same merge_fn.");
}
}  // namespace

// Kept whole: round 1 hands replica 0 the other replicas' arguments on their
// stacks, kept alive by their WaitForArgsTaken (acquire) until replica 0's
// Taken says it copied them (release), and merge_fn's failure path (the
// aborts, the agreed failure) must be read against both rounds' waits.
// NOLINTNEXTLINE(readability-function-size): both rounds and the args' guards must be read together.
std::shared_ptr<void> ReplicaContext::merge_call_impl(const internal::MergeTypes& types, const void* args,
                                                      const MergeBody& body) {
  internal::require_replica_context(*this, "merge_call");
  ReplicaChannel& ch = *channel_;
  const CommunicationOptions& opts = strategy_->communication_options();
  CollectiveCall call = internal::next_call(ch, "merge_call", opts);
  call.count_mismatch = "Some replicas made a different number of replica_context().merge_call() calls";
  Signature sig;
  sig.op = "merge_call";
  sig.sequence = call.sequence;

  // Across workers, merge_fn runs once per worker and need not cross workers
  // at all, so a worker whose replicas called another collective here would
  // be found only at the next collective that crosses workers (or by the
  // timeout). One tagged barrier of every replica of every worker finds it
  // here, with the same error everywhere. It checks the call and its place
  // in the program only: workers may run merge_fns of other types (as in
  // TensorFlow); the local round below checks the types among this worker's
  // replicas.
  if (ch.comm->size() > ch.local->size()) {
    Signature across;
    across.op = sig.op;
    across.sequence = sig.sequence;
    CollectiveCall check = call;
    check.signature_tag = across.tag(false);
    try {
      ch.comm->barrier(check);
    } catch (const SignatureMismatch&) {
      explain_mismatch(ch, across, call, first_replica_of_group(*this), internal::ShapeRule::kEqual, 0, nullptr);
    }
  }

  // Round 1: every local replica arrives with its arguments and a hash of the
  // call and the types' digest (the readable names are hashed once per
  // instantiation, not per call); if the hashes differ, a second round
  // exchanges full signatures, with the names, to explain.
  internal::TagHasher tag(sig.op);
  tag.field(kMergeTypesField, std::string_view(reinterpret_cast<const char*>(&types.digest), sizeof types.digest));
  std::vector<const void*> all_args;
  try {
    // (`object` views the instantiation's MergeTypes, owning nothing.)
    const std::shared_ptr<void> mine(std::shared_ptr<void>(), const_cast<internal::MergeTypes*>(&types));
    const auto& entries =
        ch.local->arrive(local_id_, {.send = args, .object = mine, .tag = tag.finish(sig.sequence, false)}, call);
    check_same_types(entries, call, replica_id_ - local_id_);
    for (const auto& e : entries) all_args.push_back(e.send);
  } catch (const SignatureMismatch&) {
    sig.fields = {{kMergeTypesField, types.names}};
    CollectiveCall explain = call;
    explain.signature_tag = 0;
    std::vector<Signature> sigs;
    for (const auto& e : ch.local->arrive(local_id_, {.payload = sig.encode()}, explain)) {
      sigs.push_back(Signature::decode(e.payload));
    }
    internal::check_signatures(sigs, replica_id_ - local_id_, internal::ShapeRule::kEqual, 0, nullptr);
    throw InternalError("merge_call #" + std::to_string(call.sequence) + ": signature hashes differ but agree");
  }

  // Round 2: replica 0 runs merge_fn in the cross-replica context and hands the
  // result to all. Waiting for merge_fn has no deadline: it may run whole steps.
  CollectiveCall wait_result = call;
  wait_result.timeout_seconds = 0;
  wait_result.stall_warning_seconds = 0;
  std::shared_ptr<void> result;
  if (local_id_ == 0) {
    // Said once the arguments are copied, or when the body fails before.
    struct Taken final : ArgsTaken {
      std::atomic<std::uint64_t>* flag;
      std::uint64_t sequence;
      Taken(std::atomic<std::uint64_t>* f, std::uint64_t s) : flag(f), sequence(s) {}
      Taken(const Taken&) = delete;
      Taken& operator=(const Taken&) = delete;
      ~Taken() { (*this)(); }
      void operator()() const noexcept override {
        if (flag != nullptr && flag->load(std::memory_order_relaxed) < sequence) {
          flag->store(sequence, std::memory_order_release);
        }
      }
    } const taken(ch.merge_args_taken, call.sequence);
    try {
      internal::ModeEntry entry{strategy_, strategy_, nullptr, 1, ch.depth};
      if (ch.local->size() > 1) {
        entry.merge_helpers = ch.local;  // the others, paused below, can share its copies
        entry.merge_rounds = &wait_result;
      }
      internal::ModeGuard mode(entry);
      internal::forget_agreed_worker_error();  // only an agreement inside this merge_fn counts
      result = body(all_args, taken);
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      const std::string msg = "merge_fn of replica " + std::to_string(replica_id_) + " (merge_call #" +
                              std::to_string(call.sequence) + ") failed with " + internal::describe_exception(error) +
                              "; the other replicas were aborted.";
      // An error every worker's merge_fn raised alike (a reduce_to, gather, ...
      // inside it found a mismatch between workers) leaves nothing in flight
      // between workers: their link stays usable, as for the same call outside
      // merge_call. Anything else may leave other workers waiting: abort them.
      // (The default replica context has no run, hence no shared flag.)
      const bool agreed = internal::take_agreed_worker_error(error) && ch.merge_failure_agreed != nullptr;
      if (agreed) {
        ch.agreed_failure = true;
        ch.merge_failure_agreed->store(true);
      }
      // Release the others (a group of one has nobody waiting, and the default
      // replica context's group is never reset, so it is left alone).
      if (ch.local->size() > 1) ch.local->abort(ErrorCode::kAborted, msg, local_id_);
      if (!agreed && ch.comm->size() > 1) ch.comm->abort(ErrorCode::kAborted, msg, local_id_);
      throw;
    }
    ch.local->arrive(local_id_, {.object = result}, wait_result);
    return result;
  }
  // This replica's arguments live on its stack, and replica 0 reads them in
  // place until it has copied them: an abort arriving before that (from
  // another worker, or a merge_fn that aborts) must not unwind them. Replica 0
  // reaches its copy once the first round is complete, and its copying is
  // bounded, so this wait ends.
  struct WaitForArgsTaken {
    const std::atomic<std::uint64_t>* flag;
    std::uint64_t sequence;
    ~WaitForArgsTaken() {
      while (flag != nullptr && flag->load(std::memory_order_acquire) < sequence) std::this_thread::yield();
    }
  } const wait_for_args{ch.merge_args_taken, call.sequence};
  try {
    // Until the result comes, run the shares of the work merge_fn hands out
    // (internal::share_with_paused_replicas): a round with a task, then a
    // round to say it is done.
    for (;;) {
      const auto& entries = ch.local->arrive(local_id_, {}, wait_result);
      if (entries[0].send != &internal::kMergeTaskMark) return entries[0].object;
      const auto task = std::static_pointer_cast<const internal::MergeTask>(entries[0].object);
      task->run(local_id_, ch.local->size());
      ch.local->release(local_id_, wait_result);
    }
  } catch (const Error&) {
    // Released by replica 0's failed merge_fn: an agreed failure is agreed here too.
    if (ch.merge_failure_agreed != nullptr && ch.merge_failure_agreed->load()) ch.agreed_failure = true;
    throw;
  }
}

}  // namespace distribute
