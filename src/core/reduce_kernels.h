// Element-wise reduction of several same-sized buffers: the arithmetic of every
// all-reduce and of Strategy::reduce. Inputs are combined in the order given
// (replica order), so the result is the same on every replica and every run.
//
// Arithmetic, per dtype (docs/semantics.md, "Reduction arithmetic"):
//   float32/float64: accumulate in the dtype; MEAN = sum / n.
//   float16/bfloat16: accumulate in float32, round once at the end.
//   integers: SUM and PRODUCT wrap (two's complement); MEAN is the exact mean
//             truncated toward zero, accumulated without overflow.
//   bool: SUM and MAX are OR; MIN, PRODUCT and MEAN are AND.
//   MIN/MAX propagate NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "distribute/dtype.h"
#include "distribute/reduce_op.h"

namespace distribute::internal {

// dst[i] = op(srcs[0][i], ..., srcs[k-1][i]) for i < count. For MEAN the divisor
// is `mean_divisor` if > 0, else srcs.size(). dst may alias one of the srcs.
void reduce_sources(void* dst, std::span<const void* const> srcs, std::size_t count, DType dtype, ReduceOp op,
                    std::int64_t mean_divisor = 0);

}  // namespace distribute::internal
