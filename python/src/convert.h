// Conversions between Python values and the library's: tensors from numpy
// arrays and Python scalars (tf.constant's dtype rules), nests from lists,
// tuples and dicts, and a Python object the C++ library can carry across
// replica threads.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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

// Arguments as Python gives them, checked: a TypeError (or ValueError for a
// value out of range) names the argument and what it must be, where a bare
// cast would say "Unable to cast Python instance to C++ type".
// An int (or anything with __index__, not a bool or a float) that fits an int.
int int_argument(py::handle value, std::string_view name);
// A sequence of ints (a shape).
std::vector<std::int64_t> shape_argument(py::handle value, std::string_view name);
// A list or tuple of device names (a lone string is refused: ["CPU:0"]).
std::vector<std::string> device_names_argument(py::handle value, std::string_view name);
// A CommunicationOptions, or None for the defaults.
CommunicationOptions options_argument(py::handle value);

// Records that `s` was made in this process: a strategy made before
// os.fork() is refused in the child, whose replica threads it lacks
// (strategy_bindings.cc). made_here(std::make_unique<...>(...)) records and
// passes the strategy on.
void note_made_here(const Strategy& s);
template <class S>
std::unique_ptr<S> made_here(std::unique_ptr<S> s) {
  note_made_here(*s);
  return s;
}

// make() on a thread of its own while Python's main thread waits for it
// with the GIL let go, looking for signals every 20 ms: a KeyboardInterrupt
// (or any exception a signal handler raises) is raised within that, and
// make() is left to finish or block on its own (what it made is then
// destroyed there). For waits nothing can cancel, such as workers meeting
// over MPI. Elsewhere than the main thread, make() runs here without the GIL.
template <class T>
T wait_interruptibly(std::function<T()> make);
bool on_python_main_thread();
bool python_signal_raised();  // PyErr_CheckSignals, with the GIL held

// Devices as the user named them, except that with DISTRIBUTE_GPUS_AS_CPUS=1
// and no GPU visible, "GPU:k" (in any of TF's spellings) becomes "CPU:k".
std::vector<std::string> map_gpu_names(std::vector<std::string> devices);

// make() of a strategy on `devices` (as map_gpu_names left them): where it
// raises InvalidArgumentError for a GPU name and no GPU is visible, the
// message gains how to run GPU names on CPUs (DISTRIBUTE_GPUS_AS_CPUS=1).
bool names_a_gpu_where_none_is(const std::vector<std::string>& devices);
template <class Make>
auto with_gpus_as_cpus_hint(const std::vector<std::string>& devices, Make&& make) -> decltype(make()) {
  try {
    return make();
  } catch (const InvalidArgumentError& e) {
    if (!names_a_gpu_where_none_is(devices)) throw;
    throw InvalidArgumentError(std::string(e.what()) +
                               ". Without a GPU, set DISTRIBUTE_GPUS_AS_CPUS=1 to run GPU:k on CPU:k (as the seed's "
                               "examples need)");
  }
}
py::object from_nest(const Nest<Tensor>& nest);

// The same, with IndexedSlices leaves among the tensors.
bool holds_indexed_slices(py::handle value);
Nest<TensorOrSlices> to_mixed_nest(py::handle value);
py::object from_mixed_nest(const Nest<TensorOrSlices>& nest);

template <class T>
T wait_interruptibly(std::function<T()> make) {
  if (!on_python_main_thread()) {
    py::gil_scoped_release release;
    return make();
  }
  struct State {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::optional<T> result;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  std::thread([state, make = std::move(make)] {
    std::optional<T> result;
    std::exception_ptr error;
    try {
      result.emplace(make());
    } catch (...) {
      error = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(state->mutex);
    state->result = std::move(result);
    state->error = error;
    state->done = true;
    state->done_cv.notify_all();
  }).detach();
  for (;;) {
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state->mutex);
      if (state->done_cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return state->done; })) break;
    }
    if (python_signal_raised()) throw py::error_already_set();  // what it made, later, goes with `state`
  }
  if (state->error) std::rethrow_exception(state->error);
  return std::move(*state->result);
}

}  // namespace distribute::python
