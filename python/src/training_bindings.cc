// Training from Python: mirrored and sync-on-read variables, the optimizers,
// and distributed datasets fed by Python iterables.
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"

namespace distribute::python {

namespace {

VariableOptions variable_options(std::string name, VariableSynchronization synchronization,
                                 VariableAggregation aggregation, std::optional<bool> trainable) {
  return VariableOptions{
      .name = std::move(name), .synchronization = synchronization, .aggregation = aggregation, .trainable = trainable};
}

std::optional<DType> optional_dtype(const py::object& dtype) {
  if (dtype.is_none()) return std::nullopt;
  return dtype_from_python(dtype);
}

// The variable's writes take a value converted to its dtype; in a replica
// context they may wait for the other replicas (an aggregation's merge_call).
template <class Write>
void write_variable(Variable& v, const py::object& value, const Write& write) {
  const Tensor t = to_tensor(value, v.dtype());
  py::gil_scoped_release release;
  write(v, t);
}

void bind_variable_enums(py::module_& m) {
  py::enum_<VariableSynchronization>(m, "VariableSynchronization")
      .value("AUTO", VariableSynchronization::kAuto)
      .value("NONE", VariableSynchronization::kNone)
      .value("ON_WRITE", VariableSynchronization::kOnWrite)
      .value("ON_READ", VariableSynchronization::kOnRead);
  py::enum_<VariableAggregation>(m, "VariableAggregation")
      .value("NONE", VariableAggregation::kNone)
      .value("SUM", VariableAggregation::kSum)
      .value("MEAN", VariableAggregation::kMean)
      .value("ONLY_FIRST_REPLICA", VariableAggregation::kOnlyFirstReplica);
}

void bind_variables(py::module_& m) {
  py::class_<Variable>(m, "Variable", "A variable: under a strategy's scope(), one component per replica.")
      .def(py::init([](const py::object& initial_value, const py::object& dtype, std::string name,
                       VariableSynchronization synchronization, VariableAggregation aggregation,
                       std::optional<bool> trainable) {
             return Variable(to_tensor(initial_value, optional_dtype(dtype)),
                             variable_options(std::move(name), synchronization, aggregation, trainable));
           }),
           py::arg("initial_value"), py::arg("dtype") = py::none(), py::arg("name") = "",
           py::arg("synchronization") = VariableSynchronization::kAuto,
           py::arg("aggregation") = VariableAggregation::kNone, py::arg("trainable") = py::none())
      .def_property_readonly("name", &Variable::name)
      .def_property_readonly("dtype", &Variable::dtype)
      .def_property_readonly("shape", [](const Variable& v) { return shape_tuple(v.shape()); })
      .def_property_readonly("synchronization", &Variable::synchronization)
      .def_property_readonly("aggregation", &Variable::aggregation)
      .def_property_readonly("trainable", &Variable::trainable)
      .def_property_readonly("values", &Variable::values, "The components, one per local replica.")
      .def("value", &Variable::value, py::call_guard<py::gil_scoped_release>())
      .def("read_value", &Variable::read_value, py::call_guard<py::gil_scoped_release>())
      .def("numpy", [](const Variable& v) { return py::cast(v.read_value()).attr("numpy")(); })
      .def(
          "__array__",
          [](const Variable& v, const py::object& dtype) { return py::cast(v.read_value()).attr("__array__")(dtype); },
          py::arg("dtype") = py::none())
      .def("assign",
           [](Variable& v, const py::object& value) {
             write_variable(v, value, [](Variable& var, const Tensor& t) { var.assign(t); });
           })
      .def("assign_add",
           [](Variable& v, const py::object& value) {
             write_variable(v, value, [](Variable& var, const Tensor& t) { var.assign_add(t); });
           })
      .def("assign_sub",
           [](Variable& v, const py::object& value) {
             write_variable(v, value, [](Variable& var, const Tensor& t) { var.assign_sub(t); });
           })
      .def("__repr__", &Variable::repr);
  py::class_<MirroredVariable, Variable>(m, "MirroredVariable")
      .def(py::init([](const py::object& initial_value, const py::object& dtype, std::string name,
                       VariableAggregation aggregation, std::optional<bool> trainable) {
             return MirroredVariable(
                 to_tensor(initial_value, optional_dtype(dtype)),
                 variable_options(std::move(name), VariableSynchronization::kOnWrite, aggregation, trainable));
           }),
           py::arg("initial_value"), py::arg("dtype") = py::none(), py::arg("name") = "",
           py::arg("aggregation") = VariableAggregation::kNone, py::arg("trainable") = py::none());
  py::class_<SyncOnReadVariable, Variable>(m, "SyncOnReadVariable")
      .def(py::init([](const py::object& initial_value, const py::object& dtype, std::string name,
                       VariableAggregation aggregation, std::optional<bool> trainable) {
             return SyncOnReadVariable(
                 to_tensor(initial_value, optional_dtype(dtype)),
                 variable_options(std::move(name), VariableSynchronization::kOnRead, aggregation, trainable));
           }),
           py::arg("initial_value"), py::arg("dtype") = py::none(), py::arg("name") = "",
           py::arg("aggregation") = VariableAggregation::kSum, py::arg("trainable") = py::none());
}

// What fn sees of one component in extended.update(var, fn): valid inside
// that call of fn only. Writes replace the component (as TF's assign on the
// component variable does); the library checks its dtype and shape after fn.
struct UpdateComponent {
  Tensor* component = nullptr;
  Tensor& get() const {
    if (component == nullptr) {
      throw FailedPreconditionError(
          "update: a component is only fn's to read and write while fn runs; this one is used after its call");
    }
    return *component;
  }
};

// component <- op(component, value), computed by numpy (fn's arithmetic).
void write_component(const UpdateComponent& c, const py::object& value, const char* numpy_op) {
  Tensor& t = c.get();
  if (numpy_op == nullptr) {
    t = to_tensor(value, t.dtype());
    return;
  }
  py::module_ np = py::module_::import("numpy");
  t = to_tensor(np.attr(numpy_op)(py::cast(t).attr("numpy")(), np.attr("asarray")(value)), t.dtype());
}

void bind_update(py::module_& m) {
  py::class_<UpdateComponent>(m, "_UpdateComponent")
      .def_property_readonly("dtype", [](const UpdateComponent& c) { return c.get().dtype(); })
      .def_property_readonly("device", [](const UpdateComponent& c) { return c.get().device(); })
      .def("read_value", [](const UpdateComponent& c) { return c.get(); })
      .def("value", [](const UpdateComponent& c) { return c.get(); })
      .def("numpy", [](const UpdateComponent& c) { return py::cast(c.get()).attr("numpy")(); })
      .def("assign", [](const UpdateComponent& c, const py::object& v) { write_component(c, v, nullptr); })
      .def("assign_add", [](const UpdateComponent& c, const py::object& v) { write_component(c, v, "add"); })
      .def("assign_sub", [](const UpdateComponent& c, const py::object& v) { write_component(c, v, "subtract"); });
  py::class_<StrategyExtended> extended =
      py::reinterpret_borrow<py::class_<StrategyExtended>>(m.attr("StrategyExtended"));
  extended.def("_update", [](StrategyExtended& e, Variable& var, const py::function& fn, const py::object& payloads,
                             bool per_replica) {
    // fn(component, payload) -> result; payload is this component's
    // (args, kwargs): one for every component, or one per replica.
    auto call = [&fn](Tensor& component, const PyHandle& payload) {
      py::gil_scoped_acquire gil;
      py::object view = py::cast(UpdateComponent{&component});
      auto* held = view.cast<UpdateComponent*>();  // the copy the Python object holds
      struct Invalidate {
        UpdateComponent* held;
        ~Invalidate() { held->component = nullptr; }
      } invalidate{held};
      return PyHandle(fn(view, payload.get()));
    };
    std::vector<PyHandle> given;
    if (per_replica) {
      for (py::handle p : payloads) given.emplace_back(py::reinterpret_borrow<py::object>(p));
    }
    const PyHandle shared(payloads);
    std::vector<PyHandle> results;
    {
      py::gil_scoped_release release;
      results = per_replica ? e.update(var, call, PerReplica<PyHandle>(std::move(given))).values()
                            : e.update(var, call, shared).values();
    }
    py::list out;
    for (const PyHandle& r : results) out.append(r.get());
    return out;
  });
}

// A Python callable as a schedule (a Keras LearningRateSchedule subclass, a
// lambda): called with the step, in the step's merge_call, with the GIL.
class PythonSchedule final : public LearningRateSchedule {
 public:
  explicit PythonSchedule(py::object fn) : fn_(std::move(fn)) {}
  double operator()(std::int64_t step) const override {
    py::gil_scoped_acquire gil;
    py::object rate = fn_.get()(step);
    try {
      return py::float_(rate).cast<double>();
    } catch (const py::error_already_set&) {
      throw InvalidArgumentError("learning_rate: the schedule " + describe() + " returned " +
                                 py::repr(rate).cast<std::string>() + " at step " + std::to_string(step) +
                                 ", not a number");
    }
  }
  std::string describe() const override {
    py::gil_scoped_acquire gil;
    return py::repr(fn_.get()).cast<std::string>();
  }
  const py::object& object() const { return fn_.get(); }

