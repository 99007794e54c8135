// Tensor in Python: TF's printing, numpy views that stay read-only, the
// buffer protocol, and DLPack both ways without a copy.
#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "distribute/dlpack.h"

namespace distribute::python {

namespace {

std::vector<py::ssize_t> dims_of(const Tensor& t) {
  std::vector<py::ssize_t> dims;
  for (std::int64_t d : t.shape().dims()) dims.push_back(static_cast<py::ssize_t>(d));
  return dims;
}

// A numpy array over the tensor's own memory, read-only: numpy must not change
// a value that other replicas may hold too. It keeps the storage alive.
// bfloat16, which numpy lacks, comes as a float32 copy.
py::array to_numpy(const Tensor& t) {
  if (t.dtype() == DType::kBFloat16) {
    py::array_t<float> out(dims_of(t));
    auto values = t.flat<bfloat16>();
    for (std::size_t i = 0; i < values.size(); ++i) out.mutable_data()[i] = static_cast<float>(values[i]);
    out.attr("flags").attr("writeable") = false;
    return out;
  }
  auto* keep = new Tensor(t);
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  py::array out(numpy_dtype(t.dtype()), dims_of(t), t.raw_data(), owner);
  out.attr("flags").attr("writeable") = false;
  return out;
}

std::string buffer_format(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "?";
    case DType::kInt8: return "b";
    case DType::kUInt8: return "B";
    case DType::kInt16: return "h";
    case DType::kInt32: return "i";
    case DType::kInt64: return "q";
    case DType::kFloat16: return "e";
    case DType::kFloat32: return "f";
    case DType::kFloat64: return "d";
    case DType::kBFloat16: break;  // refused by tensor_getbuffer before this is asked
  }
  return "B";
}

const Tensor& scalar(const Tensor& t, const char* what) {
  if (t.num_elements() != 1) {
    throw py::type_error(std::string(what) + " needs a tensor of one element; this one has shape " +
                         t.shape().to_string());
  }
  return t;
}

// pybind11's buffer callback may not throw (it would end the process), so a
// bfloat16 tensor, which has no buffer format, is refused before it: with a
// BufferError, after which numpy falls back to __array__ (a float32 copy).
getbufferproc pybind11_getbuffer_of_tensor = nullptr;
extern "C" int tensor_getbuffer(PyObject* object, Py_buffer* view, int flags) {
  const auto* t = py::handle(object).cast<const Tensor*>();
  if (t->dtype() == DType::kBFloat16) {
    PyErr_SetString(PyExc_BufferError, "a bfloat16 tensor has no buffer format: use .numpy() (a float32 copy)");
    return -1;
  }
  return pybind11_getbuffer_of_tensor(object, view, flags);
}

constexpr const char* kDLTensor = "dltensor";
constexpr const char* kUsedDLTensor = "used_dltensor";

// DLPack's exchange (the array API's __dlpack__): a capsule named "dltensor";
// the consumer renames it "used_dltensor" and owns the tensor. One never
// consumed is deleted with its capsule.
py::capsule to_dlpack_capsule(const Tensor& t) {
  DLManagedTensor* managed = to_dlpack(t);
  return py::capsule(managed, kDLTensor, [](PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, kDLTensor) == 0) return;  // consumed (renamed)
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kDLTensor));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  });
}

Tensor from_dlpack_object(const py::object& source) {
  py::object capsule = source;
  if (py::hasattr(source, "__dlpack__")) capsule = source.attr("__dlpack__")();
  if (PyCapsule_IsValid(capsule.ptr(), kDLTensor) == 0) {
    throw py::type_error(
        "from_dlpack: expected an object with __dlpack__ or a DLPack capsule named 'dltensor' "
        "(not yet consumed), got " +
        std::string(py::repr(py::type::of(source))));
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kDLTensor));
  Tensor t = from_dlpack(managed);  // throws, leaving the capsule (and its owner) as they were
  PyCapsule_SetName(capsule.ptr(), kUsedDLTensor);
  return t;
}

