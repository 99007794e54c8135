#include "runtime/runtime_util.h"

#include <atomic>
#include <cstdio>

namespace distribute::internal {
namespace {
std::atomic<bool> nccl_notice_given{false};
}

CollectiveCall next_call(ReplicaChannel& channel, std::string_view op, const CommunicationOptions& options) {
  CollectiveCall call;
  call.op = op;
  call.sequence = ++channel.sequence;
  channel.agreed_failure = false;
  call.timeout_seconds = options.timeout && options.timeout->count() > 0 ? options.timeout->count() : 0;
  call.stall_warning_seconds = channel.stall_warning_seconds;
  return call;
}

void note_implementation(const CommunicationOptions& options) {
  if (options.implementation != CommunicationImplementation::kNccl) return;
  if (!nccl_notice_given.exchange(true)) {
    std::fprintf(stderr,
                 "distribute: CommunicationImplementation::kNccl needs GPU support, which this build does not "
                 "have; falling back to kRing.\n");
  }
}

void reset_implementation_notice_for_testing() { nccl_notice_given = false; }

void validate_gather_leaf(const Tensor& value, int axis, Signature& sig) {
  if (sig.error_code) return;
  if (value.rank() == 0) {
    sig.error_code = ErrorCode::kInvalidArgument;
    sig.error = "all_gather needs a value of rank >= 1, got a scalar (shape ()); reshape it to shape (1,) first";
  } else if (axis < -value.rank() || axis >= value.rank()) {
    sig.error_code = ErrorCode::kInvalidArgument;
    sig.error = "axis " + std::to_string(axis) + " is out of range for a value of shape " + value.shape().to_string() +
                " (rank " + std::to_string(value.rank()) + ")";
  }
}

void throw_gather_size_overflow(int axis) {
  throw InvalidArgumentError("all_gather: the sizes along axis " + std::to_string(axis) +
                             " add up to more than 2^63 - 1");
}

}  // namespace distribute::internal
