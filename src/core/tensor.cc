#include "distribute/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <ostream>
#include <unordered_set>

#include "core/recent_answers.h"
#include "core/storage.h"
#include "core/tensor_internal.h"

namespace distribute {

// ---- Shape -------------------------------------------------------------------

Shape::Shape(std::initializer_list<std::int64_t> dims)
    : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(const std::vector<std::int64_t>& dims) : Shape(std::span<const std::int64_t>(dims)) {}

Shape::Shape(std::span<const std::int64_t> dims) : rank_(static_cast<int>(dims.size())) {
  if (rank_ <= kInlineRank) {
    std::copy(dims.begin(), dims.end(), inline_.begin());
  } else {
    heap_.assign(dims.begin(), dims.end());
  }
  for (std::int64_t d : dims) {
    if (d < 0) throw InvalidArgumentError("Shape: negative dimension in " + to_string());
  }
  // The product of the non-zero dimensions must fit in int64: then
  // num_elements() and every product of some of the dimensions (rows, strides)
  // do, even for an empty shape such as (2^62, 4, 0).
  std::int64_t n = 1;
  for (std::int64_t d : dims) {
    if (d != 0 && __builtin_mul_overflow(n, d, &n)) {
      throw InvalidArgumentError("Shape: " + to_string() + " has more than 2^63 - 1 elements");
    }
  }
}

std::int64_t Shape::num_elements() const {
  // Cannot overflow: every prefix product is at most the product of the
  // non-zero dimensions, which the constructor checked, or 0 after a 0.
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= data()[i];
  return n;
}

std::int64_t Shape::dim(int i) const {
  if (i < 0 || i >= rank()) {
    throw OutOfRangeError("Shape::dim: index " + std::to_string(i) + " out of range for shape " + to_string());
  }
  return data()[i];
}

std::string Shape::to_string() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(data()[i]);
  if (rank_ == 1) s += ",";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

// ---- Device scope -------------------------------------------------------------

namespace internal {
namespace {
thread_local const std::string* current_device = nullptr;
}  // namespace

const std::string* intern_device(std::string_view device) {
  // The last names this thread interned are checked first, without the lock.
  thread_local RecentAnswers<const std::string*> recent;
  return recent.get(device, [](std::string_view name) {
    static std::mutex* mu = new std::mutex();
    static auto* names = new std::unordered_set<std::string>();  // never destroyed: tensors outlive statics
    std::lock_guard<std::mutex> lock(*mu);
    return &*names->emplace(name).first;
  });
}

const std::string& default_device() {
  static const std::string* host = intern_device(kHostDevice);
  return current_device ? *current_device : *host;
}

DeviceScope::DeviceScope(const std::string& device) : previous_(current_device) {
  current_device = intern_device(device);
}
DeviceScope::~DeviceScope() { current_device = previous_; }
}  // namespace internal

// ---- Tensor ------------------------------------------------------------------

Tensor::Tensor() : device_(&internal::default_device()) {}

Tensor::Tensor(DType dtype, Shape shape, std::string_view device)
    : Tensor(uninitialized(dtype, std::move(shape), device)) {
  if (nbytes() > 0) std::memset(data_.get(), 0, nbytes());
}

std::size_t internal::checked_nbytes(DType dtype, const Shape& shape) {
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(shape.num_elements(), static_cast<std::int64_t>(size_of(dtype)), &bytes)) {
    throw InvalidArgumentError("Tensor: " + std::string(to_string(dtype)) + " of shape " + shape.to_string() +
                               " would hold more than 2^63 - 1 bytes");
  }
  return static_cast<std::size_t>(bytes);
}

namespace {
const std::string* device_or_default(std::string_view device) {
  return device.empty() ? &internal::default_device() : internal::intern_device(device);
}
}  // namespace

Tensor Tensor::uninitialized(DType dtype, Shape shape, std::string_view device) {
  const std::size_t bytes = internal::checked_nbytes(dtype, shape);
  std::shared_ptr<std::byte> storage;
  try {
    storage = internal::allocate_storage(bytes);
  } catch (const std::bad_alloc&) {
    throw ResourceExhaustedError("Tensor: out of memory allocating " + internal::bytes_text(bytes) + " for " +
                                 std::string(to_string(dtype)) + " of shape " + shape.to_string() + " on " +
                                 std::string(device.empty() ? internal::default_device() : device));
  }
  return Tensor(dtype, std::move(shape), std::move(storage), device_or_default(device));
}

