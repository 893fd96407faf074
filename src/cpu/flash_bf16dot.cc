// The bf16 pair-product forward of cpu/flash_amx.cc with its two products on AVX512-BF16 dot products
// (vdpbf16ps) instead of AMX tiles: the same kernel body, compiled a second time in namespace attn::cpu::bf16dot.
// cpu/dispatch.cc chooses it at the avx512bf16 level for bf16 prefill.
#define ATTN_BF16_DOT 1
#include "cpu/flash_amx.cc"
