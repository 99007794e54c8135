#include "core/cuda/cuda_check.h"

#include <string>

#include "distribute/errors.h"

namespace distribute::internal {

std::string cuda_error_text(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

void throw_cuda_error(cudaError_t error, std::string_view what) {
  // A failed call leaves its error as the thread's last error (sticky ones
  // stay in the context whatever is done); clear it so that the next call
  // is not blamed.
  static_cast<void>(cudaGetLastError());
  const std::string message = std::string(what) + " failed: " + cuda_error_text(error);
  if (error == cudaErrorMemoryAllocation) throw ResourceExhaustedError(message);
  throw InternalError(message);
}

}  // namespace distribute::internal
