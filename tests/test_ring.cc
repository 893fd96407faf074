// Ring attention over MPI (attn/dist.h), run by ctest under `mpirun -np 1, 2, 3 and 4` (oversubscribed: sizes are
// small). Every rank builds the same full Q, K, V and dO from the same seed, takes its slice, runs the ring, and
// checks its own rows against the single-process attention() / attention_backward() on the full sequence, by the
// tolerance rule against the fp64 reference: error(ring) <= 2 · error(single process) + a rounding atol. Also:
// the backward is bitwise deterministic, uneven slices, cross-attention, every rank gets the same error when one
// rank's shapes disagree or one rank's argument is invalid, and nothing hangs (ctest's timeout).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/dist.h"
#include "core/convert.h"

using namespace attn;
using attn::dist::Layout;
using attn::dist::Segment;

namespace {

int g_rank = 0, g_size = 1, g_failures = 0, g_checks = 0;

void fail(const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "rank %d: FAIL: %s\n", g_rank, what.c_str());
}
#define CHECK(cond, what)      \
  do {                         \
    ++g_checks;                \
    if (!(cond)) fail(what);   \
  } while (0)

// A [B, H, S, D] tensor held as float (values already rounded to `dtype`), with its storage in `dtype`.
struct Tensor {
  std::int64_t B = 0, H = 0, S = 0, D = 0;
  DType dtype = DType::f32;
  std::vector<float> f;                 // the values
  std::vector<std::uint16_t> half;      // bf16 / f16 storage
  void init(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, DType dt) {
    B = b, H = h, S = s, D = d, dtype = dt;
    f.assign(static_cast<std::size_t>(b * h * s * d), 0.0f);
    half.assign(dt == DType::f32 ? 0 : f.size(), 0);
  }
  float& at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) {
    return f[static_cast<std::size_t>(((b * H + h) * S + i) * D + d)];
  }
  void round_and_store() {  // values rounded to dtype, storage filled
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (dtype == DType::bf16) half[i] = core::from_float<core::bf16>(f[i]).bits, f[i] = core::to_float(core::bf16{half[i]});
      if (dtype == DType::f16) half[i] = core::from_float<core::f16>(f[i]).bits, f[i] = core::to_float(core::f16{half[i]});
    }
  }
  void load_from_storage() {
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (dtype == DType::bf16) f[i] = core::to_float(core::bf16{half[i]});
      if (dtype == DType::f16) f[i] = core::to_float(core::f16{half[i]});
    }
  }
  TensorView view() {
    return TensorView::contiguous(dtype == DType::f32 ? static_cast<void*>(f.data()) : static_cast<void*>(half.data()),
                                  dtype, {B, H, S, D});
  }
  TensorView f32_view() { return TensorView::contiguous(f.data(), DType::f32, {B, H, S, D}); }
};

void randomize(Tensor& t, std::mt19937& rng, float amp) {
  std::uniform_real_distribution<float> u(-amp, amp);
  for (float& x : t.f) {
    x = u(rng);
    if (x == 0) x = amp / 3;
  }
  t.round_and_store();
}

// Rows of `full` at the given segments, as a new tensor of the same dtype.
Tensor take(Tensor& full, const std::vector<Segment>& segs) {
  std::int64_t n = 0;
  for (const Segment& s : segs) n += s.length;
  Tensor t;
  t.init(full.B, full.H, n, full.D, full.dtype);
  for (std::int64_t b = 0; b < full.B; ++b)
    for (std::int64_t h = 0; h < full.H; ++h) {
      std::int64_t row = 0;
      for (const Segment& s : segs)
        for (std::int64_t i = 0; i < s.length; ++i, ++row)
          for (std::int64_t d = 0; d < full.D; ++d) t.at(b, h, row, d) = full.at(b, h, s.start + i, d);
    }
  t.round_and_store();
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}
double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a)
    if (std::isfinite(x)) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}
double unit_roundoff(DType dt) { return dt == DType::bf16 ? 0x1p-8 : dt == DType::f16 ? 0x1p-11 : 0x1p-24; }

// The tolerance rule on rank `g_rank`'s rows: ring vs truth <= 2 single vs truth + atol.
void rule(const std::string& name, const std::vector<float>& ring, const std::vector<float>& single,
          const std::vector<float>& truth, DType dt) {
  const double e_ring = max_abs_diff(ring, truth), e_single = max_abs_diff(single, truth);
  const double atol = 4 * unit_roundoff(dt) * std::max(max_abs(truth), 1e-3);
  char msg[512];
  std::snprintf(msg, sizeof msg, "%s: error %.3g > 2 x %.3g + %.3g", name.c_str(), e_ring, e_single, atol);
  CHECK(e_ring <= 2 * e_single + atol, msg);
}

