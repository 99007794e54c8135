#include "convert.h"

#include <pybind11/numpy.h>

#include <bit>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace distribute::python {

PyHandle::PyHandle(py::object object)
    : object_(new py::object(std::move(object)), [](py::object* o) {
        // The last copy may go on a replica thread, which holds no GIL. One
        // still held by the library when the interpreter has gone (a static
        // strategy's last merge_call result, at exit) is left alone.
        if (Py_IsInitialized() == 0 || _Py_IsFinalizing() != 0) return;
        py::gil_scoped_acquire gil;
        delete o;
      }) {}

namespace {

std::string type_name(py::handle value) { return py::str(py::type::of(value).attr("__name__")); }

constexpr std::size_t kMaxNestDepth = Nest<Tensor>::kMaxDepth;

[[noreturn]] void throw_too_deep() {
  throw InvalidArgumentError("a nest of lists, tuples and dicts is more than " + std::to_string(kMaxNestDepth) +
                             " levels deep (a list, tuple or dict that contains itself is one)");
}

// The items of a list or tuple, or the (key, item) pairs of a dict, each
// held by a reference of its own: converting a leaf may let go of the GIL
// (a large copy), and another thread may then change the container.
std::vector<py::object> items_of(py::handle container) {
  std::vector<py::object> items;
  if (py::isinstance<py::dict>(container)) {
    const auto pairs = py::reinterpret_steal<py::list>(PyDict_Items(container.ptr()));
    if (!pairs) throw py::error_already_set();
    for (py::handle pair : pairs) items.push_back(py::reinterpret_borrow<py::object>(pair));
    return items;
  }
  const py::tuple snapshot = py::reinterpret_steal<py::tuple>(PySequence_Tuple(container.ptr()));
  if (!snapshot) throw py::error_already_set();
  for (py::handle item : snapshot) items.push_back(py::reinterpret_borrow<py::object>(item));
  return items;
}

std::optional<DType> dtype_named(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (to_string(d) == name) return d;
  }
  return std::nullopt;
}

}  // namespace

DType dtype_from_python(py::handle spec) {
  if (py::isinstance<DType>(spec)) return spec.cast<DType>();
  std::string name;
  if (py::isinstance<py::str>(spec)) {
    name = spec.cast<std::string>();
  } else {
    try {
      name = py::str(py::dtype::from_args(py::reinterpret_borrow<py::object>(spec)).attr("name"));
    } catch (const py::error_already_set&) {
      throw py::type_error("dtype: " + std::string(py::repr(spec)) + " does not name a dtype");
    }
  }
  if (auto d = dtype_named(name)) return *d;
  throw py::type_error("dtype: '" + name +
                       "' is not one of bool, int8, uint8, int16, int32, int64, float16, bfloat16, float32, float64");
}

py::dtype numpy_dtype(DType dtype) {
  if (dtype == DType::kBFloat16) throw py::type_error("numpy has no bfloat16: a bfloat16 tensor has no numpy dtype");
  return py::dtype(std::string(to_string(dtype)));
}

