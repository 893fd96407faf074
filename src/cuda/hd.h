// Host-and-device function marker for the CUDA backend's shared code (src/cuda/*.h).
//
// Under nvcc, ATTN_HD functions compile for both sides; under a plain C++ compiler they are ordinary inline
// functions, so that the host tests (tests/test_cuda_*.cc) run the same index arithmetic and per-warp code as
// the kernels. The definition is the one core/online_softmax.h uses (whichever header comes first defines it;
// the two must stay identical, or the compiler reports the redefinition).
#pragma once

#if !defined(ATTN_HD)
#if defined(__CUDACC__)
#define ATTN_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define ATTN_HD inline __attribute__((always_inline))
#else
#define ATTN_HD inline
#endif
#endif

// True while compiling device code (nvcc's device pass); the host model and the host pass see 0.
#if defined(__CUDA_ARCH__)
#define ATTN_DEVICE_PASS 1
#else
#define ATTN_DEVICE_PASS 0
#endif
