// One SIMD vector of fp32 lanes for the instruction set this translation unit is compiled for.
//
// Included by cpu/flash_kernel.h, inside an instruction-set unit's `#pragma GCC target` region and its namespace
// attn::cpu::<level> (the units are generated from cpu/isa_unit.cc.in, one per line of cpu/isa_list.h), after
// that line's flavour macro ATTN_VEC_{SSE2,AVX2,AVX512} is defined. Each flavour is a thin wrapper over
// intrinsics with the same static interface; everything above it (exp2, the micro-kernel, the kernels) is
// written once. Its own includes (<immintrin.h>, <cstdint>) come from cpu/isa_prelude.h, before the region.

#if defined(ATTN_VEC_AVX512)

struct Vec {
  static constexpr int W = 16;
  using T = __m512;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static float reduce_add(T x) { return _mm512_reduce_add_ps(x); }
  static T round(T x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // x · 2^n for integral n in [-127, 127] (vscalefps: one instruction, correctly rounded like the multiply).
  static T ldexp(T x, T n) { return _mm512_scalef_ps(x, n); }
  // a < b ? x : y, lane by lane
  static T select_lt(T a, T b, T x, T y) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x); }
  // whether a < b in some lane
  static bool any_lt(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ) != 0; }
  static T load_bf16(const std::uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
  }
  static T load_f16(const std::uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static T load_i8(const std::int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p))); }
  // The sixteen products q · f of the 4-bit values q in [-8, 7], entry q + 8 (vpermps reads an index's low 4 bits:
  // a nibble looks its product up, each value rounded once as q · f).
  static T q4_table(float f) {
    return _mm512_mul_ps(_mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8), _mm512_set1_ps(f));
  }
  // W 4-bit values (attn/tensor.h's i4, nibble less 8) from the W / 2 bytes at p, times f: each byte doubled into two
  // lanes, shifted right by 0 or 4 there, looked up. Five vector instructions where widening and scaling took eight.
  static T load_q4_scaled(const std::uint8_t* p, float f) {
    const __m128i b = _mm_loadl_epi64((const __m128i*)p);
    const __m512i at = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b)),
                                         _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0));
    return _mm512_permutexvar_ps(at, q4_table(f));
  }
  // 2·W 4-bit values from the W bytes at p, times f, as two vectors: the even values (each byte's low nibble) and
  // the odd ones (its high nibble), looked up. Four vector instructions for 32 values (flash_kernel.h's kQ4Split).
  static void load_q4_split(const std::uint8_t* p, float f, T& even, T& odd) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    const T table = q4_table(f);
    even = _mm512_permutexvar_ps(b, table), odd = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
  }
  // The sums of W vectors at once (a transposing add tree, W - 1 adds): lane p of the result is the sum of
  // all lanes of v[kSumOrder[p]]. v is overwritten. Always inlined (every level): left out of line, its W vectors
  // pass through memory (20 % of a decode's time, once the scores were inlined into rows_step_packed).
  static constexpr int kSumOrder[W] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
  ATTN_INLINE static T sum_each(T* v) {
    for (int i = 0; i < 8; ++i)
      v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
    for (int i = 0; i < 4; ++i)
      v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 4], 0x88), _mm512_shuffle_f32x4(v[i], v[i + 4], 0xDD));
    for (int i = 0; i < 2; ++i)
      v[i] = _mm512_add_ps(_mm512_shuffle_ps(v[i], v[i + 2], 0x44), _mm512_shuffle_ps(v[i], v[i + 2], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
  }
  // v[i][j] becomes v[j][i] (W x W, in registers: unpacks, in-lane shuffles, then 128-bit block shuffles).
  ATTN_INLINE static void transpose(T* v) {
    T t[16];
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]), t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
    for (int i = 0; i < 16; i += 4) {
      v[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44), v[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
      v[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44), v[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int h = 0; h < 16; h += 8)
      for (int k = 0; k < 4; ++k)
        t[h + k] = _mm512_shuffle_f32x4(v[h + k], v[h + k + 4], 0x88),
        t[h + k + 4] = _mm512_shuffle_f32x4(v[h + k], v[h + k + 4], 0xDD);
    for (int k = 0; k < 8; ++k)
      v[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88), v[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
  }
};

#elif defined(ATTN_VEC_AVX2)

struct Vec {
  static constexpr int W = 8;
  using T = __m256;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static float reduce_add(T x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
  static T round(T x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T ldexp(T x, T n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(x, _mm256_castsi256_ps(e));
  }
  static T select_lt(T a, T b, T x, T y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
  static bool any_lt(T a, T b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ)) != 0; }
  static T load_bf16(const std::uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static T load_f16(const std::uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static T load_i8(const std::int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); }
  static T load_q4(const std::uint8_t* p) {
    std::int32_t w;
    std::memcpy(&w, p, 4);
    const __m128i b = _mm_cvtsi32_si128(w), m = _mm_set1_epi8(15);
    const __m128i x = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_sub_epi8(x, _mm_set1_epi8(8))));
  }
  // 2·W 4-bit values from the W bytes at p, times f, as two vectors: the even values (each byte's low nibble u) and
  // the odd ones (its high nibble), each u·f − 8f by one FMA: the exact (u − 8)·f rounded once, the same bits as
  // (u − 8)·f for a finite f. Seven vector instructions for 16 values where load_q4 and a multiply took eighteen.
  static void load_q4_split(const std::uint8_t* p, float f, T& even, T& odd) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
    const T s = _mm256_set1_ps(f), bias = _mm256_set1_ps(-8.0f * f);
    even = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))), s, bias);
    odd = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), s, bias);
  }
  static constexpr int kSumOrder[W] = {0, 2, 1, 3, 4, 6, 5, 7};
  ATTN_INLINE static T sum_each(T* v) {
    for (int i = 0; i < 4; ++i)
      v[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[i], v[i + 4], 0x20), _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
    for (int i = 0; i < 2; ++i)
      v[i] = _mm256_add_ps(_mm256_shuffle_ps(v[i], v[i + 2], 0x44), _mm256_shuffle_ps(v[i], v[i + 2], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], 0x88), _mm256_shuffle_ps(v[0], v[1], 0xDD));
  }
  // v[i][j] becomes v[j][i] (W x W, in registers).
  ATTN_INLINE static void transpose(T* v) {
    T t[8], u[8];
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]), t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44), u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44), u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k)
      v[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20), v[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
  }
};