struct Config {
  std::string name;
  std::int64_t B = 2, Hq = 4, Hkv = 2, Dk = 16, Dv = 8;
  std::int64_t S = 41, Skv = 41;  // global lengths (Skv != S: cross-attention, non-causal only)
  bool causal = false;
  Layout layout = Layout::contiguous;
  bool uneven = false;            // contiguous slices of unequal lengths (rank r gets a share ~ r + 1)
  bool kv_lens = false;
  double softcap = 0;
  DType dtype = DType::f32;
  bool backward = true;
};

// The segments of rank r for a sequence of n positions under the config's layout.
std::vector<Segment> segments(const Config& c, std::int64_t n, int r) {
  if (c.layout == Layout::contiguous && c.uneven) {
    const std::int64_t weight_total = static_cast<std::int64_t>(g_size) * (g_size + 1) / 2;
    std::int64_t start = 0;
    for (int i = 0; i < r; ++i) start += n * (i + 1) / weight_total;
    const std::int64_t len = r + 1 == g_size ? n - start : n * (r + 1) / weight_total;
    return {{start, len}};
  }
  return dist::slice_segments(c.layout, n, g_size, r);
}

std::vector<float> rows_of(Tensor& full, const std::vector<Segment>& segs) { return take(full, segs).f; }

