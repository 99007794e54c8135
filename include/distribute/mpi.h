// File: mpi.h  (library target distribute::mpi)
//
// The workers of a MultiWorkerMirroredStrategy, from MPI: one worker per MPI
// process. Start the program with any MPI launcher (mpirun, mpiexec, srun):
//
//   MultiWorkerMirroredStrategy strategy(2, distribute::mpi::cluster_from_launcher());
//
// MPI is initialised on first use with MPI_THREAD_SERIALIZED (replica threads
// call MPI one at a time) and finalised at exit. A program that initialised
// MPI itself, at that level or higher, can pass its own communicator.
#pragma once

#include <mpi.h>

#include <memory>

#include "distribute/communicator.h"

namespace distribute::mpi {

// True if this process was started by an MPI launcher (OpenMPI's mpirun,
// Hydra's mpiexec, PMIx or Slurm's srun set their variables in the environment).
bool started_by_launcher();

// The processes of MPI_COMM_WORLD if started by a launcher; nullptr (a
// one-worker cluster that never initialises MPI) otherwise. Every call makes
// a new communicator (a collective call: every process must make it).
std::shared_ptr<Communicator> cluster_from_launcher();

// The processes of `comm` (duplicated; the original is left alone). Throws
// FailedPreconditionError if MPI was initialised below MPI_THREAD_SERIALIZED.
std::shared_ptr<Communicator> cluster(MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace distribute::mpi