#elif defined(ATTN_VEC_SSE2)

// The x86-64 baseline: SSE2, no FMA (fmadd is a multiply and an add).
struct Vec {
  static constexpr int W = 4;
  using T = __m128;
  static T zero() { return _mm_setzero_ps(); }
  static T set1(float x) { return _mm_set1_ps(x); }
  static T load(const float* p) { return _mm_loadu_ps(p); }
  static void store(float* p, T x) { _mm_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm_add_ps(a, b); }
  static T sub(T a, T b) { return _mm_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm_mul_ps(a, b); }
  static T div(T a, T b) { return _mm_div_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  static T max(T a, T b) { return _mm_max_ps(a, b); }
  static float reduce_add(T x) {
    const __m128 s = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
  static T round(T x) { return _mm_cvtepi32_ps(_mm_cvtps_epi32(x)); }  // |x| <= 127 here: exact
  static T ldexp(T x, T n) {
    const __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23);
    return _mm_mul_ps(x, _mm_castsi128_ps(e));
  }
  static T select_lt(T a, T b, T x, T y) {
    const __m128 m = _mm_cmplt_ps(a, b);
    return _mm_or_ps(_mm_and_ps(m, x), _mm_andnot_ps(m, y));
  }
  static bool any_lt(T a, T b) { return _mm_movemask_ps(_mm_cmplt_ps(a, b)) != 0; }
  static T load_bf16(const std::uint16_t* p) {
    const __m128i h = _mm_loadl_epi64((const __m128i*)p);
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
  }
  static T load_f16(const std::uint16_t* p) {  // no F16C at the baseline: convert lane by lane
    alignas(16) float f[4];
    for (int i = 0; i < 4; ++i) f[i] = core::to_float(core::f16{p[i]});
    return _mm_load_ps(f);
  }
  static T load_i8(const std::int8_t* p) {  // sign-extended by shifts (no pmovsx before SSE4.1)
    std::int32_t w;
    std::memcpy(&w, p, 4);
    const __m128i b = _mm_cvtsi32_si128(w);
    return _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(_mm_unpacklo_epi8(b, b), _mm_unpacklo_epi8(b, b)), 24));
  }
  static T load_q4(const std::uint8_t* p) {
    std::uint16_t w;
    std::memcpy(&w, p, 2);
    const __m128i b = _mm_cvtsi32_si128(w), m = _mm_set1_epi8(15);
    __m128i x = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    x = _mm_sub_epi8(x, _mm_set1_epi8(8));
    return _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(_mm_unpacklo_epi8(x, x), _mm_unpacklo_epi8(x, x)), 24));
  }
  static constexpr int kSumOrder[W] = {0, 2, 1, 3};
  ATTN_INLINE static T sum_each(T* v) {
    for (int i = 0; i < 2; ++i)
      v[i] = _mm_add_ps(_mm_shuffle_ps(v[i], v[i + 2], 0x44), _mm_shuffle_ps(v[i], v[i + 2], 0xEE));
    return _mm_add_ps(_mm_shuffle_ps(v[0], v[1], 0x88), _mm_shuffle_ps(v[0], v[1], 0xDD));
  }
  // v[i][j] becomes v[j][i] (W x W, in registers).
  ATTN_INLINE static void transpose(T* v) { _MM_TRANSPOSE4_PS(v[0], v[1], v[2], v[3]); }
};

