// File: tensor.h
//
// Tensor: a dtype, a shape and shared row-major storage, with the device it
// lives on. Copies share storage (as TensorFlow's handles do); clone() copies
// the bytes. A read-only tensor (all_reduce's and all_gather's results,
// whose storage the replicas of one process share, and a tensor every
// replica receives whole) refuses writes. Printing follows
// TensorFlow's eager repr.
//
//   Tensor a = constant({1, 2, 3});              // int32, shape (3,)
//   Tensor b = constant({{1.f, 2.f}, {3.f, 4.f}}); // float32, shape (2, 2)
//   Tensor c = concat({a, a}, /*axis=*/0);        // [1, 2, 3, 1, 2, 3]
//   std::cout << c;  // <tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "distribute/dtype.h"
#include "distribute/errors.h"
#include "distribute/internal/tensor.h"  // IWYU pragma: export

namespace distribute {

// Dimensions of a tensor, outermost first. Every dimension is >= 0. Up to 8
// dimensions are stored inline, so copying a Shape (and a Tensor) allocates
// nothing.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims);
  explicit Shape(std::span<const std::int64_t> dims);

  int rank() const { return rank_; }
  std::int64_t num_elements() const;
  std::int64_t operator[](int i) const { return data()[i]; }
  std::int64_t dim(int i) const;  // bounds-checked, throws OutOfRangeError
  std::vector<std::int64_t> dims() const { return {data(), data() + rank_}; }
  std::span<const std::int64_t> dims_span() const { return {data(), static_cast<std::size_t>(rank_)}; }
  // TensorFlow/numpy spelling: "()", "(6,)", "(2, 3)".
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.rank_ == b.rank_ && std::equal(a.data(), a.data() + a.rank_, b.data());
  }

 private:
  static constexpr int kInlineRank = 8;
  const std::int64_t* data() const { return rank_ <= kInlineRank ? inline_.data() : heap_.data(); }

  int rank_ = 0;
  std::array<std::int64_t, kInlineRank> inline_{};
  std::vector<std::int64_t> heap_;  // only for rank > kInlineRank
};

// The host's first CPU device: where tensors go outside any replica.
inline constexpr const char* kHostDevice = "/job:localhost/replica:0/task:0/device:CPU:0";

class Tensor {
 public:
  // An empty float32 tensor of shape (0,).
  Tensor();
  // Zero-filled tensor, on `device` (default: the current device scope: the
  // replica's device inside Strategy::run, else kHostDevice).
  Tensor(DType dtype, Shape shape, std::string_view device = {});

