// Ring (context-parallel) attention over MPI: the forward and backward of attn/dist.h.
//
// Each call: (1) every rank validates its own arguments and the ranks agree on everything with one
// MPI_Allgather of a fixed-size descriptor (an invalid or disagreeing rank makes all of them return the same
// error before any compute); (2) the ring: P steps, at step s rank r holds K/V block (r − s) mod P, posts the
// transfer of that block to r + 1 (and the receipt of the next from r − 1) and computes its queries against it
// meanwhile, in row chunks with MPI progress between them; partial results are merged by attn::merge_attention;
// (3) an MPI_Allgather of every rank's outcome, so that a failure on one rank is every rank's error, then the
// outputs are written.
#include "attn/dist.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "attn/backward.h"
#include "core/convert.h"
#include "core/problem.h"
#include "core/views.h"
#include "core/backward_problem.h"

namespace attn::dist {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- element copies between caller views and contiguous buffers ------------------------------------------------

// Calls f(offset_in_view, linear_index) for every element of a view of rank 1..4, in logical row-major order.
template <class F>
void for_each_element(const TensorView& t, F f) {
  std::array<std::int64_t, 4> n{1, 1, 1, 1}, st{0, 0, 0, 0};
  for (int d = 0; d < t.rank; ++d) n[static_cast<std::size_t>(4 - t.rank + d)] = t.shape[static_cast<std::size_t>(d)],
                                   st[static_cast<std::size_t>(4 - t.rank + d)] = t.strides[static_cast<std::size_t>(d)];
  std::int64_t lin = 0;
  for (std::int64_t a = 0; a < n[0]; ++a)
    for (std::int64_t b = 0; b < n[1]; ++b)
      for (std::int64_t c = 0; c < n[2]; ++c)
        for (std::int64_t d = 0; d < n[3]; ++d) f(a * st[0] + b * st[1] + c * st[2] + d * st[3], lin++);
}

void to_f32(const TensorView& t, float* dst) {
  for_each_element(t, [&](std::int64_t off, std::int64_t i) { dst[i] = core::float_at(t, off); });
}
void from_f32(const float* src, const TensorView& t) {
  for_each_element(t, [&](std::int64_t off, std::int64_t i) { core::store_float(t, off, src[i]); });
}
// The view's elements, in logical order, as raw bytes (same dtype): what travels.
void pack(const TensorView& t, unsigned char* dst) {
  const std::size_t size = dtype_size(t.dtype);
  for_each_element(t, [&](std::int64_t off, std::int64_t i) {
    std::memcpy(dst + static_cast<std::size_t>(i) * size, static_cast<const unsigned char*>(t.data) + off * static_cast<std::int64_t>(size), size);
  });
}

TensorView view4(const void* data, DType dtype, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  return TensorView::contiguous(data, dtype, {a, b, c, d});
}
// Rows [r0, r0 + rows) of a contiguous [B, H, S, D] buffer (or [B, H, S] when d == 0), as a view.
TensorView rows_of(float* base, std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t d, std::int64_t r0,
                   std::int64_t rows) {
  TensorView t;
  t.dtype = DType::f32;
  if (d == 0) {
    t.data = base + r0;
    t.rank = 3;
    t.shape = {B, H, rows, 0};
    t.strides = {H * S, S, 1, 0};
  } else {
    t.data = base + r0 * d;
    t.rank = 4;
    t.shape = {B, H, rows, d};
    t.strides = {H * S * d, S * d, d, 1};
  }
  return t;
}

// ---- agreement ---------------------------------------------------------------------------------------------------

struct Desc {
  std::int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, Dk = 0, Dv = 0;
  std::int32_t qdtype = 0, kvdtype = 0, causal = 0, layout = 0, has_lse = 0, has_kv_lens = 0;
  double scale = 0, softcap = 0;
  std::int64_t kv_lens_max = 0;
  std::uint64_t kv_lens_hash = 0;
  std::int32_t error_code = 0;  // a local error: its StatusCode, parameter and message (after "param: ")
  char error_param[64] = {};
  char error[400] = {};
};

void set_error(Desc& d, const Status& s) {
  d.error_code = static_cast<std::int32_t>(s.code());
  std::snprintf(d.error_param, sizeof d.error_param, "%s", s.param().c_str());
  const std::string& m = s.message();
  const std::string head = s.param() + ": ";
  std::snprintf(d.error, sizeof d.error, "%s", (m.compare(0, head.size(), head) == 0 ? m.substr(head.size()) : m).c_str());
}

// Rank r's local error, as every rank reports it: "<param>: on rank r: <what>".
Status rank_error(const Desc& d, int r) {
  const std::string param = d.error_param[0] ? d.error_param : "comm";
  const std::string what = "on rank " + std::to_string(r) + ": " + d.error;
  switch (static_cast<StatusCode>(d.error_code)) {
    case StatusCode::out_of_memory: return Status::OutOfMemory(param, what);
    case StatusCode::unsupported: return Status::Unsupported(param, what);
    default: return Status::Invalid(param, what);
  }
}

Status mpi_error(int code, const char* what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return Status::Invalid("comm", std::string(what) + " failed: " + std::string(text, static_cast<std::size_t>(len)) +
                                     "; expected a working MPI communicator");
}

// Reads kv_lens (validated: i32/i64 [B]) into per-batch values.
std::vector<std::int64_t> read_lens(const TensorView& t) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(t.shape[0]));
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    out[static_cast<std::size_t>(b)] = t.dtype == DType::i32 ? static_cast<const std::int32_t*>(t.data)[b * t.strides[0]]
                                                             : static_cast<const std::int64_t*>(t.data)[b * t.strides[0]];
  return out;
}