 private:
  PyHandle fn_;
};

// learning_rate as Python gives it: a number, one of the library's
// schedules, or any callable of the step.
LearningRate learning_rate_of(const py::object& value) {
  if (py::isinstance<LearningRateSchedule>(value)) {
    return LearningRate(value.cast<std::shared_ptr<LearningRateSchedule>>());
  }
  if (py::isinstance<py::bool_>(value)) throw py::type_error("learning_rate must be a number or a schedule, got bool");
  if (PyNumber_Check(value.ptr()) != 0 && !PyCallable_Check(value.ptr())) {
    return LearningRate(py::float_(value).cast<double>());
  }
  if (PyCallable_Check(value.ptr()) != 0) return LearningRate(std::make_shared<PythonSchedule>(value));
  throw py::type_error("learning_rate must be a number or a schedule (a callable of the step), got " +
                       std::string(py::str(value.get_type().attr("__name__"))));
}

py::object learning_rate_to_python(const LearningRate& rate) {
  const auto& schedule = rate.schedule();
  if (!schedule) return py::float_(rate.value());
  if (const auto* python = dynamic_cast<const PythonSchedule*>(schedule.get())) return python->object();
  return py::cast(std::const_pointer_cast<LearningRateSchedule>(schedule));
}

// grads_and_vars as Keras takes it: an iterable of (gradient or None, variable) pairs.
std::vector<GradientAndVariable> gradient_pairs(const py::iterable& grads_and_vars) {
  std::vector<GradientAndVariable> pairs;
  std::size_t k = 0;
  for (py::handle item : grads_and_vars) {
    const auto bad = [&](const std::string& why) {
      return py::type_error("apply_gradients: grads_and_vars[" + std::to_string(k) +
                            "] must be a (gradient, variable) pair; " + why);
    };
    if (!py::isinstance<py::sequence>(item) || py::isinstance<py::str>(item)) {
      throw bad("got " + std::string(py::str(item.get_type().attr("__name__"))));
    }
    auto pair = py::reinterpret_borrow<py::sequence>(item);
    if (pair.size() != 2) throw bad("got " + std::to_string(pair.size()) + " items");
    py::object grad = pair[0];
    py::object var = pair[1];
    if (!py::isinstance<Variable>(var)) {
      throw bad("its second item is a " + std::string(py::str(var.get_type().attr("__name__"))) +
                ", not a distribute.Variable");
    }
    const auto& v = var.cast<const Variable&>();
    pairs.emplace_back(grad.is_none() ? std::nullopt : std::optional<Tensor>(to_tensor(grad, v.dtype())), v);
    ++k;
  }
  bool any = false;
  for (const auto& pair : pairs) any = any || pair.first.has_value();
  if (!pairs.empty() && !any) {
    std::string names;
    for (const auto& pair : pairs) names += (names.empty() ? "'" : ", '") + pair.second.name() + "'";
    throw py::value_error("No gradients provided for any variable: (" + names + ")");
  }
  return pairs;
}

void bind_schedules(py::module_& m) {
  py::class_<LearningRateSchedule, std::shared_ptr<LearningRateSchedule>>(
      m, "LearningRateSchedule", "A learning rate as a function of the step, as Keras' schedules.")
      .def(
          "__call__", [](const LearningRateSchedule& s, std::int64_t step) { return s(step); }, py::arg("step"))
      .def("__repr__", &LearningRateSchedule::describe);
  py::class_<ExponentialDecay, LearningRateSchedule, std::shared_ptr<ExponentialDecay>>(m, "ExponentialDecay")
      .def(py::init<double, std::int64_t, double, bool>(), py::arg("initial_learning_rate"), py::arg("decay_steps"),
           py::arg("decay_rate"), py::arg("staircase") = false);
  py::class_<PiecewiseConstantDecay, LearningRateSchedule, std::shared_ptr<PiecewiseConstantDecay>>(
      m, "PiecewiseConstantDecay")
      .def(py::init<std::vector<std::int64_t>, std::vector<double>>(), py::arg("boundaries"), py::arg("values"));
  py::class_<CosineDecay, LearningRateSchedule, std::shared_ptr<CosineDecay>>(m, "CosineDecay")
      .def(py::init<double, std::int64_t, double>(), py::arg("initial_learning_rate"), py::arg("decay_steps"),
           py::arg("alpha") = 0.0);
}

void bind_optimizers(py::module_& m) {
  bind_schedules(m);
  py::class_<Optimizer>(m, "Optimizer", "The base of SGD and Adam.")
      .def_property_readonly("name", [](const Optimizer& o) { return std::string(o.name()); })
      .def_property(
          "iterations", &Optimizer::iterations,
          [](Optimizer& o, const py::object& n) {
            if (!py::isinstance<py::int_>(n) || py::isinstance<py::bool_>(n)) {
              throw py::type_error("iterations must be an int, got " +
                                   std::string(py::str(n.get_type().attr("__name__"))));
            }
            o.set_iterations(n.cast<std::int64_t>());
          },
          "Steps taken (Keras' iterations); settable, so that a restored optimizer goes on with its schedule.")
      .def_property(
          "learning_rate", [](const Optimizer& o) { return learning_rate_to_python(o.learning_rate()); },
          [](Optimizer& o, const py::object& rate) { o.set_learning_rate(learning_rate_of(rate)); },
          "A number or a schedule (ExponentialDecay, PiecewiseConstantDecay, CosineDecay, or a callable of the "
          "step), evaluated at `iterations`.")
      .def_property_readonly("current_learning_rate", &Optimizer::current_learning_rate, "The rate the next step uses.")
      .def(
          "apply_gradients",
          [](Optimizer& o, const py::iterable& grads_and_vars, const py::object& options) {
            std::vector<GradientAndVariable> pairs = gradient_pairs(grads_and_vars);
            if (!options.is_none() && !py::isinstance<CommunicationOptions>(options)) {
              throw py::type_error("apply_gradients: options must be a CommunicationOptions or None, got " +
                                   std::string(py::str(options.get_type().attr("__name__"))));
            }
            const CommunicationOptions opts =
                options.is_none() ? CommunicationOptions{} : options.cast<CommunicationOptions>();
            py::gil_scoped_release release;
            o.apply_gradients(pairs, opts);
          },
          py::arg("grads_and_vars"), py::arg("options") = py::none(),
          "One step: in a replica context, the gradients are all-reduced (one merge_call) and every variable "
          "updated once. A None gradient leaves its variable as it is (with a warning).")
      .def("get_slot", &Optimizer::get_slot);
  py::class_<SGD, Optimizer>(m, "SGD").def(
      py::init([](const py::object& learning_rate, double momentum, bool nesterov) {
        return std::make_unique<SGD>(
            SGD::Options{.learning_rate = learning_rate_of(learning_rate), .momentum = momentum, .nesterov = nesterov});
      }),
      py::arg("learning_rate") = 0.01, py::arg("momentum") = 0.0, py::arg("nesterov") = false);
  py::class_<Adam, Optimizer>(m, "Adam").def(
      py::init([](const py::object& learning_rate, double beta_1, double beta_2, double epsilon) {
        return std::make_unique<Adam>(Adam::Options{
            .learning_rate = learning_rate_of(learning_rate), .beta_1 = beta_1, .beta_2 = beta_2, .epsilon = epsilon});
      }),
      py::arg("learning_rate") = 0.001, py::arg("beta_1") = 0.9, py::arg("beta_2") = 0.999, py::arg("epsilon") = 1e-7);
}

// A Python callable returning the next batch (a nest) or None at the end, as
// the library's BatchFn. It may be called on any thread: it takes the GIL.
BatchFn batch_fn_of(const py::object& next_batch) {
  return [next = PyHandle(next_batch)]() -> std::optional<Nest<Tensor>> {
    py::gil_scoped_acquire gil;
    py::object batch = next.get()();
    if (batch.is_none()) return std::nullopt;
    return to_nest(batch);
  };
}

void bind_datasets(py::module_& m) {
  py::class_<InputContext>(m, "InputContext")
      .def(py::init<int, int, int>(), py::arg("num_input_pipelines") = 1, py::arg("input_pipeline_id") = 0,
           py::arg("num_replicas_in_sync") = 1)
      .def_property_readonly("num_input_pipelines", &InputContext::num_input_pipelines)
      .def_property_readonly("input_pipeline_id", &InputContext::input_pipeline_id)
      .def_property_readonly("num_replicas_in_sync", &InputContext::num_replicas_in_sync)
      .def("get_per_replica_batch_size", &InputContext::get_per_replica_batch_size)
      .def("__repr__", &InputContext::to_string);
  auto per_replica_of = [](const std::optional<PerReplica<Nest<Tensor>>>& batch) -> py::object {
    if (!batch) return py::none();
    py::list per_replica;
    for (const Nest<Tensor>& n : batch->values()) per_replica.append(from_nest(n));
    return per_replica;
  };
  // One C++ dataset for all the passes of a Python one: a checkpoint keeps
  // its position across them.
  py::class_<DistributedDataset>(m, "_DistributedDataset")
      .def("_next",
           [per_replica_of](DistributedDataset& d) {
             std::optional<PerReplica<Nest<Tensor>>> batch;
             {
               py::gil_scoped_release release;
               batch = d.get_next();
             }
             return per_replica_of(batch);
           })
      // begin(): a new pass (or the one a restore left part read), and its first step.
      .def("_begin", [per_replica_of](DistributedDataset& d) {
        std::optional<PerReplica<Nest<Tensor>>> batch;
        {
          py::gil_scoped_release release;
          auto it = d.begin();
          if (it != d.end()) batch = *it;
        }
        return per_replica_of(batch);
      });
  py::class_<Strategy> strategy = py::reinterpret_borrow<py::class_<Strategy>>(m.attr("Strategy"));
  strategy
      .def("_distribute_dataset",
           [](Strategy& s, const py::function& make_pass, std::int64_t global_batch_size) {
             // make_pass() gives the next pass's next-batch callable.
             DatasetFn passes = [fn = PyHandle(make_pass)] {
               py::gil_scoped_acquire gil;
               return batch_fn_of(fn.get()());
             };
             py::gil_scoped_release release;
             return s.experimental_distribute_dataset(std::move(passes), global_batch_size);
           })
      .def("_datasets_from_function", [](Strategy& s, const py::function& pipeline_fn) {
        // pipeline_fn(input_context) gives that pipeline's next-batch callable.
        auto dataset_fn = [fn = PyHandle(pipeline_fn)](const InputContext& c) {
          py::gil_scoped_acquire gil;
          return batch_fn_of(fn.get()(c));
        };
        py::gil_scoped_release release;
        return s.distribute_datasets_from_function(dataset_fn);
      });
}

}  // namespace

void bind_training(py::module_& m) {
  bind_variable_enums(m);
  bind_variables(m);
  bind_update(m);
  bind_optimizers(m);
  bind_datasets(m);
}

}  // namespace distribute::python
