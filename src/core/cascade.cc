// Shared-prefix (cascade) attention over a paged KV cache (attn/sdpa.h attention_paged_cascade).
//
// Two partial results of every query row, then the one merge:
//   prefix  every query of the batch against the shared prefix, as ONE problem: the B·Sq query rows of each head
//           gathered into [1, Hq, B·Sq, Dk] and attended over the prefix's pages (a prefill-shaped product: the
//           kernels pack a KV head's query rows into blocks, so each prefix key is read once per block of rows,
//           not once per sequence);
//   suffix  each sequence's own keys, attention_paged's problem with its own causal alignment;
// both written in f32 with their LSE (the kernels' f32 rows: core::run_forward), merged row by row with
// core::merge_weights (the merge split-KV, ring attention and merge_attention use) and the sink absorbed once
// (core::finish_with_sink), then rounded to out's dtype once.
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/info.h"
#include "attn/sdpa.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "core/views.h"
#include "core/workspace_impl.h"

namespace attn {
namespace {

using i64 = std::int64_t;

// The checks attention_paged's validation does not make: what the cascade takes beyond it.
Status check_cascade(const core::Problem& p, const Params& params, const TensorView& prefix_table, i64 prefix_len) {
  if (p.device.is_cuda())
    return Status::Unsupported("q", "on " + device_name(p.device) +
                                        " for attention_paged_cascade; expected CPU tensors (the cascade runs on the "
                                        "CPU in this version)");
  if (prefix_len < 0) return Status::Invalid("prefix_len", "= " + std::to_string(prefix_len) + "; expected >= 0");
  if (prefix_len > kMaxExtent - p.Skv)
    return Status::Invalid("prefix_len", "= " + std::to_string(prefix_len) + "; expected prefix_len + Skv <= 2^31 - 1");
  if (params.window.enabled())
    return Status::Unsupported("window", "for attention_paged_cascade; expected none (a window depends on each key's "
                                         "position in its sequence)");
  if (params.mask) return Status::Unsupported("mask", "for attention_paged_cascade; expected none");
  if (params.alibi_slopes)
    return Status::Unsupported("alibi_slopes", "for attention_paged_cascade; expected none (ALiBi's bias depends on "
                                               "each key's distance to the query)");
  if (params.dropout_p > 0)
    return Status::Unsupported("dropout_p", "for attention_paged_cascade; expected 0 (dropout's counters are per "
                                            "batch row)");
  if (params.causal == Causal::top_left)
    return Status::Unsupported("causal", "top_left for attention_paged_cascade; expected none or bottom_right (the "
                                         "last query on each sequence's last key)");
  if (params.causal == Causal::bottom_right)
    for (i64 b = 0; b < p.B; ++b)
      if (p.key_len(b) < p.Sq - 1)
        return Status::Invalid("seq_lens", std::string("[").append(std::to_string(b)) + "] = " + std::to_string(p.key_len(b)) +
                                               " with causal bottom_right and Sq = " + std::to_string(p.Sq) +
                                               "; expected >= Sq - 1 (every query sees the whole prefix)");
  if (Status s = core::check_view("prefix_table", prefix_table, 1); !s) return s;
  if (prefix_table.device != p.device)
    return Status::Invalid("prefix_table", "on " + device_name(prefix_table.device) + "; expected " + device_name(p.device));
  if (prefix_table.dtype != DType::i32)
    return Status::Invalid("prefix_table", std::string("of dtype ") + dtype_name(prefix_table.dtype) + "; expected i32");
  const i64 page = p.paged->page_size, used = (prefix_len + page - 1) / page;
  if (prefix_table.shape[0] < used)
    return Status::Invalid("prefix_table", "of " + std::to_string(prefix_table.shape[0]) + " pages; expected at least " +
                                               std::to_string(used) + " (prefix_len " + std::to_string(prefix_len) +
                                               " over pages of " + std::to_string(page) + ")");
  const auto* t = static_cast<const std::int32_t*>(prefix_table.data);
  for (i64 n = 0; n < used; ++n) {
    const std::int32_t id = t[n * prefix_table.strides[0]];
    if (id < 0 || id >= p.paged->pages)
      return Status::Invalid("prefix_table", std::string("[").append(std::to_string(n)) + "] = " + std::to_string(id) +
                                                 "; expected a page in [0, " + std::to_string(p.paged->pages) + ")");
  }
  return Status::Ok();
}

// The cascade's scratch: q's rows gathered and the two partial results. Kept between calls (core::scratch: the
// caller's Workspace, else the thread's), so a decode loop allocates, zeroes and page-faults none of it per step:
// fresh, the 2.6 MB of issue 30's benchmark cost 1 ms of a 19 ms call. Every element is written before it is read.
struct CascadeScratch {
  std::vector<unsigned char> qp;      // q's rows gathered: [1, Hq, B·Sq, Dk] in q's dtype
  std::vector<float> op, lp, os, ls;  // the partial results: prefix [1, Hq, B·Sq, Dv], suffix [B, Hq, Sq, Dv]
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(qp.capacity() + sizeof(float) * (op.capacity() + lp.capacity() + os.capacity() +
                                                                      ls.capacity()));
  }
};
constexpr char kCascadeKey = 0;  // the Workspace slot's key

// A view of `shape` over `data` in q's dtype (validation's view of an f32 buffer that the problem then reads as
// f32: the element strides are the same).
TensorView as_q_dtype(void* data, DType dtype, std::initializer_list<i64> shape) {
  return TensorView::contiguous(data, dtype, shape);
}

}  // namespace

