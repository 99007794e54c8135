// CUDA runtime errors as the library's typed errors. Every CUDA call's
// result goes through check_cuda: an error is raised with CUDA's own name and
// message and the call that failed, and cleared, so that it is never ignored
// or left for the next call to find. Out of memory is ResourceExhaustedError.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

namespace distribute::internal {

// "cudaErrorNoDevice: no CUDA-capable device is detected".
std::string cuda_error_text(cudaError_t error);

// Throws for any result but cudaSuccess: ResourceExhaustedError for
// cudaErrorMemoryAllocation, InternalError otherwise; `what` names the call
// and what it was for ("cudaMalloc(4096 bytes) on GPU:1").
void throw_cuda_error(cudaError_t error, std::string_view what);

inline void check_cuda(cudaError_t error, std::string_view what) {
  if (error != cudaSuccess) throw_cuda_error(error, what);
}

}  // namespace distribute::internal
