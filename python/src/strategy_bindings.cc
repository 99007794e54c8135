// Strategies, replica contexts and their collectives in Python. Replica
// functions written in Python run on the strategy's replica threads: each
// takes the GIL to run Python and every collective, wait and C++ computation
// gives it back, so replicas whose work is numpy or BLAS run side by side.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"

namespace distribute::python {

namespace {

ReduceOp reduce_op_of(const py::handle& op) {
  if (py::isinstance<ReduceOp>(op)) return op.cast<ReduceOp>();
  if (py::isinstance<py::str>(op)) return reduce_op_from_string(op.cast<std::string>());  // "sum", "MEAN", ...
  throw py::type_error("reduce_op must be a ReduceOp or its name, not " + std::string(py::repr(op)));
}

CommunicationOptions options_of(const py::handle& options) {
  if (options.is_none()) return {};
  return options.cast<CommunicationOptions>();
}

std::optional<int> axis_of(const py::handle& axis) {
  if (axis.is_none()) return std::nullopt;
  return axis.cast<int>();
}

bool is_structure(const py::handle& value) {
  return py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value) || py::isinstance<py::dict>(value);
}

// `with strategy.scope():` as a Python context manager.
struct ScopeGuard {
  Strategy* strategy;
  py::object owner;  // the Python strategy: alive while the scope is
  std::optional<StrategyScope> scope;
};

// A C++ object owned elsewhere (a replica context, the default strategy) as
// a Python object that keeps `owner` alive while it is referenced.
template <class T>
py::object borrowed(T* object, const py::object& owner) {
  return py::cast(object, py::return_value_policy::reference_internal, owner);
}

py::object python_strategy(Strategy& s) { return py::cast(&s, py::return_value_policy::reference); }

unsigned long main_thread_ident() {   // NOLINT(google-runtime-int): Python's type
  static const unsigned long ident =  // NOLINT(google-runtime-int)
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();  // NOLINT
  return ident;
}

// A replica's thread (the strategy's pool, the main thread's runner) keeps its
// Python thread state from one run to the next instead of making one each
// time it takes the GIL. It is the interpreter's to free when the thread has
// ended (one per thread, a few hundred bytes).
void keep_thread_state(py::gil_scoped_acquire& gil) {
  thread_local bool kept = false;
  if (!kept) {
    gil.inc_ref();
    kept = true;
  }
}

// The thread that runs a run for Python's main thread (see interruptible):
// one, kept for the process, so that a run does not pay for a new thread.
class MainThreadRunner {
 public:
  static MainThreadRunner& get() {
    static auto* runner = new MainThreadRunner;  // never destroyed: its thread may outlive static destructors
    return *runner;
  }
  // Starts job() on the runner thread; wait_for() tells when it has returned.
  void start(std::function<void()> job) {
    const std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    done_ = false;
    cv_.notify_all();
  }
  bool wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }

 private:
  MainThreadRunner() {
    std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      for (;;) {
        cv_.wait(lock, [&] { return job_ != nullptr; });
        std::function<void()> job = std::move(job_);
        job_ = nullptr;
        lock.unlock();
        job();  // catches everything itself
        lock.lock();
        done_ = true;
        cv_.notify_all();
      }
    }).detach();
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true;
};

// Runs `run` (a Strategy::run) so that Ctrl-C stops it. Python handles a
// signal only on its main thread, between bytecodes; so there the run goes to
// the runner thread, and this one waits with the GIL released, looking for
// signals every 20 ms. A KeyboardInterrupt (or any exception a handler
// raises) cancels the run (Strategy::cancel_run: replicas waiting in a
// collective get CancelledError at once, the others at their next one) and
// is raised when the run has ended. Anywhere else (a replica's thread, a
// merge_fn) the run happens here, as it would in C++.
template <class Run>
auto interruptible(Strategy& s, const Run& run) -> decltype(run()) {
  using Result = decltype(run());
  if (PyThread_get_thread_ident() != main_thread_ident()) {
    py::gil_scoped_release release;
    return run();
  }
  Strategy* const entered = get_cross_replica_context();  // a `with scope():` goes along
  std::optional<Result> result;
  std::exception_ptr error;
  MainThreadRunner& runner = MainThreadRunner::get();
  runner.start([&] {
    try {
      std::optional<StrategyScope> scope;
      if (entered != nullptr) scope.emplace(entered->scope());
      result.emplace(run());
    } catch (...) {
      error = std::current_exception();
    }
  });
  bool interrupted = false;
  for (;;) {
    {
      py::gil_scoped_release release;
      if (runner.wait_for(std::chrono::milliseconds(20))) break;
    }
    if (!interrupted && PyErr_CheckSignals() != 0) {
      interrupted = true;  // the exception stays set on this thread until raised below
      s.cancel_run("the Python main thread was interrupted (KeyboardInterrupt)");
    }
  }
  if (interrupted) throw py::error_already_set();
  if (error) std::rethrow_exception(error);
  return std::move(*result);
}

