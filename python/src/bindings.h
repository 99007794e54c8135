// The pieces of the `distribute._distribute` extension module, one per file.
#pragma once

#include <pybind11/pybind11.h>

namespace distribute::python {

void bind_errors(pybind11::module_& m);        // module.cc: C++ errors as distribute.errors classes
void bind_tensor(pybind11::module_& m);        // tensor_bindings.cc: DType, Tensor, constant, DLPack
void bind_strategy(pybind11::module_& m);      // strategy_bindings.cc: strategies, contexts, collectives
void bind_training(pybind11::module_& m);      // training_bindings.cc: variables, optimizers, datasets
void bind_checkpoints(pybind11::module_& m);   // checkpoint_bindings.cc: Checkpoint, CheckpointManager, reader
void bind_multi_worker(pybind11::module_& m);  // multi_worker_bindings.cc, with MPI only

}  // namespace distribute::python