namespace {

// bfloat16 has no numpy dtype: its values go through float32.
Tensor bfloat16_from(const py::array& array) {
  auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(array);
  std::vector<bfloat16> values(static_cast<std::size_t>(f.size()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = bfloat16(f.data()[i]);
  std::vector<std::int64_t> dims(f.shape(), f.shape() + f.ndim());
  return internal::make_constant(DType::kBFloat16, Shape(dims), values.data());
}

// Copies from numpy at least this large release the GIL.
constexpr py::ssize_t kCopyWithoutGilBytes = py::ssize_t{64} * 1024;

// The DType of a numpy array's elements, when the library has one and they
// are in this machine's byte order ('=' native, '|' single bytes, '<' on x86).
std::optional<DType> dtype_of_array(const py::array& array) {
  const py::dtype d = array.dtype();
  const char order = d.byteorder();
  if (order != '=' && order != '|' && order != (std::endian::native == std::endian::little ? '<' : '>'))
    return std::nullopt;
  const auto size = d.itemsize();
  switch (d.kind()) {
    case 'b': return DType::kBool;
    case 'f':
      return size == 2   ? DType::kFloat16
             : size == 4 ? DType::kFloat32
             : size == 8 ? DType::kFloat64
                         : std::optional<DType>();
    case 'u': return size == 1 ? std::optional<DType>(DType::kUInt8) : std::nullopt;
    case 'i':
      switch (size) {
        case 1: return DType::kInt8;
        case 2: return DType::kInt16;
        case 4: return DType::kInt32;
        case 8: return DType::kInt64;
        default: return std::nullopt;
      }
    default: return std::nullopt;
  }
}

}  // namespace

namespace {

// Python ints that int64 cannot hold, in a Python number or in lists and
// tuples of them (numpy turns them into uint64, float64 or objects, and a
// cast would wrap them): the first one, unless a float stands among them
// and no integer dtype was asked (then float is the dtype, as TF's).
void refuse_python_ints_out_of_range(py::handle value, std::optional<DType> dtype) {
  if (dtype && is_floating(*dtype)) return;
  std::optional<py::object> first;
  bool any_float = false;
  std::vector<std::pair<py::object, std::size_t>> pending{{py::reinterpret_borrow<py::object>(value), 1}};
  while (!pending.empty() && !(any_float && !dtype)) {
    auto [v, depth] = std::move(pending.back());
    pending.pop_back();
    if (PyList_Check(v.ptr()) || PyTuple_Check(v.ptr())) {
      if (depth > kMaxNestDepth) throw_too_deep();
      for (py::object& item : items_of(v)) pending.emplace_back(std::move(item), depth + 1);
    } else if (PyFloat_Check(v.ptr())) {
      any_float = true;
    } else if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr()) && !first) {
      int overflow = 0;
      PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
      if (overflow != 0) first = v;
    }
  }
  if (first && !(any_float && !dtype)) {
    const DType target = dtype.value_or(DType::kInt64);
    throw py::value_error("Can't convert Python int " + std::string(py::repr(*first)) + " to a Tensor of dtype " +
                          std::string(to_string(target)) + ": out of range" +
                          (target == DType::kInt64 ? " (int64 holds -2**63 to 2**63 - 1)" : ""));
  }
}

}  // namespace

py::tuple shape_tuple(const Shape& shape) {
  py::tuple out(shape.rank());
  for (int i = 0; i < shape.rank(); ++i) out[i] = shape[i];
  return out;
}