// work() without the GIL; its result as a Python object.
template <class Work>
py::object without_gil_to_python(const Work& work) {
  std::optional<decltype(work())> out;
  {
    py::gil_scoped_release release;
    out.emplace(work());
  }
  return py::cast(std::move(*out));
}

// Converts `value` (a tensor, or a nest of lists, tuples and dicts of them),
// runs `collective` on it without the GIL, and converts the result back.
template <class Collective>
py::object collective_on(const py::object& value, const Collective& collective) {
  if (is_structure(value)) {
    const Nest<Tensor> in = to_nest(value);
    Nest<Tensor> out;
    {
      py::gil_scoped_release release;
      out = collective(in);
    }
    return from_nest(out);
  }
  const Tensor in = to_tensor(value);
  Tensor out;
  {
    py::gil_scoped_release release;
    out = collective(in);
  }
  return py::cast(out);
}

void bind_options(py::module_& m) {
  py::enum_<ReduceOp> reduce_ops(m, "ReduceOp", "How values are combined across replicas (TF has SUM and MEAN).");
  reduce_ops.value("SUM", ReduceOp::kSum)
      .value("MEAN", ReduceOp::kMean)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax)
      .value("PRODUCT", ReduceOp::kProduct);
  reduce_ops.attr("__repr__") =
      py::cpp_function([](ReduceOp op) { return "ReduceOp." + std::string(to_string(op)); }, py::is_method(reduce_ops));
  reduce_ops.def_static("from_string", [](const std::string& s) { return reduce_op_from_string(s); });

  py::enum_<CommunicationImplementation>(m, "CommunicationImplementation")
      .value("AUTO", CommunicationImplementation::kAuto)
      .value("RING", CommunicationImplementation::kRing)
      .value("NCCL", CommunicationImplementation::kNccl);

  py::class_<CommunicationOptions>(m, "CommunicationOptions", "TF's tf.distribute.experimental.CommunicationOptions.")
      .def(py::init([](std::int64_t bytes_per_pack, std::optional<double> timeout_seconds,
                       CommunicationImplementation implementation) {
             CommunicationOptions o;
             o.bytes_per_pack = bytes_per_pack;
             if (timeout_seconds) o.timeout = std::chrono::duration<double>(*timeout_seconds);
             o.implementation = implementation;
             o.validate();
             return o;
           }),
           py::arg("bytes_per_pack") = 0, py::arg("timeout_seconds") = py::none(),
           py::arg("implementation") = CommunicationImplementation::kAuto)
      .def_readonly("bytes_per_pack", &CommunicationOptions::bytes_per_pack)
      .def_property_readonly("timeout_seconds",
                             [](const CommunicationOptions& o) -> std::optional<double> {
                               if (!o.timeout) return std::nullopt;
                               return o.timeout->count();
                             })
      .def_readonly("implementation", &CommunicationOptions::implementation);
}

