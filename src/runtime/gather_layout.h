// How an all_gather lays out its output, worked out before the data moves
// (and kept by a replica from call to call: runtime/replica_channel.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "distribute/tensor.h"

namespace distribute::internal {

// N values inline, more on the heap: the all_gather layout builds two of
// these on every call, and a heap allocation there was a visible part of the
// API's fixed cost.
template <class T, std::size_t N>
class InlineArray {
 public:
  explicit InlineArray(std::size_t size) : size_(size) {
    if (size > N) heap_.resize(size);
  }
  T* data() { return size_ <= N ? inline_.data() : heap_.data(); }
  const T* data() const { return size_ <= N ? inline_.data() : heap_.data(); }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data()[i]; }
  operator std::span<const T>() const { return {data(), size_}; }

 private:
  std::size_t size_;
  std::array<T, N> inline_{};
  std::vector<T> heap_;
};

// How an all-gather of `value` along `axis` lays out, where member q holds
// along(q) elements along the axis: `outer` rows, each the concatenation of
// every member's row of counts[q] elements, giving a result of `shape`.
struct GatherLayout {
  std::size_t outer = 1;
  InlineArray<std::size_t, 8> counts;
  Shape shape;
};
// (A template, not std::function: it runs on every all_gather, and a
// std::function of the callers' lambdas costs a heap allocation.)
[[noreturn]] void throw_gather_size_overflow(int axis);
template <class Along>
GatherLayout gather_layout(const Tensor& value, int axis, std::size_t members, Along&& along) {
  const int a = axis < 0 ? axis + value.rank() : axis;
  const auto dims_in = value.shape().dims_span();
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= dims_in[static_cast<std::size_t>(d)];
  for (int d = a + 1; d < value.rank(); ++d) inner *= dims_in[static_cast<std::size_t>(d)];
  InlineArray<std::int64_t, 8> dims(dims_in.size());  // the output's
  std::copy(dims_in.begin(), dims_in.end(), dims.data());
  std::int64_t& along_axis = dims[static_cast<std::size_t>(a)];
  along_axis = 0;
  GatherLayout layout{
      .outer = static_cast<std::size_t>(outer), .counts = InlineArray<std::size_t, 8>(members), .shape = {}};
  for (std::size_t q = 0; q < members; ++q) {
    const std::int64_t n = along(q);
    layout.counts[q] = static_cast<std::size_t>(n * inner);
    if (__builtin_add_overflow(along_axis, n, &along_axis)) throw_gather_size_overflow(a);
  }
  layout.shape = Shape(std::span<const std::int64_t>(dims));
  return layout;
}

}  // namespace distribute::internal