  // A tensor whose bytes are not initialised; for buffers that are written whole.
  static Tensor uninitialized(DType dtype, Shape shape, std::string_view device = {});
  // A tensor viewing `data` (which keeps the storage alive) without copying.
  static Tensor from_shared(std::shared_ptr<std::byte> data, DType dtype, Shape shape, std::string_view device = {});

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  std::int64_t num_elements() const { return shape_.num_elements(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(num_elements()) * size_of(dtype_); }
  // Canonical device name, e.g. "/job:localhost/replica:0/task:0/device:CPU:1".
  const std::string& device() const { return *device_; }

  const void* raw_data() const { return data_.get(); }
  // Writes are seen by every Tensor that shares this storage. On a read-only
  // tensor, throws FailedPreconditionError.
  void* mutable_raw_data() const {
    if (read_only_) throw_read_only();
    return data_.get();
  }
  const std::shared_ptr<std::byte>& storage() const { return data_; }

  // Whether writes through this tensor are refused. all_reduce's and
  // all_gather's results are read-only: in one process the replicas may
  // share one result's storage, where a write by one replica would change
  // (and race with) the others'. So is a Tensor every replica receives whole
  // (a run argument, a merge_fn's result: select_replica).
  // Copies, reshape() and with_device() keep the flag; clone() gives a
  // writable copy. (from_shared(storage(), ...) makes a writable view: the
  // caller then answers for the sharers.)
  bool is_read_only() const { return read_only_; }
  // The same storage, read-only.
  Tensor as_read_only() const&;
  Tensor as_read_only() &&;

  template <class T>
  std::span<const T> flat() const {
    check_dtype(dtype_of<T>());
    return {reinterpret_cast<const T*>(data_.get()), static_cast<std::size_t>(num_elements())};
  }
  template <class T>
  std::span<T> mutable_flat() const {
    check_dtype(dtype_of<T>());
    if (read_only_) throw_read_only();
    return {reinterpret_cast<T*>(data_.get()), static_cast<std::size_t>(num_elements())};
  }
  // The single element of a rank-0 (or one-element) tensor.
  template <class T>
  T scalar() const {
    if (num_elements() != 1) throw_not_scalar();
    return flat<T>()[0];
  }
  // Element at a multi-dimensional index (bounds-checked).
  template <class T>
  T at(std::initializer_list<std::int64_t> index) const {
    return flat<T>()[static_cast<std::size_t>(flat_index(index))];
  }
  // Any element converted to double (bool -> 0/1), for printing and tests.
  double element_as_double(std::int64_t flat_index) const;

  // Same storage, another device name.
  Tensor with_device(std::string_view device) const;
  // Same storage, another shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  // A deep copy.
  Tensor clone() const;

  // TensorFlow's eager repr: <tf.Tensor: shape=(2,), dtype=float32, numpy=array([1., 2.], dtype=float32)>
  std::string repr() const;
  // numpy's repr of the value alone: array([1., 2.], dtype=float32), or 2.0 for a scalar.
  std::string numpy_repr() const;
  // The value as Python's tolist() prints it: [[1, 2], [3, 4]], 2.0, True.
  // Floats show the shortest digits of their own dtype (float32 0.1 is "0.1",
  // where Python, widening to double, would print 0.10000000149011612).
  std::string to_list_string() const;

  // Same dtype, same shape and the same bytes (so NaN == NaN; +0 != -0). Device is ignored.
  friend bool operator==(const Tensor& a, const Tensor& b);

 private:
  // Members as given: the callers have checked them.
  Tensor(DType dtype, Shape&& shape, std::shared_ptr<std::byte>&& data, const std::string* device)
      : dtype_(dtype), shape_(std::move(shape)), data_(std::move(data)), device_(device) {}
  void check_dtype(DType requested) const;
  [[noreturn]] void throw_not_scalar() const;
  [[noreturn]] void throw_read_only() const;
  std::int64_t flat_index(std::initializer_list<std::int64_t> index) const;

  DType dtype_ = DType::kFloat32;
  bool read_only_ = false;
  Shape shape_{0};
  std::shared_ptr<std::byte> data_;
  const std::string* device_;  // interned: copies share it
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::ostream& operator<<(std::ostream& os, const Shape& s);
std::string repr(const Tensor& t);

// ---- Construction, as tf.constant ----------------------------------------
// C++ types map to dtypes as dtype_of<T>(): int -> int32, float -> float32,
// double -> float64, bool -> bool, std::int64_t -> int64.
// A tensor of `shape` holding `values` (row-major); sizes must agree.
template <class T>
Tensor constant(const std::vector<T>& values, Shape shape) {
  if (static_cast<std::int64_t>(values.size()) != shape.num_elements()) {
    throw InvalidArgumentError("constant: " + std::to_string(values.size()) + " values do not fill shape " +
                               shape.to_string());
  }
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<std::uint8_t> bytes(values.begin(), values.end());
    return internal::make_constant(DType::kBool, std::move(shape), bytes.data());
  } else {
    return internal::make_constant(dtype_of<T>(), std::move(shape), values.data());
  }
}

template <class T>
Tensor constant(T value) {
  return constant(std::vector<T>{value}, Shape{});
}

template <class T>
Tensor constant(std::initializer_list<T> values) {
  return constant(std::vector<T>(values), Shape{static_cast<std::int64_t>(values.size())});
}

template <class T>
Tensor constant(std::initializer_list<std::initializer_list<T>> rows) {
  std::vector<T> flat;
  const std::int64_t cols = rows.size() == 0 ? 0 : static_cast<std::int64_t>(rows.begin()->size());
  for (const auto& row : rows) {
    if (static_cast<std::int64_t>(row.size()) != cols) {
      throw InvalidArgumentError("constant: rows have different lengths (" + std::to_string(cols) + " and " +
                                 std::to_string(row.size()) + ")");
    }
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return constant(flat, Shape{static_cast<std::int64_t>(rows.size()), cols});
}

template <class T>
Tensor constant(std::initializer_list<std::initializer_list<std::initializer_list<T>>> blocks) {
  std::vector<T> flat;
  std::vector<std::int64_t> inner;
  for (const auto& block : blocks) {
    Tensor b = constant<T>(block);
    if (!inner.empty() && b.shape().dims() != inner) {
      throw InvalidArgumentError("constant: blocks have different shapes");
    }
    inner = b.shape().dims();
    auto values = b.flat<T>();
    flat.insert(flat.end(), values.begin(), values.end());
  }
  std::vector<std::int64_t> dims{static_cast<std::int64_t>(blocks.size())};
  dims.insert(dims.end(), inner.begin(), inner.end());
  if (inner.empty()) dims.insert(dims.end(), {0, 0});
  return constant(flat, Shape(dims));
}

// A scalar of an explicit dtype, converted from double.
Tensor scalar(DType dtype, double value);
// A tensor of `shape` and `dtype` with every element `value`.
Tensor fill(DType dtype, Shape shape, double value);
// Element i equals i, converted to `dtype` (handy in tests and examples).
Tensor iota(DType dtype, Shape shape, double start = 0, double step = 1);

// Concatenates along `axis` (negative counts from the end). Ranks and dtypes
// must match and every dimension but `axis` must be equal.
Tensor concat(std::span<const Tensor> tensors, int axis);
inline Tensor concat(std::initializer_list<Tensor> tensors, int axis) {
  return concat(std::span<const Tensor>(tensors.begin(), tensors.size()), axis);
}

// Converts element by element (floats to integers truncate toward zero).
Tensor cast(const Tensor& t, DType dtype);

}  // namespace distribute
