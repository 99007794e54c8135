// Device memory of the logical GPUs: one CUDA memory pool per logical GPU,
// stream-ordered (cudaMallocFromPoolAsync / cudaFreeAsync), which keeps what
// is freed mapped for the next allocation instead of giving it back to the
// driver, so that a steady-state step (a collective's output, a kernel's
// scratch) neither calls cudaMalloc nor maps fresh pages. The logical GPU's
// memory limit is kept here, by counting the bytes handed out.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace distribute::internal {

class DeviceMemory {
 public:
  // Logical GPU `logical_index`, on CUDA device `physical`, allowed `limit_bytes`.
  DeviceMemory(int logical_index, int physical, std::int64_t limit_bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // `bytes` (nullptr for 0), usable by work ordered on `stream` after this
  // call. ResourceExhaustedError naming the GPU, the bytes asked and those
  // in use, past the limit or when the device has no more.
  void* allocate(std::size_t bytes, cudaStream_t stream);
  // Gives `p` (of allocate(bytes, ...)) back once the work ordered on
  // `stream` so far is done; work on other streams that used it must be
  // ordered before that by the caller (an event), as with cudaFreeAsync.
  void free(void* p, std::size_t bytes, cudaStream_t stream) noexcept;

  int logical_index() const { return logical_index_; }
  int physical() const { return physical_; }
  std::int64_t limit_bytes() const { return limit_bytes_; }
  std::int64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  // What the pool holds from the driver (in use or kept for reuse).
  std::int64_t bytes_reserved() const;
  // "GPU:1 (physical GPU 0)".
  std::string name() const;

 private:
  const int logical_index_;
  const int physical_;
  const std::int64_t limit_bytes_;
  cudaMemPool_t pool_ = nullptr;
  std::atomic<std::int64_t> in_use_{0};
};

// The process's memory of logical GPU `index` (devices.h's layout), made on
// first use; InvalidArgumentError if there is no such GPU.
DeviceMemory& device_memory(int index);

// `bytes` of logical GPU `index`, allocated on `stream` and given back on
// it when the last sharer lets go (see DeviceMemory::free for other streams).
std::shared_ptr<std::byte> allocate_device_storage(int index, std::size_t bytes, cudaStream_t stream);

}  // namespace distribute::internal
