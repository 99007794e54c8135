#include "core/cuda/device_memory.h"

#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/device_registry.h"
#include "core/storage.h"
#include "distribute/errors.h"

namespace distribute::internal {

DeviceMemory::DeviceMemory(int logical_index, int physical, std::int64_t limit_bytes)
    : logical_index_(logical_index), physical_(physical), limit_bytes_(limit_bytes) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = physical;
  check_cuda(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate for " + name());
  // Keep every freed byte mapped for reuse: the limit is ours to keep, and
  // giving memory back at each synchronisation would make the next step
  // map it again.
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
  if (const cudaError_t e = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep); e != cudaSuccess) {
    static_cast<void>(cudaMemPoolDestroy(pool_));
    throw_cuda_error(e, "cudaMemPoolSetAttribute(release threshold) for " + name());
  }
}

DeviceMemory::~DeviceMemory() { static_cast<void>(cudaMemPoolDestroy(pool_)); }

std::string DeviceMemory::name() const {
  return "GPU:" + std::to_string(logical_index_) + " (physical GPU " + std::to_string(physical_) + ")";
}

void* DeviceMemory::allocate(std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  auto exhausted = [&](const std::string& why) {
    return ResourceExhaustedError(name() + ": out of memory allocating " + bytes_text(bytes) + ": " + why);
  };
  const std::int64_t before = in_use_.load(std::memory_order_relaxed);
  if (bytes > static_cast<std::size_t>(limit_bytes_)) {
    throw exhausted("more than its limit of " + bytes_text(static_cast<std::size_t>(limit_bytes_)));
  }
  const auto n = static_cast<std::int64_t>(bytes);
  const std::int64_t used = in_use_.fetch_add(n, std::memory_order_relaxed) + n;
  if (used > limit_bytes_) {
    in_use_.fetch_sub(n, std::memory_order_relaxed);
    throw exhausted(bytes_text(static_cast<std::size_t>(used - n)) + " of its limit of " +
                    bytes_text(static_cast<std::size_t>(limit_bytes_)) + " are in use");
  }
  void* p = nullptr;
  if (const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, stream); e != cudaSuccess) {
    in_use_.fetch_sub(n, std::memory_order_relaxed);
    if (e == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());
      throw exhausted("the device has no more (" + bytes_text(static_cast<std::size_t>(before)) +
                      " in use on this logical GPU; " + cuda_error_text(e) + ")");
    }
    throw_cuda_error(e, "cudaMallocFromPoolAsync(" + bytes_text(bytes) + ") on " + name());
  }
  return p;
}

void DeviceMemory::free(void* p, std::size_t bytes, cudaStream_t stream) noexcept {
  if (p == nullptr) return;
  if (const cudaError_t e = cudaFreeAsync(p, stream); e != cudaSuccess) {
    // Nothing can be thrown from a deleter: say it, and clear the error so
    // that the next call is not blamed for it.
    static_cast<void>(cudaGetLastError());
    std::fprintf(stderr, "distribute: cudaFreeAsync on %s failed: %s\n", name().c_str(), cuda_error_text(e).c_str());
  }
  in_use_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
}

std::int64_t DeviceMemory::bytes_reserved() const {
  std::uint64_t reserved = 0;
  check_cuda(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved),
             "cudaMemPoolGetAttribute(reserved) for " + name());
  return static_cast<std::int64_t>(reserved);
}

DeviceMemory& device_memory(int index) {
  // Never destroyed: tensors freed while the process exits still give their
  // memory back to it, and the CUDA runtime may be gone by then.
  static std::mutex mu;
  static auto* memories = new std::vector<DeviceMemory*>();
  const LogicalGpu gpu = device_registry().logical_gpu(index, "GPU:" + std::to_string(index));
  std::lock_guard lock(mu);
  if (memories->size() <= static_cast<std::size_t>(index)) memories->resize(static_cast<std::size_t>(index) + 1);
  DeviceMemory*& m = (*memories)[static_cast<std::size_t>(index)];
  if (m == nullptr) m = new DeviceMemory(index, gpu.physical, gpu.memory_limit_bytes);
  return *m;
}

std::shared_ptr<std::byte> allocate_device_storage(int index, std::size_t bytes, cudaStream_t stream) {
  DeviceMemory& memory = device_memory(index);
  void* p = memory.allocate(bytes, stream);
  if (p == nullptr) return nullptr;
  // (If the control block cannot be made, shared_ptr calls the deleter.)
  return {static_cast<std::byte*>(p), [&memory, bytes, stream](std::byte* q) { memory.free(q, bytes, stream); }};
}

}  // namespace distribute::internal
