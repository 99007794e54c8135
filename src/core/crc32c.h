// CRC32C (Castagnoli), as checkpoints record it for each tensor. Debian has
// no C++ library for it: this is the SSE4.2 instruction where the CPU has
// it (8 bytes per instruction), else a table-driven loop.
#pragma once

#include <cstddef>
#include <cstdint>

namespace distribute::internal {

// The CRC32C of `n` bytes, continuing from `crc` (the CRC of the bytes
// before them; 0 to start). crc32c("123456789") == 0xE3069283.
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n);
inline std::uint32_t crc32c(const void* data, std::size_t n) { return crc32c_extend(0, data, n); }

}  // namespace distribute::internal
