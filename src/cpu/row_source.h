// The one way a kernel reads K or V rows (and the backward its Q and dO rows): whatever their storage (fp32, bf16,
// f16, 8-bit with a scale per row, or 4-bit with a scale per block of kI4Block values), their layout (contiguous
// [B, H, S, D], strided such as FlashAttention's [B, S, H, D], or a page pool through a page table), every kernel (the vector forward, prefill and decode, the
// backward's sweeps, the AMX forward's staging) asks this source for them in one of these forms:
//   locate     where each stored row starts (and, quantised rows, its first scale): one walk over the keys, through
//              the page table without a division per key; for kernels that widen rows in registers (decode)
//   as_float   the rows as fp32, each readable to `pitch` values (zeros past the row's `dim`): the caller's own
//              memory when it already is that (fp32, unit stride, pitch = dim), else widened copies (8- and 4-bit
//              values times their scales) in the kernel's buffer
//   as_float_block   the same at one row stride (row c at base + c·ld), for kernels whose products read rows at a
//              stride (the backward): in place when fp32, unit stride, pitch = dim and not paged, else copies
//   as_stored  the rows in their storage type, each readable to `pitch` values: in place when unit-stride and
//              pitch = dim, else copies (the AMX kernel packs bf16 rows as they are)
// and copy_stored for a gather (not for 4-bit rows, which are only widened). Widening is exact (a bf16/f16 value, or a
// quantised value times an fp32 scale, rounded once), so every form holds the same values.
//
// A kernel body (compiled per instruction set inside its namespace, after cpu/vec.h); includes nothing itself.

// Rows at one stride: row c at base + c·ld.
struct RowBlock {
  const float* base;
  std::int64_t ld;
};

// A row far ahead of the keys in use, which is only prefetched: its first byte (null for none). Whatever the row type,
// 8 bytes (a 4-bit tile's far rows as Q4Rows of 32 bytes were 4 KiB of its tables' 8, each line holding a quarter
// of what was read of it).
using FarRow = const void*;

// Prefetches bytes [from, to) (the cache lines starting there) of the rows far[c] .. far[c + n - 1] (null entries
// skipped, a null list for none) into L2 (prefetcht2). (Prefill's lane-major tiles use it for the next tile's rows,
// flash_kernel.h's NextRows, and the bf16 pair-product kernel for its next tile's, flash_amx.cc.) Decode's score loop prefetches the whole K rows far ahead of its keys, a key group at a time; each pass of the P·V loop over the tile (a slice of value dims) the same slice of the V
// rows far ahead, a key pair at a time: spread over both loops and every pass, so that lines keep arriving whichever
// runs (issued all at once before the scores the prefetches stalled on full miss buffers; with both lists in the
// score loop the memory idled during P·V: the V rows moved to the first P·V pass made D2 bf16 1.11x as fast at 2
// threads, then spread over every pass 1.4x; Zen 5, bench/results_zen5_decode_i4pairs.md). step: the bytes between
// prefetches. P·V prefetches every line of its slice; the score loop every line of the K rows or one line in two
// (128, each 128-byte pair's first line, the L2's adjacent-line prefetcher bringing the other), as the process's
// measurement finds faster (cpu/prefetch_tuner.h, Workspace::k_step): on the same kind of VM one line in two ran D1-D3
// from fp32, bf16 and fp16 caches 1.16-1.66x as fast in hours when every line was slow
// (bench/results_zen5_decode_prefetch_step.md), every line 1.16-1.5x as fast as one in two on another day
// (bench/results_zen4_prefetch_tuner.md); one line in two of the V slices too was slower in both. Always inlined: as a
// function of its own GCC finds it free of side effects (a prefetch is not one) and deletes its calls, every
// prefetch with them (measured: decode 25-35 % slower until this was seen).
ATTN_INLINE void prefetch_rows(const FarRow* far, std::int64_t c, std::int64_t n, std::int64_t from, std::int64_t to,
                               std::int64_t step = 64) {
  if (!far) return;
  const std::int64_t first = (from + step - 1) & ~(step - 1);
  if (first < to && to - first <= step) {  // one line a row (a 4-bit P·V pass at d128): no loop per row
    for (std::int64_t g = c; g < c + n; ++g)
      if (far[g]) __builtin_prefetch(static_cast<const char*>(far[g]) + first, 0, 1);
    return;
  }
  for (std::int64_t g = c; g < c + n; ++g)
    if (far[g])
      for (std::int64_t off = first; off < to; off += step)
        __builtin_prefetch(static_cast<const char*>(far[g]) + off, 0, 1);
}