Status check_kv_lens(const TensorView& t, std::int64_t B) {
  if (t.rank != 1 || t.shape[0] != B)
    return Status::Invalid("kv_lens", "rank " + std::to_string(t.rank) + " with " + std::to_string(t.shape[0]) +
                                          " entries; expected [B] = [" + std::to_string(B) + "]");
  if (t.dtype != DType::i32 && t.dtype != DType::i64)
    return Status::Invalid("kv_lens", std::string("dtype ") + dtype_name(t.dtype) + "; expected i32 or i64");
  if (!t.data && B > 0) return Status::Invalid("kv_lens", "null data; expected [B] key lengths");
  for (std::int64_t len : read_lens(t))
    if (len < 0) return Status::Invalid("kv_lens", "a length of " + std::to_string(len) + "; expected >= 0");
  return Status::Ok();
}

// Local checks every rank can make alone, through core::validate (the single-process call's own checks).
Status validate_local(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const std::optional<TensorView>& lse, const RingParams& rp, Desc* d) {
  Params p;
  p.scale = rp.scale;
  p.softcap = rp.softcap;
  p.threads = rp.threads;
  core::Problem problem;
  if (k.dtype == DType::i8 || k.dtype == DType::i4)  // (core::validate would ask for k_scale, which RingParams lacks)
    return Status::Invalid("k", std::string("dtype ") + dtype_name(k.dtype) +
                                    "; expected f32, bf16 or f16 (ring attention passes K/V without scales)");
  if (Status s = core::validate(q, k, v, out, p, lse, &problem); !s) return s;
  if (rp.layout != Layout::contiguous && rp.layout != Layout::zigzag)
    return Status::Invalid("layout", "value " + std::to_string(static_cast<int>(rp.layout)) + "; expected contiguous or zigzag");
  if (rp.row_chunk < 1) return Status::Invalid("row_chunk", std::to_string(rp.row_chunk) + "; expected >= 1");
  if (rp.causal && q.shape[2] != k.shape[2])
    return Status::Invalid("q", "causal with " + std::to_string(q.shape[2]) + " query rows but " +
                                    std::to_string(k.shape[2]) + " keys on this rank; expected self-attention slices "
                                                                 "(the same positions for Q and K/V)");
  d->B = q.shape[0], d->Hq = q.shape[1], d->Hkv = k.shape[1], d->Sq = q.shape[2], d->Skv = k.shape[2];
  d->Dk = q.shape[3], d->Dv = v.shape[3];
  d->qdtype = static_cast<int>(q.dtype), d->kvdtype = static_cast<int>(k.dtype);
  d->causal = rp.causal, d->layout = static_cast<int>(rp.layout), d->has_lse = lse.has_value();
  d->scale = problem.scale, d->softcap = rp.softcap;
  if (rp.kv_lens) {
    if (Status s = check_kv_lens(*rp.kv_lens, q.shape[0]); !s) return s;
    d->has_kv_lens = 1;
    std::uint64_t h = 1469598103934665603ull;
    for (std::int64_t len : read_lens(*rp.kv_lens)) {
      h = (h ^ static_cast<std::uint64_t>(len)) * 1099511628211ull;
      d->kv_lens_max = std::max(d->kv_lens_max, len);
    }
    d->kv_lens_hash = h;
  }
  return Status::Ok();
}

// The geometry every rank derives from the gathered descriptors: the same on all of them.
struct Ring {
  int P = 1, rank = 0;
  std::vector<Desc> all;
  std::vector<std::vector<Segment>> qseg, kseg;  // per rank: the global positions of its Q and K/V slices
  std::int64_t total_q = 0, total_kv = 0;
};

std::string rank_str(int r) { return "rank " + std::to_string(r); }

