// The process's devices: listing, logical configuration, the fixed layout.
#include "core/device_registry.h"

#include <cstdlib>
#include <ostream>
#include <string>
#include <utility>

#include "core/ascii_case.h"
#include "core/whole_number.h"
#include "distribute/errors.h"

namespace distribute {
namespace internal {

namespace {
constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::size_t kMaxLogicalPerGpu = 64;
constexpr const char* kLogicalGpusEnv = "DISTRIBUTE_LOGICAL_GPUS";
constexpr const char* kCpuPhysical = "/physical_device:CPU:0";

// Whether `type` (any case; empty: every type) selects devices of `kind`.
bool selects(std::string_view type, std::string_view kind) {
  return type.empty() || internal::ascii_upper(type) == kind;
}

std::string logical_name(std::string_view kind, int index) {
  return "/job:localhost/replica:0/task:0/device:" + std::string(kind) + ":" + std::to_string(index);
}

std::string megabytes(std::int64_t bytes) { return std::to_string(bytes / kMiB) + " MB"; }

bool same_configuration(const std::vector<LogicalDeviceConfiguration>& a,
                        const std::vector<LogicalDeviceConfiguration>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].memory_limit != b[i].memory_limit) return false;
  }
  return true;
}
}  // namespace

std::vector<LogicalDeviceConfiguration> parse_logical_gpus(std::string_view value) {
  const std::string text(value);
  auto refuse = [&]() -> std::vector<LogicalDeviceConfiguration> {
    throw InvalidArgumentError(std::string(kLogicalGpusEnv) + "='" + text +
                               "' is not \"N\" or \"N:MB\" (N logical GPUs per physical GPU, 1 to " +
                               std::to_string(kMaxLogicalPerGpu) + ", of MB megabytes each, 1 to 1073741824)");
  };
  const std::size_t colon = text.find(':');
  const std::optional<std::size_t> count = parse_whole_number(text.substr(0, colon).c_str(), kMaxLogicalPerGpu);
  if (!count || *count == 0) return refuse();
  std::optional<std::int64_t> limit;
  if (colon != std::string::npos) {
    // At most 2^30 MB (1 PiB) each, so that 64 of them add up without overflow.
    const std::optional<std::size_t> mb = parse_whole_number(text.substr(colon + 1).c_str(), std::size_t{1} << 30);
    if (!mb || *mb == 0) return refuse();
    limit = static_cast<std::int64_t>(*mb);
  }
  return std::vector<LogicalDeviceConfiguration>(*count, LogicalDeviceConfiguration{limit});
}

DeviceRegistry::DeviceRegistry(GpuProbe probe, std::optional<std::string> logical_gpus_env)
    : probe_(std::move(probe)), logical_gpus_env_(std::move(logical_gpus_env)), gpu_configs_(probe_.gpus.size()) {}

std::vector<PhysicalDevice> DeviceRegistry::physical_devices(std::string_view device_type) const {
  std::vector<PhysicalDevice> out;
  if (selects(device_type, "CPU")) out.push_back({kCpuPhysical, "CPU"});
  if (selects(device_type, "GPU")) {
    for (std::size_t i = 0; i < probe_.gpus.size(); ++i)
      out.push_back({"/physical_device:GPU:" + std::to_string(i), "GPU"});
  }
  return out;
}

int DeviceRegistry::physical_index(const PhysicalDevice& device) const {
  if (device.device_type == "CPU" && device.name == kCpuPhysical) return -1;
  const std::string prefix = "/physical_device:GPU:";
  if (device.device_type == "GPU" && device.name.rfind(prefix, 0) == 0) {
    const std::optional<std::size_t> i = parse_whole_number(device.name.c_str() + prefix.size());
    if (i && *i < probe_.gpus.size()) return static_cast<int>(*i);
  }
  std::string listed;
  for (const auto& d : physical_devices({})) listed += (listed.empty() ? "" : ", ") + d.name;
  throw InvalidArgumentError("Unrecognized device: PhysicalDevice(name='" + device.name + "', device_type='" +
                             device.device_type + "'); the physical devices are " + listed +
                             (probe_.gpus.empty() ? " (no GPU: " + probe_.why_none + ")" : ""));
}

