// File: devices.h
//
// The devices this process sees, listed and split as tf.config does:
//
//   auto gpus = distribute::list_physical_devices("GPU");
//   if (!gpus.empty()) {
//     // Two logical GPUs of 4 GiB each on the first physical GPU, as the
//     // seed's MirroredStrategy(["GPU:0", "GPU:1"]) needs on a one-GPU host.
//     distribute::set_logical_device_configuration(gpus[0], {{4096}, {4096}});
//   }
//   for (const auto& d : distribute::list_logical_devices("GPU")) std::cout << d << "\n";
//
// A physical GPU is a CUDA device the process can see (CUDA_VISIBLE_DEVICES
// applies). By default each has one logical GPU; a configuration splits it
// into several, each with a memory limit, numbered GPU:0, GPU:1, ... across
// the physical GPUs in order. The layout is fixed the first time it is read
// (list_logical_devices, or a "GPU:k" device named anywhere), as TensorFlow
// fixes it when its runtime starts: later configurations are refused.
//
// The environment variable DISTRIBUTE_LOGICAL_GPUS="N" or "N:MB" splits every
// physical GPU that set_logical_device_configuration did not configure into N
// logical GPUs (of MB megabytes each), so that tools run the seed's examples
// unchanged on a one-GPU machine.
//
// CPUs: one physical CPU, which a configuration may split into several
// logical CPUs (no memory limit), as in TensorFlow. Strategies take any
// "CPU:k" whatever the configuration: CPU devices here are replica threads.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace distribute {

// tf.config.PhysicalDevice.
struct PhysicalDevice {
  std::string name;         // "/physical_device:GPU:0"
  std::string device_type;  // "CPU" or "GPU"
  friend bool operator==(const PhysicalDevice&, const PhysicalDevice&) = default;
};

// tf.config.LogicalDevice.
struct LogicalDevice {
  std::string name;         // "/job:localhost/replica:0/task:0/device:GPU:1"
  std::string device_type;  // "CPU" or "GPU"
  friend bool operator==(const LogicalDevice&, const LogicalDevice&) = default;
};

// tf.config.LogicalDeviceConfiguration: one logical device to make of a
// physical device.
struct LogicalDeviceConfiguration {
  // The most memory, in MB (2^20 bytes), the logical GPU may allocate. Unset:
  // an even share of the memory the logical GPUs with a limit leave (all of
  // it for a GPU that is not split). GPUs only, as in TensorFlow.
  std::optional<std::int64_t> memory_limit;
};

// tf.config.experimental.get_device_details.
struct DeviceDetails {
  std::string device_name;                                // "NVIDIA H200"; empty for the CPU
  std::optional<std::pair<int, int>> compute_capability;  // (9, 0) for Hopper; GPUs only
  std::int64_t memory_bytes = 0;                          // total device memory; 0 for the CPU
};

// The physical devices of `device_type` ("CPU" or "GPU", in any case; empty:
// all). Another type ("TPU") lists none, as in TensorFlow.
std::vector<PhysicalDevice> list_physical_devices(std::string_view device_type = {});

// The logical devices of `device_type`, as list_physical_devices; fixes the
// layout (see above). InvalidArgumentError if DISTRIBUTE_LOGICAL_GPUS is not
// "N" or "N:MB" with N in [1, 64] and MB in [1, 2^30], or if a GPU's logical devices ask for more
// memory than it has.
std::vector<LogicalDevice> list_logical_devices(std::string_view device_type = {});

// Splits `device` into one logical device per entry of `logical_devices`
// (at least one). InvalidArgumentError for a device that is not listed, a
// memory limit on the CPU, a limit under 1 MB, or limits that add up to more
// than the GPU's memory; FailedPreconditionError once the layout is fixed
// (unless the configuration is the one already in force).
void set_logical_device_configuration(const PhysicalDevice& device,
                                      const std::vector<LogicalDeviceConfiguration>& logical_devices);

// The configuration set for `device`, or none if it was not configured
// (DISTRIBUTE_LOGICAL_GPUS is not a configuration).
std::optional<std::vector<LogicalDeviceConfiguration>> get_logical_device_configuration(const PhysicalDevice& device);

// What the device is. InvalidArgumentError for a device that is not listed.
DeviceDetails get_device_details(const PhysicalDevice& device);

// Why list_physical_devices("GPU") is empty ("this build of distribute has
// no GPU support ...", "no GPU is visible: CUDA says ..."); empty when it is
// not.
std::string gpus_unavailable_reason();

// PhysicalDevice(name='/physical_device:GPU:0', device_type='GPU'), as Python prints it.
std::ostream& operator<<(std::ostream& os, const PhysicalDevice& d);
// LogicalDevice(name='/job:localhost/replica:0/task:0/device:GPU:0', device_type='GPU').
std::ostream& operator<<(std::ostream& os, const LogicalDevice& d);

}  // namespace distribute