// Agreement: the same Status on every rank.
Status agree(const Desc& mine, MPI_Comm comm, Ring* ring) {
  ring->all.assign(static_cast<std::size_t>(ring->P), Desc{});
  if (int e = MPI_Allgather(&mine, sizeof(Desc), MPI_BYTE, ring->all.data(), sizeof(Desc), MPI_BYTE, comm); e != MPI_SUCCESS)
    return mpi_error(e, "MPI_Allgather of the call's shapes");
  const auto& all = ring->all;
  for (int r = 0; r < ring->P; ++r)
    if (all[static_cast<std::size_t>(r)].error_code) return rank_error(all[static_cast<std::size_t>(r)], r);
  const Desc& a = all[0];
  for (int r = 1; r < ring->P; ++r) {
    const Desc& d = all[static_cast<std::size_t>(r)];
    auto differ = [&](const char* param, const std::string& what, const std::string& mine_v,
                      const std::string& root_v) {
      return Status::Invalid(param, rank_str(r) + " has " + what + " " + mine_v + " but rank 0 has " + root_v +
                                        "; expected the same on every rank");
    };
    if (d.B != a.B) return differ("q", "batch B =", std::to_string(d.B), std::to_string(a.B));
    if (d.Hq != a.Hq) return differ("q", "query heads Hq =", std::to_string(d.Hq), std::to_string(a.Hq));
    if (d.Hkv != a.Hkv) return differ("k", "key/value heads Hkv =", std::to_string(d.Hkv), std::to_string(a.Hkv));
    if (d.Dk != a.Dk) return differ("q", "head dim Dk =", std::to_string(d.Dk), std::to_string(a.Dk));
    if (d.Dv != a.Dv) return differ("v", "head dim Dv =", std::to_string(d.Dv), std::to_string(a.Dv));
    if (d.qdtype != a.qdtype)
      return differ("q", "dtype", dtype_name(static_cast<DType>(d.qdtype)), dtype_name(static_cast<DType>(a.qdtype)));
    if (d.kvdtype != a.kvdtype)
      return differ("k", "dtype", dtype_name(static_cast<DType>(d.kvdtype)), dtype_name(static_cast<DType>(a.kvdtype)));
    if (d.causal != a.causal) return differ("causal", "causal =", std::to_string(d.causal), std::to_string(a.causal));
    if (d.layout != a.layout) return differ("layout", "layout", std::to_string(d.layout), std::to_string(a.layout));
    if (d.has_lse != a.has_lse) return differ("lse", "an lse:", d.has_lse ? "yes" : "no", a.has_lse ? "yes" : "no");
    if (d.scale != a.scale) return differ("scale", "scale", std::to_string(d.scale), std::to_string(a.scale));
    if (d.softcap != a.softcap) return differ("softcap", "softcap", std::to_string(d.softcap), std::to_string(a.softcap));
    if (d.has_kv_lens != a.has_kv_lens || d.kv_lens_hash != a.kv_lens_hash)
      return Status::Invalid("kv_lens", rank_str(r) + "'s kv_lens differ from rank 0's; expected the same global key "
                                                        "lengths on every rank");
  }
  ring->total_q = ring->total_kv = 0;
  for (const Desc& d : all) ring->total_q += d.Sq, ring->total_kv += d.Skv;
  if (a.has_kv_lens && a.kv_lens_max > ring->total_kv)
    return Status::Invalid("kv_lens", "a length of " + std::to_string(a.kv_lens_max) + "; expected at most the "
                                      "global key count " + std::to_string(ring->total_kv));
  const auto layout = static_cast<Layout>(a.layout);
  ring->qseg.assign(static_cast<std::size_t>(ring->P), {});
  ring->kseg.assign(static_cast<std::size_t>(ring->P), {});
  std::int64_t qstart = 0, kstart = 0;
  for (int r = 0; r < ring->P; ++r) {
    const Desc& d = all[static_cast<std::size_t>(r)];
    if (layout == Layout::contiguous) {
      ring->qseg[static_cast<std::size_t>(r)] = {{qstart, d.Sq}};
      ring->kseg[static_cast<std::size_t>(r)] = {{kstart, d.Skv}};
      qstart += d.Sq, kstart += d.Skv;
      continue;
    }
    auto qs = slice_segments(layout, ring->total_q, ring->P, r), ks = slice_segments(layout, ring->total_kv, ring->P, r);
    const std::int64_t want_q = qs[0].length + qs[1].length, want_k = ks[0].length + ks[1].length;
    if (d.Sq != want_q || d.Skv != want_k)
      return Status::Invalid("layout", rank_str(r) + " holds " + std::to_string(d.Sq) + " query rows and " +
                                           std::to_string(d.Skv) + " keys; the zigzag layout of " +
                                           std::to_string(ring->total_q) + " positions over " + std::to_string(ring->P) +
                                           " ranks gives it " + std::to_string(want_q) + " and " +
                                           std::to_string(want_k) + " (scatter_sequence makes the slices)");
    ring->qseg[static_cast<std::size_t>(r)] = qs;
    ring->kseg[static_cast<std::size_t>(r)] = ks;
  }
  return Status::Ok();
}

// ---- messages ------------------------------------------------------------------------------------------------

constexpr std::int64_t kPiece = std::int64_t{1} << 30;  // bytes per MPI message (counts are int)
constexpr int kTagKv = 100, kTagGrad = 20000;

void post(bool send, void* buf, std::int64_t bytes, int peer, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs,
          int* error) {
  auto* p = static_cast<unsigned char*>(buf);
  for (std::int64_t off = 0, piece = 0; off < bytes || (bytes == 0 && piece == 0); off += kPiece, ++piece) {
    const int n = static_cast<int>(std::min(kPiece, bytes - off));
    MPI_Request r;
    const int e = send ? MPI_Isend(p + off, n, MPI_BYTE, peer, tag + static_cast<int>(piece), comm, &r)
                       : MPI_Irecv(p + off, n, MPI_BYTE, peer, tag + static_cast<int>(piece), comm, &r);
    if (e != MPI_SUCCESS && !*error) *error = e;
    if (e == MPI_SUCCESS) reqs.push_back(r);
    if (bytes == 0) break;
  }
}