void DeviceRegistry::configure(const PhysicalDevice& device,
                               const std::vector<LogicalDeviceConfiguration>& logical_devices) {
  const int p = physical_index(device);
  if (logical_devices.empty()) {
    throw InvalidArgumentError("set_logical_device_configuration(" + device.name +
                               "): give at least one logical device configuration");
  }
  std::int64_t asked = 0;
  for (const auto& c : logical_devices) {
    if (!c.memory_limit) continue;
    if (p < 0) {
      throw InvalidArgumentError("set_logical_device_configuration(" + device.name +
                                 "): setting a memory limit on a CPU logical device is not supported");
    }
    if (*c.memory_limit < 1 || *c.memory_limit > INT64_MAX / kMiB) {
      throw InvalidArgumentError("set_logical_device_configuration(" + device.name + "): memory_limit " +
                                 std::to_string(*c.memory_limit) + " MB is not a size in MB (at least 1)");
    }
    asked += *c.memory_limit;
    if (asked > INT64_MAX / kMiB) asked = INT64_MAX / kMiB;
  }
  if (p >= 0 && asked * kMiB > probe_.gpus[static_cast<std::size_t>(p)].memory_bytes) {
    const PhysicalGpu& gpu = probe_.gpus[static_cast<std::size_t>(p)];
    throw InvalidArgumentError("set_logical_device_configuration(" + device.name + "): the logical devices ask for " +
                               std::to_string(asked) + " MB in all, more than the " + megabytes(gpu.memory_bytes) +
                               " of " + gpu.name);
  }
  std::lock_guard lock(mu_);
  auto& slot = p < 0 ? cpu_config_ : gpu_configs_[static_cast<std::size_t>(p)];
  if (fixed_) {
    if (slot && same_configuration(*slot, logical_devices)) return;
    throw FailedPreconditionError(
        "Virtual devices cannot be modified after being initialized: the logical devices were fixed when they were "
        "first listed or used; call set_logical_device_configuration before that");
  }
  slot = logical_devices;
}

std::optional<std::vector<LogicalDeviceConfiguration>> DeviceRegistry::configuration(
    const PhysicalDevice& device) const {
  const int p = physical_index(device);
  std::lock_guard lock(mu_);
  return p < 0 ? cpu_config_ : gpu_configs_[static_cast<std::size_t>(p)];
}

DeviceDetails DeviceRegistry::details(const PhysicalDevice& device) const {
  const int p = physical_index(device);
  if (p < 0) return {};
  const PhysicalGpu& gpu = probe_.gpus[static_cast<std::size_t>(p)];
  return {gpu.name, std::pair{gpu.major, gpu.minor}, gpu.memory_bytes};
}

std::vector<LogicalGpu> DeviceRegistry::split_locked(int physical,
                                                     const std::vector<LogicalDeviceConfiguration>& configs) const {
  const PhysicalGpu& gpu = probe_.gpus[static_cast<std::size_t>(physical)];
  std::int64_t limited = 0;
  std::int64_t unlimited = 0;
  for (const auto& c : configs) {
    if (c.memory_limit) {
      limited += *c.memory_limit * kMiB;
    } else {
      ++unlimited;
    }
  }
  if (limited > gpu.memory_bytes) {
    // Only DISTRIBUTE_LOGICAL_GPUS gets here: set_logical_device_configuration checked its own.
    throw InvalidArgumentError(std::string(kLogicalGpusEnv) + "='" + logical_gpus_env_.value_or("") + "' asks " +
                               megabytes(limited) + " of physical GPU " + std::to_string(physical) + " (" + gpu.name +
                               "), which has " + megabytes(gpu.memory_bytes));
  }
  std::vector<LogicalGpu> out;
  for (const auto& c : configs) {
    const std::int64_t bytes = c.memory_limit ? *c.memory_limit * kMiB : (gpu.memory_bytes - limited) / unlimited;
    out.push_back({physical, bytes});
  }
  return out;
}

void DeviceRegistry::fix_layout_locked() {
  if (fixed_) return;
  std::optional<std::vector<LogicalDeviceConfiguration>> from_env;
  if (logical_gpus_env_ && !logical_gpus_env_->empty() && !probe_.gpus.empty()) {
    from_env = parse_logical_gpus(*logical_gpus_env_);
  }
  std::vector<LogicalGpu> gpus;
  for (std::size_t p = 0; p < probe_.gpus.size(); ++p) {
    const auto& configs = gpu_configs_[p] ? *gpu_configs_[p]
                          : from_env      ? *from_env
                                          : std::vector<LogicalDeviceConfiguration>(1);
    for (const LogicalGpu& g : split_locked(static_cast<int>(p), configs)) gpus.push_back(g);
  }
  logical_gpus_ = std::move(gpus);
  logical_cpus_ = cpu_config_ ? static_cast<int>(cpu_config_->size()) : 1;
  fixed_ = true;
}