void bind_strategies(py::module_& m) {
  py::class_<Strategy>(m, "Strategy", "The base of every strategy; get_strategy() gives the current one.")
      .def_property_readonly("num_replicas_in_sync", &Strategy::num_replicas_in_sync)
      .def_property_readonly("_num_local_replicas", &Strategy::num_local_replicas)
      .def_property_readonly("_devices", &Strategy::devices)
      .def_property_readonly("_is_default", [](const Strategy& s) { return is_default_strategy(s); })
      .def_property_readonly(
          "extended", [](Strategy& s) -> StrategyExtended& { return s.extended(); },
          py::return_value_policy::reference_internal)
      .def("__repr__", &Strategy::describe)
      .def(
          "scope",
          [](Strategy& s) {
            return ScopeGuard{&s, python_strategy(s), std::nullopt};
          },
          "Enters this strategy's cross-replica context: `with strategy.scope(): ...`.")
      .def(
          "_run_replicas",
          [](Strategy& s, const py::function& replica_fn, bool call_for_each_replica) {
            auto body = [&replica_fn](ReplicaContext& ctx) {
              py::gil_scoped_acquire gil;
              keep_thread_state(gil);
              return PyHandle(replica_fn(ctx.local_replica_id()));
            };
            // The two differ in the API their errors name (and TF's checks).
            const std::vector<PyHandle> results = interruptible(s, [&] {
              return call_for_each_replica ? s.extended().call_for_each_replica(body).values() : s.run(body).values();
            });
            py::list out;
            for (const PyHandle& r : results) out.append(r.get());
            return out;
          },
          py::arg("replica_fn"), py::arg("call_for_each_replica") = false,
          "Calls replica_fn(local_replica_id) on every local replica, on the replica threads; their results.")
      .def("_values_from_function",
           [](Strategy& s, const py::function& value_fn) {
             const PerReplica<PyHandle> values =
                 s.experimental_distribute_values_from_function([&value_fn](const ValueContext& c) {
                   return PyHandle(value_fn(c.replica_id_in_sync_group(), c.num_replicas_in_sync()));
                 });
             py::list out;
             for (const PyHandle& v : values.values()) out.append(v.get());
             return out;
           })
      .def(
          "_reduce_components",
          [](Strategy& s, const py::object& op, std::vector<Tensor> components, const py::object& axis, bool mirrored) {
            const ReduceOp r = reduce_op_of(op);
            const std::optional<int> a = axis_of(axis);
            py::gil_scoped_release release;
            if (mirrored) return s.reduce(r, Mirrored<Tensor>(std::move(components)), a);
            return s.reduce(r, PerReplica<Tensor>(std::move(components)), a);
          })
      .def("_reduce_tensor",
           [](Strategy& s, const py::object& op, const py::object& value, const py::object& axis) {
             const ReduceOp r = reduce_op_of(op);
             const Tensor t = to_tensor(value);
             const std::optional<int> a = axis_of(axis);
             py::gil_scoped_release release;
             return s.reduce(r, t, a);
           })
      .def("_reduce_slices",
           [](Strategy& s, const py::object& op, std::vector<IndexedSlices> components) {
             const ReduceOp r = reduce_op_of(op);
             py::gil_scoped_release release;
             return s.reduce(r, PerReplica<IndexedSlices>(std::move(components)));
           })
      .def("_gather_per_replica",
           [](Strategy& s, std::vector<Tensor> components, int axis) {
             py::gil_scoped_release release;
             return s.gather(PerReplica<Tensor>(std::move(components)), axis);
           })
      .def("_gather_tensor", [](Strategy& s, const py::object& value, int axis) {
        const Tensor t = to_tensor(value);
        py::gil_scoped_release release;
        return s.gather(t, axis);
      });
}

void bind_strategy_kinds(py::module_& m) {
  py::class_<ScopeGuard>(m, "_StrategyScope")
      .def("__enter__",
           [](ScopeGuard& g) {
             if (g.scope) throw py::value_error("this scope() is already entered: call strategy.scope() again");
             g.scope.emplace(g.strategy->scope());
             return g.owner;
           })
      .def("__exit__", [](ScopeGuard& g, const py::args&) {
        g.scope.reset();
        return false;
      });

  py::class_<OneDeviceStrategy, Strategy>(m, "OneDeviceStrategy", "One replica, on one device.")
      .def(py::init([](const std::string& device, const std::optional<CommunicationOptions>& options) {
             return std::make_unique<OneDeviceStrategy>(map_gpu_names({device})[0],
                                                        options.value_or(CommunicationOptions{}));
           }),
           py::arg("device"), py::arg("communication_options") = py::none());

  py::class_<MirroredStrategy, Strategy>(m, "MirroredStrategy",
                                         "Replicas on devices of this host, one thread each; values kept in sync.")
      .def(py::init([](const std::optional<std::vector<std::string>>& devices, const py::object& cross_device_ops,
                       const std::optional<CommunicationOptions>& options) {
             if (!cross_device_ops.is_none()) {
               throw UnimplementedError(
                   "MirroredStrategy: cross_device_ops is not supported; pass "
                   "communication_options=CommunicationOptions(implementation=...) instead");
             }
             if (!devices) return std::make_unique<MirroredStrategy>();
             return std::make_unique<MirroredStrategy>(map_gpu_names(*devices),
                                                       options.value_or(CommunicationOptions{}));
           }),
           py::arg("devices") = py::none(), py::arg("cross_device_ops") = py::none(),
           py::arg("communication_options") = py::none());
}