double wait_all(std::vector<MPI_Request>& reqs, int* error) {
  const auto t0 = Clock::now();
  if (!reqs.empty()) {
    const int e = MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
    if (e != MPI_SUCCESS && !*error) *error = e;
  }
  reqs.clear();
  return seconds_since(t0);
}

void progress(std::vector<MPI_Request>& reqs) {
  if (reqs.empty()) return;
  int done = 0;
  MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
  if (done) reqs.clear();
}

// ---- one (query segment, key segment) pair ----------------------------------------------------------------------

// Which query rows of a segment pair see which keys, under the global causal rule j <= i.
struct PairPlan {
  bool skip = false;
  std::int64_t row0 = 0;        // first row that sees a key
  std::int64_t delta = 0;       // row i (segment-relative) sees keys j <= i + delta (segment-relative)
  bool windowed = false;        // false: every key of the segment, for every row from row0
};

PairPlan plan_pair(bool causal, const Segment& qs, const Segment& ks) {
  PairPlan p;
  if (qs.length == 0 || ks.length == 0) return p.skip = true, p;
  if (!causal) return p;
  p.delta = qs.start - ks.start;
  if (p.delta >= ks.length - 1) return p;             // every row sees every key
  if (p.delta + qs.length - 1 < 0) return p.skip = true, p;  // no row sees any key
  p.row0 = std::max<std::int64_t>(0, -p.delta);
  p.windowed = true;
  return p;
}

// Params for the rows [row0 + a, ...) of a pair (a relative to the pair's rows): key j (segment-relative) allowed
// when j <= i + delta, i the segment-relative row: a top-left window whose right side is (a + delta) for the call's
// rows counted from 0 (top-left: independent of the key lengths).
Params pair_params(const Desc& d, const RingParams& rp, const PairPlan& pp, std::int64_t first_row,
                   const std::vector<std::int64_t>* lens, TensorView* lens_view) {
  Params p;
  p.scale = d.scale;
  p.softcap = d.softcap;
  p.threads = rp.threads;
  p.check_mask_values = false;
  if (pp.windowed) p.window = Window{-1, first_row + pp.delta, Align::top_left};
  if (lens) {
    *lens_view = TensorView::contiguous(lens->data(), DType::i64, {static_cast<std::int64_t>(lens->size())});
    p.kv_lens = *lens_view;
  }
  return p;
}

// Per-batch key lengths of a key segment: the keys below the global kv_lens[b] (a prefix of the segment).
std::vector<std::int64_t> segment_lens(const std::vector<std::int64_t>& global, const Segment& ks) {
  std::vector<std::int64_t> out(global.size());
  for (std::size_t b = 0; b < global.size(); ++b) out[b] = std::clamp<std::int64_t>(global[b] - ks.start, 0, ks.length);
  return out;
}

// Calls f(qoff + a, rows, koff, ks, params) for every piece of work of rank r against block blk: each (query
// segment, key segment) pair the causal rule leaves visible, in chunks of at most rp.row_chunk query rows (qoff + a:
// the first local query row; koff, ks: the key segment's local offset and extent), stopping once `local` fails.
template <class F>
void for_each_piece(const Ring& ring, int r, int blk, const Desc& d, const RingParams& rp,
                    const std::vector<std::int64_t>& global_lens, const Status& local, F f) {
  std::int64_t qoff = 0;
  for (const Segment& qs : ring.qseg[static_cast<std::size_t>(r)]) {
    std::int64_t koff = 0;
    for (const Segment& ks : ring.kseg[static_cast<std::size_t>(blk)]) {
      const PairPlan pp = plan_pair(d.causal, qs, ks);
      const std::vector<std::int64_t> lens = rp.kv_lens ? segment_lens(global_lens, ks) : std::vector<std::int64_t>{};
      for (std::int64_t a = pp.row0; !pp.skip && local.ok() && a < qs.length; a += rp.row_chunk) {
        TensorView lens_view;
        const Params p = pair_params(d, rp, pp, a, rp.kv_lens ? &lens : nullptr, &lens_view);
        f(qoff + a, std::min(rp.row_chunk, qs.length - a), koff, ks, p);
      }
      koff += ks.length;
    }
    qoff += qs.length;
  }
}

struct CommGuard {
  MPI_Comm comm = MPI_COMM_NULL;
  ~CommGuard() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

// Every rank's outcome, so that all return the same Status.
Status agree_outcome(const Status& mine, MPI_Comm comm, int P) {
  Desc d;
  if (!mine.ok()) set_error(d, mine);
  std::vector<Desc> all(static_cast<std::size_t>(P));
  if (int e = MPI_Allgather(&d, sizeof(Desc), MPI_BYTE, all.data(), sizeof(Desc), MPI_BYTE, comm); e != MPI_SUCCESS)
    return mpi_error(e, "MPI_Allgather of the outcome");
  for (int r = 0; r < P; ++r)
    if (all[static_cast<std::size_t>(r)].error_code) return rank_error(all[static_cast<std::size_t>(r)], r);
  return Status::Ok();
}

Status start(MPI_Comm comm, CommGuard* guard, Ring* ring) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return Status::Invalid("comm", "MPI is not initialized; expected MPI_Init before the call");
  if (comm == MPI_COMM_NULL) return Status::Invalid("comm", "MPI_COMM_NULL; expected a communicator");
  // A private communicator: our messages never meet the caller's, and errors come back as codes.
  if (int e = MPI_Comm_dup(comm, &guard->comm); e != MPI_SUCCESS) return mpi_error(e, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(guard->comm, MPI_ERRORS_RETURN);
  MPI_Comm_size(guard->comm, &ring->P);
  MPI_Comm_rank(guard->comm, &ring->rank);
  return Status::Ok();
}

}  // namespace

