// Checkpoints from Python: the engine's train::Checkpoint, CheckpointManager
// and CheckpointReader. distribute/train.py builds TF's API on them
// (keyword objects, nests of variables, attribute assignment).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "distribute/checkpoint.h"
#include "distribute/preemption.h"
#include "distribute/strategy.h"

namespace distribute::python {

namespace {

// A Variable, an Optimizer or a dataset from Python; anything else is a
// TypeError that names what was given.
train::Trackable trackable_of(const std::string& name, const py::handle& object) {
  if (py::isinstance<Variable>(object)) return train::Trackable(object.cast<const Variable&>());
  if (py::isinstance<Optimizer>(object)) return train::Trackable(object.cast<Optimizer&>());
  if (py::isinstance<DistributedDataset>(object)) return train::Trackable(object.cast<DistributedDataset&>());
  throw py::type_error("Checkpoint: '" + name + "' must be a Variable, an Optimizer or a dataset, got " +
                       std::string(py::str(object.get_type().attr("__name__"))));
}

void bind_status(py::module_& m) {
  using Status = train::CheckpointLoadStatus;
  py::class_<Status>(m, "CheckpointLoadStatus", "What restore() returns: TF's load-status assertions.")
      .def("assert_consumed", &Status::assert_consumed, py::return_value_policy::reference_internal)
      .def("assert_existing_objects_matched", &Status::assert_existing_objects_matched,
           py::return_value_policy::reference_internal)
      .def("assert_nontrivial_match", &Status::assert_nontrivial_match, py::return_value_policy::reference_internal)
      .def("expect_partial", &Status::expect_partial, py::return_value_policy::reference_internal);
}

void bind_options(py::module_& m) {
  py::class_<train::CheckpointOptions>(m, "CheckpointOptions",
                                       "tf.train.CheckpointOptions: experimental_enable_async_checkpoint saves in the "
                                       "background (at most one save in flight; sync() waits for it).")
      .def(py::init([](bool async) { return train::CheckpointOptions{.experimental_enable_async_checkpoint = async}; }),
           py::arg("experimental_enable_async_checkpoint") = false)
      .def_readwrite("experimental_enable_async_checkpoint",
                     &train::CheckpointOptions::experimental_enable_async_checkpoint)
      .def("__repr__", [](const train::CheckpointOptions& o) {
        return std::string("CheckpointOptions(experimental_enable_async_checkpoint=") +
               (o.experimental_enable_async_checkpoint ? "True" : "False") + ")";
      });
}

void bind_checkpoint(py::module_& m) {
  // The objects are tracked by distribute/train.py, which also keeps the
  // Python optimizers alive as long as the checkpoint (the engine holds them
  // by reference).
  py::class_<train::Checkpoint>(m, "_Checkpoint")
      .def(py::init<>())
      .def(
          "_track",
          [](train::Checkpoint& c, const std::string& name, const py::object& object) {
            train::Trackable t = trackable_of(name, object);
            py::gil_scoped_release release;
            c.track(name, std::move(t));
          },
          py::arg("name"), py::arg("object"))
      // Save and restore may wait for other workers (and read SyncOnRead
      // variables, a collective): the GIL is released.
      .def("save", &train::Checkpoint::save, py::arg("file_prefix"), py::arg("options") = train::CheckpointOptions{},
           py::call_guard<py::gil_scoped_release>())
      .def("write", &train::Checkpoint::write, py::arg("file_prefix"), py::arg("options") = train::CheckpointOptions{},
           py::call_guard<py::gil_scoped_release>())
      .def("restore", &train::Checkpoint::restore, py::arg("save_path"), py::keep_alive<0, 1>(),
           py::call_guard<py::gil_scoped_release>())
      .def("read", &train::Checkpoint::read, py::arg("save_path"), py::keep_alive<0, 1>(),
           py::call_guard<py::gil_scoped_release>())
      .def("sync", &train::Checkpoint::sync, py::call_guard<py::gil_scoped_release>())
      .def("_initial_value", &train::Checkpoint::initial_value, py::arg("name"))
      .def_property_readonly("save_counter", &train::Checkpoint::save_counter);
}

void bind_manager(py::module_& m) {
  py::class_<train::CheckpointManager>(m, "_CheckpointManager")
      .def(py::init([](train::Checkpoint& checkpoint, std::string directory, std::optional<int> max_to_keep,
                       std::optional<double> keep_every_n_hours, std::string checkpoint_name,
                       std::optional<Variable> step_counter, std::optional<std::int64_t> checkpoint_interval,
                       const py::object& init_fn) {
             train::CheckpointManagerOptions options{.keep_checkpoint_every_n_hours = keep_every_n_hours,
                                                     .checkpoint_name = std::move(checkpoint_name),
                                                     .step_counter = std::move(step_counter),
                                                     .checkpoint_interval = checkpoint_interval};
             if (!init_fn.is_none()) {
               // Called from restore_or_initialize, with the GIL released.
               options.init_fn = [fn = PyHandle(init_fn)] {
                 py::gil_scoped_acquire gil;
                 fn.get()();
               };
             }
             py::gil_scoped_release release;
             return std::make_unique<train::CheckpointManager>(checkpoint, std::move(directory), max_to_keep,
                                                               std::move(options));
           }),
           py::arg("checkpoint"), py::arg("directory"), py::arg("max_to_keep"),
           py::arg("keep_checkpoint_every_n_hours") = py::none(), py::arg("checkpoint_name") = "ckpt",
           py::arg("step_counter") = py::none(), py::arg("checkpoint_interval") = py::none(),
           py::arg("init_fn") = py::none(), py::keep_alive<1, 2>())
      .def(
          "save",
          [](train::CheckpointManager& mgr, std::optional<std::int64_t> number, bool check_interval,
             const train::CheckpointOptions& options) {
            py::gil_scoped_release release;
            return mgr.save(number, check_interval, options);
          },
          py::arg("checkpoint_number") = py::none(), py::arg("check_interval") = true,
          py::arg("options") = train::CheckpointOptions{})
      .def("sync", &train::CheckpointManager::sync, py::call_guard<py::gil_scoped_release>())
      .def("restore_or_initialize",
           [](train::CheckpointManager& mgr) {
             py::gil_scoped_release release;
             return mgr.restore_or_initialize();
           })
      .def_property_readonly("latest_checkpoint", &train::CheckpointManager::latest_checkpoint)
      .def_property_readonly("checkpoints", &train::CheckpointManager::checkpoints)
      .def_property_readonly("directory", &train::CheckpointManager::directory);
}

void bind_reader(py::module_& m) {
  py::class_<train::CheckpointEntry>(m, "CheckpointEntry", "One tensor of a checkpoint, as its manifest names it.")
      .def_readonly("key", &train::CheckpointEntry::key)
      .def_readonly("full_name", &train::CheckpointEntry::full_name)
      .def_readonly("dtype", &train::CheckpointEntry::dtype)
      .def_property_readonly("shape", [](const train::CheckpointEntry& e) { return shape_tuple(e.shape); })
      .def_readonly("file", &train::CheckpointEntry::file)
      .def_readonly("offset", &train::CheckpointEntry::offset)
      .def_readonly("size", &train::CheckpointEntry::size)
      .def_readonly("crc32c", &train::CheckpointEntry::crc32c)
      .def("__repr__", [](const train::CheckpointEntry& e) {
        return "CheckpointEntry(" + e.key + ", " + std::string(to_string(e.dtype)) + e.shape.to_string() + ")";
      });
  py::class_<train::CheckpointReader>(m, "CheckpointReader",
                                      "tf.train.load_checkpoint: a checkpoint's tensors, read without a model.")
      .def(py::init<const std::string&>(), py::arg("path"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("prefix", &train::CheckpointReader::prefix)
      .def("entries", &train::CheckpointReader::entries)
      .def("has_tensor", [](const train::CheckpointReader& r, const std::string& key) { return r.has_tensor(key); })
      .def(
          "get_tensor",
          [](const train::CheckpointReader& r, const std::string& key) {
            Tensor t;
            {
              py::gil_scoped_release release;
              t = r.get_tensor(key);
            }
            return py::cast(t).attr("numpy")();
          },
          py::arg("key"), "The tensor's value as a numpy array, its CRC32C checked.")
      .def("get_variable_to_shape_map",
           [](const train::CheckpointReader& r) {
             py::dict out;
             for (const auto& e : r.entries()) out[py::str(e.key)] = py::list(shape_tuple(e.shape));
             return out;
           })
      .def("get_variable_to_dtype_map",
           [](const train::CheckpointReader& r) {
             py::dict out;
             for (const auto& e : r.entries()) out[py::str(e.key)] = py::cast(e.dtype);
             return out;
           })
      .def("verify", &train::CheckpointReader::verify, py::call_guard<py::gil_scoped_release>(),
           "Reads every tensor and checks its CRC32C: one line per problem, empty when sound.")
      .def_property_readonly("step", &train::CheckpointReader::step)
      .def_property_readonly("save_counter", &train::CheckpointReader::save_counter)
      .def_property_readonly("layout", &train::CheckpointReader::layout);
  m.def("latest_checkpoint", &train::latest_checkpoint, py::arg("checkpoint_dir"),
        py::call_guard<py::gil_scoped_release>(),
        "tf.train.latest_checkpoint: the newest whole checkpoint the directory's index names, or None.");
}

void bind_preemption(py::module_& m) {
  using Handler = train::PreemptionCheckpointHandler;
  py::class_<Handler>(m, "_PreemptionCheckpointHandler")
      .def(
          py::init([](Strategy& strategy, train::CheckpointManager& manager, const py::object& exit_fn,
                      double exchange_budget, double max_stop_delay_seconds, std::int64_t max_steps_between_exchanges) {
            train::TerminationConfig config{.exchange_budget = exchange_budget,
                                            .max_stop_delay_seconds = max_stop_delay_seconds,
                                            .max_steps_between_exchanges = max_steps_between_exchanges};
            // Python's exit_fn (sys.exit(42) by default): the SystemExit it
            // raises leaves _save_checkpoint_if_preempted to the caller.
            config.exit_fn = [fn = PyHandle(exit_fn)] {
              py::gil_scoped_acquire gil;
              fn.get()();
            };
            py::gil_scoped_release release;  // the restore may wait for other workers
            return std::make_unique<Handler>(strategy, manager, std::move(config));
          }),
          py::arg("strategy"), py::arg("manager"), py::arg("exit_fn"), py::arg("exchange_budget"),
          py::arg("max_stop_delay_seconds"), py::arg("max_steps_between_exchanges"), py::keep_alive<1, 2>(),
          py::keep_alive<1, 3>())
      .def("_save_checkpoint_if_preempted", &Handler::save_checkpoint_if_preempted,
           py::call_guard<py::gil_scoped_release>())
      .def("_request_stop", &Handler::request_stop)
      .def_property_readonly("total_run_calls", &Handler::total_run_calls)
      .def_property_readonly("saved_path", &Handler::saved_path);
}

}  // namespace

void bind_checkpoints(py::module_& m) {
  bind_options(m);
  bind_status(m);
  bind_checkpoint(m);
  bind_manager(m);
  bind_reader(m);
  bind_preemption(m);
}

}  // namespace distribute::python
