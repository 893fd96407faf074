// Which vector instructions issue beside the decode's products at no cost, and which take the products' own pipes:
// eight independent `vdpbf16ps` (or `vfmadd231ps`) per iteration, timed alone and then with n extra instructions of
// one kind on registers of their own (no dependency on the products), one core, registers only (loads from L1 where
// the instruction reads memory). An extra instruction's cost is printed in products,
// (t − t_alone) / (t_alone / 8) / n: 0 where it issues beside them, 1 where it takes a product's slot. Last, the
// widening sequences of the 8- and 4-bit decode (src/cpu/flash_kernel.h: load_pairs, q4_nibbles) and alternatives
// built from instructions that cost nothing alone, each as it would run beside one K row's 4 lanes of products (a
// GQA group of 4).
//
// For whoever wants the 8- or 4-bit decode cheaper: on a core where the products and the shuffles share a pipe and
// one more 512-bit instruction issues beside each product (Zen 4: bench/results_zen4_pipes.md), a widening is judged
// by its cross-lane shuffles and by how many instructions it adds per product, not by its instruction count alone.
//
// Built on request only: cmake --build build --target micro_pipes && build/micro_pipes
// x86-64 GCC (inline assembly; the functions' target attributes allow zmm16-31 in the clobbers); needs AVX512-BF16
// and AVX512-VBMI at run time (it says so and exits otherwise).
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace {

alignas(64) std::int8_t g_bytes[4096];

#define ATTN_MICRO_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi"), noinline))
#define CLOBBERS                                                                                                     \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",        \
      "xmm15", "xmm16", "xmm17", "memory"

// The products: eight independent accumulators zmm0-7, operands zmm8 and zmm9.
#define DP8                                                                                                          \
  "vdpbf16ps %%zmm8, %%zmm9, %%zmm0\n vdpbf16ps %%zmm8, %%zmm9, %%zmm1\n vdpbf16ps %%zmm8, %%zmm9, %%zmm2\n"         \
  "vdpbf16ps %%zmm8, %%zmm9, %%zmm3\n vdpbf16ps %%zmm8, %%zmm9, %%zmm4\n vdpbf16ps %%zmm8, %%zmm9, %%zmm5\n"         \
  "vdpbf16ps %%zmm8, %%zmm9, %%zmm6\n vdpbf16ps %%zmm8, %%zmm9, %%zmm7\n"
#define FMA8                                                                                                         \
  "vfmadd231ps %%zmm8, %%zmm9, %%zmm0\n vfmadd231ps %%zmm8, %%zmm9, %%zmm1\n vfmadd231ps %%zmm8, %%zmm9, %%zmm2\n"   \
  "vfmadd231ps %%zmm8, %%zmm9, %%zmm3\n vfmadd231ps %%zmm8, %%zmm9, %%zmm4\n vfmadd231ps %%zmm8, %%zmm9, %%zmm5\n"   \
  "vfmadd231ps %%zmm8, %%zmm9, %%zmm6\n vfmadd231ps %%zmm8, %%zmm9, %%zmm7\n"

// One instruction of a kind on register r (zmm10-17), its other operands zmm20/zmm21 or L1 at %0.
#define PADDD(r) "vpaddd %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define PANDD(r) "vpandd %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define PSRLD(r) "vpsrld $16, %%zmm" r ", %%zmm" r "\n"
#define ADDPS(r) "vaddps %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define CVTDQ2PS(r) "vcvtdq2ps %%zmm" r ", %%zmm" r "\n"
#define PMOVSXBD(r) "vpmovsxbd (%0), %%zmm" r "\n"
#define PMOVZXBW(r) "vpmovzxbw (%0), %%zmm" r "\n"
#define UNPCKLPS(r) "vunpcklps %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define PUNPCKLWD(r) "vpunpcklwd %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define SHUFPS(r) "vshufps $0x44, %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define PSHUFB(r) "vpshufb %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define PERMW(r) "vpermw %%zmm" r ", %%zmm20, %%zmm" r "\n"
#define PERMT2W(r) "vpermt2w %%zmm20, %%zmm21, %%zmm" r "\n"
#define PERMI2B(r) "vpermi2b %%zmm20, %%zmm21, %%zmm" r "\n"
#define SHUFF32X4(r) "vshuff32x4 $0x44, %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define CVTNE2PS2BF16(r) "vcvtne2ps2bf16 %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define BROADCASTI32X4(r) "vbroadcasti32x4 (%0), %%zmm" r "\n"
#define LOADZMM(r) "vmovdqu64 (%0), %%zmm" r "\n"
#define PMULLW(r) "vpmullw %%zmm20, %%zmm" r ", %%zmm" r "\n"
#define X4(op) op("10") op("11") op("12") op("13")
#define X8(op) X4(op) op("14") op("15") op("16") op("17")
#define X16(op) X8(op) X8(op)

// 32 8-bit values at %0 + o as 32 bf16 in a (b a scratch register), as load_pairs does: sign-extended to 32 bits,
// converted to fp32 (exact), the two vectors' upper halves gathered by one word permute (index in zmm20).
#define I8_PERMUTE(a, b, o)                                                                                          \
  "vpmovsxbd " o "(%0), %%zmm" a "\n vpmovsxbd " o "+16(%0), %%zmm" b "\n vcvtdq2ps %%zmm" a ", %%zmm" a "\n"       \
  "vcvtdq2ps %%zmm" b ", %%zmm" b "\n vpermt2w %%zmm" b ", %%zmm20, %%zmm" a "\n"
// The same values paired without a shuffle: a's fp32 shifted to its lower half, or'ed with b's (whose lower half is
// zero): lane i holds values i and 16 + i (q laid out to match), or, for P·V, two keys' values of one dim.
#define I8_SHIFT_OR(a, b, o)                                                                                         \
  "vpmovsxbd " o "(%0), %%zmm" a "\n vpmovsxbd " o "+16(%0), %%zmm" b "\n vcvtdq2ps %%zmm" a ", %%zmm" a "\n"       \
  "vcvtdq2ps %%zmm" b ", %%zmm" b "\n vpsrld $16, %%zmm" a ", %%zmm" a "\n vpord %%zmm" b ", %%zmm" a ", %%zmm" a "\n"
// 64 4-bit values (32 bytes at %0 + o) as bf16 by two lookups, as q4_nibbles does (table in zmm20).
#define Q4_LOOKUP(a, b, o)                                                                                           \
  "vpmovzxbw " o "(%0), %%zmm" a "\n vpsrlw $4, %%zmm" a ", %%zmm" b "\n vpermw %%zmm" a ", %%zmm20, %%zmm" a "\n" \
  "vpermw %%zmm" b ", %%zmm20, %%zmm" b "\n"
// 32 4-bit values (16 bytes) without a shuffle: nibbles masked and shifted in 32-bit lanes, less the bias (zmm21),
// converted, paired by shift and or.
#define Q4_NO_SHUFFLE(a, b, o)                                                                                       \
  "vpmovzxbd " o "(%0), %%zmm" a "\n vpsrld $4, %%zmm" a ", %%zmm" b "\n vpandd %%zmm20, %%zmm" a ", %%zmm" a "\n"  \
  "vpsubd %%zmm21, %%zmm" a ", %%zmm" a "\n vpsubd %%zmm21, %%zmm" b ", %%zmm" b "\n"                             \
  "vcvtdq2ps %%zmm" a ", %%zmm" a "\n vcvtdq2ps %%zmm" b ", %%zmm" b "\n vpsrld $16, %%zmm" a ", %%zmm" a "\n"      \
  "vpord %%zmm" b ", %%zmm" a ", %%zmm" a "\n"

constexpr long kIters = 20'000'000;

// Each case: whether its products are FMAs, an id, the products (DP8 or FMA8), the extra instructions, how many,
// a name.
#define CASES(X)                                                                                                       \
  X(false, dp_alone, DP8, "", 0, "vdpbf16ps x8 alone")                                                                 \
  X(false, dp_paddd, DP8, X8(PADDD), 8, "vpaddd")                                                                      \
  X(false, dp_paddd16, DP8, X16(PADDD), 16, "vpaddd")                                                                  \
  X(false, dp_pandd, DP8, X8(PANDD), 8, "vpandd")                                                                      \
  X(false, dp_psrld, DP8, X8(PSRLD), 8, "vpsrld")                                                                      \
  X(false, dp_addps, DP8, X8(ADDPS), 8, "vaddps")                                                                      \
  X(false, dp_cvt, DP8, X8(CVTDQ2PS), 8, "vcvtdq2ps")                                                                  \
  X(false, dp_cvt16, DP8, X16(CVTDQ2PS), 16, "vcvtdq2ps")                                                              \
  X(false, dp_pmovsxbd, DP8, X4(PMOVSXBD), 4, "vpmovsxbd (mem)")                                                       \
  X(false, dp_pmovzxbw, DP8, X4(PMOVZXBW), 4, "vpmovzxbw (mem)")                                                       \
  X(false, dp_unpcklps, DP8, X4(UNPCKLPS), 4, "vunpcklps")                                                             \
  X(false, dp_punpcklwd, DP8, X4(PUNPCKLWD), 4, "vpunpcklwd")                                                          \
  X(false, dp_shufps, DP8, X4(SHUFPS), 4, "vshufps")                                                                   \
  X(false, dp_pshufb, DP8, X4(PSHUFB), 4, "vpshufb")                                                                   \
  X(false, dp_permw, DP8, X4(PERMW), 4, "vpermw")                                                                      \
  X(false, dp_permt2w, DP8, X4(PERMT2W), 4, "vpermt2w")                                                                \
  X(false, dp_permi2b, DP8, X4(PERMI2B), 4, "vpermi2b")                                                                \
  X(false, dp_shuff32x4, DP8, X4(SHUFF32X4), 4, "vshuff32x4")                                                          \
  X(false, dp_cvtne2, DP8, X4(CVTNE2PS2BF16), 4, "vcvtne2ps2bf16")                                                     \
  X(false, dp_bcast4, DP8, X4(BROADCASTI32X4), 4, "vbroadcasti32x4 (mem) x4")                                          \
  X(false, dp_bcast8, DP8, X8(BROADCASTI32X4), 8, "vbroadcasti32x4 (mem) x8")                                          \
  X(false, dp_load, DP8, X8(LOADZMM), 8, "vmovdqu64 (mem)")                                                            \
  X(false, dp_pmullw, DP8, X4(PMULLW), 4, "vpmullw")                                                                   \
  X(true, fma_alone, FMA8, "", 0, "vfmadd231ps x8 alone")                                                              \
  X(true, fma_cvt, FMA8, X8(CVTDQ2PS), 8, "vcvtdq2ps")                                                                 \
  X(true, fma_permw, FMA8, X4(PERMW), 4, "vpermw")                                                                     \
  X(true, fma_shuff32x4, FMA8, X4(SHUFF32X4), 4, "vshuff32x4")                                                         \
  X(true, fma_unpcklps, FMA8, X4(UNPCKLPS), 4, "vunpcklps")                                                            \
  X(false, w_i8_permute, DP8, I8_PERMUTE("10", "11", "0") I8_PERMUTE("12", "13", "32"), 10,                            \
    "8-bit, 64 values: permute")                                                                                       \
  X(false, w_i8_shift_or, DP8, I8_SHIFT_OR("10", "11", "0") I8_SHIFT_OR("12", "13", "32"), 12,                         \
    "8-bit, 64 values: shift|or")                                                                                      \
  X(false, w_q4_lookup, DP8, Q4_LOOKUP("10", "11", "0") Q4_LOOKUP("12", "13", "32"), 8, "4-bit, 128 values: lookups")  \
  X(false, w_q4_no_shuffle, DP8,                                                                                       \
    Q4_NO_SHUFFLE("10", "11", "0") Q4_NO_SHUFFLE("12", "13", "16") Q4_NO_SHUFFLE("14", "15", "32")                     \
        Q4_NO_SHUFFLE("16", "17", "48"),                                                                               \
    36, "4-bit, 128 values: no shuffle")

#define DEFINE_TIMED(fma, id, products, extra, n, name)                                                                \
  ATTN_MICRO_TARGET double id##_ns() {                                                                               \
    const auto t0 = std::chrono::steady_clock::now();                                                               \
    for (long i = 0; i < kIters; ++i) asm volatile(products extra::"r"(g_bytes) : CLOBBERS);                        \
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kIters;        \
  }
