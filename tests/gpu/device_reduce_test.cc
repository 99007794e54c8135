// The GPU reduction kernel against the CPU kernels: every dtype and op, 1 to
// 5 sources, bit for bit, on values that include NaN, infinities,
// subnormals, signed zeros and integer extremes.
#include "core/cuda/device_reduce.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/reduce_kernels.h"
#include "distribute/devices.h"
#include "distribute/errors.h"
#include "testing/errors.h"
#include "testing/gpu.h"

namespace distribute::internal {
namespace {

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

// Random bytes, with special values planted in the float dtypes and bools
// kept to 0 or 1 (the only bytes a bool tensor holds).
std::vector<std::uint8_t> random_bytes(DType dtype, std::size_t count, std::mt19937_64& rng) {
  const std::size_t size = size_of(dtype);
  std::vector<std::uint8_t> bytes(count * size);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  if (dtype == DType::kBool) {
    for (auto& b : bytes) b &= 1;
  }
  if (dtype == DType::kFloat32) {
    const float specials[] = {0.f, -0.f, 1e-45f, -1e-40f, 3.4e38f, INFINITY, -INFINITY, NAN, 1.f, -2.5f};
    for (std::size_t i = 0; i < count; i += 7) std::memcpy(&bytes[i * size], &specials[i % 10], size);
  }
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    const std::uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x7c00, 0xfc00, 0x7e00, 0x3c00, 0x03ff};
    for (std::size_t i = 0; i < count; i += 5) std::memcpy(&bytes[i * size], &specials[i % 8], size);
  }
  return bytes;
}

class DeviceReduceTest : public testing::GpuStreamTest {
 protected:
  void TearDown() override {
    for (void* p : buffers_) {
      EXPECT_EQ(cudaFree(p), cudaSuccess);
    }
    GpuStreamTest::TearDown();
  }
  void* device_copy(const std::vector<std::uint8_t>& bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes.size() + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }
  std::vector<void*> buffers_;
};

TEST_F(DeviceReduceTest, MatchesTheCpuKernelsBitForBit) {
  std::mt19937_64 rng(7);
  const std::size_t count = 3000;  // several blocks, and a ragged last one
  for (DType dtype : kAllDTypes) {
    for (std::size_t k = 1; k <= 5; ++k) {
      std::vector<std::vector<std::uint8_t>> inputs;
      std::vector<const void*> host_srcs;
      std::vector<const void*> device_srcs;
      for (std::size_t j = 0; j < k; ++j) inputs.push_back(random_bytes(dtype, count, rng));
      for (const auto& in : inputs) {
        host_srcs.push_back(in.data());
        device_srcs.push_back(device_copy(in));
      }
      void* device_dst = device_copy(std::vector<std::uint8_t>(count * size_of(dtype)));
      for (ReduceOp op : kOps) {
        for (std::int64_t divisor : {std::int64_t{0}, std::int64_t{3}}) {
          if (divisor != 0 && op != ReduceOp::kMean) continue;
          std::vector<std::uint8_t> want(count * size_of(dtype));
          reduce_sources(want.data(), host_srcs, count, dtype, op, divisor);
          reduce_sources_on_device(device_dst, device_srcs, count, dtype, op, divisor, stream_);
          std::vector<std::uint8_t> got(want.size());
          ASSERT_EQ(cudaMemcpyAsync(got.data(), device_dst, got.size(), cudaMemcpyDeviceToHost, stream_), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
          EXPECT_EQ(got, want) << to_string(dtype) << " " << to_string(op) << " of " << k << " sources, divisor "
                               << divisor;
        }
      }
    }
  }
}

TEST_F(DeviceReduceTest, InPlaceAndLimits) {
  std::vector<float> a(1000, 1.5f);
  std::vector<float> b(1000, 2.f);
  auto bytes = [](const std::vector<float>& v) {
    std::vector<std::uint8_t> out(v.size() * sizeof(float));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  void* da = device_copy(bytes(a));
  void* db = device_copy(bytes(b));
  const void* srcs[] = {da, db};
  reduce_sources_on_device(da, srcs, a.size(), DType::kFloat32, ReduceOp::kSum, 0, stream_);  // dst is a source
  std::vector<float> got(a.size());
  ASSERT_EQ(cudaMemcpyAsync(got.data(), da, got.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(got, std::vector<float>(a.size(), 3.5f));
  std::vector<const void*> too_many(kMaxDeviceReduceSources + 1, da);
  auto message = testing::error_message<InvalidArgumentError>(
      [&] { reduce_sources_on_device(da, too_many, 1, DType::kFloat32, ReduceOp::kSum, 0, stream_); });
  EXPECT_NE(message.find("at most 256 buffers at once, not 257"), std::string::npos) << message;
}

}  // namespace
}  // namespace distribute::internal