void bind_replica_context(py::module_& m) {
  py::class_<ReplicaContext>(m, "ReplicaContext", "What a replica function can do: get_replica_context() gives it.")
      .def_property_readonly("replica_id_in_sync_group",
                             [](const ReplicaContext& ctx) -> py::object {
                               // TF: an int32 tensor in a strategy's replicas, the int 0 in the default context.
                               if (is_default_strategy(ctx.strategy())) return py::int_(ctx.replica_id_in_sync_group());
                               return py::cast(constant(static_cast<std::int32_t>(ctx.replica_id_in_sync_group())));
                             })
      .def_property_readonly("num_replicas_in_sync", &ReplicaContext::num_replicas_in_sync)
      .def_property_readonly("_local_replica_id", &ReplicaContext::local_replica_id)
      .def_property_readonly("strategy", [](const ReplicaContext& ctx) { return python_strategy(ctx.strategy()); })
      .def_property_readonly("devices", &ReplicaContext::devices)
      .def(
          "all_reduce",
          [](ReplicaContext& ctx, const py::object& reduce_op, const py::object& value, const py::object& options) {
            const ReduceOp op = reduce_op_of(reduce_op);
            const CommunicationOptions o = options_of(options);
            if (py::isinstance<IndexedSlices>(value)) {
              const auto in = value.cast<IndexedSlices>();
              return without_gil_to_python([&] { return ctx.all_reduce(op, in, o); });
            }
            if (holds_indexed_slices(value)) {
              const Nest<TensorOrSlices> in = to_mixed_nest(value);
              Nest<TensorOrSlices> out;
              {
                py::gil_scoped_release release;
                out = ctx.all_reduce(op, in, o);
              }
              return from_mixed_nest(out);
            }
            return collective_on(value, [&](const auto& v) { return ctx.all_reduce(op, v, o); });
          },
          py::arg("reduce_op"), py::arg("value"), py::arg("options") = py::none(),
          "All-reduces a tensor, an IndexedSlices, or a nest (lists, tuples, dicts) of them across replicas.")
      .def(
          "all_gather",
          [](ReplicaContext& ctx, const py::object& value, int axis, const py::object& options) {
            const CommunicationOptions o = options_of(options);
            if (py::isinstance<IndexedSlices>(value)) {
              const auto in = value.cast<IndexedSlices>();
              return without_gil_to_python([&] { return ctx.all_gather(in, axis, o); });
            }
            return collective_on(value, [&](const auto& v) { return ctx.all_gather(v, axis, o); });
          },
          py::arg("value"), py::arg("axis"), py::arg("options") = py::none(),
          "All-gathers a tensor, an IndexedSlices or a nest of tensors along `axis`; the sizes along it may differ "
          "between replicas.")
      .def(
          "broadcast",
          [](ReplicaContext& ctx, const py::object& value, int root_replica, const py::object& options) {
            const CommunicationOptions o = options_of(options);
            return collective_on(value, [&](const auto& v) { return ctx.broadcast(v, root_replica, o); });
          },
          py::arg("value"), py::arg("root_replica") = 0, py::arg("options") = py::none(),
          "Every replica gets root_replica's value (an extension: TF has no replica-context broadcast).")
      .def("_merge_call", [](ReplicaContext& ctx, const py::function& merge_body, const py::object& payload) {
        // Every replica hands its payload; replica 0's merge_body gets them
        // all (in local replica order) and its result goes to every replica.
        const PyHandle mine(payload);
        PyHandle result;
        {
          py::gil_scoped_release release;
          result = ctx.merge_call(
              [&merge_body](Strategy& s, const PerReplica<PyHandle>& all) {
                py::gil_scoped_acquire gil;
                py::list payloads;
                for (const PyHandle& p : all.values()) payloads.append(p.get());
                return PyHandle(merge_body(python_strategy(s), payloads));
              },
              mine);
        }
        return result.get();
      });
}

void bind_context_functions(py::module_& m) {
  m.def(
      "get_replica_context",
      []() -> py::object {
        ReplicaContext* ctx = get_replica_context();
        if (ctx == nullptr) return py::none();
        return borrowed(ctx, python_strategy(ctx->strategy()));
      },
      "The current replica context: None in a cross-replica context (inside scope() or a merge_fn).");
  m.def("in_cross_replica_context", &in_cross_replica_context);
  m.def("get_cross_replica_context", []() -> py::object {
    Strategy* s = get_cross_replica_context();
    if (s == nullptr) return py::none();
    return python_strategy(*s);
  });
  m.def("get_strategy", [] { return python_strategy(get_strategy()); });
  m.def("has_strategy", &has_strategy);
  m.def("_gpus_visible", [] { return !list_physical_devices("GPU").empty(); });
  m.def(
      "_time_cpp_all_reduce",
      [](Strategy& s, std::int64_t elements, int iterations, bool fresh_input) {
        double seconds = 0;
        py::gil_scoped_release release;
        s.run([&](ReplicaContext& ctx) {
          const Tensor value(DType::kFloat32, Shape{elements});
          ctx.all_reduce(ReduceOp::kSum, value);  // warm: buffers, memo
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < iterations; ++i) {
            ctx.all_reduce(ReduceOp::kSum, fresh_input ? value.clone() : value);
          }
          if (ctx.local_replica_id() == 0) {
            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
          }
        });
        return seconds;
      },
      py::arg("strategy"), py::arg("elements"), py::arg("iterations"), py::arg("fresh_input") = false,
      "Seconds per float32 all_reduce of `elements`, the loop written in C++ (bench/python_bench.py compares "
      "the same loop in Python with it).");
}

