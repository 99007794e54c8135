// Devices (devices.h): the logical layout's rules on registries built from
// any set of GPUs, and the process's own devices, GPUs where there are some.
#include "distribute/devices.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_registry.h"
#include "distribute/errors.h"
#include "testing/errors.h"

namespace distribute::internal {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;

GpuProbe two_gpus() { return {{{"NVIDIA H200", 9, 0, 140 * kGiB}, {"NVIDIA L4", 8, 9, 22 * kGiB}}, ""}; }
GpuProbe no_gpus() { return {{}, "no NVIDIA driver is loaded"}; }

PhysicalDevice gpu(int i) { return {"/physical_device:GPU:" + std::to_string(i), "GPU"}; }
const PhysicalDevice kCpu{"/physical_device:CPU:0", "CPU"};

std::vector<std::string> names(const std::vector<LogicalDevice>& devices) {
  std::vector<std::string> out;
  for (const auto& d : devices) out.push_back(d.name);
  return out;
}

TEST(DeviceRegistryTest, ListsPhysicalDevicesByType) {
  DeviceRegistry r(two_gpus(), std::nullopt);
  EXPECT_EQ(r.physical_devices("GPU"), (std::vector<PhysicalDevice>{gpu(0), gpu(1)}));
  EXPECT_EQ(r.physical_devices("gpu"), r.physical_devices("GPU"));
  EXPECT_EQ(r.physical_devices("CPU"), std::vector<PhysicalDevice>{kCpu});
  EXPECT_EQ(r.physical_devices("").size(), 3u);
  EXPECT_TRUE(r.physical_devices("TPU").empty());
  DeviceRegistry none(no_gpus(), std::nullopt);
  EXPECT_TRUE(none.physical_devices("GPU").empty());
  EXPECT_EQ(none.why_no_gpu(), "no NVIDIA driver is loaded");
}

TEST(DeviceRegistryTest, OneLogicalDevicePerPhysicalDeviceByDefault) {
  DeviceRegistry r(two_gpus(), std::nullopt);
  EXPECT_EQ(names(r.logical_devices("GPU")),
            (std::vector<std::string>{"/job:localhost/replica:0/task:0/device:GPU:0",
                                      "/job:localhost/replica:0/task:0/device:GPU:1"}));
  EXPECT_EQ(names(r.logical_devices("CPU")), std::vector<std::string>{"/job:localhost/replica:0/task:0/device:CPU:0"});
  const auto gpus = r.logical_gpus();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[1].physical, 1);
  EXPECT_EQ(gpus[1].memory_limit_bytes, 22 * kGiB);
  EXPECT_FALSE(r.configuration(gpu(0)).has_value());
}

TEST(DeviceRegistryTest, SplitsAGpuIntoNumberedLogicalGpus) {
  DeviceRegistry r(two_gpus(), std::nullopt);
  r.configure(gpu(0), {{4096}, {4096}});
  const auto gpus = r.logical_gpus();
  ASSERT_EQ(gpus.size(), 3u);  // GPU:0 and GPU:1 on the H200, GPU:2 the L4
  EXPECT_EQ(gpus[0].physical, 0);
  EXPECT_EQ(gpus[1].physical, 0);
  EXPECT_EQ(gpus[1].memory_limit_bytes, 4096 * kMiB);
  EXPECT_EQ(gpus[2].physical, 1);
  EXPECT_EQ(r.describe_gpu(1, "GPU:1"), "GPU:1 (NVIDIA H200, physical GPU 0, 4096 MB)");
  ASSERT_TRUE(r.configuration(gpu(0)).has_value());
  EXPECT_EQ(r.configuration(gpu(0))->size(), 2u);
}

TEST(DeviceRegistryTest, LogicalGpusWithoutALimitShareWhatIsLeft) {
  DeviceRegistry r({{{"small", 8, 0, 8 * kGiB}}, ""}, std::nullopt);
  r.configure(gpu(0), {{1024}, {}, {}});
  const auto gpus = r.logical_gpus();
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].memory_limit_bytes, 1 * kGiB);
  EXPECT_EQ(gpus[1].memory_limit_bytes, 7 * kGiB / 2);
  EXPECT_EQ(gpus[2].memory_limit_bytes, 7 * kGiB / 2);
}