Status attention_paged_cascade(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                               const TensorView& prefix_table, std::int64_t prefix_len, const TensorView& page_table,
                               const TensorView& seq_lens, const TensorView& out, const Params& params,
                               const std::optional<TensorView>& lse) {
  core::Problem p;  // the call as attention_paged sees it (every argument but the prefix checked here)
  const core::KvLenLoan loan{p};
  if (Status s = core::validate_paged(q, k_pages, v_pages, page_table, seq_lens, out, params, lse, &p); !s) return s;
  if (Status s = check_cascade(p, params, prefix_table, prefix_len); !s) return s;
  if (prefix_len == 0 || p.B * p.Hq * p.Sq == 0) return core::run_forward(p);

  const i64 B = p.B, Hq = p.Hq, Sq = p.Sq, Dk = p.Dk, Dv = p.Dv, rows = B * Sq;
  const std::size_t qe = dtype_size(q.dtype);
  const std::int64_t need = Hq * rows * Dk * static_cast<i64>(qe) + 4 * (2 * Hq * rows * Dv + 2 * Hq * rows);
  CascadeScratch fresh;
  CascadeScratch& sc = core::scratch(params.workspace, &kCascadeKey, fresh, need);
  auto& [qp, op, lp, os, ls] = sc;
  try {
    qp.resize(static_cast<std::size_t>(Hq * rows * Dk) * qe);
    op.resize(static_cast<std::size_t>(Hq * rows * Dv));
    lp.resize(static_cast<std::size_t>(Hq * rows));
    os.resize(static_cast<std::size_t>(B * Hq * Sq * Dv));
    ls.resize(static_cast<std::size_t>(B * Hq * Sq));
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("q", "the cascade's partial results could not be allocated");
  }
  for (i64 h = 0; h < Hq; ++h)
    for (i64 b = 0; b < B; ++b)
      for (i64 i = 0; i < Sq; ++i) {
        unsigned char* to = &qp[static_cast<std::size_t>(((h * rows) + b * Sq + i) * Dk) * qe];
        const auto* from = static_cast<const unsigned char*>(q.data) + p.q.offset(b, h, i, 0) * static_cast<i64>(qe);
        if (p.q.stride[3] == 1) {
          std::memcpy(to, from, static_cast<std::size_t>(Dk) * qe);
        } else {
          for (i64 d = 0; d < Dk; ++d)
            std::memcpy(to + d * static_cast<i64>(qe), from + d * p.q.stride[3] * static_cast<i64>(qe), qe);
        }
      }

  // The two partial problems, validated as attention_paged's (their outputs viewed in q's dtype, then read as f32
  // rows), without the sink (absorbed once, after the merge) and without the caller's workspace during validation
  // (its key-length vector is lent to `p`).
  Params part = params;
  part.sinks.reset();
  part.workspace = nullptr;
  Params pre = part;
  pre.causal = Causal::none;  // every query sees the whole prefix (check_cascade)
  std::int64_t prefix_keys = prefix_len;
  const TensorView prefix_lens = TensorView::contiguous(&prefix_keys, DType::i64, {1});
  TensorView prefix_pages = prefix_table;
  prefix_pages.rank = 2;
  prefix_pages.shape = {1, prefix_table.shape[0], 0, 0};
  prefix_pages.strides = {prefix_table.shape[0] * prefix_table.strides[0], prefix_table.strides[0], 0, 0};
  core::Problem pp, ps;
  const core::KvLenLoan loan_p{pp}, loan_s{ps};
  if (Status s = core::validate_paged(as_q_dtype(qp.data(), q.dtype, {1, Hq, rows, Dk}), k_pages, v_pages,
                                      prefix_pages, prefix_lens, as_q_dtype(op.data(), q.dtype, {1, Hq, rows, Dv}),
                                      pre, TensorView::contiguous(lp.data(), DType::f32, {1, Hq, rows}), &pp);
      !s)
    return s;
  if (Status s = core::validate_paged(q, k_pages, v_pages, page_table, seq_lens,
                                      as_q_dtype(os.data(), q.dtype, {B, Hq, Sq, Dv}), part,
                                      TensorView::contiguous(ls.data(), DType::f32, {B, Hq, Sq}), &ps);
      !s)
    return s;
  pp.out.dtype = ps.out.dtype = DType::f32;
  pp.workspace = ps.workspace = params.workspace;
  if (Status s = core::run_forward(pp); !s) return s;
  if (Status s = core::run_forward(ps); !s) return s;

  // The merge, row by row: each side a state in natural-log units (core::state_from_lse) merged by core::merge
  // (the merge split-KV and merge_attention use) into the prefix's row, then the sink absorbed once. Rows are
  // independent: shared out over the call's threads.
  const float c = static_cast<float>(core::kLog2e);
  const i64 all_rows = B * Hq * Sq;
  const int threads = resolve_threads(params.threads);
#pragma omp parallel for num_threads(threads) schedule(static) if (all_rows * Dv >= 32768)
  for (i64 row = 0; row < all_rows; ++row) {
    const i64 i = row % Sq, h = (row / Sq) % Hq, b = row / (Sq * Hq);
    const i64 ra = h * rows + b * Sq + i;
    float* o = &op[static_cast<std::size_t>(ra * Dv)];
    core::RowState st = core::state_from_lse(lp[static_cast<std::size_t>(ra)]);
    core::merge(st, o, core::state_from_lse(ls[static_cast<std::size_t>(row)]), &os[static_cast<std::size_t>(row * Dv)],
                Dv, c);
    const float sink = params.sinks ? core::float_at(*params.sinks, h * params.sinks->strides[0])
                                    : -std::numeric_limits<float>::infinity();
    const core::Finish f = core::finish_with_sink(st.m, st.l, 1.0, sink);
    const i64 at = p.out.offset(b, h, i, 0), step = p.out.stride[3];
    const auto store = [&](auto* to) {  // typed once per row, not per element
      using T = std::remove_pointer_t<decltype(to)>;
      for (i64 d = 0; d < Dv; ++d) to[at + d * step] = core::from_float<T>(core::finish_output(o[d], st.l, f.factor));
    };
    if (out.dtype == DType::bf16) store(static_cast<core::bf16*>(out.data));
    else if (out.dtype == DType::f16) store(static_cast<core::f16*>(out.data));
    else store(static_cast<float*>(out.data));
    if (lse) static_cast<float*>(lse->data)[p.lse->offset(b, h, i, 0)] = f.lse;
  }
  return Status::Ok();
}

}  // namespace attn
