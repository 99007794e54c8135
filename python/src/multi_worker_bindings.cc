// MultiWorkerMirroredStrategy in Python: one worker per MPI process, started
// by mpirun (built where the MPI backend is, DIST_PYTHON_HAVE_MPI).
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "distribute/mpi.h"

namespace distribute::python {

void bind_multi_worker(py::module_& m) {
  m.def("_started_by_launcher", &mpi::started_by_launcher,
        "Whether an MPI launcher (mpirun, mpiexec, srun) started this process.");
  py::class_<MultiWorkerMirroredStrategy, Strategy>(
      m, "MultiWorkerMirroredStrategy",
      "Replicas on every worker process of an MPI job (mpirun -np N python3 ...), several per worker; without "
      "a launcher, one worker.")
      .def(py::init([](const py::object& local_devices, const py::object& options) {
             // Every worker makes it: the workers meet (a collective, which
             // MPI cannot cancel), on a thread of its own, so that Ctrl-C
             // ends the wait for a worker that never comes.
             const CommunicationOptions o = options_argument(options);
             std::optional<std::vector<std::string>> devices;  // none: `replicas` CPUs
             int replicas = 1;
             if (!local_devices.is_none() &&
                 (PyIndex_Check(local_devices.ptr()) != 0 && !PyBool_Check(local_devices.ptr()))) {
               replicas = int_argument(local_devices, "MultiWorkerMirroredStrategy: local_devices");
             } else if (!local_devices.is_none()) {
               devices =
                   map_gpu_names(device_names_argument(local_devices, "MultiWorkerMirroredStrategy: local_devices"));
             }
             // A meeting that Ctrl-C left still waiting owns the workers' link
             // until it ends: a second one would mix its messages with it.
             static std::atomic<bool> meeting{false};
             if (meeting.exchange(true)) {
               throw FailedPreconditionError(
                   "MultiWorkerMirroredStrategy: an earlier one, interrupted while it waited for the other "
                   "workers, is still meeting them; a new one can be made once that meeting has ended");
             }
             using Made = std::unique_ptr<MultiWorkerMirroredStrategy>;
             return wait_interruptibly<Made>([devices, replicas, o]() -> Made {
               struct Ended {
                 Ended() = default;
                 Ended(const Ended&) = delete;
                 Ended& operator=(const Ended&) = delete;
                 ~Ended() { meeting.store(false); }
               } ended;
               if (!devices) {
                 return made_here(
                     std::make_unique<MultiWorkerMirroredStrategy>(replicas, mpi::cluster_from_launcher(), o));
               }
               return with_gpus_as_cpus_hint(*devices, [&] {
                 return made_here(
                     std::make_unique<MultiWorkerMirroredStrategy>(*devices, mpi::cluster_from_launcher(), o));
               });
             });
           }),
           py::arg("local_devices") = py::none(), py::arg("communication_options") = py::none(),
           "local_devices: this worker's devices (['CPU:0', 'CPU:1']) or their number; one replica by default.")
      .def_property_readonly("worker_rank", &MultiWorkerMirroredStrategy::worker_rank)
      .def_property_readonly("num_workers", &MultiWorkerMirroredStrategy::num_workers);
}

}  // namespace distribute::python
