// MultiWorkerMirroredStrategy in Python: one worker per MPI process, started
// by mpirun (built where the MPI backend is, DIST_PYTHON_HAVE_MPI).
#include <pybind11/stl.h>

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
      .def(
          py::init([](const py::object& local_devices, const std::optional<CommunicationOptions>& options) {
            // Every worker makes it: the workers meet (a collective), so
            // the GIL is let go meanwhile.
            const CommunicationOptions o = options.value_or(CommunicationOptions{});
            if (local_devices.is_none() ||
                (PyIndex_Check(local_devices.ptr()) != 0 && !PyBool_Check(local_devices.ptr()))) {
              const int replicas = local_devices.is_none()
                                       ? 1
                                       : int_argument(local_devices, "MultiWorkerMirroredStrategy: local_devices");
              py::gil_scoped_release release;
              return made_here(
                  std::make_unique<MultiWorkerMirroredStrategy>(replicas, mpi::cluster_from_launcher(), o));
            }
            const auto devices =
                map_gpu_names(device_names_argument(local_devices, "MultiWorkerMirroredStrategy: local_devices"));
            py::gil_scoped_release release;
            return with_gpus_as_cpus_hint(devices, [&] {
              return made_here(std::make_unique<MultiWorkerMirroredStrategy>(devices, mpi::cluster_from_launcher(), o));
            });
          }),
          py::arg("local_devices") = py::none(), py::arg("communication_options") = py::none(),
          "local_devices: this worker's devices (['CPU:0', 'CPU:1']) or their number; one replica by default.")
      .def_property_readonly("worker_rank", &MultiWorkerMirroredStrategy::worker_rank)
      .def_property_readonly("num_workers", &MultiWorkerMirroredStrategy::num_workers);
}

}  // namespace distribute::python