// NOLINTNEXTLINE(readability-function-size): tf.constant's dtype rules, one case after another
Tensor to_tensor(py::handle value, std::optional<DType> dtype) {
  if (py::isinstance<Tensor>(value)) {
    Tensor t = value.cast<Tensor>();
    if (dtype && *dtype != t.dtype()) {
      throw InvalidArgumentError("Tensor conversion requested dtype " + std::string(to_string(*dtype)) +
                                 " for a Tensor with dtype " + std::string(to_string(t.dtype())));
    }
    return t;
  }
  if (py::isinstance<py::array>(value)) {
    // The common case, without a Python call: a row-major array of a dtype
    // the library has, converted to nothing else; one copy.
    const auto array = py::reinterpret_borrow<py::array>(value);
    const std::optional<DType> own = dtype_of_array(array);
    if (own && (!dtype || *dtype == *own) && (array.flags() & py::array::c_style) != 0) {
      const Shape shape(std::vector<std::int64_t>(array.shape(), array.shape() + array.ndim()));
      if (array.nbytes() < kCopyWithoutGilBytes) return internal::make_constant(*own, shape, array.data());
      // A large copy lets the other replicas run Python meanwhile; `array`
      // holds the memory it reads.
      py::gil_scoped_release release;
      return internal::make_constant(*own, shape, array.data());
    }
  }
  if (py::isinstance<Variable>(value)) return to_tensor(py::cast(value.cast<const Variable&>().read_value()), dtype);
  if (py::isinstance<IndexedSlices>(value)) {
    throw py::type_error(
        "an IndexedSlices is not a Tensor: all_reduce (alone or in a nest), all_gather (alone) and "
        "strategy.reduce take it; call .to_dense() for a tensor");
  }
  if (value.is_none() || py::isinstance<py::str>(value) || py::isinstance<py::bytes>(value)) {
    throw py::type_error("Can't convert " + type_name(value) + " " + std::string(py::repr(value)) +
                         " to a Tensor: only numbers, bools and numpy arrays (and lists of them) are tensors here");
  }
  py::module_ np = py::module_::import("numpy");
  const bool from_numpy = py::isinstance(value, np.attr("ndarray")) || py::isinstance(value, np.attr("generic"));
  if (!from_numpy) refuse_python_ints_out_of_range(value, dtype);
  py::array array;
  try {
    array = np.attr("asarray")(value);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_RecursionError)) throw;
    throw py::value_error("Can't convert " + type_name(value) + " to a Tensor: " + std::string(py::str(e.value())));
  }
  const char kind = py::str(array.dtype().attr("kind")).cast<std::string>()[0];
  if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f') {
    throw py::type_error("Can't convert " + type_name(value) + " of numpy dtype " +
                         std::string(py::str(array.dtype())) + " to a Tensor");
  }
  DType target;
  if (dtype) {
    target = *dtype;
  } else if (from_numpy) {
    target = dtype_from_python(array.dtype());
  } else if (kind == 'f') {
    target = DType::kFloat32;  // tf.constant(1.5) is float32
  } else if (kind == 'b') {
    target = DType::kBool;
  } else {
    // Python ints: int32, or int64 when a value needs it (as tf.constant).
    const auto lo = np.attr("min")(array).cast<long double>();
    const auto hi = np.attr("max")(array).cast<long double>();
    const bool fits = array.size() == 0 || (lo >= std::numeric_limits<std::int32_t>::min() &&
                                            hi <= std::numeric_limits<std::int32_t>::max());
    target = fits ? DType::kInt32 : DType::kInt64;
  }
  if (target == DType::kBFloat16) return bfloat16_from(array);
  const py::dtype want = numpy_dtype(target);
  // One copy only (make_constant's): an array already of the dtype and
  // row-major goes as it is; astype(order="C") keeps a 0-d array 0-d.
  const bool as_is = array.dtype().equal(want) && (array.flags() & py::array::c_style) != 0;
  py::array converted = as_is ? array : py::array(array.attr("astype")(want, py::arg("order") = "C"));
  if (!is_floating(target)) {
    // Integers and bools hold only what they can: 1.5 or 300 as int8 is refused.
    const bool exact = np.attr("array_equal")(converted.attr("astype")(array.dtype()), array).cast<bool>();
    if (!exact) {
      throw py::type_error("Can't convert " + std::string(py::repr(value)) + " to a Tensor of dtype " +
                           std::string(to_string(target)) + ": the values do not fit");
    }
  }
  std::vector<std::int64_t> dims(converted.shape(), converted.shape() + converted.ndim());
  return internal::make_constant(target, Shape(dims), converted.data());
}

