// File: indexed_slices.h
//
// IndexedSlices, as tf.IndexedSlices: a sparse representation of a dense
// tensor of shape `dense_shape` whose rows `indices[i]` equal `values[i]`.
// Rows may repeat; the dense value is their sum. It is what gradients of an
// embedding lookup look like.
//
//   IndexedSlices g(constant({{1.f, 2.f}}), constant({3}), Shape{10, 2});
//   Tensor dense = g.to_dense();   // shape (10, 2), row 3 = [1, 2]
#pragma once

#include <iosfwd>
#include <string>
#include <variant>

#include "distribute/tensor.h"

namespace distribute {

class IndexedSlices {
 public:
  // `indices` is int32 or int64 of rank 1; values.shape[0] == len(indices);
  // values.shape[1:] == dense_shape[1:]. Violations throw InvalidArgumentError.
  IndexedSlices(Tensor values, Tensor indices, Shape dense_shape);

  const Tensor& values() const { return values_; }
  const Tensor& indices() const { return indices_; }
  const Shape& dense_shape() const { return dense_shape_; }
  DType dtype() const { return values_.dtype(); }

  // The same slices (the same storage) with read-only values and indices,
  // as a value every replica receives whole is handed out. No check again:
  // these were checked when made (O(1), where the constructor reads every
  // index).
  IndexedSlices as_read_only() const;

  // Sums rows into a dense tensor (duplicates add up, in order; integers
  // wrap). The indices are checked again (InvalidArgumentError): their
  // storage stays writable through any Tensor that shares it.
  Tensor to_dense() const;

  std::string repr() const;
  friend bool operator==(const IndexedSlices& a, const IndexedSlices& b);

 private:
  struct Checked {};
  // "index 12 at position 3 is outside [0, 10)".
  std::string outside(std::int64_t row, std::int64_t position) const;
  IndexedSlices(Checked, Tensor values, Tensor indices, Shape dense_shape)
      : values_(std::move(values)), indices_(std::move(indices)), dense_shape_(std::move(dense_shape)) {}

  Tensor values_;
  Tensor indices_;
  Shape dense_shape_;
};

std::ostream& operator<<(std::ostream& os, const IndexedSlices& s);
inline std::string repr(const IndexedSlices& s) { return s.repr(); }

// A leaf of a nest that holds dense tensors and IndexedSlices side by side,
// as a model's gradients do when some of them are sparse (an embedding's):
// ReplicaContext::all_reduce takes a Nest<TensorOrSlices> and reduces each
// leaf as it would alone.
using TensorOrSlices = std::variant<Tensor, IndexedSlices>;
std::string repr(const TensorOrSlices& v);
std::ostream& operator<<(std::ostream& os, const TensorOrSlices& v);

}  // namespace distribute
