// Strategies, replica contexts and their collectives in Python. Replica
// functions written in Python run on the strategy's replica threads: each
// takes the GIL to run Python and every collective, wait and C++ computation
// gives it back, so replicas whose work is numpy or BLAS run side by side.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
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

std::optional<int> axis_of(const py::handle& axis) {
  if (axis.is_none()) return std::nullopt;
  return int_argument(axis, "reduce: axis");
}

bool is_structure(const py::handle& value) {
  return py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value) || py::isinstance<py::dict>(value);
}

// `with strategy.scope():` as a Python context manager.
// A scope is a thread's: it is exited on the thread that entered it. A
// guard dropped while its scope is still entered on another thread (a
// garbage collection elsewhere) leaves that scope as it is and keeps its
// strategy alive for good, so that the entering thread's context never
// names a strategy that is gone.
struct ScopeGuard {
  Strategy* strategy;
  py::object owner;  // the Python strategy: alive while the scope is
  std::optional<StrategyScope> scope;
  std::thread::id entered_on;

  ScopeGuard(Strategy* s, py::object o) : strategy(s), owner(std::move(o)) {}
  ScopeGuard(ScopeGuard&&) = default;
  ScopeGuard& operator=(ScopeGuard&&) = delete;
  ~ScopeGuard() {
    if (!scope || entered_on == std::this_thread::get_id()) return;
    try {
      static_cast<void>(new StrategyScope(std::move(*scope)));  // never destroyed: the entering thread stands in it
      owner.release();                                          // (a reference kept for good)
    } catch (const std::bad_alloc&) {
      // (out of memory: the scope ends here after all)
    }
    scope.reset();
  }
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
// time it takes the GIL. When the thread ends (its strategy is destroyed) it
// cannot take the GIL to free the state (the thread destroying the strategy
// may hold it while it joins): it hands the state over, and the next thread
// that holds the GIL here frees it (free_ended_thread_states).
// A child of os.fork() has none of the parent's threads, and CPython frees
// their states in the child: the states are kept with their process, and a
// child leaves the parent's alone.
std::mutex ended_states_mutex;
std::vector<std::pair<PyThreadState*, pid_t>> ended_states;  // guarded by ended_states_mutex

struct KeptThreadState {
  PyThreadState* state = nullptr;
  ~KeptThreadState() {
    if (state == nullptr) return;
    const std::lock_guard<std::mutex> lock(ended_states_mutex);
    ended_states.emplace_back(state, getpid());
  }
};
thread_local KeptThreadState kept_thread_state;

void keep_thread_state(py::gil_scoped_acquire& gil) {
  if (kept_thread_state.state == nullptr) {
    gil.inc_ref();
    kept_thread_state.state = PyThreadState_Get();
  }
}

// With the GIL held: frees the states of replica threads that have ended.
void free_ended_thread_states() {
  std::vector<std::pair<PyThreadState*, pid_t>> ended;
  {
    const std::lock_guard<std::mutex> lock(ended_states_mutex);
    ended.swap(ended_states);
  }
  const pid_t here = getpid();
  for (const auto& [state, process] : ended) {
    if (process != here) continue;  // the parent's, already freed by CPython in this child
    PyThreadState_Clear(state);
    PyThreadState_Delete(state);
  }
}

// The thread that runs a run for Python's main thread (see interruptible):
// one, kept for the process, so that a run does not pay for a new thread.
// A child of os.fork() has no such thread (only the forking thread goes on
// in a child): it makes its own on first use.
class MainThreadRunner {
 public:
  static MainThreadRunner& get() {
    static MainThreadRunner* runner = nullptr;  // never destroyed: its thread may outlive static destructors
    static pid_t owner = 0;
    if (runner == nullptr || owner != getpid()) {  // (the parent's, in a child, is left as it was)
      runner = new MainThreadRunner;
      owner = getpid();
    }
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
  // Whether a job is in flight (only the main thread starts jobs).
  bool busy() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return !done_;
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

// The runs in flight, so that the interpreter's exit can end them first
// (end_runs_for_exit, called by atexit before the interpreter finalises).
// A thread that comes back from C++ into a finalising interpreter is ended
// by Python inside C++ frames, which aborts the process; a run ended before
// that point comes back while Python still runs. An InFlight is made and
// destroyed with the GIL held, so a run counts until its thread is back in
// Python; after the exit began, a run is refused before the GIL is let go.
std::mutex in_flight_mutex;
std::condition_variable in_flight_changed;
std::unordered_multiset<Strategy*> in_flight;  // guarded by in_flight_mutex
bool exiting = false;                          // guarded by in_flight_mutex

class InFlight {
 public:
  explicit InFlight(Strategy& s) : strategy_(&s) {
    const std::lock_guard<std::mutex> lock(in_flight_mutex);
    if (exiting) throw CancelledError("run: the Python interpreter is exiting; no new run starts");
    in_flight.insert(strategy_);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() {
    const std::lock_guard<std::mutex> lock(in_flight_mutex);
    in_flight.erase(in_flight.find(strategy_));
    in_flight_changed.notify_all();
  }

 private:
  Strategy* strategy_;
};

// At exit (atexit, the GIL held): cancels every run in flight (daemon
// threads' runs) and waits, without the GIL, until they have returned into
// Python, for at most `seconds`; no run starts after this.
void end_runs_for_exit(double seconds) {
  {
    const std::lock_guard<std::mutex> lock(in_flight_mutex);
    exiting = true;
    if (in_flight.empty()) return;
    for (Strategy* s : in_flight) s->cancel_run("the Python interpreter is exiting");
  }
  // The mutex is let go before the GIL is taken back (InFlight takes them
  // in the other order).
  py::gil_scoped_release release;
  std::unique_lock<std::mutex> lock(in_flight_mutex);
  in_flight_changed.wait_for(lock, std::chrono::duration<double>(seconds), [] { return in_flight.empty(); });
}

// The strategies made from Python, with the process that made each: a
// strategy made before os.fork() has no replica threads in the child.
std::mutex made_in_mutex;
std::unordered_map<const Strategy*, pid_t> made_in;  // guarded by made_in_mutex

void require_made_here(const Strategy& s) {
  pid_t maker = 0;
  {
    const std::lock_guard<std::mutex> lock(made_in_mutex);
    auto it = made_in.find(&s);
    if (it == made_in.end()) return;
    maker = it->second;
  }
  if (maker != getpid()) {
    throw FailedPreconditionError(s.describe() + " was made in process " + std::to_string(maker) +
                                  ", before os.fork(); its replica threads do not exist in this child process " +
                                  std::to_string(getpid()) + ": make a new strategy here");
  }
}

// Runs `run` (a Strategy::run) so that Ctrl-C stops it. Python handles a
// signal only on its main thread, between bytecodes; so there the run goes to
// the runner thread, and this one waits with the GIL released, looking for
// signals every 20 ms. A KeyboardInterrupt (or any exception a handler
// raises) cancels the run (Strategy::cancel_run: replicas waiting in a
// collective get CancelledError at once, the others at their next one) and
// is raised when the run has ended. Anywhere else (a replica's thread, a
// merge_fn) the run happens here, as it would in C++.
//
// A run started on the main thread while the runner has one in flight (a
// signal handler that calls run while the main thread waits here) runs on
// the main thread itself, as any other thread's would: it takes its turn
// after the first when both are on one strategy.
template <class Run>
auto interruptible(Strategy& s, const Run& run) -> decltype(run()) {
  using Result = decltype(run());
  if (PyThread_get_thread_ident() != main_thread_ident() || MainThreadRunner::get().busy()) {
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

// NOLINTNEXTLINE(readability-function-size): one binding after another, in the order of strategy.h
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
          "scope", [](Strategy& s) { return ScopeGuard(&s, python_strategy(s)); },
          "Enters this strategy's cross-replica context: `with strategy.scope(): ...`.")
      .def(
          "_run_replicas",
          [](Strategy& s, const py::function& replica_fn, bool call_for_each_replica) {
            require_made_here(s);
            free_ended_thread_states();
            auto body = [&replica_fn](ReplicaContext& ctx) {
              py::gil_scoped_acquire gil;
              keep_thread_state(gil);
              return PyHandle(replica_fn(ctx.local_replica_id()));
            };
            // The two differ in the API their errors name (and TF's checks).
            // Counted with the GIL held on both sides: an exit waiting for it
            // sees the end only once this thread is back in Python.
            const InFlight counted(s);
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
           [](Strategy& s, std::vector<Tensor> components, const py::object& axis_arg) {
             const int axis = int_argument(axis_arg, "gather: axis");
             py::gil_scoped_release release;
             return s.gather(PerReplica<Tensor>(std::move(components)), axis);
           })
      .def("_gather_tensor", [](Strategy& s, const py::object& value, const py::object& axis_arg) {
        const int axis = int_argument(axis_arg, "gather: axis");
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
             g.entered_on = std::this_thread::get_id();
             return g.owner;
           })
      .def("__exit__", [](ScopeGuard& g, const py::args&) {
        if (g.scope && g.entered_on != std::this_thread::get_id()) {
          throw FailedPreconditionError("scope() of " + g.strategy->describe() +
                                        " was entered on another thread and cannot be exited on this one: exit "
                                        "it on the thread that entered it (a scope is a thread's, as in TF)");
        }
        g.scope.reset();
        return false;
      });

  py::class_<OneDeviceStrategy, Strategy>(m, "OneDeviceStrategy", "One replica, on one device.")
      .def(py::init([](const std::string& device, const std::optional<CommunicationOptions>& options) {
             const std::vector<std::string> mapped = map_gpu_names({device});
             return with_gpus_as_cpus_hint(mapped, [&] {
               return made_here(
                   std::make_unique<OneDeviceStrategy>(mapped[0], options.value_or(CommunicationOptions{})));
             });
           }),
           py::arg("device"), py::arg("communication_options") = py::none());

  py::class_<MirroredStrategy, Strategy>(m, "MirroredStrategy",
                                         "Replicas on devices of this host, one thread each; values kept in sync.")
      .def(py::init([](const py::object& devices, const py::object& cross_device_ops, const py::object& options) {
             if (!cross_device_ops.is_none()) {
               throw UnimplementedError(
                   "MirroredStrategy: cross_device_ops is not supported; pass "
                   "communication_options=CommunicationOptions(implementation=...) instead");
             }
             const CommunicationOptions o = options_argument(options);
             if (devices.is_none() && options.is_none()) return made_here(std::make_unique<MirroredStrategy>());
             if (devices.is_none()) {
               // MirroredStrategy()'s devices, one per usable core, with the options given.
               cpu_set_t set;
               const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
               std::vector<std::string> all;
               all.reserve(static_cast<std::size_t>(cores));
               for (int i = 0; i < cores; ++i) all.push_back("CPU:" + std::to_string(i));
               return made_here(std::make_unique<MirroredStrategy>(all, o));
             }
             const std::vector<std::string> mapped =
                 map_gpu_names(device_names_argument(devices, "MirroredStrategy: devices"));
             return with_gpus_as_cpus_hint(mapped,
                                           [&] { return made_here(std::make_unique<MirroredStrategy>(mapped, o)); });
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
            const CommunicationOptions o = options_argument(options);
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
          [](ReplicaContext& ctx, const py::object& value, const py::object& axis_arg, const py::object& options) {
            const int axis = int_argument(axis_arg, "all_gather: axis");
            const CommunicationOptions o = options_argument(options);
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
          [](ReplicaContext& ctx, const py::object& value, const py::object& root_arg, const py::object& options) {
            const int root_replica = int_argument(root_arg, "broadcast: root_replica");
            const CommunicationOptions o = options_argument(options);
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
             const CommunicationOptions o = options_argument(options);
             py::gil_scoped_release release;
             return reduce_to(e, r, std::move(components), kind, Destinations::of_devices(devices), o);
           })
      .def("_batch_reduce_to",
           [](StrategyExtended& e, const py::object& op, const std::vector<std::vector<Tensor>>& values,
              const std::vector<std::vector<std::string>>& devices, const py::object& options) {
             const ReduceOp r = reduce_op_of(op);
             const CommunicationOptions o = options_argument(options);
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

bool on_python_main_thread() { return PyThread_get_thread_ident() == main_thread_ident(); }

bool python_signal_raised() { return PyErr_CheckSignals() != 0; }

void note_made_here(const Strategy& s) {
  const std::lock_guard<std::mutex> lock(made_in_mutex);
  made_in[&s] = getpid();
}

void bind_strategy(py::module_& m) {
  m.def("_end_runs_for_exit", &end_runs_for_exit, py::arg("seconds") = 10.0,
        "Called by atexit: cancels the runs in flight and waits for them to return into Python.");
  m.def(
      "_thread_state_count",
      [] {
        int n = 0;
        for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t != nullptr;
             t = PyThreadState_Next(t)) {
          ++n;
        }
        return n;
      },
      "The interpreter's thread states (for the tests of thread-state reuse).");
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
