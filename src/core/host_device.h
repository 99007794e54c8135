// DIST_HOST_DEVICE marks a function that both the host compiler and nvcc
// compile (for the CPU kernels and the GPU kernels alike): one definition of
// the arithmetic, so that a GPU's results are the CPU engine's, bit for bit.
#pragma once

#if defined(__CUDACC__)
#define DIST_HOST_DEVICE __host__ __device__
#else
#define DIST_HOST_DEVICE
#endif
