// Which CUDA devices the process sees. The library does not link the CUDA
// runtime: a CPU-only program must run where libcudart is absent. The probe
// loads it when the device layout is first read (dlopen), and finds no GPU,
// saying why, where it cannot. GPU memory and kernels are in the separate
// distribute::cuda library (src/core/cuda/), which links the runtime.
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "core/device_registry.h"
#include "distribute/errors.h"

#ifdef DIST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace distribute::internal {

#ifdef DIST_HAVE_CUDA

namespace {

// The runtime's entry points, by the names the header gives them (CUDA 12
// maps cudaGetDeviceProperties to cudaGetDeviceProperties_v2).
#define DIST_NAME_OF(symbol) DIST_NAME_OF_EXPANDED(symbol)
#define DIST_NAME_OF_EXPANDED(symbol) #symbol

struct CudaRuntime {
  decltype(&::cudaGetDeviceCount) get_device_count = nullptr;
  decltype(&::cudaGetDeviceProperties) get_device_properties = nullptr;
  decltype(&::cudaRuntimeGetVersion) runtime_get_version = nullptr;
  decltype(&::cudaDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cudaGetErrorName) get_error_name = nullptr;
  decltype(&::cudaGetErrorString) get_error_string = nullptr;
  decltype(&::cudaGetLastError) get_last_error = nullptr;
  std::string why_not;  // empty once loaded
};

template <class F>
void find(void* library, const char* name, F& out, std::string& why_not) {
  out = reinterpret_cast<F>(dlsym(library, name));  // NOLINT: dlsym gives an untyped address
  if (out == nullptr && why_not.empty()) why_not = std::string("the CUDA runtime has no ") + name;
}

// Loaded once, kept for the process (never closed: other libraries of the
// process may share it).
const CudaRuntime& cuda_runtime() {
  static const CudaRuntime runtime = [] {
    CudaRuntime r;
    // The major version this build was compiled against, only (another's
    // structures differ): from the toolkit the build used, then wherever
    // the loader looks (LD_LIBRARY_PATH, ld.so.conf). CUDA 11 names it
    // libcudart.so.11.0.
    const std::string major = std::to_string(CUDART_VERSION / 1000);
    const std::string name = "libcudart.so." + major;
    void* library = nullptr;
    for (const std::string& candidate : {std::string(DIST_CUDART_DIR) + "/" + name, name, name + ".0"}) {
      library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library != nullptr) break;
    }
    if (library == nullptr) {
      const char* error = dlerror();
      r.why_not = "the CUDA runtime (" + name + ") could not be loaded: " + (error != nullptr ? error : "not found");
      return r;
    }
    find(library, DIST_NAME_OF(cudaGetDeviceCount), r.get_device_count, r.why_not);
    find(library, DIST_NAME_OF(cudaGetDeviceProperties), r.get_device_properties, r.why_not);
    find(library, DIST_NAME_OF(cudaRuntimeGetVersion), r.runtime_get_version, r.why_not);
    find(library, DIST_NAME_OF(cudaDriverGetVersion), r.driver_get_version, r.why_not);
    find(library, DIST_NAME_OF(cudaGetErrorName), r.get_error_name, r.why_not);
    find(library, DIST_NAME_OF(cudaGetErrorString), r.get_error_string, r.why_not);
    find(library, DIST_NAME_OF(cudaGetLastError), r.get_last_error, r.why_not);
    int version = 0;
    if (r.why_not.empty() &&
        (r.runtime_get_version(&version) != cudaSuccess || version / 1000 != CUDART_VERSION / 1000)) {
      r.why_not = "the CUDA runtime loaded is version " + std::to_string(version) + ", not " + major +
                  ".x as this build of distribute";
    }
    return r;
  }();
  return runtime;
}

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

std::string error_text(const CudaRuntime& cuda, cudaError_t error) {
  return std::string(cuda.get_error_name(error)) + ": " + cuda.get_error_string(error);
}

// Why cudaGetDeviceCount failed, in words a user can act on.
std::string no_gpu_reason(const CudaRuntime& cuda, cudaError_t error) {
  std::string why = error_text(cuda, error);
  int runtime = 0;
  int driver = 0;
  static_cast<void>(cuda.runtime_get_version(&runtime));
  if (cuda.driver_get_version(&driver) == cudaSuccess && driver == 0) {
    why = "no NVIDIA driver is loaded (" + why + ")";
  } else if (driver > 0 && driver < runtime) {
    why = "the NVIDIA driver supports CUDA " + version_text(driver) + ", older than this build's runtime, CUDA " +
          version_text(runtime) + " (" + why + ")";
  }
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    why += "; CUDA_VISIBLE_DEVICES='" + std::string(visible) + "'";
  }
  static_cast<void>(cuda.get_last_error());  // the failure is reported here, not left for the next call
  return why;
}

}  // namespace

GpuProbe probe_gpus() {
  GpuProbe probe;
  const CudaRuntime& cuda = cuda_runtime();
  if (!cuda.why_not.empty()) {
    probe.why_none = cuda.why_not;
    return probe;
  }
  int count = 0;
  if (const cudaError_t e = cuda.get_device_count(&count); e != cudaSuccess) {
    probe.why_none = no_gpu_reason(cuda, e);
    return probe;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (const cudaError_t e = cuda.get_device_properties(&prop, d); e != cudaSuccess) {
      static_cast<void>(cuda.get_last_error());
      throw InternalError("cudaGetDeviceProperties(" + std::to_string(d) + ") failed: " + error_text(cuda, e));
    }
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