// extended: the cross-replica reductions to destinations. Python hands the
// components (with whether they are a PerReplica, a Mirrored or one tensor)
// and the destination devices; the C++ API does the rest.
enum class ValueKind { kTensor, kPerReplica, kMirrored };

std::vector<Tensor> reduce_to(StrategyExtended& e, ReduceOp op, std::vector<Tensor> components, ValueKind kind,
                              const Destinations& destinations, const CommunicationOptions& options) {
  switch (kind) {
    case ValueKind::kTensor: return e.reduce_to(op, components.at(0), destinations, options).values();
    case ValueKind::kPerReplica:
      return e.reduce_to(op, PerReplica<Tensor>(std::move(components)), destinations, options).values();
    case ValueKind::kMirrored:
      return e.reduce_to(op, Mirrored<Tensor>(std::move(components)), destinations, options).values();
  }
  throw InternalError("reduce_to: unknown value kind");
}

void bind_extended(py::module_& m) {
  py::enum_<ValueKind>(m, "_ValueKind")
      .value("TENSOR", ValueKind::kTensor)
      .value("PER_REPLICA", ValueKind::kPerReplica)
      .value("MIRRORED", ValueKind::kMirrored);
  py::class_<StrategyExtended>(m, "StrategyExtended", "strategy.extended: reductions to destinations, and more.")
      .def_property_readonly("worker_devices", &StrategyExtended::worker_devices)
      .def_property_readonly("_strategy", [](const StrategyExtended& e) { return python_strategy(e.strategy()); })
      .def("_reduce_to",
           [](StrategyExtended& e, const py::object& op, std::vector<Tensor> components, ValueKind kind,
              const std::vector<std::string>& devices, const py::object& options) {
             const ReduceOp r = reduce_op_of(op);
             const CommunicationOptions o = options_of(options);
             py::gil_scoped_release release;
             return reduce_to(e, r, std::move(components), kind, Destinations::of_devices(devices), o);
           })
      .def("_batch_reduce_to",
           [](StrategyExtended& e, const py::object& op, const std::vector<std::vector<Tensor>>& values,
              const std::vector<std::vector<std::string>>& devices, const py::object& options) {
             const ReduceOp r = reduce_op_of(op);
             const CommunicationOptions o = options_of(options);
             py::gil_scoped_release release;
             std::vector<std::pair<PerReplica<Tensor>, Destinations>> pairs;
             for (std::size_t i = 0; i < values.size(); ++i) {
               pairs.emplace_back(PerReplica<Tensor>(values[i]), Destinations::of_devices(devices.at(i)));
             }
             std::vector<std::vector<Tensor>> out;
             for (const Mirrored<Tensor>& result : e.batch_reduce_to(r, pairs, o)) out.push_back(result.values());
             return out;
           })
      .def("_broadcast_to",
           [](StrategyExtended& e, const py::object& value, const std::optional<std::vector<std::string>>& devices) {
             const Tensor t = to_tensor(value);
             py::gil_scoped_release release;
             if (!devices) return e.broadcast_to(t).values();
             return e.broadcast_to(t, Destinations::of_devices(*devices)).values();
           });
}

}  // namespace

void bind_strategy(py::module_& m) {
  // Function-local statics that call into Python are made now, on the
  // importing thread: made later on a replica thread, one waiting for the
  // GIL inside the static's guard deadlocks another holding the GIL at the
  // guard. (pybind11's numpy API is one of them.)
  main_thread_ident();
  py::detail::npy_api::get();
  bind_extended(m);
  bind_options(m);
  bind_strategies(m);
  bind_strategy_kinds(m);
  bind_replica_context(m);
  bind_context_functions(m);
}

}  // namespace distribute::python