std::vector<LogicalDevice> DeviceRegistry::logical_devices(std::string_view device_type) {
  std::lock_guard lock(mu_);
  fix_layout_locked();
  std::vector<LogicalDevice> out;
  if (selects(device_type, "CPU")) {
    for (int i = 0; i < logical_cpus_; ++i) out.push_back({logical_name("CPU", i), "CPU"});
  }
  if (selects(device_type, "GPU")) {
    for (std::size_t i = 0; i < logical_gpus_.size(); ++i)
      out.push_back({logical_name("GPU", static_cast<int>(i)), "GPU"});
  }
  return out;
}

std::vector<LogicalGpu> DeviceRegistry::logical_gpus() {
  std::lock_guard lock(mu_);
  fix_layout_locked();
  return logical_gpus_;
}

std::string DeviceRegistry::available_gpus_locked() const {
  if (logical_gpus_.empty()) return "no GPU is visible: " + probe_.why_none;
  std::string out = "the GPUs are GPU:0";
  if (logical_gpus_.size() > 1) out += " to GPU:" + std::to_string(logical_gpus_.size() - 1);
  out += " (" + std::to_string(logical_gpus_.size()) + " logical GPU" + (logical_gpus_.size() == 1 ? "" : "s") +
         " on " + std::to_string(probe_.gpus.size()) + " physical GPU" + (probe_.gpus.size() == 1 ? "" : "s") + ")";
  return out;
}

LogicalGpu DeviceRegistry::logical_gpu(int index, std::string_view device) {
  std::lock_guard lock(mu_);
  fix_layout_locked();
  if (index < 0 || static_cast<std::size_t>(index) >= logical_gpus_.size()) {
    throw InvalidArgumentError("device '" + std::string(device) + "' does not exist: " + available_gpus_locked());
  }
  return logical_gpus_[static_cast<std::size_t>(index)];
}

std::string DeviceRegistry::describe_gpu(int index, std::string_view device) {
  const LogicalGpu g = logical_gpu(index, device);
  const PhysicalGpu& gpu = probe_.gpus[static_cast<std::size_t>(g.physical)];
  return "GPU:" + std::to_string(index) + " (" + gpu.name + ", physical GPU " + std::to_string(g.physical) + ", " +
         megabytes(g.memory_limit_bytes) + ")";
}

DeviceRegistry& device_registry() {
  static DeviceRegistry registry = [] {
    const char* env = std::getenv(kLogicalGpusEnv);
    return DeviceRegistry(probe_gpus(), env ? std::optional<std::string>(env) : std::nullopt);
  }();
  return registry;
}

}  // namespace internal

std::vector<PhysicalDevice> list_physical_devices(std::string_view device_type) {
  return internal::device_registry().physical_devices(device_type);
}

std::vector<LogicalDevice> list_logical_devices(std::string_view device_type) {
  return internal::device_registry().logical_devices(device_type);
}

void set_logical_device_configuration(const PhysicalDevice& device,
                                      const std::vector<LogicalDeviceConfiguration>& logical_devices) {
  internal::device_registry().configure(device, logical_devices);
}

std::optional<std::vector<LogicalDeviceConfiguration>> get_logical_device_configuration(const PhysicalDevice& device) {
  return internal::device_registry().configuration(device);
}

DeviceDetails get_device_details(const PhysicalDevice& device) { return internal::device_registry().details(device); }

std::string gpus_unavailable_reason() { return internal::device_registry().why_no_gpu(); }

std::ostream& operator<<(std::ostream& os, const PhysicalDevice& d) {
  return os << "PhysicalDevice(name='" << d.name << "', device_type='" << d.device_type << "')";
}

std::ostream& operator<<(std::ostream& os, const LogicalDevice& d) {
  return os << "LogicalDevice(name='" << d.name << "', device_type='" << d.device_type << "')";
}

}  // namespace distribute
