#include "distribute/indexed_slices.h"

#include <cstring>
#include <ostream>
#include <type_traits>

namespace distribute {
namespace {
std::int64_t index_at(const Tensor& indices, std::int64_t i) {
  return indices.dtype() == DType::kInt32 ? indices.flat<std::int32_t>()[static_cast<std::size_t>(i)]
                                          : indices.flat<std::int64_t>()[static_cast<std::size_t>(i)];
}
}  // namespace

IndexedSlices::IndexedSlices(Tensor values, Tensor indices, Shape dense_shape)
    : values_(std::move(values)), indices_(std::move(indices)), dense_shape_(std::move(dense_shape)) {
  auto fail = [&](const std::string& why) {
    throw InvalidArgumentError("IndexedSlices: " + why + " (values " + values_.shape().to_string() + ", indices " +
                               indices_.shape().to_string() + ", dense_shape " + dense_shape_.to_string() + ")");
  };
  if (indices_.dtype() != DType::kInt32 && indices_.dtype() != DType::kInt64) {
    fail("indices must be int32 or int64, not " + std::string(to_string(indices_.dtype())));
  }
  if (indices_.rank() != 1) fail("indices must have rank 1");
  if (values_.rank() < 1) fail("values must have rank >= 1");
  if (values_.shape()[0] != indices_.shape()[0]) fail("values and indices disagree on the number of slices");
  if (dense_shape_.rank() != values_.rank()) fail("values and dense_shape have different ranks");
  for (int d = 1; d < values_.rank(); ++d) {
    if (values_.shape()[d] != dense_shape_[d]) fail("a slice's shape differs from dense_shape[1:]");
  }
  for (std::int64_t i = 0; i < indices_.num_elements(); ++i) {
    const std::int64_t row = index_at(indices_, i);
    if (row < 0 || row >= dense_shape_[0]) fail(outside(row, i));
  }
}

std::string IndexedSlices::outside(std::int64_t row, std::int64_t position) const {
  return "index " + std::to_string(row) + " at position " + std::to_string(position) + " is outside [0, " +
         std::to_string(dense_shape_[0]) + ")";
}

IndexedSlices IndexedSlices::as_read_only() const {
  return IndexedSlices(Checked{}, values_.as_read_only(), indices_.as_read_only(), dense_shape_);
}

Tensor IndexedSlices::to_dense() const {
  Tensor dense(values_.dtype(), dense_shape_, values_.device());
  const std::int64_t row_elems = dense_shape_[0] == 0 ? 0 : dense_shape_.num_elements() / dense_shape_[0];
  visit_dtype(values_.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = reinterpret_cast<const T*>(values_.raw_data());
    T* dst = reinterpret_cast<T*>(dense.mutable_raw_data());
    for (std::int64_t i = 0; i < indices_.num_elements(); ++i) {
      // Checked again: the indices' storage stays writable through any Tensor
      // that shares it, so they may have changed since the constructor read them.
      const std::int64_t at = index_at(indices_, i);
      if (at < 0 || at >= dense_shape_[0]) {
        throw InvalidArgumentError("IndexedSlices::to_dense: " + outside(at, i) +
                                   ": the indices were changed after the IndexedSlices was made");
      }
      T* row = dst + at * row_elems;
      const T* in = src + i * row_elems;
      for (std::int64_t j = 0; j < row_elems; ++j) {
        if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
          row[j] = T(static_cast<float>(row[j]) + static_cast<float>(in[j]));
        } else if constexpr (std::is_same_v<T, bool>) {
          row[j] = row[j] || in[j];
        } else if constexpr (std::is_integral_v<T>) {
          // Duplicates wrap (two's complement), as every integer sum here does.
          using U = std::make_unsigned_t<T>;
          row[j] = static_cast<T>(static_cast<U>(static_cast<U>(row[j]) + static_cast<U>(in[j])));
        } else {
          row[j] = static_cast<T>(row[j] + in[j]);
        }
      }
    }
  });
  return dense;
}

std::string IndexedSlices::repr() const {
  return "IndexedSlices(indices=" + indices_.repr() + ", values=" + values_.repr() +
         ", dense_shape=" + dense_shape_.to_string() + ")";
}

bool operator==(const IndexedSlices& a, const IndexedSlices& b) {
  return a.values_ == b.values_ && a.indices_ == b.indices_ && a.dense_shape_ == b.dense_shape_;
}

std::ostream& operator<<(std::ostream& os, const IndexedSlices& s) { return os << s.repr(); }

std::string repr(const TensorOrSlices& v) {
  return std::visit([](const auto& x) { return x.repr(); }, v);
}

std::ostream& operator<<(std::ostream& os, const TensorOrSlices& v) { return os << repr(v); }

}  // namespace distribute