namespace {

// A nest of lists, tuples and dicts (string keys) with leaves from `leaf`;
// at most kMaxNestDepth levels of recursion, whatever the input.
template <class T, class Leaf>
Nest<T> nest_of(py::handle value, const Leaf& leaf, std::size_t depth = 1) {
  const bool sequence = py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value);
  if (!sequence && !py::isinstance<py::dict>(value)) return Nest<T>(leaf(value));
  if (depth > kMaxNestDepth) throw_too_deep();
  const std::vector<py::object> items = items_of(value);
  if (sequence) {
    std::vector<Nest<T>> children;
    children.reserve(items.size());
    for (const py::object& item : items) children.push_back(nest_of<T>(item, leaf, depth + 1));
    return py::isinstance<py::list>(value) ? Nest<T>::list(std::move(children)) : Nest<T>::tuple(std::move(children));
  }
  typename Nest<T>::Items children;
  for (const py::object& pair : items) {
    const py::object key = pair[py::int_(0)];
    if (!py::isinstance<py::str>(key)) {
      throw py::type_error("a dict in a nest must have string keys, not " + type_name(key) + " " +
                           std::string(py::repr(key)));
    }
    children.emplace_back(py::str(key).cast<std::string>(), nest_of<T>(pair[py::int_(1)], leaf, depth + 1));
  }
  return Nest<T>::dict(std::move(children));
}

// The Python lists, tuples and dicts of a nest, with leaves from `leaf`.
template <class T, class Leaf>
py::object python_of(const Nest<T>& nest, const Leaf& leaf) {
  switch (nest.kind()) {
    case NestKind::kLeaf: return leaf(nest.leaf());
    case NestKind::kDict: {
      py::dict out;
      for (const auto& [key, child] : nest.dict_items()) out[py::str(key)] = python_of(child, leaf);
      return out;
    }
    case NestKind::kList: {
      py::list out;
      for (const auto& child : nest.items()) out.append(python_of(child, leaf));
      return out;
    }
    case NestKind::kTuple: {
      py::tuple out(nest.items().size());
      for (std::size_t i = 0; i < nest.items().size(); ++i) out[i] = python_of(nest.items()[i], leaf);
      return out;
    }
  }
  throw InternalError("python_of: unknown nest kind");
}

}  // namespace

bool holds_indexed_slices(py::handle value) {
  // A lone value (a collective's common case) costs no walk.
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value) && !py::isinstance<py::dict>(value)) {
    return py::isinstance<IndexedSlices>(value);
  }
  // Without recursion: a self-containing list must not exhaust the stack
  // before nest_of's depth check refuses it.
  std::vector<std::pair<py::object, std::size_t>> pending{{py::reinterpret_borrow<py::object>(value), 1}};
  while (!pending.empty()) {
    auto [v, depth] = std::move(pending.back());
    pending.pop_back();
    if (py::isinstance<IndexedSlices>(v)) return true;
    const bool container = py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v) || py::isinstance<py::dict>(v);
    if (!container) continue;
    if (depth > kMaxNestDepth) throw_too_deep();
    for (py::object& item : items_of(v)) {
      pending.emplace_back(py::isinstance<py::dict>(v) ? py::object(item[py::int_(1)]) : std::move(item), depth + 1);
    }
  }
  return false;
}

Nest<TensorOrSlices> to_mixed_nest(py::handle value) {
  return nest_of<TensorOrSlices>(value, [](py::handle v) -> TensorOrSlices {
    if (py::isinstance<IndexedSlices>(v)) return v.cast<IndexedSlices>();
    return to_tensor(v);
  });
}

py::object from_mixed_nest(const Nest<TensorOrSlices>& nest) {
  return python_of(nest,
                   [](const TensorOrSlices& v) { return std::visit([](const auto& x) { return py::cast(x); }, v); });
}

Nest<Tensor> to_nest(py::handle value) {
  return nest_of<Tensor>(value, [](py::handle v) { return to_tensor(v); });
}

py::object from_nest(const Nest<Tensor>& nest) {
  return python_of(nest, [](const Tensor& t) { return py::cast(t); });
}

int int_argument(py::handle value, std::string_view name) {
  if (PyBool_Check(value.ptr()) || PyIndex_Check(value.ptr()) == 0) {
    throw py::type_error(std::string(name) + " must be an int, got " + type_name(value) + " " +
                         std::string(py::repr(value)));
  }
  const py::int_ index = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0 || v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    throw py::value_error(std::string(name) + " " + std::string(py::repr(value)) + " is out of range");
  }
  return static_cast<int>(v);
}