#else
#error "define one of ATTN_VEC_AVX512, ATTN_VEC_AVX2, ATTN_VEC_SSE2"
#endif

// W 4-bit values from p times f, each product rounded once: the flavour's table lookup where it has one (AVX-512),
// else widening, then a multiply (the same bits either way).
template <class X = Vec>
inline Vec::T load_q4_scaled(const std::uint8_t* p, float f) {
  if constexpr (requires { X::load_q4_scaled(p, f); }) return X::load_q4_scaled(p, f);
  else return X::mul(X::load_q4(p), X::set1(f));
}

// A 4-bit row (attn/tensor.h's i4) as the row-major micro-kernels read it: like a pointer to the row's first value
// (`[d]` is value d as fp32, its block's scale applied; `+ d` gives a Q4At, d values on), with the row's block
// scales (`scales`, adjacent: the kernels take 4-bit rows in place only when they are) carried along, so that the
// kernels written over `row + d` and `row[d]` read 4-bit rows as they read the others. 16 bytes: decode's tables of
// a tile's rows (StoredTile) write two a store (as 32-byte rows with a scale stride and an offset, their stores were
// 5 % of a 4-bit MHA decode's time, and the tables 4 KiB of L1 a tile). Null (a value-initialised Q4Row{}, or null
// bytes) where a pointer would be. No default member initialisers: like a pointer, a default-initialised one is left
// unset.
struct Q4At;
struct Q4Row {
  const std::uint8_t* bytes;
  const float* scales;
  Q4At operator+(std::int64_t d) const;
  float operator[](std::int64_t d) const {  // (unsigned: a shift, not a signed division)
    return static_cast<float>(core::q4_at(bytes, d)) * scales[static_cast<std::uint64_t>(d) / kI4Block];
  }
  explicit operator bool() const { return bytes != nullptr; }
};
// A 4-bit row `off` values on (Q4Row + d): what `+` and `[]` give stay relative to the row's start, whose blocks
// the scales follow.
struct Q4At {
  Q4Row row;
  std::int64_t off;
  Q4At operator+(std::int64_t d) const { return {row, off + d}; }
  float operator[](std::int64_t d) const { return row[off + d]; }
};
inline Q4At Q4Row::operator+(std::int64_t d) const { return {*this, d}; }
// Bytes of `dim` stored values of rows of type R (a pointer to stored values, or Q4Row).
template <class R>
inline std::int64_t row_bytes(std::int64_t dim) {
  if constexpr (std::is_same_v<R, Q4Row>) return (dim + 1) / 2;
  else return dim * static_cast<std::int64_t>(sizeof(*R{}));
}

// W values from a 4-bit row at a whole vector of one block (off a multiple of W; kI4Block is a multiple of every
// W): the values times their block's scale, each rounded once, as Q4Row's [] gives them.
inline Vec::T load_as_float(const Q4At& r) {
  return load_q4_scaled(r.row.bytes + (r.off >> 1), r.row.scales[static_cast<std::uint64_t>(r.off) / kI4Block]);
}

// W storage values (fp32, bf16, f16, or i8 before its row's scale) as one vector of fp32.
template <class T>
inline Vec::T load_as_float(const T* p) {
  if constexpr (std::is_same_v<T, core::bf16>) return Vec::load_bf16(reinterpret_cast<const std::uint16_t*>(p));
  else if constexpr (std::is_same_v<T, core::f16>) return Vec::load_f16(reinterpret_cast<const std::uint16_t*>(p));
  else if constexpr (std::is_same_v<T, std::int8_t>) return Vec::load_i8(p);
  else return Vec::load(p);
}

// 2^x for every lane, written once over the wrapper: x = n + f with n = round(x), |f| <= 1/2, and
// 2^f from its degree-7 Taylor polynomial (relative error below 1e-8, under fp32 rounding). Callers pass
// x <= 0 (core::OnlineSoftmax never forms a positive exponent). Lanes with x < -126 (including -inf) give
// exactly 0, so masked scores carry no weight; a NaN lane stays NaN (max(lo, x) returns x when x is NaN).
inline Vec::T exp2v(Vec::T x) {
  const Vec::T lo = Vec::set1(-126.0f);
  const Vec::T xc = Vec::max(lo, x);
  const Vec::T n = Vec::round(xc);
  const Vec::T f = Vec::sub(xc, n);
  Vec::T p = Vec::set1(1.5252733804059840e-5f);
  p = Vec::fmadd(p, f, Vec::set1(1.5403530393381606e-4f));
  p = Vec::fmadd(p, f, Vec::set1(1.3333558146428443e-3f));
  p = Vec::fmadd(p, f, Vec::set1(9.6181291076284772e-3f));
  p = Vec::fmadd(p, f, Vec::set1(5.5504108664821580e-2f));
  p = Vec::fmadd(p, f, Vec::set1(2.4022650695910071e-1f));
  p = Vec::fmadd(p, f, Vec::set1(6.9314718055994531e-1f));
  p = Vec::fmadd(p, f, Vec::set1(1.0f));
  return Vec::select_lt(x, lo, Vec::zero(), Vec::ldexp(p, n));
}

