// File: dlpack.h
//
// Zero-copy exchange of tensors with other libraries (numpy, PyTorch, JAX,
// TVM, ...) through DLPack (Debian's libdlpack-dev, the 0.6 ABI).
//
//   DLManagedTensor* m = to_dlpack(t);   // shares t's storage; the consumer calls m->deleter(m)
//   Tensor u = from_dlpack(m);           // takes ownership of m on success
#pragma once

#include <dlpack/dlpack.h>

#include "distribute/tensor.h"

namespace distribute {

// Exports `t` without copying. The returned tensor keeps t's storage alive
// until its deleter is called; call it exactly once. A read-only tensor
// (Tensor::is_read_only) is exported as a copy: DLPack 0.6 cannot tell its
// consumer not to write.
DLManagedTensor* to_dlpack(const Tensor& t);

// Imports a CPU tensor without copying. Accepted: device kDLCPU (or
// kDLCUDAHost), lanes == 1, a dtype that maps to a distribute::DType,
// compact row-major strides (or none), at most 64 dimensions, and elements
// aligned to their size where they start (data + byte_offset). Anything else throws
// InvalidArgumentError (UnimplementedError for a supported-elsewhere device)
// and leaves ownership with the caller. On success the Tensor owns `managed`
// and calls its deleter when the last copy of the Tensor goes away.
Tensor from_dlpack(DLManagedTensor* managed);

// DLPack's description of a dtype. DLPack 0.6 has no bool code; bool uses
// code 6, the kDLBool of DLPack 0.8 and later.
DLDataType to_dl_dtype(DType dtype);

}  // namespace distribute