void bind_dtypes(py::module_& m) {
  py::enum_<DType> dtypes(m, "DType", "A tensor's element type; printed as TF prints it (tf.float32).");
  for (DType d : kAllDTypes) dtypes.value(std::string(to_string(d)).c_str(), d);
  // Set, not def'd: def would add an overload behind enum_'s own.
  dtypes.attr("__repr__") =
      py::cpp_function([](DType d) { return "tf." + std::string(to_string(d)); }, py::is_method(dtypes));
  dtypes.attr("__str__") = py::cpp_function([](DType d) { return std::string(to_string(d)); }, py::is_method(dtypes));
  dtypes.def_property_readonly("name", [](DType d) { return std::string(to_string(d)); })
      .def_property_readonly("size", [](DType d) { return size_of(d); })
      .def_property_readonly("is_floating", [](DType d) { return is_floating(d); })
      .def_property_readonly("is_integer", [](DType d) { return is_integer(d); })
      .def_property_readonly("as_numpy_dtype", [](DType d) { return numpy_dtype(d); });
  for (DType d : kAllDTypes) m.attr(std::string(to_string(d)).c_str()) = d;
}

py::class_<Tensor> bind_tensor_class(py::module_& m) {
  py::class_<Tensor> tensor(m, "Tensor", py::buffer_protocol(),
                            "An immutable n-dimensional array, as TF's eager tensor. Make one with constant().");
  tensor.def_property_readonly("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", &Tensor::device)
      .def_property_readonly("ndim", &Tensor::rank)
      .def("numpy", &to_numpy, "The values as a read-only numpy array over the tensor's memory (no copy).")
      .def(
          "__array__",
          [](const Tensor& t, const py::object& dtype) -> py::object {
            py::array a = to_numpy(t);
            return dtype.is_none() ? py::object(a) : a.attr("astype")(dtype);
          },
          py::arg("dtype") = py::none())
      .def("__repr__", &Tensor::repr)
      .def("__str__",
           [](const Tensor& t) {
             return "tf.Tensor(" + std::string(py::str(to_numpy(t))) + ", shape=" + t.shape().to_string() +
                    ", dtype=" + std::string(to_string(t.dtype())) + ")";
           })
      .def("__len__",
           [](const Tensor& t) {
             if (t.rank() == 0) throw py::type_error("len() of a scalar tensor (shape ())");
             return t.shape()[0];
           })
      .def("__getitem__", [](const Tensor& t, const py::object& key) { return to_tensor(to_numpy(t)[key]); })
      .def("__bool__", [](const Tensor& t) { return to_numpy(scalar(t, "bool()")).attr("item")().cast<bool>(); })
      .def("__int__", [](const Tensor& t) { return py::int_(to_numpy(scalar(t, "int()")).attr("item")()); })
      .def("__float__", [](const Tensor& t) { return py::float_(to_numpy(scalar(t, "float()")).attr("item")()); })
      .def("__index__", [](const Tensor& t) {
        if (!is_integer(t.dtype())) {
          throw py::type_error("only integer tensors can be used as an index, not " +
                               std::string(to_string(t.dtype())));
        }
        return py::int_(to_numpy(scalar(t, "index")).attr("item")());
      });
  // Comparisons are element-wise, as numpy's (and TF's): a scalar compares
  // as a bool, so `if ctx.replica_id_in_sync_group == 0:` works.
  for (const char* op : {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"}) {
    tensor.def(op, [op](const Tensor& t, const py::object& other) { return to_numpy(t).attr(op)(other); });
  }
  tensor.attr("__hash__") = py::none();  // == is element-wise, as numpy's
  return tensor;
}

// The ways other libraries read a tensor without a copy.
void bind_tensor_exchange(py::class_<Tensor>& tensor) {
  tensor
      .def_buffer([](const Tensor& t) {
        std::vector<py::ssize_t> strides(static_cast<std::size_t>(t.rank()));
        py::ssize_t stride = static_cast<py::ssize_t>(size_of(t.dtype()));
        for (int i = t.rank() - 1; i >= 0; --i) {
          strides[static_cast<std::size_t>(i)] = stride;
          stride *= static_cast<py::ssize_t>(t.shape()[i]);
        }
        // The buffer is read-only: the tensor's values are shared, not owned by the reader.
        return py::buffer_info(const_cast<void*>(t.raw_data()), static_cast<py::ssize_t>(size_of(t.dtype())),
                               buffer_format(t.dtype()), t.rank(), dims_of(t), strides, /*readonly=*/true);
      })
      .def(
          "__dlpack__",
          [](const Tensor& t, const py::object& stream) {
            if (!stream.is_none() && !(py::isinstance<py::int_>(stream) && stream.cast<long>() == -1)) {
              throw py::buffer_error("__dlpack__: a CPU tensor takes no stream (got " + std::string(py::repr(stream)) +
                                     ")");
            }
            return to_dlpack_capsule(t);
          },
          py::arg("stream") = py::none(),
          "A DLPack capsule over the tensor's memory (a read-only tensor is exported as a copy: DLPack 0.6 cannot "
          "mark memory read-only).")
      .def("__dlpack_device__", [](const Tensor&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); });
  auto* type = reinterpret_cast<PyTypeObject*>(tensor.ptr());
  pybind11_getbuffer_of_tensor = type->tp_as_buffer->bf_getbuffer;
  type->tp_as_buffer->bf_getbuffer = tensor_getbuffer;
}

}  // namespace

