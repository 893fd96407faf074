// attn: scaled dot-product attention, O = softmax(scale * Q Kᵀ + bias) V, row-wise over the allowed keys.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/status.h"
#include "attn/tensor.h"
#include "attn/workspace.h"

namespace attn {

// Which diagonal a causal mask or a local window is measured from, for query row i and key column j:
//   top_left:     the diagonal is j = i                       (PyTorch's is_causal)
//   bottom_right: the diagonal is j = i + (Skv_b - Sq)        (FlashAttention; what a KV cache needs)
// Skv_b is the batch's key length: kv_lens[b] when key lengths are given, else Skv.
enum class Align : std::uint8_t { top_left, bottom_right };

enum class Causal : std::uint8_t { none, top_left, bottom_right };

// Local (sliding-window) attention: key j is allowed for query i when
//   diag(i) - left <= j <= diag(i) + right,   with -1 meaning unbounded on that side.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;
  Align align = Align::bottom_right;
  bool enabled() const { return left >= 0 || right >= 0; }
};

// Limits the kernels are built for (calls beyond them are refused with a Status naming the parameter):
// head dims Dk, Dv (per-thread scratch grows with them) and every other size (batch, heads, sequence lengths,
// page size, pages).
inline constexpr std::int64_t kMaxHeadDim = 16384;
inline constexpr std::int64_t kMaxExtent = (std::int64_t{1} << 31) - 1;
// The scale's range: normal fp32 numbers, with room for the factor log2(e) the kernels fold into it.
inline constexpr double kMinScale = 0x1p-126;  // 1.18e-38
inline constexpr double kMaxScale = 0x1p+127;  // 1.70e+38

// Where attention_backward takes each query row's softmax statistics (its LSE and D = rowsum(dO ∘ O)) from.
enum class BackwardStatistics : std::uint8_t {
  automatic,     // each row's max and sum recomputed from the scores; D from the forward's O where scores are small
                 // (attn/backward.h)
  from_forward,  // always the given lse and out (FlashAttention-2's way): a backward over a subset of the keys
                 // whose lse and out are those of the whole key set (ring attention, attn/dist.h)
};

enum class Backend : std::uint8_t {
  automatic,  // the fastest available implementation: flash on the CPU; on CUDA, cuDNN where it takes the call,
              // else attn's own kernels
  reference,  // materialises the scores, accumulates in fp64: the oracle, slow (CPU tensors only)
  flash,      // attn's own tiled kernels (online softmax, never materialises Sq x Skv), on the CPU or on CUDA
  cudnn,      // CUDA tensors only: cuDNN's fused attention, Unsupported (naming the reason) where cuDNN refuses
};

