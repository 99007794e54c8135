// Test helpers for GPU tests, which skip, saying why, where no GPU is
// visible:
//   if (testing::no_gpu()) GTEST_SKIP() << testing::no_gpu_message();
// or derive from GpuStreamTest.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

#include "distribute/devices.h"

namespace distribute::testing {

inline bool no_gpu() { return list_physical_devices("GPU").empty(); }
inline std::string no_gpu_message() { return "no GPU: " + gpus_unavailable_reason(); }

// A test on physical GPU 0 with a stream of its own (stream_), destroyed at
// the end; skipped without a GPU.
class GpuStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (no_gpu()) {
      GTEST_SKIP() << no_gpu_message();
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace distribute::testing