TEST(DeviceRegistryTest, RefusesBadConfigurations) {
  DeviceRegistry r(two_gpus(), std::nullopt);
  auto big = testing::error_message<InvalidArgumentError>([&] { r.configure(gpu(1), {{20000}, {20000}}); });
  EXPECT_NE(big.find("ask for 40000 MB in all, more than the 22528 MB of NVIDIA L4"), std::string::npos) << big;
  EXPECT_THROW(r.configure(gpu(0), {}), InvalidArgumentError);
  EXPECT_THROW(r.configure(gpu(0), {{0}}), InvalidArgumentError);
  EXPECT_THROW(r.configure(gpu(0), {{-5}}), InvalidArgumentError);
  auto cpu_limit = testing::error_message<InvalidArgumentError>([&] { r.configure(kCpu, {{100}}); });
  EXPECT_NE(cpu_limit.find("memory limit on a CPU"), std::string::npos) << cpu_limit;
  auto unknown = testing::error_message<InvalidArgumentError>([&] { r.configure(gpu(2), {{}}); });
  EXPECT_NE(unknown.find("Unrecognized device: PhysicalDevice(name='/physical_device:GPU:2', device_type='GPU'); the "
                         "physical devices are /physical_device:CPU:0, /physical_device:GPU:0, /physical_device:GPU:1"),
            std::string::npos)
      << unknown;
  EXPECT_THROW(r.configure({"/physical_device:GPU:0", "CPU"}, {{}}), InvalidArgumentError);
  DeviceRegistry none(no_gpus(), std::nullopt);
  auto no_gpu = testing::error_message<InvalidArgumentError>([&] { none.configure(gpu(0), {{}}); });
  EXPECT_NE(no_gpu.find("(no GPU: no NVIDIA driver is loaded)"), std::string::npos) << no_gpu;
  // Nothing refused was kept.
  EXPECT_FALSE(r.configuration(gpu(0)).has_value());
  EXPECT_FALSE(r.configuration(gpu(1)).has_value());
}

TEST(DeviceRegistryTest, TheLayoutIsFixedOnceRead) {
  DeviceRegistry r(two_gpus(), std::nullopt);
  r.configure(kCpu, {{}, {}});
  r.configure(kCpu, {{}, {}, {}});  // changed before anything read it
  EXPECT_EQ(r.logical_devices("CPU").size(), 3u);
  auto fixed = testing::error_message<FailedPreconditionError>([&] { r.configure(kCpu, {{}, {}}); });
  EXPECT_NE(fixed.find("Virtual devices cannot be modified after being initialized"), std::string::npos) << fixed;
  EXPECT_THROW(r.configure(gpu(0), {{1024}, {1024}}), FailedPreconditionError);
  r.configure(kCpu, {{}, {}, {}});  // the configuration in force: nothing to change
  EXPECT_EQ(r.logical_devices("").size(), 5u);
}

TEST(DeviceRegistryTest, NamesTheGpusThatExistWhenAskedForAnother) {
  DeviceRegistry r(two_gpus(), std::nullopt);
  r.configure(gpu(0), {{1024}, {1024}});
  auto missing = testing::error_message<InvalidArgumentError>([&] { r.logical_gpu(3, "/device:GPU:3"); });
  EXPECT_NE(missing.find("device '/device:GPU:3' does not exist: the GPUs are GPU:0 to GPU:2 (3 logical GPUs on 2 "
                         "physical GPUs)"),
            std::string::npos)
      << missing;
  EXPECT_EQ(r.logical_gpu(2, "GPU:2").physical, 1);
  DeviceRegistry none(no_gpus(), std::nullopt);
  auto nothing = testing::error_message<InvalidArgumentError>([&] { none.logical_gpu(0, "GPU:0"); });
  EXPECT_NE(nothing.find("device 'GPU:0' does not exist: no GPU is visible: no NVIDIA driver is loaded"),
            std::string::npos)
      << nothing;
}

TEST(DeviceRegistryTest, EnvironmentSplitsTheGpusNotConfigured) {
  DeviceRegistry r(two_gpus(), "2:1024");
  r.configure(gpu(1), {{}});
  const auto gpus = r.logical_gpus();
  ASSERT_EQ(gpus.size(), 3u);  // two of 1 GiB on the H200; the L4 as configured, whole
  EXPECT_EQ(gpus[0].memory_limit_bytes, kGiB);
  EXPECT_EQ(gpus[1].memory_limit_bytes, kGiB);
  EXPECT_EQ(gpus[2].memory_limit_bytes, 22 * kGiB);
  EXPECT_FALSE(r.configuration(gpu(0)).has_value());  // the environment is not a configuration
  DeviceRegistry even(two_gpus(), "4");
  EXPECT_EQ(even.logical_gpus().size(), 8u);
  EXPECT_EQ(even.logical_gpus()[7].memory_limit_bytes, 22 * kGiB / 4);
}

