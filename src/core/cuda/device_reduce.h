// Element-wise reduction of several same-sized buffers in device memory: the
// GPU's reduce_sources (core/reduce_kernels.h), with the same arithmetic
// (core/reduce_arith.h) in the same order, so that its results are the CPU
// engine's, bit for bit, for every dtype and op.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "distribute/dtype.h"
#include "distribute/reduce_op.h"

namespace distribute::internal {

// The most sources one launch combines (their pointers travel as the
// kernel's parameters).
inline constexpr std::size_t kMaxDeviceReduceSources = 256;

// Enqueues dst[i] = op(srcs[0][i], ..., srcs[k-1][i]) for i < count on
// `stream`: every pointer device memory that the stream's device reads (its
// own, or a peer's with peer access on). MEAN divides by `mean_divisor` if
// > 0, else k. dst may alias one of the srcs. InvalidArgumentError for more
// than kMaxDeviceReduceSources sources; a failed launch raises CUDA's error.
void reduce_sources_on_device(void* dst, std::span<const void* const> srcs, std::size_t count, DType dtype, ReduceOp op,
                              std::int64_t mean_divisor, cudaStream_t stream);

}  // namespace distribute::internal
