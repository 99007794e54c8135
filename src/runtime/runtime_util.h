// Small pieces shared by the runtime's collectives.
#pragma once

#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distribute/communicator.h"
#include "distribute/options.h"
#include "distribute/tensor.h"
#include "runtime/gather_layout.h"
#include "runtime/replica_channel.h"
#include "runtime/signature.h"

namespace distribute::internal {

// "InvalidArgumentError: message" / "std::out_of_range: message".
std::string describe_exception(const std::exception_ptr& e);
// A failed agreement between workers raises the same error on every worker;
// note_agreed_worker_error records the exception being thrown (per thread,
// called inside its catch block), take_agreed_worker_error says whether `e` is
// that very exception (and forgets it), forget_agreed_worker_error forgets it.
void note_agreed_worker_error();
void forget_agreed_worker_error();
bool take_agreed_worker_error(const std::exception_ptr& e);
// A non-negative number of seconds from the environment; 0 when unset.
double env_seconds(const char* name);
// Checks the engine's settings that a strategy's creation checks
// (DISTRIBUTE_STREAM_ALL_REDUCE_BYTES, DISTRIBUTE_SPIN_MICROSECONDS,
// DISTRIBUTE_STORAGE_CACHE_BYTES, DISTRIBUTE_ONE_ROUND_READ_BYTES):
// InvalidArgumentError naming a bad one.
// Returns the all_reduce stream threshold.
std::size_t checked_engine_settings();

// The CollectiveCall for the next collective of this replica.
CollectiveCall next_call(ReplicaChannel& channel, std::string_view op, const CommunicationOptions& options);

// kNccl needs GPU support, which this build lacks: fall back to kRing and say
// so on stderr, once per process (TensorFlow logs the same fallback).
void note_implementation(const CommunicationOptions& options);
void reset_implementation_notice_for_testing();

// Records in `sig` why `value` cannot be all-gathered along `axis`, if it cannot.
void validate_gather_leaf(const Tensor& value, int axis, Signature& sig);

}  // namespace distribute::internal
