// The extension module `distribute._distribute`. The package's Python files
// (python/distribute/) build the user's API on it: what needs Python's own
// structures (regrouping per-replica results, select_replica) is written
// there; tensors, collectives, checks and errors stay in C++.
#include <pybind11/pybind11.h>

#include <exception>
#include <optional>
#include <string>

#include "bindings.h"
#include "distribute/errors.h"
#include "distribute/internal/exception_text.h"

namespace distribute::python {

namespace py = pybind11;

// A Python exception carried through C++ (pybind11::error_already_set), as
// other replicas and workers quote it: "KeyError: 'missing'", without the
// wrapper's type and the traceback that run raises with the original.
std::optional<std::string> describe_python_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const py::error_already_set& error) {
    std::string text = error.what();
    const std::size_t traceback = text.find("\n\nAt:");
    if (traceback != std::string::npos) text.resize(traceback);
    return text;
  } catch (...) {
    return std::nullopt;
  }
}

void bind_errors(py::module_& m) {
  internal::set_exception_describer(&describe_python_exception);
  // distribute.errors (errors.py) holds the classes, named as TensorFlow's:
  // InvalidArgumentError, ... all subclasses of OpError. Looked up when an
  // error is raised, so the module imports in either order.
  // pybind11 takes a translator of exactly this type: the pointer by value.
  py::register_exception_translator([](std::exception_ptr p) {  // NOLINT(performance-unnecessary-value-param)
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object errors = py::module_::import("distribute.errors");
      py::object cls = errors.attr(std::string(to_string(e.code())).c_str());
      py::object instance = cls(py::str(e.what()));
      PyErr_SetObject(cls.ptr(), instance.ptr());
    }
  });
  m.def("_error_code_names", [] {
    py::list names;
    for (int c = 0; c <= static_cast<int>(ErrorCode::kDataLoss); ++c) {
      names.append(std::string(to_string(static_cast<ErrorCode>(c))));
    }
    return names;
  });
}

}  // namespace distribute::python

PYBIND11_MODULE(_distribute, m) {
  m.doc() = "distribute's C++ engine; use the `distribute` package, which builds on it.";
  distribute::python::bind_errors(m);
  distribute::python::bind_tensor(m);
  distribute::python::bind_strategy(m);
  distribute::python::bind_training(m);
  distribute::python::bind_checkpoints(m);
#ifdef DIST_PYTHON_HAVE_MPI
  distribute::python::bind_multi_worker(m);
#endif
}
