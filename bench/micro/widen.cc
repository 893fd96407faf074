// Ways to turn 8-bit K/V values into the bf16 operands of `vdpbf16ps`, timed beside the dot products a decode
// score loop does with them (GQA group of 4 lanes: each 32 values widened once and multiplied into 4 lanes), on
// one core, from L1. For whoever wants the 8-bit (and 4-bit) decode cheaper: the widening, not the products, is what
// the 8-bit cache pays over bf16 rows (docs/how-it-computes.md, issue 31's notes), and which sequence is cheapest
// depends on the core. Each way is checked first on all 256 byte values against float(x) (every 8-bit value is
// exact in bf16), so a timing is only printed for a way that is exact.
//
// Built on request only: cmake --build build --target micro_widen && build/micro_widen
// Needs AVX512-BF16 and AVX512-VBMI at run time (it says so and exits otherwise).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define ATTN_MICRO_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")))

namespace {

using BH = __m512bh;

// A way: 64 int8 values at p -> two vectors of 32 bf16 (k0, k1), in an order the way names (`order`: the value
// index each of the 64 words holds), so that a caller lays q out to match (as the 4-bit path does).
struct Way {
  const char* name;
  const char* what;
  void (*widen)(const std::int8_t* p, BH& k0, BH& k1);
  void (*order)(int* index);  // index[w] = which of the 64 values word w (k0's 0-31, then k1's) holds
  double (*time)(const std::vector<std::int8_t>& k, std::int64_t stride, float* sink);
};

void natural_order(int* index) {
  for (int w = 0; w < 64; ++w) index[w] = w;
}

// The sequence the kernels use (src/cpu/flash_kernel.h, load_pairs): sign-extend 16 bytes to 32-bit lanes, convert
// to fp32 (exact), pack two vectors to bf16 (exact: 8 significant bits at most).
ATTN_MICRO_TARGET BH cvt32(const std::int8_t* p) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}
ATTN_MICRO_TARGET void way_cvt(const std::int8_t* p, BH& k0, BH& k1) { k0 = cvt32(p), k1 = cvt32(p + 32); }

// The same, the pack as one word permute of the fp32 values' upper halves (their lower halves are zero).
ATTN_MICRO_TARGET BH cvt32_permw(const std::int8_t* p) {
  const __m512i upper = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  return (BH)_mm512_permutex2var_epi16(_mm512_castps_si512(lo), upper, _mm512_castps_si512(hi));
}
ATTN_MICRO_TARGET void way_cvt_permw(const std::int8_t* p, BH& k0, BH& k1) { k0 = cvt32_permw(p), k1 = cvt32_permw(p + 32); }

// fp32 by the exponent trick: the zero-extended byte b = x + 128 (mod 256, flipped sign bit) or'ed into 2^23's bits
// is the float 2^23 + x + 128; one subtraction leaves x exactly.
ATTN_MICRO_TARGET __m512 magic16(const std::int8_t* p) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_sub_ps(_mm512_castsi512_ps(_mm512_xor_si512(b, _mm512_set1_epi32(0x4B000080))),
                       _mm512_set1_ps(8388608.0f + 128.0f));
}
ATTN_MICRO_TARGET BH magic32(const std::int8_t* p) { return _mm512_cvtne2ps_pbh(magic16(p + 16), magic16(p)); }
ATTN_MICRO_TARGET void way_magic32(const std::int8_t* p, BH& k0, BH& k1) { k0 = magic32(p), k1 = magic32(p + 32); }

// Sign-extend 32 bytes to 16-bit words once; each 32-bit lane then holds a pair (x_even, x_odd): the odd one by an
// arithmetic shift, the even one by two, both converted, the even one's upper half moved down and the two or'ed.
ATTN_MICRO_TARGET BH split16(const std::int8_t* p) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512 odd = _mm512_cvtepi32_ps(_mm512_srai_epi32(w, 16));
  const __m512 even = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 16), 16));
  return (BH)_mm512_or_si512(_mm512_castps_si512(odd), _mm512_srli_epi32(_mm512_castps_si512(even), 16));
}
ATTN_MICRO_TARGET void way_split16(const std::int8_t* p, BH& k0, BH& k1) { k0 = split16(p), k1 = split16(p + 32); }

