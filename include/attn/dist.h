// attn::dist: attention across processes over MPI: context-parallel (ring) attention, forward and backward.
//
// The sequence is split over the P ranks of a communicator: each rank holds a slice of Q, K and V (and gets its
// slice of O and the LSE). The K/V slices travel around the ring (rank r sends to r + 1 and receives from r - 1)
// with non-blocking point-to-point messages that overlap the current block's compute, and every rank merges its
// partial results with the one online-softmax merge (attn::merge_attention's formula). The library is its own
// target (attn_dist), so the core attn library has no MPI dependency.
//
//   attn::dist::RingParams rp;  rp.causal = true;  rp.layout = attn::dist::Layout::zigzag;
//   attn::Status s = attn::dist::ring_attention(q_slice, k_slice, v_slice, out_slice, MPI_COMM_WORLD, rp, lse_slice);
//
// Every rank must call with the same B, heads, head dims, dtypes and parameters. Before any compute the ranks
// agree on all of it (one MPI_Allgather): a rank whose arguments are invalid, or whose shapes disagree with the
// others', makes every rank return the same error (naming the rank and the parameter); nothing hangs and no
// output is written. MPI errors themselves are returned as a Status naming "comm".
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/sdpa.h"
#include "attn/status.h"
#include "attn/tensor.h"

namespace attn::dist {

// How the global sequence of S positions is laid out over the P ranks.
enum class Layout : std::uint8_t {
  // Rank r holds positions [start_r, start_r + S_r): slices in rank order, of any lengths (uneven allowed).
  contiguous,
  // The sequence cut into 2P chunks as even as possible (the first S mod 2P one longer); rank r holds chunk r
  // followed by chunk 2P-1-r. With a causal mask every rank then does the same work (load balance).
  zigzag,
};

// One run of consecutive global positions [start, start + length) a rank holds (in its local order).
struct Segment {
  std::int64_t start = 0, length = 0;
};

// The segments rank `rank` holds of a sequence of `total` positions under `layout`; for contiguous, the even
// split (the first total mod P ranks one longer) that scatter_sequence and gather_sequence use.
std::vector<Segment> slice_segments(Layout layout, std::int64_t total, int ranks, int rank);

// Copies rank `rank`'s slice of `full` [B, H, S, D] (any dtype, any strides) into `slice` [B, H, S_rank, D] (same
// dtype), and back: the documented helpers for putting a whole sequence into a layout and reassembling it. Local
// copies only (no MPI); every rank can call them on the full tensor it has, or a root can call them per rank.
Status scatter_sequence(const TensorView& full, Layout layout, int ranks, int rank, const TensorView& slice);
Status gather_sequence(const TensorView& slice, Layout layout, int ranks, int rank, const TensorView& full);

struct RingParams {
  std::optional<double> scale;  // multiplies q·k; default 1/sqrt(Dk)
  // Causal over global positions: key j allowed for query i when j <= i. Needs self-attention slices: every rank's
  // Q and K/V slices hold the same positions (Sq_r = Skv_r).
  bool causal = false;
  // Global key lengths [B] (i32 or i64, the same on every rank): keys at global positions >= kv_lens[b] are
  // padding. The causal diagonal stays j <= i (padding does not move it).
  std::optional<TensorView> kv_lens;
  double softcap = 0;  // logit soft-capping, as attn::Params::softcap (position-free, so it composes with the ring)
  Layout layout = Layout::contiguous;
  int threads = 0;  // threads per rank for the local kernels (0 = attn's default)
  // Query rows per local kernel call: between calls the rank lets MPI progress the transfers in flight.
  std::int64_t row_chunk = 512;
};

// Where a rank's time went, per ring step (for ring-bench and the planner's check).
struct RingStep {
  double compute_seconds = 0;  // local kernels and merges
  double wait_seconds = 0;     // blocked on the step's messages after its compute
  std::int64_t bytes_sent = 0;
};
struct RingStats {
  std::vector<RingStep> steps;
  double total_seconds = 0;  // the whole call, agreement included
};

// q [B, Hq, Sq_r, Dk], k [B, Hkv, Skv_r, Dk], v [B, Hkv, Skv_r, Dv], out [B, Hq, Sq_r, Dv] (rank r's slices; f32,
// bf16 or f16; k and v share a dtype, out has q's): out = rank r's rows of attention over the whole sequence's
// keys, lse (f32 [B, Hq, Sq_r], optional) their log-sum-exp. Accumulation is fp32; K/V travel in their own dtype.
// GQA/MQA (Hq % Hkv == 0), Dv != Dk, kv_lens and causal as in RingParams. Cross-attention (non-causal) may have
// Sq_r != Skv_r. Equal to single-process attn::attention() on the gathered sequence within the tolerance rule
// (tests/test_ring.cc).
Status ring_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      MPI_Comm comm, const RingParams& params = {},
                      const std::optional<TensorView>& lse = std::nullopt, RingStats* stats = nullptr);

// The backward over the ring: given rank r's q, k, v, the forward's out and lse (from ring_attention) and grad_out,
// writes rank r's grad_q, grad_k, grad_v (the dtypes of q, k and k). dQ stays on its rank; each K/V block's dK/dV
// accumulators (fp32) travel with it and return home after a full turn. The sums run in a fixed order for a fixed
// number of ranks: the result is bitwise deterministic.
Status ring_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView& lse, const TensorView& grad_out, const TensorView& grad_q,
                               const TensorView& grad_k, const TensorView& grad_v, MPI_Comm comm,
                               const RingParams& params = {}, RingStats* stats = nullptr);

}  // namespace attn::dist