// ---- layouts --------------------------------------------------------------------------------------------------

std::vector<Segment> slice_segments(Layout layout, std::int64_t total, int ranks, int rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks || total < 0) return {};
  if (layout == Layout::contiguous) {
    const std::int64_t base = total / ranks, rem = total % ranks;
    const std::int64_t start = rank * base + std::min<std::int64_t>(rank, rem);
    return {{start, base + (rank < rem ? 1 : 0)}};
  }
  const std::int64_t chunks = 2 * static_cast<std::int64_t>(ranks), base = total / chunks, rem = total % chunks;
  auto chunk = [&](std::int64_t c) { return Segment{c * base + std::min(c, rem), base + (c < rem ? 1 : 0)}; };
  return {chunk(rank), chunk(chunks - 1 - rank)};
}

namespace {
Status copy_slice(const TensorView& full, Layout layout, int ranks, int rank, const TensorView& slice, bool to_slice) {
  if (full.rank != 4) return Status::Invalid("full", "rank " + std::to_string(full.rank) + "; expected 4 ([B, H, S, D])");
  if (slice.rank != 4) return Status::Invalid("slice", "rank " + std::to_string(slice.rank) + "; expected 4 ([B, H, S, D])");
  if (full.dtype != slice.dtype)
    return Status::Invalid("slice", std::string("dtype ") + dtype_name(slice.dtype) + "; expected full's (" +
                                        dtype_name(full.dtype) + ")");
  if (ranks < 1 || rank < 0 || rank >= ranks)
    return Status::Invalid("rank", std::to_string(rank) + " of " + std::to_string(ranks) + "; expected 0 <= rank < ranks");
  const auto segs = slice_segments(layout, full.shape[2], ranks, rank);
  std::int64_t len = 0;
  for (const Segment& s : segs) len += s.length;
  if (slice.shape[0] != full.shape[0] || slice.shape[1] != full.shape[1] || slice.shape[3] != full.shape[3] ||
      slice.shape[2] != len)
    return Status::Invalid("slice", "shape [" + std::to_string(slice.shape[0]) + ", " + std::to_string(slice.shape[1]) +
                                        ", " + std::to_string(slice.shape[2]) + ", " + std::to_string(slice.shape[3]) +
                                        "]; expected [B, H, " + std::to_string(len) + ", D] (rank " +
                                        std::to_string(rank) + "'s share of " + std::to_string(full.shape[2]) + ")");
  if (len == 0 || full.shape[0] * full.shape[1] * full.shape[3] == 0) return Status::Ok();  // nothing to copy
  if (!full.data || !slice.data) return Status::Invalid(full.data ? "slice" : "full", "null data; expected memory");
  const std::size_t size = dtype_size(full.dtype);
  std::int64_t local = 0;
  for (const Segment& s : segs) {
    for (std::int64_t b = 0; b < full.shape[0]; ++b)
      for (std::int64_t h = 0; h < full.shape[1]; ++h)
        for (std::int64_t i = 0; i < s.length; ++i)
          for (std::int64_t d = 0; d < full.shape[3]; ++d) {
            auto* f = static_cast<unsigned char*>(full.data) +
                      (b * full.strides[0] + h * full.strides[1] + (s.start + i) * full.strides[2] + d * full.strides[3]) *
                          static_cast<std::int64_t>(size);
            auto* l = static_cast<unsigned char*>(slice.data) +
                      (b * slice.strides[0] + h * slice.strides[1] + (local + i) * slice.strides[2] + d * slice.strides[3]) *
                          static_cast<std::int64_t>(size);
            if (to_slice) std::memcpy(l, f, size);
            else std::memcpy(f, l, size);
          }
    local += s.length;
  }
  return Status::Ok();
}
}  // namespace

Status scatter_sequence(const TensorView& full, Layout layout, int ranks, int rank, const TensorView& slice) {
  return copy_slice(full, layout, ranks, rank, slice, true);
}
Status gather_sequence(const TensorView& slice, Layout layout, int ranks, int rank, const TensorView& full) {
  return copy_slice(full, layout, ranks, rank, slice, false);
}

// ---- forward ----------------------------------------------------------------------------------------------------

