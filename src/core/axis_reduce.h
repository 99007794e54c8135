// Reduction of one tensor along some of its axes, for Strategy::reduce with
// an axis. Results are in an accumulator dtype so that combining replicas and
// dividing for a mean loses nothing: integers and bool -> int64, float16 and
// bfloat16 -> float32, float32 and float64 unchanged.
#pragma once

#include <vector>

#include "distribute/reduce_op.h"
#include "distribute/tensor.h"

namespace distribute::internal {

DType accumulator_dtype(DType dtype);

// Reduces `t` along `axes` (normalised: 0 <= axis < rank, no repeats) with
// op (SUM for MEAN: the caller divides). The reduced axes are removed.
// Empty reductions give the op's identity (0, 1, +inf/max, -inf/lowest).
Tensor reduce_axes(const Tensor& t, const std::vector<int>& axes, ReduceOp op);

// Validates and normalises axes for a tensor of `rank` (negative count from
// the end); throws InvalidArgumentError ("`axis` = 3 out of range for `value`
// with rank 2") for a bad or repeated axis.
std::vector<int> normalize_axes(const std::vector<int>& axes, int rank);

}  // namespace distribute::internal