struct Params {
  // Multiplies Q Kᵀ; default 1/sqrt(Dk). Must be in [kMinScale, kMaxScale] (normal fp32 numbers).
  std::optional<double> scale;
  // Causal mask: key j is allowed for query i when j <= diag(i) (see Align).
  Causal causal = Causal::none;
  Window window;
  // Per-batch key lengths [B] (i32 or i64, 0 <= len <= Skv): keys j >= kv_lens[b] are padding.
  std::optional<TensorView> kv_lens;
  // Dense mask broadcastable (NumPy rules, rank 1..4) to [B, Hq, Sq, Skv]:
  //   f32: added to the scaled scores (finite values or -inf; -inf blocks the key);
  //   boolean: nonzero = keep, zero = block.
  std::optional<TensorView> mask;
  // 8-bit K/V (k and v of dtype i8): row j of KV head hk holds the values k_scale[·, hk, j] · k[·, hk, j, :] (v
  // likewise with v_scale), a symmetric quantisation with one f32 scale per (token, KV head) as attn::KVCache
  // writes it. Shape [B, Hkv, Skv] for attention(), [P, Hkv, page_size] for attention_paged() (k's leading three
  // dimensions), any strides. Required when k and v are i8, refused otherwise. The kernels read the 8-bit rows and
  // apply the scales in registers (a key's scale multiplies its score, a value's its weight); there is no backward
  // for i8 K/V. Scale values are not checked: a NaN or ±inf scale gives NaN in the rows that attend its key.
  // 4-bit K/V (dtype i4, attn/tensor.h's packing): one f32 scale per block of kI4Block (32) values of a row,
  // value d of row j being k_scale[·, hk, j, d / 32] · k[·, hk, j, d]: scales of rank 4, [B, Hkv, Skv, ceil(Dk / 32)]
  // ([P, Hkv, page_size, ...] paged; Dv for v_scale), as attn::KVCache(dtype i4) writes them.
  std::optional<TensorView> k_scale;
  std::optional<TensorView> v_scale;
  // Threads for this call: 0 = the default (attn::set_num_threads(), else ATTN_NUM_THREADS, else OpenMP's default).
  int threads = 0;
  Backend backend = Backend::automatic;
  // Scratch kept between calls (attn/workspace.h): repeated calls of a shape it fits allocate nothing. null:
  // every call allocates and frees its own.
  Workspace* workspace = nullptr;
  // CUDA tensors (TensorView::device): the cudaStream_t the call is queued on, as an opaque handle (null: the
  // device's default stream). The call returns once its work is queued; outputs are ready when the stream has
  // run it. Ignored for host tensors.
  void* stream = nullptr;
  // ---- score variants (FlashAttention's names and meanings; docs/api.md "Score variants") ----
  // With x = scale·q·k, the score of key j for query i of head h is
  //   s_ij = T(x) − slope_h·|i + Skv_b − Sq − j| + mask_ij,   T(x) = softcap·tanh(x / softcap)  (x when softcap = 0)
  // (Skv_b: the batch's key length). Logit soft-capping (Gemma 2): softcap > 0 caps every score at ±softcap
  // after the scale and before any bias; 0 turns it off. Must be 0 or a normal fp32 number.
  double softcap = 0;
  // ALiBi slopes, f32 [Hq] or [B, Hq] (finite; 0 = no bias for that head): the bias −slope·|i + Skv_b − Sq − j|,
  // aligned bottom-right as FlashAttention aligns it (the last query sits on the last key) whatever `causal` is.
  std::optional<TensorView> alibi_slopes;
  // Attention sinks (gpt-oss, StreamingLLM), f32 [Hq] (finite or −inf = none): a logit per head, in natural-log
  // units like s_ij, that joins every row's softmax denominator but carries no value:
  //   out_i = Σ_j e^(s_ij) v_j / (e^(sink_h) + Σ_j e^(s_ij)),   lse_i = log(e^(sink_h) + Σ_j e^(s_ij)).
  // A row with no allowed key then gets out = 0 and lse = sink_h.
  std::optional<TensorView> sinks;
  // Attention dropout (training; FlashAttention's dropout_p): each weight P_ij = softmax(s)_ij is dropped with
  // probability dropout_p and the kept ones are scaled by 1 / (1 − dropout_p); the LSE is that of P (before
  // dropout). Which weights drop is a pure function of (dropout_seed, b, h, i, j) (Philox4x32-10, docs/api.md
  // "Score variants"): the same seed gives the same mask at every thread count, in the backward, and in the reference.
  // 0 turns it off; must be in [0, 1).
  double dropout_p = 0;
  std::uint64_t dropout_seed = 0;
  // attention_backward only (ignored by the forward): see BackwardStatistics. from_forward needs the flash
  // backend (the reference recomputes everything) and no sinks.
  BackwardStatistics backward_statistics = BackwardStatistics::automatic;
  // Whether the values of an f32 mask are checked (one pass over the mask; NaN and +inf are refused). false
  // trusts them: a NaN or +inf value then gives NaN in its row, as IEEE arithmetic does.
  bool check_mask_values = true;
};

