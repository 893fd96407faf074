// The host-and-device function marker of the code the CPU kernels and the CUDA backend share (the online-softmax
// state, the variants, the dropout counters) and of the CUDA backend's own index arithmetic and per-warp code.
//
// Under nvcc, ATTN_HD functions compile for both sides; under a plain C++ compiler they are inline and always
// inlined: the vector kernels, compiled per instruction set inside a `#pragma GCC target` region, then get the
// shared arithmetic compiled for their own target (a function defined outside the region would be compiled for
// the baseline and called, not inlined), and the host tests (tests/test_cuda_*.cc) run the same index
// arithmetic and per-warp code as the kernels.
#pragma once

#if defined(__CUDACC__)
#define ATTN_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define ATTN_HD inline __attribute__((always_inline))
#else
#define ATTN_HD inline
#endif

// True while compiling device code (nvcc's device pass); the host model and the host pass see 0.
#if defined(__CUDA_ARCH__)
#define ATTN_DEVICE_PASS 1
#else
#define ATTN_DEVICE_PASS 0
#endif
