// File: options.h
//
// CommunicationOptions, as tf.distribute.experimental.CommunicationOptions:
// how a collective packs its values, how long it may wait, and which
// implementation it asks for. A plain aggregate, meant for designated
// initializers:
//
//   ctx.all_reduce(ReduceOp::kSum, grads, {.bytes_per_pack = 1 << 20,
//                                          .timeout = std::chrono::seconds(30)});
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace distribute {

// tf.distribute.experimental.CommunicationImplementation.
enum class CommunicationImplementation {
  kAuto,
  kRing,
  kNccl,  // GPU only; without GPU support it falls back to kRing and says so once
};

std::string_view to_string(CommunicationImplementation impl);
// Case-insensitive "auto", "ring", "nccl"; else InvalidArgumentError.
CommunicationImplementation communication_implementation_from_string(std::string_view name);

struct CommunicationOptions {
  // Values of one dtype are packed into buffers; a new pack starts once the
  // current one holds more than this many bytes (TensorFlow's group_by_size
  // rule). 0: one pack per dtype. Must be >= 0.
  std::int64_t bytes_per_pack = 0;
  // A collective that waits longer raises DeadlineExceededError naming the
  // replicas that did not arrive. Unset: DISTRIBUTE_COLLECTIVE_TIMEOUT (seconds)
  // if set, else wait forever. Zero disables the timeout. Must be >= 0.
  std::optional<std::chrono::duration<double>> timeout;
  CommunicationImplementation implementation = CommunicationImplementation::kAuto;

  // TensorFlow's Options.merge: each field of `other` that is not its default
  // overrides this one's.
  CommunicationOptions merge(const CommunicationOptions& other) const;
  // Throws InvalidArgumentError for a negative bytes_per_pack or timeout.
  void validate() const;
};

}  // namespace distribute
