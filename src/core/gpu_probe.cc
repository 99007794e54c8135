// Which CUDA devices the process sees, from the CUDA runtime; in a build
// without CUDA, none, and why.
#include <cstdlib>
#include <string>

#include "core/device_registry.h"

#ifdef DIST_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda/cuda_check.h"
#endif

namespace distribute::internal {

#ifdef DIST_HAVE_CUDA

namespace {
std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// Why cudaGetDeviceCount failed, in words a user can act on.
std::string no_gpu_reason(cudaError_t error) {
  std::string why = cuda_error_text(error);
  int runtime = 0;
  int driver = 0;
  static_cast<void>(cudaRuntimeGetVersion(&runtime));
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0) {
    why = "no NVIDIA driver is loaded (" + why + ")";
  } else if (driver > 0 && driver < runtime) {
    why = "the NVIDIA driver supports CUDA " + version_text(driver) + ", older than this build's runtime, CUDA " +
          version_text(runtime) + " (" + why + ")";
  }
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    why += "; CUDA_VISIBLE_DEVICES='" + std::string(visible) + "'";
  }
  static_cast<void>(cudaGetLastError());  // the failure is reported here, not left for the next call
  return why;
}
}  // namespace

GpuProbe probe_gpus() {
  GpuProbe probe;
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    probe.why_none = no_gpu_reason(e);
    return probe;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties(" + std::to_string(d) + ")");
    probe.gpus.push_back({prop.name, prop.major, prop.minor, static_cast<std::int64_t>(prop.totalGlobalMem)});
  }
  if (count == 0) probe.why_none = "the CUDA runtime lists no device";
  return probe;
}

#else

GpuProbe probe_gpus() {
  return {{}, "this build of distribute has no GPU support (it was built without the CUDA toolkit)"};
}

#endif

}  // namespace distribute::internal
