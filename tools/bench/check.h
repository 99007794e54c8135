// The inputs of every replica (small integers, exact in every dtype) and the
// check of an operation's result against them (--check), for every mode.
#pragma once

#include <cstddef>

#include "distribute/dtype.h"
#include "distribute/tensor.h"
#include "options.h"

namespace distribute::bench {

// Replica r's input of `count` elements of `dtype`: small integers, exact in every dtype.
Tensor make_input(DType dtype, int r, std::size_t count);

// Elements of `out` (of replica `r`) that differ from the expected result
// (`count`: the elements of the operation; reduce_scatter gives each replica
// its count / n).
std::size_t count_wrong(const Options& o, const Tensor& out, std::size_t count, int n, int r);

}  // namespace distribute::bench
