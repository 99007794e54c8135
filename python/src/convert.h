// Conversions between Python values and the library's: tensors from numpy
// arrays and Python scalars (tf.constant's dtype rules), nests from lists,
// tuples and dicts, and a Python object the C++ library can carry across
// replica threads.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distribute/distribute.h"

namespace distribute::python {

namespace py = pybind11;

// A Python object held by C++ code that may copy or drop it on a replica
// thread without the GIL (run's results, merge_call's arguments): copies
// share one reference, and the last one takes the GIL to release it.
class PyHandle {
 public:
  PyHandle() = default;
  explicit PyHandle(py::object object);  // with the GIL held
  const py::object& get() const { return *object_; }

 private:
  std::shared_ptr<py::object> object_;
};

// The DType a Python user names: a DType, its name ('float32'), a numpy dtype
// or a numpy scalar type. Anything else raises TypeError.
DType dtype_from_python(py::handle spec);

// A numpy dtype for `dtype` (bfloat16, which numpy lacks, has none: raises).
py::dtype numpy_dtype(DType dtype);

// A shape as Python gives it: a tuple of ints.
py::tuple shape_tuple(const Shape& shape);

// `value` as a tensor, as tf.constant makes one: a Tensor as it is (cast
// checked against `dtype`); a numpy array or scalar keeps its dtype; Python
// floats become float32, ints int32 (int64 when they do not fit), bools bool.
// The data is copied: later writes to the array do not reach the tensor.
Tensor to_tensor(py::handle value, std::optional<DType> dtype = std::nullopt);

// A nest of tensors from lists, tuples and dicts (string keys) of values
// to_tensor takes; and back, as lists, tuples and dicts of Tensors.
Nest<Tensor> to_nest(py::handle value);

// Devices as the user named them, except that with DISTRIBUTE_GPUS_AS_CPUS=1
// and no GPU visible, "GPU:k" (in any of TF's spellings) becomes "CPU:k".
std::vector<std::string> map_gpu_names(std::vector<std::string> devices);
py::object from_nest(const Nest<Tensor>& nest);

// The same, with IndexedSlices leaves among the tensors.
bool holds_indexed_slices(py::handle value);
Nest<TensorOrSlices> to_mixed_nest(py::handle value);
py::object from_mixed_nest(const Nest<TensorOrSlices>& nest);

}  // namespace distribute::python
