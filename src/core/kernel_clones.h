// DISTRIBUTE_KERNEL_CLONES: compiles a hot element-wise function three times
// (AVX-512, AVX2, baseline x86-64), each with everything it calls inlined
// (flatten); the dynamic loader picks the copy for the CPU at hand (GCC
// function multi-versioning, resolved once through an ifunc). The build turns
// floating-point contraction off (-ffp-contract=off), so no copy fuses a
// multiply and an add: every copy gives the same bits.
// Off under the sanitizers and other compilers: one portable copy.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define DISTRIBUTE_KERNEL_CLONES __attribute__((flatten, target_clones("avx512f", "avx2", "default")))
#else
#define DISTRIBUTE_KERNEL_CLONES
#endif
