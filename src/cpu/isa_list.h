// The instruction-set levels the vector kernels are compiled for, lowest first: the one list. CMake reads the
// X(...) lines below to compile src/cpu/isa_unit.cc.in once per level (the kernels of that level, in namespace
// attn::cpu::<name>); cpu/kernels.h turns them into the Isa enum and cpu/dispatch.cc into the dispatch table,
// with AMX (bf16 prefill on the tile unit, everything else on the last level's kernels) appended as `amx`.
//   X(name, GCC/clang target attribute string, cpu/vec.h flavour, usable on this CPU and OS given CpuFeatures f)
// Adding a level is one line here (and, for a new vector width, a flavour in cpu/vec.h).
#pragma once

#define ATTN_VECTOR_ISAS(X)                                                                                \
  X(sse2, "sse2", SSE2, true)                                                                              \
  X(avx2, "avx2,fma,f16c", AVX2, f.avx2_usable())                                                          \
  X(avx512, "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c", AVX512, f.avx512_usable())                 \
  X(avx512bf16, "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c", AVX512,                     \
    f.avx512_usable() && f.avx512_bf16)
