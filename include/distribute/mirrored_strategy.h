// File: mirrored_strategy.h
//
// The single-process strategies:
//   default_strategy(): always present, one replica, no distribution
//     (tf.distribute's _DefaultDistributionStrategy);
//   OneDeviceStrategy: one replica placed on one device;
//   MirroredStrategy: one replica per device, each a thread of a pool owned by
//     the strategy, all running truly in parallel.
//
//   MirroredStrategy strategy({"CPU:0", "CPU:1"});
//   auto r = strategy.run([] { return get_replica_context()->replica_id_in_sync_group(); });
//
// Devices are CPU devices, named as TensorFlow names them: "CPU:0", "/cpu:1",
// "/device:CPU:2", "/job:localhost/replica:0/task:0/device:CPU:3". Any number
// of virtual CPU devices may be used (they need not exist as cores). GPUs
// ("GPU:1", "/device:GPU:1", ...) are listed and split by devices.h, but
// replicas do not run on them yet: a GPU that exists is UnimplementedError,
// one that does not (or any, in a build without CUDA or on a machine without
// a GPU) is InvalidArgumentError naming the GPUs there are, or why none.
#pragma once

#include <string>
#include <vector>

#include "distribute/strategy.h"

namespace distribute {

// Canonical full name of a device: "/job:localhost/replica:0/task:0/device:CPU:1".
// Throws InvalidArgumentError for a malformed name, a GPU that does not
// exist, or a remote job; UnimplementedError for a GPU that does (above).
std::string canonical_device_name(std::string_view device);

class DefaultStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "_DefaultDistributionStrategy"; }

 private:
  friend Strategy& default_strategy();
  DefaultStrategy();
};

// The process-wide default strategy.
Strategy& default_strategy();
bool is_default_strategy(const Strategy& s);

class OneDeviceStrategy final : public Strategy {
 public:
  explicit OneDeviceStrategy(const std::string& device, CommunicationOptions options = {});
  std::string_view name() const override { return "OneDeviceStrategy"; }
};

class MirroredStrategy final : public Strategy {
 public:
  // No devices given: one CPU device per hardware thread (TensorFlow would use
  // a single CPU device; on a CPU-only host one replica per core is what
  // mirroring is for).
  MirroredStrategy();
  // Duplicates or an empty list are InvalidArgumentError.
  explicit MirroredStrategy(const std::vector<std::string>& devices, CommunicationOptions options = {});
  std::string_view name() const override { return "MirroredStrategy"; }
};

}  // namespace distribute