Status ring_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      MPI_Comm comm_in, const RingParams& rp, const std::optional<TensorView>& lse, RingStats* stats) {
  const auto t_call = Clock::now();
  CommGuard guard;
  Ring ring;
  if (Status s = start(comm_in, &guard, &ring); !s) return s;
  MPI_Comm comm = guard.comm;
  Desc mine;
  if (Status s = validate_local(q, k, v, out, lse, rp, &mine); !s) set_error(mine, s);
  if (Status s = agree(mine, comm, &ring); !s) return s;
  const Desc& d = mine;
  const int P = ring.P, r = ring.rank;
  const DType kvdt = k.dtype;
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(kvdt));
  auto block_bytes = [&](int b) { return d.B * d.Hkv * ring.all[static_cast<std::size_t>(b)].Skv * (d.Dk + d.Dv) * esize; };
  std::int64_t max_bytes = 0;
  for (int b = 0; b < P; ++b) max_bytes = std::max(max_bytes, block_bytes(b));
  const std::vector<std::int64_t> global_lens = rp.kv_lens ? read_lens(*rp.kv_lens) : std::vector<std::int64_t>{};

  Status local = Status::Ok();
  std::vector<float> q32, acc, acc_lse, part, part_lse;
  std::vector<unsigned char> buf[2];
  try {
    q32.resize(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dk));
    acc.assign(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dv), 0.0f);
    acc_lse.assign(static_cast<std::size_t>(d.B * d.Hq * d.Sq), -std::numeric_limits<float>::infinity());
    const std::int64_t chunk = std::min<std::int64_t>(std::max<std::int64_t>(d.Sq, 1), rp.row_chunk);
    part.resize(static_cast<std::size_t>(d.B * d.Hq * chunk * d.Dv));
    part_lse.resize(static_cast<std::size_t>(d.B * d.Hq * chunk));
    buf[0].resize(static_cast<std::size_t>(max_bytes));
    buf[1].resize(static_cast<std::size_t>(max_bytes));
  } catch (const std::bad_alloc&) {
    local = Status::OutOfMemory("q", "ring_attention could not allocate its fp32 accumulators and K/V buffers");
  }
  if (Status s = agree_outcome(local, comm, P); !s) return s;

  to_f32(q, q32.data());
  const std::int64_t kbytes = d.B * d.Hkv * d.Skv * d.Dk * esize;
  pack(k, buf[0].data());
  pack(v, buf[0].data() + kbytes);
  if (stats) stats->steps.assign(static_cast<std::size_t>(P), RingStep{});
  int mpi_err = 0;
  std::vector<MPI_Request> reqs;
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  for (int s = 0; s < P; ++s) {
    const int blk = (r - s + P) % P;
    unsigned char* cur = buf[s % 2].data();
    if (s + 1 < P) {  // the next block arrives while this one is computed
      post(false, buf[(s + 1) % 2].data(), block_bytes((blk + P - 1) % P), prev, kTagKv, comm, reqs, &mpi_err);
      post(true, cur, block_bytes(blk), next, kTagKv, comm, reqs, &mpi_err);
      if (stats) stats->steps[static_cast<std::size_t>(s)].bytes_sent = block_bytes(blk);
    }
    const auto t0 = Clock::now();
    const std::int64_t skv = ring.all[static_cast<std::size_t>(blk)].Skv;
    const TensorView kb = view4(cur, kvdt, d.B, d.Hkv, skv, d.Dk);
    const TensorView vb = view4(cur + d.B * d.Hkv * skv * d.Dk * esize, kvdt, d.B, d.Hkv, skv, d.Dv);
    for_each_piece(ring, r, blk, d, rp, global_lens, local, [&](std::int64_t row, std::int64_t rows, std::int64_t koff,
                                                                const Segment& ks, const Params& p) {
      const TensorView qv = rows_of(q32.data(), d.B, d.Hq, d.Sq, d.Dk, row, rows);
      TensorView kv = kb, vv = vb;
      kv.data = static_cast<unsigned char*>(kb.data) + koff * d.Dk * esize, kv.shape[2] = ks.length;
      vv.data = static_cast<unsigned char*>(vb.data) + koff * d.Dv * esize, vv.shape[2] = ks.length;
      const TensorView po = rows_of(part.data(), d.B, d.Hq, rows, d.Dv, 0, rows);
      const TensorView pl = rows_of(part_lse.data(), d.B, d.Hq, rows, 0, 0, rows);
      local = attention(qv, kv, vv, po, p, pl);
      const TensorView ao = rows_of(acc.data(), d.B, d.Hq, d.Sq, d.Dv, row, rows);
      const TensorView al = rows_of(acc_lse.data(), d.B, d.Hq, d.Sq, 0, row, rows);
      if (local.ok()) local = merge_attention(ao, al, po, pl, ao, al);
      progress(reqs);
    });
    const double compute = seconds_since(t0);
    const double wait = wait_all(reqs, &mpi_err);
    if (stats) stats->steps[static_cast<std::size_t>(s)].compute_seconds = compute,
               stats->steps[static_cast<std::size_t>(s)].wait_seconds = wait;
  }
  if (mpi_err && local.ok()) local = mpi_error(mpi_err, "a K/V transfer around the ring");
  if (Status s = agree_outcome(local, comm, P); !s) return s;
  from_f32(acc.data(), out);
  if (lse) from_f32(acc_lse.data(), *lse);
  if (stats) stats->total_seconds = seconds_since(t_call);
  return Status::Ok();
}

// ---- backward ---------------------------------------------------------------------------------------------------

