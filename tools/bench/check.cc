// The inputs of the replicas and the expected results of the operations on
// them, computed by plain loops in double (--check).
#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "distribute/reduce_op.h"

namespace distribute::bench {
namespace {

// Input of replica r, element i: small integers, exact in every dtype.
double input_value(int r, std::size_t i) { return static_cast<double>((i % 5) + static_cast<std::size_t>(r)); }

}  // namespace

Tensor make_input(DType dtype, int r, std::size_t count) {
  Tensor t = Tensor::uninitialized(dtype, Shape{static_cast<std::int64_t>(count)});
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.mutable_raw_data());
    for (std::size_t i = 0; i < count; ++i) {
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        p[i] = T(static_cast<float>(input_value(r, i)));
      } else {
        p[i] = static_cast<T>(input_value(r, i));
      }
    }
  });
  return t;
}

namespace {

// Element i of the reduction over n replicas, by a plain loop in double,
// rounded to the dtype.
double reduced_value(const Options& o, std::size_t i, int n) {
  double acc = input_value(0, i);
  for (int q = 1; q < n; ++q) {
    const double x = input_value(q, i);
    if (o.redop == ReduceOp::kSum || o.redop == ReduceOp::kMean) acc += x;
    if (o.redop == ReduceOp::kProduct) acc *= x;
    if (o.redop == ReduceOp::kMin) acc = std::min(acc, x);
    if (o.redop == ReduceOp::kMax) acc = std::max(acc, x);
  }
  if (o.redop == ReduceOp::kMean) acc = is_floating(o.dtype) ? acc / n : std::trunc(acc / n);
  return o.dtype == DType::kBool ? (acc != 0) : scalar(o.dtype, acc).element_as_double(0);
}

}  // namespace

std::size_t count_wrong(const Options& o, const Tensor& out, std::size_t count, int n, int r) {
  std::size_t wrong = 0;
  if (o.op == "reduce_scatter") {
    const std::size_t per = count / static_cast<std::size_t>(n);
    for (std::size_t j = 0; j < per; ++j) {
      if (out.element_as_double(static_cast<std::int64_t>(j)) !=
          reduced_value(o, static_cast<std::size_t>(r) * per + j, n)) {
        ++wrong;
      }
    }
    return wrong;
  }
  for (std::size_t i = 0; i < count; ++i) {
    double want = 0;
    if (o.op == "all_reduce") {
      want = reduced_value(o, i, n);
    } else if (o.op == "all_gather") {
      const std::size_t per = count / static_cast<std::size_t>(n);
      want = scalar(o.dtype, input_value(static_cast<int>(i / per), i % per)).element_as_double(0);
    } else {
      want = scalar(o.dtype, input_value(0, i)).element_as_double(0);
    }
    if (out.element_as_double(static_cast<std::int64_t>(i)) != want) ++wrong;
  }
  return wrong;
}

}  // namespace distribute::bench
