// Storage for tensor bytes: 64-byte aligned so kernels may use aligned vector
// loads, shared so that copies and views of a Tensor need no copy of the bytes.
#pragma once

#include <cstddef>
#include <memory>

namespace distribute::internal {

inline constexpr std::size_t kStorageAlignment = 64;

// Uninitialised bytes; nullptr for 0 bytes.
std::shared_ptr<std::byte> allocate_storage(std::size_t bytes);

}  // namespace distribute::internal