// The rows of head hk of batch b of one tensor of a validated problem (K or V, through the page table when the cache
// is paged; or Q, dO: never paged). T: the storage type.
template <class T>
struct RowSource {
  const core::Problem* p = nullptr;
  const core::Strided* t = nullptr;      // p.k, p.v (or p.q, the backward's dO)
  const core::Strided* scale = nullptr;  // quantised rows: p.k_scale or p.v_scale
  std::int64_t dim = 0, b = 0, hk = 0;
  bool paged = false;                    // K and V of a paged problem

  static constexpr bool kI4 = std::is_same_v<T, core::q4x2>;  // 4-bit rows: a scale per block of kI4Block values
  static constexpr bool kScaled = std::is_same_v<T, std::int8_t> || kI4;
  bool unit_stride() const { return t->stride[3] == 1; }
  // Whether a row's block scales are adjacent (or it has one block), as a Q4Row reads them: true for other rows.
  bool scales_adjacent() const { return !kI4 || dim <= kI4Block || scale->stride[3] == 1; }

  // Where the element at offset `off` (in elements) lies; 4-bit rows start on a byte (validate: even strides).
  const T* at(std::int64_t off) const { return static_cast<const T*>(t->data) + (kI4 ? off >> 1 : off); }

  // Where row j starts: strided, or through the page table.
  const T* row(std::int64_t j) const {
    return at(paged ? core::kv_row_offset(*p, *t, b, hk, j) : t->offset(b, hk, j, 0));
  }

  // The rows j0 .. j0+n-1 as runs of rows at one stride: f(c, m, row, step, scale, scale_step) for rows c .. c+m-1,
  // row c + e starting at row + e·step (in T) and its (first) scale at scale + e·scale_step (quantised rows, when
  // `scales`; else null). Contiguous rows are one run; paged ones a run per page, the table read and the offsets
  // formed once per page, not per row (locating took 11 % of D3's time from an 8-bit cache).
  template <class F>
  void runs(std::int64_t j0, std::int64_t n, bool scales, F&& f) const {
    const auto run = [&](std::int64_t c, std::int64_t m, std::int64_t a, std::int64_t r) {
      const std::int64_t o0 = t->offset(a, hk, r, 0), step = t->stride[2];
      const float* s0 = nullptr;
      if constexpr (kScaled)
        if (scales) s0 = static_cast<const float*>(scale->data) + scale->offset(a, hk, r, 0);
      f(c, m, at(o0), kI4 ? step >> 1 : step, s0, kScaled && scales ? scale->stride[2] : 0);
    };
    if (!paged) return run(0, n, b, j0);
    const core::Paged& pg = *p->paged;
    std::int64_t page = j0 / pg.page_size, slot = j0 % pg.page_size;
    for (std::int64_t c = 0, m; c < n; c += m, ++page, slot = 0) {
      m = std::min(n - c, pg.page_size - slot);
      run(c, m, pg.table[b * pg.table_stride[0] + page * pg.table_stride[1]], slot);
    }
  }

  // far[c] = where row j0 + c starts, for c < n: rows only prefetched (prefetch_rows), located without their scales.
  void locate_far(std::int64_t j0, std::int64_t n, FarRow* far) const {
    runs(j0, n, false, [far](std::int64_t c, std::int64_t m, const T* r0, std::int64_t step, const float*,
                             std::int64_t) {
      for (std::int64_t e = 0; e < m; ++e) far[c + e] = r0 + e * step;
    });
  }