void run(const Config& c) {
  std::mt19937 rng(static_cast<unsigned>(std::hash<std::string>{}(c.name)));
  Tensor q, k, v, dout;
  q.init(c.B, c.Hq, c.S, c.Dk, c.dtype);
  k.init(c.B, c.Hkv, c.Skv, c.Dk, c.dtype);
  v.init(c.B, c.Hkv, c.Skv, c.Dv, c.dtype);
  dout.init(c.B, c.Hq, c.S, c.Dv, c.dtype);
  randomize(q, rng, 2.0f), randomize(k, rng, 2.0f), randomize(v, rng, 1.0f), randomize(dout, rng, 1.0f);
  std::vector<std::int64_t> lens = {c.Skv, c.Skv * 2 / 3};
  lens.resize(static_cast<std::size_t>(c.B), c.Skv - 3);
  lens[0] = c.Skv;

  Params p;
  p.causal = c.causal ? Causal::top_left : Causal::none;
  p.softcap = c.softcap;
  if (c.kv_lens) p.kv_lens = TensorView::contiguous(lens.data(), DType::i64, {c.B});
  dist::RingParams rp;
  rp.causal = c.causal;
  rp.layout = c.layout;
  rp.softcap = c.softcap;
  rp.threads = 1;
  rp.row_chunk = 16;  // several chunks per block, so the progress calls and piece offsets are exercised
  if (c.kv_lens) rp.kv_lens = p.kv_lens;

  // Single process, same precision (flash), and the fp64 truth (the reference backend on the same values in f32).
  Tensor out1, out_truth;
  out1.init(c.B, c.Hq, c.S, c.Dv, c.dtype);
  out_truth.init(c.B, c.Hq, c.S, c.Dv, DType::f32);
  std::vector<float> lse1(static_cast<std::size_t>(c.B * c.Hq * c.S)), lse_truth(lse1.size());
  const TensorView lse1_v = TensorView::contiguous(lse1.data(), DType::f32, {c.B, c.Hq, c.S});
  const TensorView lset_v = TensorView::contiguous(lse_truth.data(), DType::f32, {c.B, c.Hq, c.S});
  CHECK(attention(q.view(), k.view(), v.view(), out1.view(), p, lse1_v).ok(), c.name + ": single-process forward");
  out1.load_from_storage();
  Params pref = p;
  pref.backend = Backend::reference;
  CHECK(attention(q.f32_view(), k.f32_view(), v.f32_view(), out_truth.view(), pref, lset_v).ok(), c.name + ": reference");

  // The ring on this rank's slices.
  const auto qs = segments(c, c.S, g_rank), ks = segments(c, c.Skv, g_rank);
  Tensor ql = take(q, qs), kl = take(k, ks), vl = take(v, ks), dol = take(dout, qs);
  Tensor ol;
  ol.init(c.B, c.Hq, ql.S, c.Dv, c.dtype);
  std::fill(ol.f.begin(), ol.f.end(), NAN);
  std::fill(ol.half.begin(), ol.half.end(), 0xFFFF);  // NaN in bf16 and in f16
  std::vector<float> lsel(static_cast<std::size_t>(c.B * c.Hq * ql.S), NAN);
  const TensorView lsel_v = TensorView::contiguous(lsel.data(), DType::f32, {c.B, c.Hq, ql.S});
  const Status s = dist::ring_attention(ql.view(), kl.view(), vl.view(), ol.view(), MPI_COMM_WORLD, rp, lsel_v);
  CHECK(s.ok(), c.name + ": ring_attention: " + s.message());
  if (!s.ok()) return;
  ol.load_from_storage();
  // Rows of the full results at this rank's query positions.
  Tensor lse_t1, lse_tt;  // the LSEs as [B, Hq, S, 1] tensors, to take rows the same way
  lse_t1.init(c.B, c.Hq, c.S, 1, DType::f32), lse_tt.init(c.B, c.Hq, c.S, 1, DType::f32);
  lse_t1.f = lse1, lse_tt.f = lse_truth;
  rule(c.name + " out", ol.f, rows_of(out1, qs), rows_of(out_truth, qs), c.dtype);
  rule(c.name + " lse", lsel, rows_of(lse_t1, qs), rows_of(lse_tt, qs), DType::f32);
  if (!c.backward) return;

  // Backward: single process (flash, same precision: the statistics taken from the given O and LSE, as the ring
  // takes them, FlashAttention-2's way) and the fp64 reference on the same O, LSE and dO.
  Tensor dq1, dk1, dv1, dqt, dkt, dvt;
  dq1.init(c.B, c.Hq, c.S, c.Dk, c.dtype), dk1.init(c.B, c.Hkv, c.Skv, c.Dk, c.dtype), dv1.init(c.B, c.Hkv, c.Skv, c.Dv, c.dtype);
  dqt.init(c.B, c.Hq, c.S, c.Dk, DType::f32), dkt.init(c.B, c.Hkv, c.Skv, c.Dk, DType::f32), dvt.init(c.B, c.Hkv, c.Skv, c.Dv, DType::f32);
  Params p_single = p;
  p_single.backward_statistics = BackwardStatistics::from_forward;
  CHECK(attention_backward(q.view(), k.view(), v.view(), out1.view(), lse1_v, dout.view(), dq1.view(), dk1.view(),
                           dv1.view(), p_single).ok(), c.name + ": single-process backward");
  dq1.load_from_storage(), dk1.load_from_storage(), dv1.load_from_storage();
  CHECK(attention_backward(q.f32_view(), k.f32_view(), v.f32_view(), out_truth.view(), lset_v, dout.f32_view(),
                           dqt.view(), dkt.view(), dvt.view(), pref).ok(), c.name + ": reference backward");
  Tensor dql, dkl, dvl;
  dql.init(c.B, c.Hq, ql.S, c.Dk, c.dtype), dkl.init(c.B, c.Hkv, kl.S, c.Dk, c.dtype), dvl.init(c.B, c.Hkv, kl.S, c.Dv, c.dtype);
  const Status sb = dist::ring_attention_backward(ql.view(), kl.view(), vl.view(), ol.view(), lsel_v, dol.view(),
                                                  dql.view(), dkl.view(), dvl.view(), MPI_COMM_WORLD, rp);
  CHECK(sb.ok(), c.name + ": ring_attention_backward: " + sb.message());
  if (!sb.ok()) return;
  std::vector<std::uint16_t> first_half = dql.half;
  std::vector<float> first = dql.f;
  dql.load_from_storage(), dkl.load_from_storage(), dvl.load_from_storage();
  rule(c.name + " dq", dql.f, rows_of(dq1, qs), rows_of(dqt, qs), c.dtype);
  rule(c.name + " dk", dkl.f, rows_of(dk1, ks), rows_of(dkt, ks), c.dtype);
  rule(c.name + " dv", dvl.f, rows_of(dv1, ks), rows_of(dvt, ks), c.dtype);
  // Deterministic: the same bits again.
  Tensor dq2, dk2, dv2;
  dq2.init(c.B, c.Hq, ql.S, c.Dk, c.dtype), dk2.init(c.B, c.Hkv, kl.S, c.Dk, c.dtype), dv2.init(c.B, c.Hkv, kl.S, c.Dv, c.dtype);
  CHECK(dist::ring_attention_backward(ql.view(), kl.view(), vl.view(), ol.view(), lsel_v, dol.view(), dq2.view(),
                                      dk2.view(), dv2.view(), MPI_COMM_WORLD, rp).ok(), c.name + ": second backward");
  const bool same = c.dtype == DType::f32 ? std::memcmp(first.data(), dq2.f.data(), first.size() * 4) == 0
                                           : first_half == dq2.half;
  CHECK(same, c.name + ": the backward is not bitwise deterministic");
}