Tensor Tensor::from_shared(std::shared_ptr<std::byte> data, DType dtype, Shape shape, std::string_view device) {
  const std::size_t bytes = internal::checked_nbytes(dtype, shape);
  if (!data && bytes > 0) throw InvalidArgumentError("Tensor::from_shared: null storage for " + shape.to_string());
  return Tensor(dtype, std::move(shape), std::move(data), device_or_default(device));
}

void Tensor::check_dtype(DType requested) const {
  if (requested != dtype_) {
    throw InvalidArgumentError("Tensor has dtype " + std::string(to_string(dtype_)) + ", not " +
                               std::string(to_string(requested)));
  }
}

void Tensor::throw_not_scalar() const {
  throw InvalidArgumentError("Tensor::scalar: tensor of shape " + shape_.to_string() + " has " +
                             std::to_string(num_elements()) + " elements, not 1");
}

void Tensor::throw_read_only() const {
  throw FailedPreconditionError(
      "Tensor " + std::string(to_string(dtype_)) + " " + shape_.to_string() + " on " + *device_ +
      " is read-only (its storage is shared with values that must not change, such as the other "
      "replicas' all_reduce and all_gather results): clone() it to write");
}

Tensor Tensor::as_read_only() const& { return Tensor(*this).as_read_only(); }

Tensor Tensor::as_read_only() && {
  read_only_ = true;
  return std::move(*this);
}

std::int64_t Tensor::flat_index(std::initializer_list<std::int64_t> index) const {
  if (static_cast<int>(index.size()) != rank()) {
    throw InvalidArgumentError("Tensor::at: index of rank " + std::to_string(index.size()) + " for shape " +
                               shape_.to_string());
  }
  std::int64_t flat = 0;
  int axis = 0;
  for (std::int64_t i : index) {
    if (i < 0 || i >= shape_[axis]) {
      throw OutOfRangeError("Tensor::at: index " + std::to_string(i) + " out of range for dimension " +
                            std::to_string(axis) + " of shape " + shape_.to_string());
    }
    flat = flat * shape_[axis] + i;
    ++axis;
  }
  return flat;
}

double Tensor::element_as_double(std::int64_t i) const {
  if (i < 0 || i >= num_elements()) {
    throw OutOfRangeError("Tensor: element " + std::to_string(i) + " out of range for shape " + shape_.to_string());
  }
  return visit_dtype(dtype_, [&](auto tag) -> double {
    using T = decltype(tag);
    const T* p = reinterpret_cast<const T*>(data_.get()) + i;
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
      return static_cast<double>(static_cast<float>(*p));
    } else {
      return static_cast<double>(*p);
    }
  });
}

Tensor Tensor::with_device(std::string_view device) const {
  Tensor t = *this;
  t.device_ = device_or_default(device);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape.num_elements() != num_elements()) {
    throw InvalidArgumentError("Tensor::reshape: cannot reshape " + shape_.to_string() + " (" +
                               std::to_string(num_elements()) + " elements) to " + shape.to_string());
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = uninitialized(dtype_, shape_, *device_);
  if (nbytes() > 0) std::memcpy(t.data_.get(), data_.get(), nbytes());
  return t;
}

bool operator==(const Tensor& a, const Tensor& b) {
  if (a.dtype_ != b.dtype_ || a.shape_ != b.shape_) return false;
  return a.nbytes() == 0 || a.data_ == b.data_ || std::memcmp(a.data_.get(), b.data_.get(), a.nbytes()) == 0;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.repr(); }
std::string repr(const Tensor& t) { return t.repr(); }

// ---- Construction -------------------------------------------------------------

namespace internal {
Tensor make_constant(DType dtype, Shape shape, const void* data) {
  Tensor t = Tensor::uninitialized(dtype, std::move(shape));
  if (t.nbytes() > 0) std::memcpy(t.mutable_raw_data(), data, t.nbytes());
  return t;
}
}  // namespace internal

namespace {
template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (std::is_integral_v<T>) {
    // Truncate toward zero, then wrap into T (never undefined behaviour): NaN
    // gives 0 and values beyond int64 saturate first.
    if (std::isnan(v)) return T(0);
    if (v >= 9.2233720368547758e18) return static_cast<T>(std::numeric_limits<std::int64_t>::max());
    if (v <= -9.2233720368547758e18) return static_cast<T>(std::numeric_limits<std::int64_t>::min());
    return static_cast<T>(static_cast<std::int64_t>(v));
  } else {
    return static_cast<T>(v);
  }
}
}  // namespace