  // rows[c] = where row j0 + c starts, and (quantised rows, when scales is given) scales[c] = where its (first)
  // scale is; then, per run with scales, on_scales(s0, m, s_step) (decode prefetches them there: in a walk of its
  // own, with no other effect, GCC deleted the prefetches).
  template <class OnScales = void (*)(const float*, std::int64_t, std::int64_t)>
  void locate(std::int64_t j0, std::int64_t n, const T** rows, const float** scales = nullptr,
              OnScales&& on_scales = nullptr) const {
    runs(j0, n, scales != nullptr,
         [&](std::int64_t c, std::int64_t m, const T* r0, std::int64_t step, const float* s0, std::int64_t s_step) {
           for (std::int64_t e = 0; e < m; ++e) rows[c + e] = r0 + e * step;
           if (s0) {
             for (std::int64_t e = 0; e < m; ++e) scales[c + e] = s0 + e * s_step;
             if constexpr (!std::is_pointer_v<std::decay_t<OnScales>>) on_scales(s0, m, s_step);
           }
         });
  }

  // The scale of 8-bit row j (1 for rows of values).
  float row_scale(std::int64_t j) const {
    if constexpr (std::is_same_v<T, std::int8_t>) return core::kv_scale(*p, *scale, b, hk, j);
    return 1.0f;
  }

  // Rows j0 .. j0+n-1 as fp32, out[c] readable to `pitch` values (pitch >= dim; zeros past dim): in place when
  // they are fp32 with unit stride and pitch = dim, else widened into buf [n][pitch].
  void as_float(std::int64_t j0, std::int64_t n, std::int64_t pitch, float* buf, const float** out) const {
    if constexpr (std::is_same_v<T, float>)
      if (unit_stride() && pitch == dim) return locate(j0, n, out);
    for (std::int64_t c0 = 0; c0 < n; c0 += kMaxRows)
      widen_into(j0 + c0, std::min(kMaxRows, n - c0), pitch, buf + c0 * pitch, out + c0);
  }

  // Rows j0 .. j0+n-1 as fp32 at one stride, readable to `pitch` values (zeros past dim): in place when fp32,
  // unit-stride, pitch = dim and not paged, else widened into buf [n][pitch].
  RowBlock as_float_block(std::int64_t j0, std::int64_t n, std::int64_t pitch, float* buf) const {
    if constexpr (std::is_same_v<T, float>)
      if (unit_stride() && pitch == dim && !paged) return {row(j0), t->stride[2]};
    const float* rows[kMaxRows];
    for (std::int64_t c0 = 0; c0 < n; c0 += kMaxRows)
      widen_into(j0 + c0, std::min(kMaxRows, n - c0), pitch, buf + c0 * pitch, rows);
    return {buf, pitch};
  }

  // Rows j0 .. j0+n-1 in their storage type, out[c] readable to `pitch` values (zeros past dim): in place when
  // unit-stride and pitch = dim, else copied into buf [n][pitch].
  void as_stored(std::int64_t j0, std::int64_t n, std::int64_t pitch, T* buf, const T** out) const {
    static_assert(!kI4, "4-bit rows are only read widened");
    locate(j0, n, out);
    if (unit_stride() && pitch == dim) return;
    for (std::int64_t c = 0; c < n; ++c) {
      T* dst = buf + c * pitch;
      copy_row(out[c], dst);
      std::fill(dst + dim, dst + pitch, T{});
      out[c] = dst;
    }
  }

  // Rows j0 .. j0+n-1 copied as stored into dst [n][dim] (a gather into contiguous rows).
  void copy_stored(std::int64_t j0, std::int64_t n, T* dst) const {
    static_assert(!kI4, "4-bit rows are only read widened");
    const T* src[kMaxRows];
    for (std::int64_t c0 = 0; c0 < n; c0 += kMaxRows) {
      const std::int64_t m = std::min(kMaxRows, n - c0);
      locate(j0 + c0, m, src);
      for (std::int64_t c = 0; c < m; ++c) copy_row(src[c], dst + (c0 + c) * dim);
    }
  }