// Every rank must get a non-ok Status with the same message (gathered and compared), containing `part`.
void same_error_everywhere(const std::string& name, const Status& s, const std::string& part) {
  CHECK(!s.ok(), name + ": expected an error, got ok");
  char mine[512] = {};
  std::snprintf(mine, sizeof mine, "%s", s.message().c_str());
  std::vector<char> all(static_cast<std::size_t>(512 * g_size));
  MPI_Allgather(mine, 512, MPI_CHAR, all.data(), 512, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < g_size; ++r)
    CHECK(std::strcmp(all.data() + 512 * r, mine) == 0,
          name + ": rank " + std::to_string(r) + " says '" + (all.data() + 512 * r) + "', this rank '" + mine + "'");
  CHECK(s.message().find(part) != std::string::npos, name + ": '" + s.message() + "' lacks '" + part + "'");
  if (g_rank == 0) std::printf("  %s -> %s\n", name.c_str(), s.message().c_str());
}

void errors() {
  const std::int64_t B = 1, H = 2, S = 8, D = 8;
  std::vector<float> q(static_cast<std::size_t>(B * 4 * S * D), 0.5f), kv(static_cast<std::size_t>(B * H * S * D), 0.25f),
      out(q.size(), NAN);
  const bool odd = g_rank == g_size - 1;
  // The last rank's query has 4 heads where the others have 2.
  const std::int64_t hq = odd && g_size > 1 ? 4 : H;
  Status s = dist::ring_attention(TensorView::contiguous(q.data(), DType::f32, {B, hq, S, D}),
                                  TensorView::contiguous(kv.data(), DType::f32, {B, H, S, D}),
                                  TensorView::contiguous(kv.data(), DType::f32, {B, H, S, D}),
                                  TensorView::contiguous(out.data(), DType::f32, {B, hq, S, D}), MPI_COMM_WORLD);
  if (g_size > 1) {
    same_error_everywhere("heads disagree", s, "expected the same on every rank");
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isnan(x); }), "an output was written on error");
  }
  // An invalid argument on one rank (rank 0's out has the wrong shape): every rank gets it, none hangs.
  const std::int64_t sq_out = g_rank == 0 ? S - 1 : S;
  s = dist::ring_attention(TensorView::contiguous(q.data(), DType::f32, {B, H, S, D}),
                           TensorView::contiguous(kv.data(), DType::f32, {B, H, S, D}),
                           TensorView::contiguous(kv.data(), DType::f32, {B, H, S, D}),
                           TensorView::contiguous(out.data(), DType::f32, {B, H, sq_out, D}), MPI_COMM_WORLD);
  same_error_everywhere("invalid out on rank 0", s, "on rank 0");
  // kv_lens that differ on one rank.
  std::int64_t len = odd && g_size > 1 ? 3 : 5;
  dist::RingParams rp;
  rp.kv_lens = TensorView::contiguous(&len, DType::i64, {1});
  s = dist::ring_attention(TensorView::contiguous(q.data(), DType::f32, {B, H, S, D}),
                           TensorView::contiguous(kv.data(), DType::f32, {B, H, S, D}),
                           TensorView::contiguous(kv.data(), DType::f32, {B, H, S, D}),
                           TensorView::contiguous(out.data(), DType::f32, {B, H, S, D}), MPI_COMM_WORLD, rp);
  if (g_size > 1) same_error_everywhere("kv_lens disagree", s, "kv_lens");
  // Causal with a rank whose query and key slices differ in length.
  rp = {};
  rp.causal = true;
  const std::int64_t skv = g_rank == 0 ? S - 2 : S;
  s = dist::ring_attention(TensorView::contiguous(q.data(), DType::f32, {B, H, S, D}),
                           TensorView::contiguous(kv.data(), DType::f32, {B, H, skv, D}),
                           TensorView::contiguous(kv.data(), DType::f32, {B, H, skv, D}),
                           TensorView::contiguous(out.data(), DType::f32, {B, H, S, D}), MPI_COMM_WORLD, rp);
  same_error_everywhere("causal, uneven Q and K/V", s, "self-attention");
  // A zigzag slice of the wrong length.
  rp = {};
  rp.layout = Layout::zigzag;
  const std::int64_t sz = g_rank == 0 && g_size > 1 ? S + 2 : S;  // (S + 1 would be a valid zigzag share)
  std::vector<float> q2(static_cast<std::size_t>(B * H * (S + 2) * D), 0.5f), kv2(q2.size(), 0.25f), out2(q2.size());
  s = dist::ring_attention(TensorView::contiguous(q2.data(), DType::f32, {B, H, sz, D}),
                           TensorView::contiguous(kv2.data(), DType::f32, {B, H, sz, D}),
                           TensorView::contiguous(kv2.data(), DType::f32, {B, H, sz, D}),
                           TensorView::contiguous(out2.data(), DType::f32, {B, H, sz, D}), MPI_COMM_WORLD, rp);
  if (g_size > 1) same_error_everywhere("zigzag slice of the wrong length", s, "zigzag");
}