std::vector<std::int64_t> shape_argument(py::handle value, std::string_view name) {
  if (!py::isinstance<py::sequence>(value) || py::isinstance<py::str>(value) || py::isinstance<py::bytes>(value)) {
    throw py::type_error(std::string(name) + " must be a sequence of ints (a tuple or a list), got " +
                         type_name(value) + " " + std::string(py::repr(value)));
  }
  std::vector<std::int64_t> dims;
  for (const py::object& d : items_of(value)) {
    if (PyBool_Check(d.ptr()) || PyIndex_Check(d.ptr()) == 0) {
      throw py::type_error(std::string(name) + " must be a sequence of ints, but " + std::string(py::repr(value)) +
                           " holds " + type_name(d) + " " + std::string(py::repr(d)));
    }
    int overflow = 0;
    const py::int_ index = py::reinterpret_steal<py::int_>(PyNumber_Index(d.ptr()));
    if (!index) throw py::error_already_set();
    dims.push_back(PyLong_AsLongLongAndOverflow(index.ptr(), &overflow));
    if (overflow != 0)
      throw py::value_error(std::string(name) + ": dimension " + std::string(py::repr(d)) + " is out of range");
  }
  return dims;
}

std::vector<std::string> device_names_argument(py::handle value, std::string_view name) {
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) {
    throw py::type_error(std::string(name) + " must be a list of device names (['CPU:0', 'CPU:1']), got " +
                         type_name(value) + " " + std::string(py::repr(value)));
  }
  std::vector<std::string> names;
  for (const py::object& d : items_of(value)) {
    if (!py::isinstance<py::str>(d)) {
      throw py::type_error(std::string(name) + " must hold device names (strings), not " + type_name(d) + " " +
                           std::string(py::repr(d)));
    }
    names.push_back(d.cast<std::string>());
  }
  return names;
}

CommunicationOptions options_argument(py::handle value) {
  if (value.is_none()) return {};
  if (!py::isinstance<CommunicationOptions>(value)) {
    throw py::type_error("options must be a CommunicationOptions or None, got " + type_name(value) + " " +
                         std::string(py::repr(value)));
  }
  return value.cast<CommunicationOptions>();
}

// DISTRIBUTE_GPUS_AS_CPUS=1, where no GPU is visible, runs "GPU:k" (in any
// of TF's spellings) on "CPU:k", so that the seed's examples run anywhere.
// With GPUs, or without the variable, GPU names go to the library as written.
namespace {
// Where "GPU:" stands in a device name, in any case; npos if nowhere.
std::size_t gpu_position(const std::string& d, std::size_t from = 0) {
  for (std::size_t i = from; i + 4 <= d.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(d[i])) == 'G' &&
        std::toupper(static_cast<unsigned char>(d[i + 1])) == 'P' &&
        std::toupper(static_cast<unsigned char>(d[i + 2])) == 'U' && d[i + 3] == ':') {
      return i;
    }
  }
  return std::string::npos;
}
}  // namespace

std::vector<std::string> map_gpu_names(std::vector<std::string> devices) {
  const char* flag = std::getenv("DISTRIBUTE_GPUS_AS_CPUS");
  if (flag == nullptr || std::string(flag) != "1" || !list_physical_devices("GPU").empty()) return devices;
  for (std::string& d : devices) {
    for (std::size_t i = gpu_position(d); i != std::string::npos; i = gpu_position(d, i + 4)) d.replace(i, 3, "CPU");
  }
  return devices;
}

bool names_a_gpu_where_none_is(const std::vector<std::string>& devices) {
  bool named = false;
  for (const std::string& d : devices) named = named || gpu_position(d) != std::string::npos;
  return named && list_physical_devices("GPU").empty();
}

}  // namespace distribute::python