// Through fp16: the zero-extended word b = x + 128 or'ed into 1024's bits is the half 1152 + x, exact (11
// significant bits); widened to fp32 (F16C), 1152 subtracted, packed to bf16.
ATTN_MICRO_TARGET BH half16(const std::int8_t* p) {
  const __m512i w =
      _mm512_xor_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), _mm512_set1_epi16(0x6480));
  const __m512 off = _mm512_set1_ps(1152.0f);
  const __m512 lo = _mm512_sub_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(w)), off);
  const __m512 hi = _mm512_sub_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1)), off);
  return _mm512_cvtne2ps_pbh(hi, lo);
}
ATTN_MICRO_TARGET void way_half16(const std::int8_t* p, BH& k0, BH& k1) { k0 = half16(p), k1 = half16(p + 32); }

// Byte planes by table lookup (AVX512-VBMI): |x| indexes two 128-entry tables (vpermi2b, 7 bits) for the low and
// the high byte of bf16(|x|); the sign bit is or'ed into the high byte; zero bytes are zeroed by the mask (entry 0
// holds bf16(128), for x = -128, whose |x| reads as index 0); the bytes interleaved into words within 128-bit lanes.
struct Planes {
  __m512i lo0, lo1, hi0, hi1;
};
Planes g_planes;
void make_planes() {
  alignas(64) std::uint8_t lo[128], hi[128];
  for (int a = 0; a < 128; ++a) {
    const float f = a == 0 ? 128.0f : static_cast<float>(a);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    lo[a] = static_cast<std::uint8_t>(bits >> 16), hi[a] = static_cast<std::uint8_t>(bits >> 24);
  }
  std::memcpy(&g_planes.lo0, lo, 64), std::memcpy(&g_planes.lo1, lo + 64, 64);
  std::memcpy(&g_planes.hi0, hi, 64), std::memcpy(&g_planes.hi1, hi + 64, 64);
}
ATTN_MICRO_TARGET void way_planes(const std::int8_t* p, BH& k0, BH& k1) {
  const Planes& t = g_planes;
  const __m512i x = _mm512_loadu_si512(p), a = _mm512_abs_epi8(x);
  const __mmask64 nonzero = _mm512_test_epi8_mask(x, x);
  const __m512i lo = _mm512_maskz_permutex2var_epi8(nonzero, t.lo0, a, t.lo1);
  const __m512i hi = _mm512_ternarylogic_epi32(_mm512_maskz_permutex2var_epi8(nonzero, t.hi0, a, t.hi1), x,
                                               _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (x & 0x80)
  k0 = (BH)_mm512_unpacklo_epi8(lo, hi), k1 = (BH)_mm512_unpackhi_epi8(lo, hi);
}
void planes_order(int* index) {  // unpacklo: bytes 0-7 of each 128-bit lane, unpackhi: bytes 8-15
  for (int l = 0; l < 4; ++l)
    for (int j = 0; j < 8; ++j) index[8 * l + j] = 16 * l + j, index[32 + 8 * l + j] = 16 * l + 8 + j;
}

// bf16 rows as stored (no widening): the floor, the products alone.
ATTN_MICRO_TARGET void way_bf16(const std::int8_t* p, BH& k0, BH& k1) {
  k0 = (BH)_mm512_loadu_si512(p), k1 = (BH)_mm512_loadu_si512(p + 64);
}

// Seconds per 32 values: each 64 values widened once and multiplied into 4 lanes' accumulators (8 of them, as
// registers), over a 32 KiB buffer (L1) many times; the way inlined (a template argument).
template <void (*widen)(const std::int8_t*, BH&, BH&)>
ATTN_MICRO_TARGET double time_way(const std::vector<std::int8_t>& k, std::int64_t stride, float* sink) {
  // q about 2^-20 (the sums stay finite over every repetition)
  const BH q0 = (BH)_mm512_set1_epi32(0x35803580), q1 = (BH)_mm512_set1_epi32(0x35813581),
           q2 = (BH)_mm512_set1_epi32(0x35823582), q3 = (BH)_mm512_set1_epi32(0x35833583);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const std::int64_t n = static_cast<std::int64_t>(k.size()) - 128, reps = 4000;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t r = 0; r < reps; ++r)
    for (std::int64_t i = 0; i < n; i += stride) {
      BH k0, k1;
      widen(k.data() + i, k0, k1);
      a0 = _mm512_dpbf16_ps(a0, q0, k0), a1 = _mm512_dpbf16_ps(a1, q1, k0);
      a2 = _mm512_dpbf16_ps(a2, q2, k0), a3 = _mm512_dpbf16_ps(a3, q3, k0);
      a4 = _mm512_dpbf16_ps(a4, q0, k1), a5 = _mm512_dpbf16_ps(a5, q1, k1);
      a6 = _mm512_dpbf16_ps(a6, q2, k1), a7 = _mm512_dpbf16_ps(a7, q3, k1);
    }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                   _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  *sink += _mm512_reduce_add_ps(sum);
  const double groups = static_cast<double>(reps) * static_cast<double>((n + stride - 1) / stride);
  return s / (groups * 2);  // two vectors of 32 values per group
}