// tanh(y) for every lane: for |y| <= 1/2 the odd Taylor polynomial through y^15 (truncation below 1e-8 relative),
// above it (1 − e) / (1 + e) with e = 2^(−2|y|·log2 e) <= 1/e (no cancellation), the sign restored. ±inf give ±1
// (e = 0), NaN stays NaN (|y| and e are NaN). A few ulp from the exact value, like a libm tanhf. When no lane is
// above 1/2 (soft-capping's usual case: scores well inside the cap) the exponential and the division are skipped.
inline Vec::T tanhv(Vec::T y) {
  const Vec::T a = Vec::max(y, Vec::sub(Vec::zero(), y));  // |y| (NaN when y is: max returns its second operand)
  const Vec::T z = Vec::mul(y, y);
  Vec::T p = Vec::set1(-929569.0f / 638512875.0f);
  p = Vec::fmadd(p, z, Vec::set1(21844.0f / 6081075.0f));
  p = Vec::fmadd(p, z, Vec::set1(-1382.0f / 155925.0f));
  p = Vec::fmadd(p, z, Vec::set1(62.0f / 2835.0f));
  p = Vec::fmadd(p, z, Vec::set1(-17.0f / 315.0f));
  p = Vec::fmadd(p, z, Vec::set1(2.0f / 15.0f));
  p = Vec::fmadd(p, z, Vec::set1(-1.0f / 3.0f));
  const Vec::T small = Vec::fmadd(Vec::mul(p, z), y, y);  // y + y·z·P(z)
  if (!Vec::any_lt(Vec::set1(0.5f), a)) return small;     // (a NaN lane: small is NaN too)
  const Vec::T e = exp2v(Vec::mul(a, Vec::set1(-2.0f * 1.4426950408889634f)));
  const Vec::T t = Vec::div(Vec::sub(Vec::set1(1.0f), e), Vec::add(Vec::set1(1.0f), e));
  const Vec::T large = Vec::select_lt(y, Vec::zero(), Vec::sub(Vec::zero(), t), t);
  return Vec::select_lt(a, Vec::set1(0.5f), small, large);
}

// The lane arithmetic core::OnlineSoftmax needs, over this instruction set's vectors (one query row per lane).
struct VecLanes {
  using T = Vec::T;
  static constexpr int W = Vec::W;
  static T set1(float x) { return Vec::set1(x); }
  static T load(const float* p) { return Vec::load(p); }
  static T add(T a, T b) { return Vec::add(a, b); }
  static T sub(T a, T b) { return Vec::sub(a, b); }
  static T mul(T a, T b) { return Vec::mul(a, b); }
  static T max(T a, T b) { return Vec::max(a, b); }
  static T exp2(T x) { return exp2v(x); }
  // x == -inf ? a : b (x < -FLT_MAX holds for -inf alone; false for NaN)
  static T if_neg_inf(T x, T a, T b) { return Vec::select_lt(x, Vec::set1(-3.4028234663852886e38f), a, b); }
  static bool any_neg_inf(T x) { return Vec::any_lt(x, Vec::set1(-3.4028234663852886e38f)); }
  static T abs(T x) { return Vec::max(x, Vec::sub(Vec::zero(), x)); }
  static T tanh(T x) { return tanhv(x); }
};

// Whether every value of `cols` rows of `dim` values (rows R: pointers to fp32, bf16, f16 or i8 values of unit
// stride, or Q4Rows) is finite: x·0 is 0 for a finite x and NaN otherwise, summed over everything.
template <class R>
inline bool rows_finite(const R* rows, std::int64_t cols, std::int64_t dim) {
  const Vec::T zero = Vec::zero();
  Vec::T acc = zero;
  float tail = 0.0f;
  for (std::int64_t c = 0; c < cols; ++c) {
    std::int64_t d = 0;
    for (; d + Vec::W <= dim; d += Vec::W) acc = Vec::add(acc, Vec::mul(load_as_float(rows[c] + d), zero));
    for (; d < dim; ++d) tail += core::to_float(rows[c][d]) * 0.0f;
  }
  return Vec::reduce_add(acc) + tail == 0.0f;
}