Status ring_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView& lse, const TensorView& grad_out, const TensorView& grad_q,
                               const TensorView& grad_k, const TensorView& grad_v, MPI_Comm comm_in,
                               const RingParams& rp, RingStats* stats) {
  const auto t_call = Clock::now();
  CommGuard guard;
  Ring ring;
  if (Status s = start(comm_in, &guard, &ring); !s) return s;
  MPI_Comm comm = guard.comm;
  Desc mine;
  {
    Status s = validate_local(q, k, v, out, lse, rp, &mine);
    if (s) {  // the gradients, through the single-process backward's own checks
      Params p;
      p.scale = rp.scale;
      p.softcap = rp.softcap;
      core::BackwardProblem bp;
      s = core::validate_backward(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, p, std::nullopt, &bp);
    }
    if (!s) set_error(mine, s);
  }
  if (Status s = agree(mine, comm, &ring); !s) return s;
  const Desc& d = mine;
  const int P = ring.P, r = ring.rank;
  const DType kvdt = k.dtype;
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(kvdt));
  auto skv_of = [&](int b) { return ring.all[static_cast<std::size_t>(b)].Skv; };
  auto kv_bytes = [&](int b) { return d.B * d.Hkv * skv_of(b) * (d.Dk + d.Dv) * esize; };
  auto grad_floats = [&](int b) { return d.B * d.Hkv * skv_of(b) * (d.Dk + d.Dv); };
  std::int64_t max_skv = 0;
  for (int b = 0; b < P; ++b) max_skv = std::max(max_skv, skv_of(b));
  const std::vector<std::int64_t> global_lens = rp.kv_lens ? read_lens(*rp.kv_lens) : std::vector<std::int64_t>{};

  Status local = Status::Ok();
  std::vector<float> q32, o32, do32, lse32, dq, dq_part, kv32, part_grad, dk_scratch, dv_scratch, gbuf[2];
  std::vector<unsigned char> buf[2];
  const std::int64_t chunk = std::min<std::int64_t>(std::max<std::int64_t>(d.Sq, 1), rp.row_chunk);
  try {
    q32.resize(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dk));
    o32.resize(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dv));
    do32.resize(o32.size());
    lse32.resize(static_cast<std::size_t>(d.B * d.Hq * d.Sq));
    dq.assign(q32.size(), 0.0f);
    dq_part.resize(static_cast<std::size_t>(d.B * d.Hq * chunk * d.Dk));
    kv32.resize(static_cast<std::size_t>(d.B * d.Hkv * max_skv * (d.Dk + d.Dv)));
    part_grad.resize(kv32.size());
    dk_scratch.resize(static_cast<std::size_t>(d.B * d.Hkv * max_skv * d.Dk));
    dv_scratch.resize(static_cast<std::size_t>(d.B * d.Hkv * max_skv * d.Dv));
    gbuf[0].resize(kv32.size());
    gbuf[1].resize(kv32.size());
    buf[0].resize(static_cast<std::size_t>(d.B * d.Hkv * max_skv * (d.Dk + d.Dv) * esize));
    buf[1].resize(buf[0].size());
  } catch (const std::bad_alloc&) {
    local = Status::OutOfMemory("q", "ring_attention_backward could not allocate its fp32 buffers");
  }
  if (Status s = agree_outcome(local, comm, P); !s) return s;

  to_f32(q, q32.data());
  to_f32(out, o32.data());
  to_f32(grad_out, do32.data());
  to_f32(lse, lse32.data());
  const std::int64_t kbytes = d.B * d.Hkv * d.Skv * d.Dk * esize;
  pack(k, buf[0].data());
  pack(v, buf[0].data() + kbytes);
  if (stats) stats->steps.assign(static_cast<std::size_t>(P), RingStep{});
  int mpi_err = 0;
  std::vector<MPI_Request> kv_reqs, grad_send, grad_recv;
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  int gcur = 0;  // gbuf[gcur]: the accumulators of this step's block (received, or this rank's own at step 0)
  for (int s = 0; s < P; ++s) {
    const int blk = (r - s + P) % P;
    const std::int64_t skv = skv_of(blk);
    unsigned char* cur = buf[s % 2].data();
    if (s + 1 < P) {
      post(false, buf[(s + 1) % 2].data(), kv_bytes((blk + P - 1) % P), prev, kTagKv, comm, kv_reqs, &mpi_err);
      post(true, cur, kv_bytes(blk), next, kTagKv, comm, kv_reqs, &mpi_err);
    }
    const auto t0 = Clock::now();
    // The block's K and V in fp32 ([K | V]), and this rank's contribution to its dK, dV ([dK | dV]), zeroed.
    const TensorView kraw = view4(cur, kvdt, d.B, d.Hkv, skv, d.Dk);
    const TensorView vraw = view4(cur + d.B * d.Hkv * skv * d.Dk * esize, kvdt, d.B, d.Hkv, skv, d.Dv);
    float* k32 = kv32.data();
    float* v32 = kv32.data() + d.B * d.Hkv * skv * d.Dk;
    to_f32(kraw, k32);
    to_f32(vraw, v32);
    float* pdk = part_grad.data();
    float* pdv = part_grad.data() + d.B * d.Hkv * skv * d.Dk;
    std::fill(part_grad.begin(), part_grad.begin() + grad_floats(blk), 0.0f);
    for_each_piece(ring, r, blk, d, rp, global_lens, local, [&](std::int64_t row, std::int64_t rows, std::int64_t koff,
                                                                const Segment& ks, const Params& pair) {
      Params p = pair;
      p.backward_statistics = BackwardStatistics::from_forward;  // lse and out are the whole sequence's
      p.backend = Backend::flash;
      const TensorView qv = rows_of(q32.data(), d.B, d.Hq, d.Sq, d.Dk, row, rows);
      const TensorView ov = rows_of(o32.data(), d.B, d.Hq, d.Sq, d.Dv, row, rows);
      const TensorView gv = rows_of(do32.data(), d.B, d.Hq, d.Sq, d.Dv, row, rows);
      const TensorView lv = rows_of(lse32.data(), d.B, d.Hq, d.Sq, 0, row, rows);
      const TensorView kv = rows_of(k32, d.B, d.Hkv, skv, d.Dk, koff, ks.length);
      const TensorView vv = rows_of(v32, d.B, d.Hkv, skv, d.Dv, koff, ks.length);
      const TensorView dqv = rows_of(dq_part.data(), d.B, d.Hq, rows, d.Dk, 0, rows);
      const TensorView dkv = rows_of(dk_scratch.data(), d.B, d.Hkv, ks.length, d.Dk, 0, ks.length);
      const TensorView dvv = rows_of(dv_scratch.data(), d.B, d.Hkv, ks.length, d.Dv, 0, ks.length);
      local = attention_backward(qv, kv, vv, ov, lv, gv, dqv, dkv, dvv, p);
      if (local.ok()) {
        for (std::int64_t bh = 0; bh < d.B * d.Hq; ++bh)
          for (std::int64_t i = 0; i < rows * d.Dk; ++i)
            dq[static_cast<std::size_t>((bh * d.Sq + row) * d.Dk + i)] += dq_part[static_cast<std::size_t>(bh * rows * d.Dk + i)];
        for (std::int64_t bh = 0; bh < d.B * d.Hkv; ++bh) {
          for (std::int64_t i = 0; i < ks.length * d.Dk; ++i)
            pdk[(bh * skv + koff) * d.Dk + i] += dk_scratch[static_cast<std::size_t>(bh * ks.length * d.Dk + i)];
          for (std::int64_t i = 0; i < ks.length * d.Dv; ++i)
            pdv[(bh * skv + koff) * d.Dv + i] += dv_scratch[static_cast<std::size_t>(bh * ks.length * d.Dv + i)];
        }
      }
      progress(kv_reqs);
      progress(grad_recv);
    });
    double compute = seconds_since(t0);
    double wait = 0;
    // This block's accumulators: this rank's own block starts them; later blocks' arrive from prev.
    if (s > 0) wait += wait_all(grad_recv, &mpi_err);
    const auto t1 = Clock::now();
    float* accum = gbuf[gcur].data();
    const std::int64_t n = grad_floats(blk);
    if (s == 0) std::copy(part_grad.begin(), part_grad.begin() + n, accum);
    else
      for (std::int64_t i = 0; i < n; ++i) accum[i] += part_grad[static_cast<std::size_t>(i)];
    compute += seconds_since(t1);
    // Pass them on (after a full turn they reach home: block r + 1's go to rank r + 1), and take in the next.
    wait += wait_all(grad_send, &mpi_err);  // the other buffer's previous send
    if (P > 1) {
      post(true, accum, n * 4, next, kTagGrad, comm, grad_send, &mpi_err);
      const int incoming = s + 1 < P ? (blk + P - 1) % P : r;  // the next step's block, or this rank's own, home
      post(false, gbuf[1 - gcur].data(), grad_floats(incoming) * 4, prev, kTagGrad, comm, grad_recv, &mpi_err);
      if (stats) stats->steps[static_cast<std::size_t>(s)].bytes_sent = (s + 1 < P ? kv_bytes(blk) : 0) + n * 4;
    }
    wait += wait_all(kv_reqs, &mpi_err);
    if (stats) stats->steps[static_cast<std::size_t>(s)].compute_seconds = compute,
               stats->steps[static_cast<std::size_t>(s)].wait_seconds = wait;
    gcur = 1 - gcur;
  }
  wait_all(grad_recv, &mpi_err);
  wait_all(grad_send, &mpi_err);
  if (mpi_err && local.ok()) local = mpi_error(mpi_err, "a transfer around the ring");
  if (Status s = agree_outcome(local, comm, P); !s) return s;
  // Home: gbuf[gcur] holds this rank's block's dK, dV summed over every rank (P = 1: its own, from step 0).
  const float* home = P > 1 ? gbuf[gcur].data() : gbuf[1 - gcur].data();
  from_f32(dq.data(), grad_q);
  from_f32(home, grad_k);
  from_f32(home + d.B * d.Hkv * d.Skv * d.Dk, grad_v);
  if (stats) stats->total_seconds = seconds_since(t_call);
  return Status::Ok();
}

}  // namespace attn::dist
