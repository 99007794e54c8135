// Collectives among the workers of a multi-worker strategy that the layers
// above the strategy's own files use (variables, input): each agrees first,
// so that a worker's refusal is raised by every worker, not left waiting.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "distribute/errors.h"
#include "distribute/strategy.h"
#include "distribute/tensor.h"

namespace distribute::internal {

// Multi-worker strategies: replaces `value` (which must own its storage) on
// every worker with worker 0's, after the workers agree on its dtype and
// shape (a mismatch raises the same InvalidArgumentError on every worker).
// A worker that passes `local_error` (its own refusal of the value) makes
// every worker raise it, naming that worker. One worker: does nothing.
void broadcast_from_first_worker(Strategy& s, Tensor& value, std::string_view api, const Error* local_error = nullptr);
// Multi-worker strategies: every worker's `payload`, in worker order (a
// collective). One worker: {payload}. A worker that passes `local_error`
// (found before the call) makes every worker raise it, instead of leaving
// the others waiting for a call it never makes.
std::vector<std::string> exchange_across_workers(Strategy& s, std::string payload, std::string_view api,
                                                 const Error* local_error = nullptr);

// This process's place among the strategy's workers: {0, 1} for a strategy
// of one worker.
struct WorkerPlace {
  int rank = 0;
  int count = 1;
};
WorkerPlace worker_place(Strategy& s);

// Preemption (train::PreemptionCheckpointHandler). Every agreement among the
// workers (agree_workers: the cross-replica reductions, an optimizer's
// apply_gradients, a dataset's get_next, a checkpoint's save) carries each
// worker's stop request, so that the request reaches every worker in the
// same agreement with no exchange of its own.
// The request of this worker: set from a signal handler (lock-free).
std::atomic<bool>& stop_request(Strategy& s);
// Whether an agreement so far carried a request from any worker (or, for
// one worker, whether it has one).
bool stop_agreed(Strategy& s);
// Withdraws this worker's request and forgets the agreed one (a new handler).
void clear_stop(Strategy& s);
// Agreements among the workers made so far (0 for one worker).
std::uint64_t worker_agreements(Strategy& s);

}  // namespace distribute::internal