// Computes attention for
//   q   [B, Hq,  Sq,  Dk]    k [B, Hkv, Skv, Dk]    v [B, Hkv, Skv, Dv]
//   out [B, Hq,  Sq,  Dv]    lse (optional, f32) [B, Hq, Sq]
// with Hq % Hkv == 0 (query head h reads KV head h / (Hq / Hkv)): MHA, GQA and MQA.
// q, k, v, out: f32, bf16 or f16 (k and v may also be i8 or i4, with Params::k_scale / v_scale); k and v share a dtype,
// q and out share a dtype.
// lse[b,h,i] = log(sum_j exp(score_ij)) over allowed keys, natural log; a row with no allowed
// key gets out = 0 and lse = -inf. Every argument is validated before anything is written:
// on error the returned Status names the parameter and the expectation, and out/lse are untouched.
Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                 const Params& params = {}, const std::optional<TensorView>& lse = std::nullopt);

// Attention over a paged KV cache (vLLM / FlashInfer style). Keys and values live in a pool of pages:
//   k_pages [P, Hkv, page_size, Dk], v_pages [P, Hkv, page_size, Dv]   (any strides, f32/bf16/f16, or i8 with
//   Params::k_scale / v_scale [P, Hkv, page_size], or i4 with [P, Hkv, page_size, ceil(D / 32)])
//   page_table [B, max_pages] i32: page_table[b][n] is the pool page holding keys n·page_size .. of sequence b
//   seq_lens [B] i32 or i64: the number of keys of sequence b (<= max_pages · page_size); entries of
//   page_table past ceil(seq_lens[b] / page_size) are never read.
// q, out, lse and every Params field mean what they mean for attention(), with Skv = max_pages · page_size
// and kv_lens = seq_lens (params.kv_lens must be empty). A page index outside [0, P) among the pages a
// sequence uses is an error (nothing is written).
Status attention_paged(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                       const TensorView& page_table, const TensorView& seq_lens, const TensorView& out,
                       const Params& params = {}, const std::optional<TensorView>& lse = std::nullopt);

// Shared-prefix (cascade) attention over a paged KV cache, as FlashInfer's cascade attention: many sequences share
// a prefix (a system prompt, few-shot examples, beams or parallel samples of one prompt), whose keys sit once in
// the page pool. Sequence b's keys are the shared prefix's prefix_len keys (pages prefix_table[0], [1], ...)
// followed by its own seq_lens[b] keys (pages page_table[b][..], as attention_paged reads them). The prefix is
// attended once for every query of the batch together (one product of all B·Sq query rows against the prefix:
// each prefix key is read once, not once per sequence), each sequence's own keys separately, and the two partial
// results (f32) merged with the one LSE merge (merge_attention's), then rounded to out's dtype once. The result
// is attention_paged over the concatenated keys, to fp32 rounding of the merge.
//   prefix_table [n] i32 (n · page_size >= prefix_len, entries in [0, P)); prefix_len >= 0 (0: attention_paged)
//   every other argument as attention_paged's; lse is over all of a row's keys.
// Params: causal none or bottom_right (each sequence's last query sits on its last key; every query must then see
// the whole prefix: seq_lens[b] >= Sq - 1), softcap, sinks (absorbed once, after the merge), threads, workspace,
// backend (reference: the fp64 reference over the concatenated keys). Refused with a Status naming the parameter:
// windows, dense masks, ALiBi and dropout (their definitions depend on a key's position in its sequence or on the
// batch), CUDA tensors (not yet).
Status attention_paged_cascade(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                               const TensorView& prefix_table, std::int64_t prefix_len, const TensorView& page_table,
                               const TensorView& seq_lens, const TensorView& out, const Params& params = {},
                               const std::optional<TensorView>& lse = std::nullopt);

// Merges two attention results over disjoint key sets of the same queries (split-KV, cascade and
// distributed attention): out = (e^lse_a·out_a + e^lse_b·out_b) / (e^lse_a + e^lse_b) and
// lse = log(e^lse_a + e^lse_b), computed stably. out_* are [B, H, S, Dv] f32, lse_* [B, H, S] f32.
// A side with lse = -inf contributes nothing; both -inf gives out = 0, lse = -inf. out/lse may be the
// same views as out_a/lse_a (or out_b/lse_b) to merge in place. All six on one device; on CUDA the merge is
// queued on `stream` (a cudaStream_t; null: the default stream).
Status merge_attention(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                       const TensorView& lse_b, const TensorView& out, const TensorView& lse,
                       void* stream = nullptr);

}  // namespace attn
