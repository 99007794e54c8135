// Device memory of the logical GPUs (src/core/cuda/device_memory.h), on the
// GPUs there are; every test skips, saying why, where there is none.
#include "core/cuda/device_memory.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "distribute/devices.h"
#include "distribute/errors.h"
#include "testing/errors.h"
#include "testing/gpu.h"

namespace distribute::internal {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

using DeviceMemoryTest = testing::GpuStreamTest;

TEST_F(DeviceMemoryTest, HandsOutMemoryThatHoldsBytesAndReusesIt) {
  DeviceMemory memory(0, 0, 64 * kMiB);
  void* p = memory.allocate(kMiB, stream_);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(memory.bytes_in_use(), static_cast<std::int64_t>(kMiB));
  std::vector<std::uint8_t> back(kMiB, 0);
  ASSERT_EQ(cudaMemsetAsync(p, 0x5a, kMiB, stream_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), p, kMiB, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(back.front(), 0x5a);
  EXPECT_EQ(back.back(), 0x5a);
  memory.free(p, kMiB, stream_);
  EXPECT_EQ(memory.bytes_in_use(), 0);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::int64_t reserved = memory.bytes_reserved();
  EXPECT_GE(reserved, static_cast<std::int64_t>(kMiB));  // kept, not given back at the synchronisation
  for (int step = 0; step < 10; ++step) {                // a steady state takes nothing new from the driver
    void* q = memory.allocate(kMiB, stream_);
    memory.free(q, kMiB, stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  EXPECT_EQ(memory.bytes_reserved(), reserved);
  EXPECT_EQ(memory.allocate(0, stream_), nullptr);
}

TEST_F(DeviceMemoryTest, TheLogicalGpusLimitIsResourceExhausted) {
  DeviceMemory memory(3, 0, 2 * kMiB);
  void* p = memory.allocate(kMiB + kMiB / 2, stream_);
  auto message = testing::error_message<ResourceExhaustedError>([&] { memory.allocate(kMiB, stream_); });
  EXPECT_NE(message.find("GPU:3 (physical GPU 0): out of memory allocating 1,048,576 bytes (1.0 MiB)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("1,572,864 bytes (1.5 MiB) of its limit of 2,097,152 bytes (2.0 MiB) are in use"),
            std::string::npos)
      << message;
  EXPECT_THROW(memory.allocate(3 * kMiB, stream_), ResourceExhaustedError);
  EXPECT_EQ(memory.bytes_in_use(), static_cast<std::int64_t>(kMiB + kMiB / 2));  // nothing counted for a refusal
  memory.free(p, kMiB + kMiB / 2, stream_);
  memory.free(memory.allocate(2 * kMiB, stream_), 2 * kMiB, stream_);  // all of it, once free
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing left for the next call
}

TEST_F(DeviceMemoryTest, ProcessMemoryPerLogicalGpuAndSharedStorage) {
  DeviceMemory& gpu0 = device_memory(0);
  EXPECT_EQ(&gpu0, &device_memory(0));
  EXPECT_EQ(gpu0.physical(), 0);
  const auto count = static_cast<int>(list_logical_devices("GPU").size());
  auto missing = testing::error_message<InvalidArgumentError>([&] { device_memory(count); });
  EXPECT_NE(missing.find("does not exist: the GPUs are GPU:0"), std::string::npos) << missing;
  const std::int64_t before = gpu0.bytes_in_use();
  {
    std::shared_ptr<std::byte> a = allocate_device_storage(0, 4096, stream_);
    std::shared_ptr<std::byte> b = a;
    EXPECT_EQ(gpu0.bytes_in_use(), before + 4096);
    a.reset();
    EXPECT_EQ(gpu0.bytes_in_use(), before + 4096);  // b still holds it
  }
  EXPECT_EQ(gpu0.bytes_in_use(), before);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

}  // namespace
}  // namespace distribute::internal