const Way kWays[] = {
    {"cvt", "vpmovsxbd, vcvtdq2ps (x2), vcvtne2ps2bf16: the kernels' sequence", way_cvt, natural_order, time_way<way_cvt>},
    {"cvt_permw", "the same, packed by vpermt2w", way_cvt_permw, natural_order, time_way<way_cvt_permw>},
    {"magic32", "vpmovzxbd, vpxord, vsubps (x2), vcvtne2ps2bf16", way_magic32, natural_order, time_way<way_magic32>},
    {"split16", "vpmovsxbw, then even/odd words by shifts, vcvtdq2ps (x2), vpsrld, vpord", way_split16, natural_order, time_way<way_split16>},
    {"half16", "vpmovzxbw, vpxord, vcvtph2ps (x2), vsubps (x2), vcvtne2ps2bf16", way_half16, natural_order, time_way<way_half16>},
    {"planes", "vpabsb, vptestmb, vpermi2b (x2), vpternlogd, vpunpck[lh]bw", way_planes, planes_order, time_way<way_planes>},
};

// Every byte value through the way, in its order, against float(x): the number of words that differ.
int mismatches(const Way& way) {
  int bad = 0;
  alignas(64) std::int8_t x[64];
  for (int base = 0; base < 256; base += 64) {
    for (int i = 0; i < 64; ++i) x[i] = static_cast<std::int8_t>(base + i - 128);
    BH k0, k1;
    way.widen(x, k0, k1);
    alignas(64) std::uint16_t words[64];
    std::memcpy(words, &k0, 64), std::memcpy(words + 32, &k1, 64);
    int index[64];
    way.order(index);
    for (int w = 0; w < 64; ++w) {
      const std::uint32_t bits = static_cast<std::uint32_t>(words[w]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      bad += f != static_cast<float>(x[index[w]]);
    }
  }
  return bad;
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512vbmi")) {
    std::printf("micro_widen: this CPU lacks AVX512-BF16 or AVX512-VBMI; nothing to time\n");
    return 0;
  }
  make_planes();
  std::vector<std::int8_t> k(32 * 1024 + 128);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::int8_t>((i * 37 + 11) % 256 - 128);
  std::vector<std::int8_t> kb(k.size());  // finite bf16 values for the floor (k's bytes read as bf16 include NaNs)
  for (std::size_t i = 0; i + 1 < kb.size(); i += 2) {
    const std::uint16_t w = static_cast<std::uint16_t>(0x3F80 + (i / 2) % 64);
    std::memcpy(&kb[i], &w, 2);
  }
  float sink = 0;
  constexpr int kRounds = 5;  // interleaved; the best of them reported
  const int nways = static_cast<int>(sizeof(kWays) / sizeof(kWays[0]));
  std::vector<double> best(nways + 1, 1e30);
  for (int round = 0; round < kRounds; ++round) {
    for (int w = 0; w < nways; ++w) best[w] = std::min(best[w], kWays[w].time(k, 64, &sink));
    best[nways] = std::min(best[nways], time_way<way_bf16>(kb, 128, &sink));
  }
  std::printf("8-bit values to bf16 pairs, then 4 lanes of vdpbf16ps (one core, L1, best of %d):\n", kRounds);
  std::printf("  %-10s %10s %9s  %s\n", "way", "ns/32 val", "vs cvt", "instructions (exact on all 256 values?)");
  for (int w = 0; w < nways; ++w) {
    const int bad = mismatches(kWays[w]);
    std::printf("  %-10s %10.3f %8.2fx  %s (%s)\n", kWays[w].name, best[w] * 1e9, best[0] / best[w], kWays[w].what,
                bad ? "NOT exact" : "exact");
  }
  std::printf("  %-10s %10.3f %8.2fx  bf16 rows as stored: the 4 products alone\n", "bf16", best[nways] * 1e9,
              best[0] / best[nways]);
  std::printf("(sum of every accumulator, kept so that nothing is optimised away: %g)\n", static_cast<double>(sink));
  return 0;
}