CASES(DEFINE_TIMED)

struct Case {
  double (*time)();
  int n;
  const char* name;
  bool fma;
};
#define LIST(fma, id, products, extra, n, name) {id##_ns, n, name, fma},
const Case kCases[] = {CASES(LIST)};

ATTN_MICRO_TARGET void set_operands() {
  // zmm8 and zmm9: 1.0f in every lane (as bf16 pairs: 0 and 1), so neither product sees a subnormal; zmm20: 3 in
  // every dword (a valid word and byte index, and a lookup table); zmm21: 7 in every dword.
  asm volatile(
      "vpternlogd $0xFF, %%zmm8, %%zmm8, %%zmm8\n vpsrld $25, %%zmm8, %%zmm8\n vpslld $23, %%zmm8, %%zmm8\n"
      "vmovdqa64 %%zmm8, %%zmm9\n vpternlogd $0xFF, %%zmm20, %%zmm20, %%zmm20\n vpsrld $30, %%zmm20, %%zmm20\n"
      "vpternlogd $0xFF, %%zmm21, %%zmm21, %%zmm21\n vpsrld $29, %%zmm21, %%zmm21\n" ::
          : "xmm8", "xmm9", "xmm20", "xmm21");
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512vbmi")) {
    std::printf("micro_pipes: this CPU lacks AVX512-BF16 or AVX512-VBMI; nothing to time\n");
    return 0;
  }
  set_operands();
  std::printf("%-34s %10s %22s\n", "extra instructions", "ns/iter", "cost each, in products");
  for (int round = 0; round < 2; ++round) {
    double alone[2] = {0, 0};
    for (const Case& c : kCases) {
      const double t = c.time();
      if (c.n == 0) {
        alone[c.fma] = t;
        std::printf("%-34s %10.3f\n", c.name, t);
      } else {
        std::printf("  + %-2d %-28s %10.3f %22.2f\n", c.n, c.name, t, (t - alone[c.fma]) / (alone[c.fma] / 8) / c.n);
      }
    }
    std::printf("\n");
  }
}
