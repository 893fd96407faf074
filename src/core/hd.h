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

// Host-only code the vector kernels instantiate from outside their `#pragma GCC target` region (core/variant.h's
// vector hooks, templates over a kernel's lane type): always inlined, for the same reason. A template function
// defined outside the region is compiled for the baseline wherever it is instantiated, so out of line (as GCC
// leaves it at -O2 under the sanitizers) it would take and return AVX vectors through the baseline's ABI: wrong
// values, no diagnostic (-Wno-psabi). scripts/check_isa_objects.py rejects any such function left out of line.
#if defined(__GNUC__)
#define ATTN_INLINE inline __attribute__((always_inline))
#else
#define ATTN_INLINE inline
#endif

// True while compiling device code (nvcc's device pass); the host model and the host pass see 0.
#if defined(__CUDA_ARCH__)
#define ATTN_DEVICE_PASS 1
#else
#define ATTN_DEVICE_PASS 0
#endif

// Unrolls the loop that follows in device code (nvcc's #pragma unroll); nothing on the host compilers, which
// would warn of an unknown pragma.
#if defined(__CUDACC__)
#define ATTN_UNROLL _Pragma("unroll")
#else
#define ATTN_UNROLL
#endif
