// OpenBLAS as the training tool uses it: its thread count, what it chose,
// and kernels that fit the CPU. OpenBLAS (a DYNAMIC_ARCH build, as Debian's)
// picks its kernels from the CPU's model when it loads; a CPU newer than the
// OpenBLAS can get much older kernels (0.3.21 runs its SSE3 `Prescott`
// kernels on the device machine's Xeon, which it does not know), and
// OPENBLAS_CORETYPE, read only at load, is the one way to choose.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace distribute::train {

// OpenBLAS's thread count for every GEMM of this process (1: each replica's
// GEMMs run on its own thread only).
void set_blas_threads(int threads);
// "OpenBLAS 0.3.21 ... (SkylakeX kernels, 1 thread)", and why those kernels
// when OPENBLAS_CORETYPE chose them, for logs and benchmarks.
std::string blas_description();

// The widest vector instructions a CPU runs, or that an OpenBLAS core's
// GEMM kernels use.
enum class SimdLevel { kUnknown, kSse, kAvx, kAvx2, kAvx512 };
std::string_view to_string(SimdLevel level);
// This CPU's: AVX-512 with F, CD, BW, DQ and VL (what OpenBLAS's SkylakeX
// kernels use), AVX2 with FMA, AVX, or SSE.
SimdLevel cpu_simd_level();
// The level of an x86-64 OpenBLAS core name (any case); kUnknown for names
// not known here (another architecture, a newer OpenBLAS).
SimdLevel blas_core_level(std::string_view core);
// The OpenBLAS core to ask for instead of `picked` on a CPU of level `cpu`:
// the generic core of the CPU's level (SkylakeX, Haswell, SandyBridge) when
// `picked` is a known core below it; nothing when it fits or is unknown.
std::optional<std::string> better_blas_core(std::string_view picked, SimdLevel cpu);

// Why `core` cannot be asked for on a CPU of level `cpu` (not an x86-64
// OpenBLAS core known here, or kernels the CPU cannot run), or "" if it can.
std::string refuse_blas_core(std::string_view core, SimdLevel cpu);

// Run in main before any thread or MPI. `requested` is "auto" or a core
// name that refuse_blas_core accepts. With "auto", when OPENBLAS_CORETYPE
// is not set and OpenBLAS picked kernels below what the CPU runs
// (better_blas_core); with a name, unless OpenBLAS runs that core already:
// runs this program again (the same arguments) with OPENBLAS_CORETYPE set,
// and DISTRIBUTE_BLAS_PICKED and DISTRIBUTE_BLAS_WHY telling
// blas_description() what OpenBLAS had picked and why it changed. Returns
// when nothing is to change, in the run that follows, or when the new run
// cannot start (with a warning on stderr).
void fit_blas_to_cpu(char** argv, std::string_view requested);

}  // namespace distribute::train
