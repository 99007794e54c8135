// The process's devices (devices.h): what the GPU probe found, the logical
// layout made of it, and the rule that fixes the layout once it is read.
// DeviceRegistry is built from a probe so that the layout's rules are tested
// with any set of GPUs, and the process's registry from the real one.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distribute/devices.h"

namespace distribute::internal {

// One CUDA device the process sees.
struct PhysicalGpu {
  std::string name;  // "NVIDIA H200"
  int major = 0;     // compute capability
  int minor = 0;
  std::int64_t memory_bytes = 0;
};

// What the CUDA runtime reports: the GPUs, or why there are none.
struct GpuProbe {
  std::vector<PhysicalGpu> gpus;
  std::string why_none;  // set when gpus is empty
};

// Asks the CUDA runtime (gpu_probe.cc); in a build without CUDA, no GPUs and
// the reason.
GpuProbe probe_gpus();

// A logical GPU: part of physical GPU `physical`, allowed `memory_limit_bytes`.
struct LogicalGpu {
  int physical = 0;
  std::int64_t memory_limit_bytes = 0;
};

class DeviceRegistry {
 public:
  // `logical_gpus_env`: DISTRIBUTE_LOGICAL_GPUS's value, if set (read when
  // the layout is fixed, and refused then if malformed).
  DeviceRegistry(GpuProbe probe, std::optional<std::string> logical_gpus_env);

  std::vector<PhysicalDevice> physical_devices(std::string_view device_type) const;
  std::vector<LogicalDevice> logical_devices(std::string_view device_type);
  void configure(const PhysicalDevice& device, const std::vector<LogicalDeviceConfiguration>& logical_devices);
  std::optional<std::vector<LogicalDeviceConfiguration>> configuration(const PhysicalDevice& device) const;
  DeviceDetails details(const PhysicalDevice& device) const;
  const std::string& why_no_gpu() const { return probe_.why_none; }

  // The logical GPUs, in index order (fixes the layout).
  std::vector<LogicalGpu> logical_gpus();
  // Logical GPU `index`, named `device` by the user; InvalidArgumentError
  // naming the GPUs there are (or why there are none) if it is not one.
  LogicalGpu logical_gpu(int index, std::string_view device);
  // "GPU:1 (NVIDIA H200, physical GPU 0, 4096 MB)": for messages. A GPU that
  // is not there is logical_gpu's InvalidArgumentError, naming `device`.
  std::string describe_gpu(int index, std::string_view device);

 private:
  // Index into probe_.gpus of a listed GPU, -1 for the CPU; throws for others.
  int physical_index(const PhysicalDevice& device) const;
  void fix_layout_locked();
  std::vector<LogicalGpu> split_locked(int physical, const std::vector<LogicalDeviceConfiguration>& configs) const;
  std::string available_gpus_locked() const;

  const GpuProbe probe_;
  const std::optional<std::string> logical_gpus_env_;
  mutable std::mutex mu_;
  std::vector<std::optional<std::vector<LogicalDeviceConfiguration>>> gpu_configs_;  // per physical GPU
  std::optional<std::vector<LogicalDeviceConfiguration>> cpu_config_;
  bool fixed_ = false;
  std::vector<LogicalGpu> logical_gpus_;  // once fixed_
  int logical_cpus_ = 1;                  // once fixed_
};

// The process's registry: probe_gpus() and DISTRIBUTE_LOGICAL_GPUS, on first use.
DeviceRegistry& device_registry();

// "N" or "N:MB" (N in [1, 64], MB in [1, 2^30]): N logical GPUs per physical GPU.
// InvalidArgumentError naming the variable otherwise.
std::vector<LogicalDeviceConfiguration> parse_logical_gpus(std::string_view value);

}  // namespace distribute::internal
