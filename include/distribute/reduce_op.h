// File: reduce_op.h
//
// ReduceOp, as tf.distribute.ReduceOp, plus kMin, kMax and kProduct, which
// TensorFlow lacks. Strings are accepted case-insensitively ("sum", "MEAN").
//
//   ctx.all_reduce(ReduceOp::kSum, value);
//   ReduceOp op = reduce_op_from_string("mean");   // ReduceOp::kMean
#pragma once

#include <string_view>

namespace distribute {

enum class ReduceOp {
  kSum,
  kMean,     // sum, then divide by the number of replicas (see docs/semantics.md for integers)
  kMin,      // extension: TensorFlow has only SUM and MEAN
  kMax,      // extension
  kProduct,  // extension
};

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin, ReduceOp::kMax,
                                             ReduceOp::kProduct};

// "SUM", "MEAN", "MIN", "MAX", "PRODUCT".
std::string_view to_string(ReduceOp op);
// Case-insensitive; an unknown name throws InvalidArgumentError.
ReduceOp reduce_op_from_string(std::string_view name);

}  // namespace distribute
