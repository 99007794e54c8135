// Element-wise arithmetic on whole tensors, for variable writes and
// optimizers: the few operations the library itself needs, not a tensor
// algebra. Integers wrap (two's complement); float16 and bfloat16 compute in
// float32 and round once.
#pragma once

#include <cstdint>

#include "distribute/tensor.h"

namespace distribute::internal {

// dst += src and dst -= src, element by element. Same dtype and element
// count (checked by the caller); bool is not numeric and is refused by callers.
void add_into(const Tensor& dst, const Tensor& src);
void sub_into(const Tensor& dst, const Tensor& src);
// A new tensor: every element divided by `divisor` (>= 1), as TensorFlow's
// cast(t / n, dtype): floating point divided in double and rounded back to
// the dtype (float16 and bfloat16 through float), integers exactly,
// truncating toward zero (TensorFlow divides int32 and int64 in double,
// which rounds large int64 values first).
Tensor divided(const Tensor& t, std::int64_t divisor);

}  // namespace distribute::internal
