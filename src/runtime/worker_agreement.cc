// The agreement among a multi-worker strategy's workers: the collectives among
// them (worker_call), the signatures they check alike (agree_workers), and the
// errors every worker raises alike.
#include "runtime/worker_agreement.h"

#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/payload_list.h"
#include "distribute/communicator.h"
#include "distribute/strategy.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"
#include "runtime/strategy_internal.h"

namespace distribute::internal {

CollectiveCall worker_call(StrategyState& st, const CommunicationOptions& options, std::string_view op) {
  CollectiveCall call;
  call.op = op;
  call.sequence = ++st.worker_sequence;
  call.timeout_seconds = options.timeout && options.timeout->count() > 0 ? options.timeout->count() : 0;
  call.stall_warning_seconds = st.stall_warning_seconds;
  return call;
}

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
                                     ShapeRule rule, int axis, const std::string* extra,
                                     std::vector<std::string>* extras) {
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
  // Every worker's payload: its signature, its stop request (one byte, not
  // in the tag), then the extra payload.
  const std::string stop = st.stop_request.load(std::memory_order_relaxed) ? "1" : "0";
  try {
    payloads = st.workers->exchange(extra != nullptr ? encode_payload_list({sig.encode(), stop, *extra})
                                                     : encode_payload_list({sig.encode(), stop}),
                                    call);
  } catch (const SignatureMismatch&) {
    // Another worker is in a different collective: exchange signatures only
    // (whatever that collective sends to explain), to say which.
    agreed = false;
    call.signature_tag = 0;
    payloads = st.workers->exchange(encode_payload_list({sig.encode()}), call);
  }
  std::vector<Signature> sigs;
  if (extras != nullptr) extras->clear();
  bool stop_agreed = false;
  for (const std::string& p : payloads) {
    const std::vector<std::string> list = decode_payload_list(p);
    if (agreed) {
      // Every worker is in this call.
      sigs.push_back(Signature::decode(list.at(0)));
      stop_agreed = stop_agreed || list.at(1) == "1";
      if (extras != nullptr && extra != nullptr) extras->push_back(list.at(2));
      continue;
    }
    for (const std::string& one : list) sigs.push_back(Signature::decode(one));
  }
  if (agreed) {
    // Every worker finds the same here, in the same agreement.
    st.worker_agreements.fetch_add(1, std::memory_order_relaxed);
    if (stop_agreed) st.stop_agreed.store(true, std::memory_order_relaxed);
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
  StrategyState& st = Access::state(s);
  if (st.workers == nullptr || st.workers->size() == 1) return;  // (the caller raises its own error)
  Signature sig;
  sig.op = std::string(api);
  if (local_error != nullptr) sig.set_error(*local_error);
  sig.leaves.push_back({value.dtype(), value.shape().dims()});
  std::lock_guard<std::recursive_mutex> lock(st.worker_mutex);
  agree_workers(st, Access::options(s), sig, ShapeRule::kEqual, 0);
  const CollectiveCall call = worker_call(st, Access::options(s), api);
  st.workers->broadcast(value.mutable_raw_data(), static_cast<std::size_t>(value.num_elements()), value.dtype(),
                        /*root=*/0, call);
}

std::vector<std::string> exchange_across_workers(Strategy& s, std::string payload, std::string_view api,
                                                 const Error* local_error) {
  StrategyState& st = Access::state(s);
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
  agree_workers(st, Access::options(s), sig, ShapeRule::kEqual, 0, &payload, &all);
  return all;
}

std::atomic<bool>& stop_request(Strategy& s) { return Access::state(s).stop_request; }

bool stop_agreed(Strategy& s) {
  StrategyState& st = Access::state(s);
  if (st.workers == nullptr || st.workers->size() == 1) return st.stop_request.load();
  return st.stop_agreed.load();
}

void clear_stop(Strategy& s) {
  StrategyState& st = Access::state(s);
  st.stop_request.store(false);
  st.stop_agreed.store(false);
}

std::uint64_t worker_agreements(Strategy& s) { return Access::state(s).worker_agreements.load(); }

WorkerPlace worker_place(Strategy& s) {
  const StrategyState& st = Access::state(s);
  if (st.workers == nullptr) return {};
  return {st.workers->rank(), st.workers->size()};
}

}  // namespace distribute::internal