void bind_indexed_slices(py::module_& m) {
  py::class_<IndexedSlices>(m, "IndexedSlices",
                            "Rows of a dense tensor (a sparse gradient): values[i] is row indices[i] of dense_shape.")
      .def(py::init([](const py::object& values, const py::object& indices, const std::vector<std::int64_t>& shape) {
             return IndexedSlices(to_tensor(values), to_tensor(indices), Shape(shape));
           }),
           py::arg("values"), py::arg("indices"), py::arg("dense_shape"))
      .def_property_readonly("values", &IndexedSlices::values)
      .def_property_readonly("indices", &IndexedSlices::indices)
      .def_property_readonly("dense_shape", [](const IndexedSlices& s) { return shape_tuple(s.dense_shape()); })
      .def_property_readonly("dtype", &IndexedSlices::dtype)
      .def("to_dense", &IndexedSlices::to_dense, "The rows summed into a dense tensor (duplicates add up).")
      .def("__repr__", &IndexedSlices::repr);
}

void bind_tensor(py::module_& m) {
  bind_dtypes(m);
  py::class_<Tensor> tensor = bind_tensor_class(m);
  bind_tensor_exchange(tensor);
  bind_indexed_slices(m);

  m.def(
      "constant",
      [](const py::object& value, const py::object& dtype, const py::object& shape) {
        std::optional<DType> d;
        if (!dtype.is_none()) d = dtype_from_python(dtype);
        Tensor t = to_tensor(value, d);
        if (shape.is_none()) return t;
        std::vector<std::int64_t> dims = shape_argument(shape, "constant: shape");
        const Shape target(dims);
        if (t.num_elements() == 1 && target.num_elements() != 1) {
          // tf.constant(0., shape=(2, 3)) fills the shape.
          py::module_ np = py::module_::import("numpy");
          return to_tensor(
              np.attr("full")(py::tuple(py::cast(dims)), to_numpy(t).attr("item")(), numpy_dtype(t.dtype())));
        }
        return t.reshape(target);
      },
      py::arg("value"), py::arg("dtype") = py::none(), py::arg("shape") = py::none(),
      "A tensor from a number, a bool, a (nested) list of them or a numpy array, with tf.constant's dtype rules. "
      "Inside strategy.run it is placed on the replica's device.");
  m.def("from_dlpack", &from_dlpack_object, py::arg("source"),
        "A Tensor over the memory of `source` (an object with __dlpack__, or a DLPack capsule), without a copy.");
}

}  // namespace distribute::python