TEST(DeviceRegistryTest, EnvironmentIsParsedStrictly) {
  EXPECT_EQ(parse_logical_gpus("2").size(), 2u);
  EXPECT_FALSE(parse_logical_gpus("2")[0].memory_limit.has_value());
  EXPECT_EQ(parse_logical_gpus("3:512")[2].memory_limit, 512);
  EXPECT_EQ(parse_logical_gpus("64").size(), 64u);
  EXPECT_EQ(parse_logical_gpus("64:1073741824")[63].memory_limit, std::int64_t{1} << 30);
  for (const char* bad :
       {"", "0", "65", "-1", "x", "2:", "2:0", "2:1073741825", "2:1024x", ":1024", " 2", "2:-1", "1.5"}) {
    auto message = testing::error_message<InvalidArgumentError>([&] { parse_logical_gpus(bad); });
    EXPECT_NE(message.find("DISTRIBUTE_LOGICAL_GPUS='" + std::string(bad) + "' is not \"N\" or \"N:MB\""),
              std::string::npos)
        << message;
  }
  // Refused when the layout is fixed, and again at the next read.
  DeviceRegistry r(two_gpus(), "two");
  EXPECT_THROW(r.logical_devices("GPU"), InvalidArgumentError);
  EXPECT_THROW(r.logical_gpus(), InvalidArgumentError);
  auto too_big =
      testing::error_message<InvalidArgumentError>([] { DeviceRegistry(two_gpus(), "2:16384").logical_gpus(); });
  EXPECT_NE(too_big.find("asks 32768 MB of physical GPU 1 (NVIDIA L4), which has 22528 MB"), std::string::npos)
      << too_big;
  // Without a GPU the variable splits nothing, and is not read.
  EXPECT_TRUE(DeviceRegistry(no_gpus(), "two").logical_devices("GPU").empty());
}

TEST(DeviceRegistryTest, DetailsAndPrinting) {
  DeviceRegistry r(two_gpus(), std::nullopt);
  const DeviceDetails d = r.details(gpu(0));
  EXPECT_EQ(d.device_name, "NVIDIA H200");
  EXPECT_EQ(d.compute_capability, (std::pair{9, 0}));
  EXPECT_EQ(d.memory_bytes, 140 * kGiB);
  EXPECT_EQ(r.details(kCpu).device_name, "");
  EXPECT_FALSE(r.details(kCpu).compute_capability.has_value());
  std::ostringstream os;
  os << gpu(1) << " " << r.logical_devices("GPU")[1];
  EXPECT_EQ(os.str(),
            "PhysicalDevice(name='/physical_device:GPU:1', device_type='GPU') "
            "LogicalDevice(name='/job:localhost/replica:0/task:0/device:GPU:1', device_type='GPU')");
}

// The process's own devices: the GPUs CUDA reports, or why there are none.
TEST(ProcessDevicesTest, GpusListedOrTheReasonGiven) {
  const auto gpus = list_physical_devices("GPU");
  EXPECT_EQ(list_physical_devices("CPU").size(), 1u);
  if (gpus.empty()) {
    EXPECT_FALSE(gpus_unavailable_reason().empty());
    return;
  }
  EXPECT_EQ(gpus_unavailable_reason(), "");
  for (const auto& g : gpus) {
    const DeviceDetails d = get_device_details(g);
    EXPECT_FALSE(d.device_name.empty()) << g;
    ASSERT_TRUE(d.compute_capability.has_value()) << g;
    EXPECT_GE(d.compute_capability->first, 1) << g;
    EXPECT_GT(d.memory_bytes, 0) << g;
  }
}

// The real GPUs split as the seed's examples need them on a one-GPU machine.
TEST(ProcessDevicesTest, RealGpusSplitIntoLogicalGpus) {
  GpuProbe probe = probe_gpus();
  if (probe.gpus.empty()) GTEST_SKIP() << "no GPU: " << probe.why_none;
  const std::size_t physical = probe.gpus.size();
  DeviceRegistry r(std::move(probe), "2:1024");
  const auto gpus = r.logical_gpus();
  ASSERT_EQ(gpus.size(), 2 * physical);
  EXPECT_EQ(gpus[1].physical, 0);
  EXPECT_EQ(gpus[1].memory_limit_bytes, kGiB);
}

// The process's registry, configured once: its own process under ctest.
TEST(ProcessDevicesTest, CpuSplitThenFixed) {
  const PhysicalDevice cpu = list_physical_devices("CPU").at(0);
  EXPECT_EQ(cpu, kCpu);
  set_logical_device_configuration(cpu, {{}, {}});
  EXPECT_EQ(get_logical_device_configuration(cpu)->size(), 2u);
  EXPECT_EQ(list_logical_devices("CPU").size(), 2u);
  EXPECT_THROW(set_logical_device_configuration(cpu, {{}}), FailedPreconditionError);
  if (std::getenv("DISTRIBUTE_LOGICAL_GPUS") == nullptr) {
    EXPECT_EQ(list_logical_devices("GPU").size(), list_physical_devices("GPU").size());
  }
}

}  // namespace
}  // namespace distribute::internal