void layouts() {
  // slice_segments covers the sequence exactly once; scatter then gather is the identity.
  for (Layout layout : {Layout::contiguous, Layout::zigzag})
    for (std::int64_t n : {0, 1, 7, 41, 64}) {
      std::vector<int> seen(static_cast<std::size_t>(n), 0);
      for (int r = 0; r < g_size; ++r)
        for (const Segment& s : dist::slice_segments(layout, n, g_size, r))
          for (std::int64_t i = s.start; i < s.start + s.length; ++i) ++seen[static_cast<std::size_t>(i)];
      CHECK(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; }), "slice_segments is not a partition");
      std::vector<float> full(static_cast<std::size_t>(2 * n * 3)), back(full.size(), -1);
      for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
      const TensorView fv = TensorView::contiguous(full.data(), DType::f32, {1, 2, n, 3});
      const TensorView bv = TensorView::contiguous(back.data(), DType::f32, {1, 2, n, 3});
      for (int r = 0; r < g_size; ++r) {
        std::int64_t len = 0;
        for (const Segment& s : dist::slice_segments(layout, n, g_size, r)) len += s.length;
        std::vector<float> slice(static_cast<std::size_t>(2 * len * 3));
        const TensorView sv = TensorView::contiguous(slice.data(), DType::f32, {1, 2, len, 3});
        CHECK(dist::scatter_sequence(fv, layout, g_size, r, sv).ok(), "scatter_sequence");
        CHECK(dist::gather_sequence(sv, layout, g_size, r, bv).ok(), "gather_sequence");
      }
      CHECK(full == back, "scatter then gather is not the identity");
    }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  std::vector<Config> configs;
  for (bool causal : {false, true})
    for (Layout layout : {Layout::contiguous, Layout::zigzag}) {
      Config c;
      c.causal = causal, c.layout = layout;
      c.name = std::string(causal ? "causal" : "full") + (layout == Layout::zigzag ? " zigzag" : " contiguous");
      configs.push_back(c);
    }
  {
    Config c;
    c.name = "causal uneven slices, kv_lens, Dv != Dk, GQA";
    c.causal = true, c.uneven = true, c.kv_lens = true, c.S = c.Skv = 53;
    configs.push_back(c);
    c.name = "causal zigzag kv_lens MQA softcap";
    c.uneven = false, c.layout = Layout::zigzag, c.Hkv = 1, c.softcap = 3.0;
    configs.push_back(c);
    c = Config{};
    c.name = "cross-attention (Sq != Skv), uneven";
    c.S = 29, c.Skv = 47, c.uneven = true, c.kv_lens = true;
    configs.push_back(c);
    c = Config{};
    c.name = "one position per rank";
    c.S = c.Skv = g_size, c.causal = true;
    configs.push_back(c);
  }
  for (DType dt : {DType::bf16, DType::f16})
    for (bool causal : {false, true}) {
      Config c;
      c.dtype = dt, c.causal = causal, c.layout = causal ? Layout::zigzag : Layout::contiguous;
      c.name = std::string(dtype_name(dt)) + (causal ? " causal zigzag" : " full");
      configs.push_back(c);
    }
  for (const Config& c : configs) {
    const int before = g_failures;
    run(c);
    if (g_rank == 0) std::printf("%-50s %s\n", c.name.c_str(), g_failures == before ? "ok" : "FAILED");
  }
  layouts();
  errors();
  int failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("test_ring on %d ranks: %d checks per rank, %d failures over all ranks\n", g_size, g_checks, failures);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