Tensor fill(DType dtype, Shape shape, double value) { return iota(dtype, std::move(shape), value, 0); }

Tensor scalar(DType dtype, double value) { return fill(dtype, Shape{}, value); }

Tensor iota(DType dtype, Shape shape, double start, double step) {
  Tensor t = Tensor::uninitialized(dtype, std::move(shape));
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(t.mutable_raw_data());
    for (std::int64_t i = 0; i < t.num_elements(); ++i) p[i] = from_double<T>(start + step * static_cast<double>(i));
  });
  return t;
}

Tensor cast(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t.clone();
  Tensor out = Tensor::uninitialized(dtype, t.shape(), t.device());
  visit_dtype(dtype, [&](auto out_tag) {
    using O = decltype(out_tag);
    O* dst = reinterpret_cast<O*>(out.mutable_raw_data());
    visit_dtype(t.dtype(), [&](auto in_tag) {
      using I = decltype(in_tag);
      const I* src = reinterpret_cast<const I*>(t.raw_data());
      for (std::int64_t i = 0; i < t.num_elements(); ++i) {
        if constexpr (std::is_integral_v<I> && std::is_integral_v<O> && !std::is_same_v<O, bool>) {
          dst[i] = static_cast<O>(src[i]);  // integer to integer: exact, wrapping (never through double)
        } else if constexpr (std::is_same_v<I, float16> || std::is_same_v<I, bfloat16>) {
          dst[i] = from_double<O>(static_cast<double>(static_cast<float>(src[i])));
        } else {
          dst[i] = from_double<O>(static_cast<double>(src[i]));
        }
      }
    });
  });
  return out;
}

Tensor concat(std::span<const Tensor> tensors, int axis) {
  if (tensors.empty()) throw InvalidArgumentError("concat: no tensors given");
  const Tensor& first = tensors[0];
  const int rank = first.rank();
  if (rank == 0) throw InvalidArgumentError("concat: cannot concatenate scalars (rank 0)");
  if (axis < -rank || axis >= rank) {
    throw InvalidArgumentError("concat: axis " + std::to_string(axis) + " out of range for rank " +
                               std::to_string(rank));
  }
  if (axis < 0) axis += rank;
  std::vector<std::int64_t> dims = first.shape().dims();
  dims[static_cast<std::size_t>(axis)] = 0;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    if (t.dtype() != first.dtype()) {
      throw InvalidArgumentError("concat: tensor " + std::to_string(k) + " has dtype " +
                                 std::string(to_string(t.dtype())) + ", tensor 0 has " +
                                 std::string(to_string(first.dtype())));
    }
    if (t.rank() != rank) {
      throw InvalidArgumentError("concat: Ranks of all input tensors should match: tensor " + std::to_string(k) +
                                 " has shape " + t.shape().to_string() + ", tensor 0 has " + first.shape().to_string());
    }
    for (int d = 0; d < rank; ++d) {
      if (d != axis && t.shape()[d] != first.shape()[d]) {
        throw InvalidArgumentError("concat: Dimension " + std::to_string(d) +
                                   " in both shapes must be equal: tensor 0 has shape " + first.shape().to_string() +
                                   ", tensor " + std::to_string(k) + " has " + t.shape().to_string());
      }
    }
    if (__builtin_add_overflow(dims[static_cast<std::size_t>(axis)], t.shape()[axis],
                               &dims[static_cast<std::size_t>(axis)])) {
      throw InvalidArgumentError("concat: the sizes along axis " + std::to_string(axis) +
                                 " add up to more than 2^63 - 1");
    }
  }
  Tensor out = Tensor::uninitialized(first.dtype(), Shape(dims), first.device());
  std::int64_t outer = 1;
  for (int d = 0; d < axis; ++d) outer *= dims[static_cast<std::size_t>(d)];
  std::int64_t inner = 1;
  for (int d = axis + 1; d < rank; ++d) inner *= dims[static_cast<std::size_t>(d)];
  const std::size_t esz = size_of(first.dtype());
  auto* dst = static_cast<std::byte*>(out.mutable_raw_data());
  if (out.num_elements() == 0) return out;  // any number of empty rows, as (2^62, 0), without walking them
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const Tensor& t : tensors) {
      const std::size_t block = static_cast<std::size_t>(t.shape()[axis] * inner) * esz;
      if (block == 0) continue;
      std::memcpy(dst, static_cast<const std::byte*>(t.raw_data()) + static_cast<std::size_t>(o) * block, block);
      dst += block;
    }
  }
  return out;
}

}  // namespace distribute