 private:
  static constexpr std::int64_t kMaxRows = 64;  // rows located at a time by as_float and copy_stored

  // Rows j0 .. j0+n-1 (n <= kMaxRows) widened into dst [n][pitch], out[c] = dst + c·pitch.
  void widen_into(std::int64_t j0, std::int64_t n, std::int64_t pitch, float* dst, const float** out) const {
    const T* src[kMaxRows];
    const float* scales[kMaxRows];
    locate(j0, n, src, scales);
    for (std::int64_t c = 0; c < n; ++c) {
      float* d = dst + c * pitch;
      if constexpr (kI4) widen_blocks(src[c], scales[c], d);
      else widen(src[c], row_scale(j0 + c), d);
      std::fill(d + dim, d + pitch, 0.0f);
      out[c] = d;
    }
  }

  void copy_row(const T* src, T* dst) const {
    if (unit_stride()) std::memcpy(dst, src, static_cast<std::size_t>(dim) * sizeof(T));
    else for (std::int64_t d = 0; d < dim; ++d) dst[d] = src[d * t->stride[3]];
  }

  // One 4-bit row as fp32: each value q times its block's scale (scales: the row's first, at the scale view's last
  // stride), rounded once; whole blocks a vector at a time.
  void widen_blocks(const T* src, const float* scales, float* dst) const {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(src);
    for (std::int64_t d0 = 0; d0 < dim; d0 += kI4Block) {
      const float f = scales[(d0 / kI4Block) * scale->stride[3]];
      const std::int64_t end = std::min(dim, d0 + kI4Block);
      std::int64_t d = d0;
      if constexpr (kI4Block % Vec::W == 0)
        if (end - d0 == kI4Block) {
          for (; d < end; d += Vec::W) Vec::store(dst + d, load_q4_scaled(bytes + d / 2, f));
        }
      for (; d < end; ++d) dst[d] = static_cast<float>(core::q4_at(bytes, d)) * f;
    }
  }

  // One stored row as fp32 (8-bit values times the row's scale f).
  void widen(const T* src, float f, float* dst) const {
    std::int64_t d = 0;
    const std::int64_t step = t->stride[3];
    if constexpr (kScaled) {
      const Vec::T fv = Vec::set1(f);
      if (step == 1)
        for (; d + Vec::W <= dim; d += Vec::W) Vec::store(dst + d, Vec::mul(load_as_float(src + d), fv));
      for (; d < dim; ++d) dst[d] = f * core::to_float(src[d * step]);
    } else {
      if constexpr (!std::is_same_v<T, float>)
        if (step == 1)
          for (; d + Vec::W <= dim; d += Vec::W) Vec::store(dst + d, load_as_float(src + d));
      for (; d < dim; ++d) dst[d] = core::to_float(src[d * step]);
    }
  }
};

// The K and V rows of (batch b, KV head hk); the rows of head h of another [B, H, S, dim] tensor t of the problem
// (Q, the backward's dO and gradients: never paged, never scaled).
template <class T>
RowSource<T> key_rows(const core::Problem& p, std::int64_t b, std::int64_t hk) {
  return {&p, &p.k, p.k_scale ? &*p.k_scale : nullptr, p.Dk, b, hk, p.paged.has_value()};
}
template <class T>
RowSource<T> value_rows(const core::Problem& p, std::int64_t b, std::int64_t hk) {
  return {&p, &p.v, p.v_scale ? &*p.v_scale : nullptr, p.Dv, b, hk, p.paged.has_value()};
}
template <class T>
RowSource<T> head_rows(const core::Problem& p, const core::Strided& t, std::int64_t dim, std::int64_t b,
                       std::int64_t h) {
  return {&p, &t, nullptr, dim, b, h, false};
}
