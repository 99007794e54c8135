#include <cstdlib>

#include "comm/mpi/mpi_communicator.h"
#include "distribute/mpi.h"

namespace distribute::mpi {

bool started_by_launcher() {
  // OpenMPI (mpirun), PMIx (OpenMPI 5, srun --mpi=pmix), PMI-1/2 (MPICH's and
  // Intel's mpiexec, srun --mpi=pmi2), Hydra.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return true;
  }
  return false;
}

std::shared_ptr<Communicator> cluster_from_launcher() {
  if (!started_by_launcher()) return nullptr;
  return cluster(MPI_COMM_WORLD);
}

std::shared_ptr<Communicator> cluster(MPI_Comm comm) { return std::make_shared<internal::MpiCommunicator>(comm); }

}  // namespace distribute::mpi
