// The backward pass: the fp64 reference against central finite differences, the flash kernel against the
// fp64 reference under the gradient tolerance rule (factor 3) on the case registry, determinism across
// runs and thread counts, fully masked rows, and bad input.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "cases.h"
#include "core/backward_problem.h"
#include "core/workspace_impl.h"

namespace attn::test {
namespace {

double max_abs(const std::vector<double>& x) { return max_finite(x, 0); }

// Runs the flash forward for O and LSE (what a training step would save).
void forward(Instance& in) {
  Params p = in.params;
  p.backend = Backend::flash;
  const Status s = attention(in.q.view, in.k.view, in.v.view, in.out.view, p, in.lse.view);
  ASSERT_TRUE(s.ok()) << s.message();
}

// Poisons the gradients, runs the backward, checks nothing outside the gradient views changed.
Status backward(Instance& in, GradInstance& g, Backend backend, int threads) {
  g.dq.poison(), g.dk.poison(), g.dv.poison();
  const bool sinks = !g.dsinks.storage.empty();
  if (sinks) g.dsinks.poison();
  const std::vector<unsigned char> pq = g.dq.storage, pk = g.dk.storage, pv = g.dv.storage;
  Params p = in.params;
  p.backend = backend;
  p.threads = threads;
  const Status s = attention_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                      g.dq.view, g.dk.view, g.dv.view, p,
                                      sinks ? std::optional<TensorView>(g.dsinks.view) : std::nullopt);
  EXPECT_TRUE(untouched_outside(g.dq, pq) && untouched_outside(g.dk, pk) && untouched_outside(g.dv, pv))
      << "bytes outside a gradient view were written";
  return s;
}

// ---- the flash kernel vs the fp64 reference, on the case registry --------------------------------------

class BackwardCase : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardCase, MatchesFp64Reference) {
  ATTN_SKIP_UNLESS_SAMPLED();
  const Case& c = GetParam();
  Instance in = instantiate(c);
  GradInstance g = instantiate_grads(c);
  forward(in);
  core::BackwardProblem bp;
  ASSERT_TRUE(core::validate_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                      g.dq.view, g.dk.view, g.dv.view, in.params, std::nullopt, &bp).ok());
  const reference::Grads ref = reference::attention_backward<double>(bp.fwd, bp.dout);
  const reference::Grads naive = reference::attention_backward<float>(bp.fwd, bp.dout);

  auto check = [&](Backend backend) {
    const Status s = backward(in, g, backend, 0);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(gradient_failures(c, in, g, bp.fwd.scale, ref, naive), "");
  };
  for (cpu::Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string("flash, ") + cpu::isa_name(isa));
    ForceIsa force(isa);
    check(Backend::flash);
  }
  SCOPED_TRACE("reference");
  check(Backend::reference);
}

// The scratch the backward reports before it runs (describe_attention_backward: the dispatcher's
// workspace_bytes, the kernel's Plan::bytes) is exactly what it then allocates, at every level and thread count.
TEST_P(BackwardCase, ReportedScratchIsWhatTheCallAllocates) {
  const Case& c = GetParam();
  Instance in = instantiate(c);
  forward(in);
  for (cpu::Isa isa : supported_isas()) {
    ForceIsa force(isa);
    for (int threads : {1, 3}) {
      GradInstance g = instantiate_grads(c);
      Params params = in.params;
      params.threads = threads;
      core::BackwardProblem bp;
      ASSERT_TRUE(core::validate_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                          g.dq.view, g.dk.view, g.dv.view, params, std::nullopt, &bp).ok());
      const std::int64_t reported = cpu::select_backward(bp, threads).workspace_bytes;
      Workspace ws;
      params.workspace = &ws;
      const Status s = attention_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                          g.dq.view, g.dk.view, g.dv.view, params);
      ASSERT_TRUE(s.ok()) << s.message();
      const auto kv_lens = static_cast<std::int64_t>(ws.impl().kv_len.capacity() * sizeof(std::int64_t));
      EXPECT_EQ(ws.bytes() - kv_lens, reported) << cpu::isa_name(isa) << ", " << threads << " threads";
    }
  }
}

// Every output element is owned by one work item that sums in a fixed order: repeated runs, every thread count
// and a Workspace kept across calls (holding the scratch of a longer and a wider shape first) give the same
// bits, at an instruction-set level chosen per case (every level over the registry: supported_isas).
TEST_P(BackwardCase, DeterministicAcrossRunsThreadCountsAndWorkspaces) {
  const Case& c = GetParam();
  Workspace shared;
  for (const Case& other : workspace_primers(c)) {
    Instance o = instantiate(other);
    GradInstance og = instantiate_grads(other);
    forward(o);
    o.params.workspace = &shared;
    EXPECT_TRUE(backward(o, og, Backend::flash, 3).ok());
  }
  Instance in = instantiate(c);
  GradInstance g = instantiate_grads(c);
  forward(in);
  auto run = [&](int threads) {
    EXPECT_TRUE(backward(in, g, Backend::flash, threads).ok());
    return std::vector<std::vector<unsigned char>>{g.dq.storage, g.dk.storage, g.dv.storage};
  };
  for (cpu::Isa isa : supported_isas(/*rotate=*/true)) {  // (one level per case; every level over the registry)
    SCOPED_TRACE(cpu::isa_name(isa));
    ForceIsa force(isa);
    in.params.workspace = nullptr;
    const auto first = run(1);
    for (int threads : {1, 2, 3, 2}) EXPECT_TRUE(run(threads) == first) << "threads = " << threads;
    in.params.workspace = &shared;
    for (int threads : {2, 1, 3}) EXPECT_TRUE(run(threads) == first) << "workspace, threads = " << threads;
    in.params.workspace = nullptr;
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, BackwardCase, ::testing::ValuesIn(backward_registry()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

// ---- the fp64 reference vs central finite differences -----------------------------------------------------

// Small cases, one per way of masking (and GQA, cross lengths, Dv != Dk, a peaked softmax).
std::vector<Case> fd_cases() {
  std::vector<Case> out;
  const Case base{.B = 2, .Hq = 2, .Hkv = 1, .Sq = 5, .Skv = 7, .Dk = 3, .Dv = 4};
  auto with = [&](std::function<void(Case&)> f) {
    Case c = base;
    f(c);
    out.push_back(c);
  };
  with([](Case&) {});
  with([](Case& c) { c.causal = Causal::top_left; });
  with([](Case& c) { c.causal = Causal::bottom_right; });
  with([](Case& c) { c.causal = Causal::bottom_right, c.Sq = 7, c.Skv = 5; });
  with([](Case& c) { c.kv_lens = true, c.B = 3; });
  with([](Case& c) { c.mask = MaskCase::additive_full; });
  with([](Case& c) { c.mask = MaskCase::additive_2d, c.causal = Causal::top_left; });
  with([](Case& c) { c.mask = MaskCase::keep_per_batch; });
  with([](Case& c) { c.mask = MaskCase::keep_keys, c.kv_lens = true; });
  with([](Case& c) { c.window = {1, 1, Align::top_left}; });
  with([](Case& c) { c.window = {2, 0, Align::bottom_right}, c.causal = Causal::bottom_right; });
  with([](Case& c) { c.Hq = 4, c.Hkv = 1, c.Dk = 5, c.Dv = 2; });
  with([](Case& c) { c.scale = 2.0, c.amplitude = 2.0; });
  with([](Case& c) { c.softcap = 0.5, c.amplitude = 2.0; });
  with([](Case& c) { c.alibi = 2, c.causal = Causal::bottom_right; });
  with([](Case& c) { c.sinks = true, c.mask = MaskCase::additive_full, c.softcap = 1.5, c.alibi = 1; });
  // Dropout: the mask is fixed by the seed, so the loss is smooth in the inputs.
  with([](Case& c) { c.dropout = 0.4, c.causal = Causal::bottom_right; });
  with([](Case& c) { c.dropout = 0.2, c.sinks = true, c.softcap = 1.0, c.kv_lens = true, c.B = 3; });
  return out;
}

class FiniteDifference : public ::testing::TestWithParam<Case> {};

// d/dx of L = Σ O ∘ G by central differences in fp64, for every element of Q, K and V.
TEST_P(FiniteDifference, ReferenceBackwardMatchesCentralDifferences) {
  const Case& c = GetParam();
  Instance in = instantiate(c);
  GradInstance g = instantiate_grads(c);
  core::BackwardProblem bp;
  forward(in);
  ASSERT_TRUE(core::validate_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                      g.dq.view, g.dk.view, g.dv.view, in.params, std::nullopt, &bp).ok());
  const reference::Grads analytic = reference::attention_backward<double>(bp.fwd, bp.dout);
  const std::vector<double> G = values(g.dout);
  auto loss = [&] {
    const reference::Result r = reference::attention<double>(bp.fwd);  // reads the tensors in place
    double l = 0;
    for (std::size_t i = 0; i < G.size(); ++i) l += r.out[i] * G[i];
    return l;
  };
  const double h = 1e-4;
  std::vector<double> dsinks_ref = analytic.dsinks;  // (laid out as a [1, 1, 1, Hq] tensor below)
  for (auto [name, t, grad] : {std::tuple{"dq", &in.q, &analytic.dq}, {"dk", &in.k, &analytic.dk},
                               {"dv", &in.v, &analytic.dv}, {"dsinks", &in.sinks, &dsinks_ref}}) {
    if (t->storage.empty()) continue;
    const double tol = 1e-6 * std::max(1.0, max_abs(*grad));
    std::size_t n = 0;
    double worst = 0;
    t->for_each_index([&](auto a, auto b, auto s, auto d) {
      const double x0 = t->get(a, b, s, d);
      // The inputs are fp32: step to the nearest fp32 neighbours and divide by the exact step taken.
      const double xp = static_cast<float>(x0 + h), xm = static_cast<float>(x0 - h);
      t->set(xp, a, b, s, d);
      const double lp = loss();
      t->set(xm, a, b, s, d);
      const double lm = loss();
      t->set(x0, a, b, s, d);
      const double fd = (lp - lm) / (xp - xm);
      worst = std::max(worst, std::fabs(fd - (*grad)[n]));
      ++n;
    });
    EXPECT_LE(worst, tol) << name << ": max |finite difference - analytic| over " << n << " elements";
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, FiniteDifference, ::testing::ValuesIn(fd_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

// ---- fully masked rows and unseen keys ---------------------------------------------------------------------

// A row with no allowed key (lse = -inf) contributes nothing and gets dQ = 0; a key no query sees gets
// dK = dV = 0: exact zeros, never NaN, on both backends.
TEST(BackwardNumerics, FullyMaskedRowsAndUnseenKeysGiveZeroGradients) {
  for (Backend backend : {Backend::flash, Backend::reference})
    for (int how = 0; how < 3; ++how) {
      SCOPED_TRACE("how " + std::to_string(how));
      Case c{.B = 2, .Hq = 2, .Hkv = 1, .Sq = 70, .Skv = 90, .Dk = 16, .Dv = 8};
      if (how == 1) c.causal = Causal::bottom_right, c.Sq = 90, c.Skv = 70;
      if (how == 2) c.kv_lens = true;
      Instance in = instantiate(c);
      Tensor mask;
      if (how == 0) {  // an additive -inf row, and a key column blocked for every query
        mask = Tensor::plain(DType::f32, {c.Sq, c.Skv});
        mask.for_each_index([&](auto i, auto j, auto, auto) { mask.set(i == 3 || j == 11 ? -INFINITY : 0.5, i, j); });
        in.params.mask = mask.view;
      }
      GradInstance g = instantiate_grads(c);
      forward(in);
      ASSERT_TRUE(backward(in, g, backend, 2).ok());
      std::vector<std::pair<std::int64_t, std::int64_t>> empty_rows, unseen_keys;  // (batch, index)
      for (std::int64_t b = 0; b < c.B; ++b) {
        if (how == 0) empty_rows.push_back({b, 3}), unseen_keys.push_back({b, 11});
        if (how == 1)  // the first Sq - Skv rows see nothing
          for (std::int64_t i = 0; i < c.Sq - c.Skv; ++i) empty_rows.push_back({b, i});
      }
      if (how == 2)  // batch 0 has length 0: nothing is seen
        for (std::int64_t i = 0; i < c.Sq; ++i) empty_rows.push_back({0, i});
      if (how == 2)
        for (std::int64_t j = 0; j < c.Skv; ++j) unseen_keys.push_back({0, j});
      for (auto [b, i] : empty_rows)
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t d = 0; d < c.Dk; ++d) ASSERT_EQ(g.dq.get(b, h, i, d), 0.0) << "dq row " << i;
      for (auto [b, j] : unseen_keys)
        for (std::int64_t h = 0; h < c.Hkv; ++h) {
          for (std::int64_t d = 0; d < c.Dk; ++d) ASSERT_EQ(g.dk.get(b, h, j, d), 0.0) << "dk key " << j;
          for (std::int64_t d = 0; d < c.Dv; ++d) ASSERT_EQ(g.dv.get(b, h, j, d), 0.0) << "dv key " << j;
        }
      // And nothing anywhere is NaN.
      for (const Tensor* t : {&g.dq, &g.dk, &g.dv})
        for (double x : values(*t)) ASSERT_TRUE(std::isfinite(x));
    }
}

// A row that attends one key has P = 1 exactly, so the key's dV is the row's dO to the bit. The backward's
// statistics come from the forward's own online-softmax state over the same scores sweep 2 recomputes (an LSE
// rounded to fp32 gave P = 1 ± a few ulp in about one row in ten). Every row here sees one key (a window of
// width 0 on the diagonal), one row per key, over every level, with scores large and small.
TEST(BackwardNumerics, OneAllowedKeyGivesDvEqualToDoutExactly) {
  for (cpu::Isa isa : supported_isas()) {
    ForceIsa force(isa);
    for (double amplitude : {1.0, 3.0}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + ", amplitude " + std::to_string(amplitude));
      Case c{.B = 2, .Hq = 2, .Hkv = 2, .Sq = 157, .Skv = 157, .Dk = 32, .Dv = 24, .window = {0, 0, Align::top_left},
             .amplitude = amplitude};
      Instance in = instantiate(c);
      GradInstance g = instantiate_grads(c);
      forward(in);
      ASSERT_TRUE(backward(in, g, Backend::flash, 2).ok());
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t j = 0; j < c.Skv; ++j)
            for (std::int64_t d = 0; d < c.Dv; ++d)
              ASSERT_EQ(g.dv.get(b, h, j, d), g.dout.get(b, h, j, d)) << "key " << j << ", dim " << d;
    }
  }
}

// The seeds' worked example, by hand: one key per query sees everything, dV of key j = Σ_i P_ij dO_i.
TEST(BackwardNumerics, GradientOfValuesIsColumnSumsOfProbabilities) {
  const float q[] = {1, 0, 0, 1}, k[] = {1, 0, 0, 1, 1, 1}, v[] = {1, 0, 0, 2, 3, 1}, dout[] = {1, 1, 1, 1};
  float out[4], lse[2], dq[4], dk[6], dv[6];
  const auto f32 = DType::f32;
  using T = TensorView;
  ASSERT_TRUE(attention(T::contiguous(q, f32, {1, 1, 2, 2}), T::contiguous(k, f32, {1, 1, 3, 2}),
                        T::contiguous(v, f32, {1, 1, 3, 2}), T::contiguous(out, f32, {1, 1, 2, 2}), {},
                        T::contiguous(lse, f32, {1, 1, 2})).ok());
  ASSERT_TRUE(attention_backward(T::contiguous(q, f32, {1, 1, 2, 2}), T::contiguous(k, f32, {1, 1, 3, 2}),
                                 T::contiguous(v, f32, {1, 1, 3, 2}), T::contiguous(out, f32, {1, 1, 2, 2}),
                                 T::contiguous(lse, f32, {1, 1, 2}), T::contiguous(dout, f32, {1, 1, 2, 2}),
                                 T::contiguous(dq, f32, {1, 1, 2, 2}), T::contiguous(dk, f32, {1, 1, 3, 2}),
                                 T::contiguous(dv, f32, {1, 1, 3, 2})).ok());
  // Row 0 scores (1, 0, 1)/√2, row 1 scores (0, 1, 1)/√2; with dO = 1, dV_j = Σ_i P_ij (both columns).
  const double e = std::exp(1 / std::sqrt(2.0)), z = 2 * e + 1;
  const double expect[3] = {(e + 1) / z, (1 + e) / z, 2 * e / z};
  for (int j = 0; j < 3; ++j)
    for (int d = 0; d < 2; ++d) EXPECT_NEAR(dv[j * 2 + d], expect[j], 1e-6);
}

// ---- bad input -------------------------------------------------------------------------------------------

struct BwdEnv {
  Tensor q{DType::f32, 2, 4, 5, 8}, k{DType::f32, 2, 2, 6, 8}, v{DType::f32, 2, 2, 6, 3}, out{DType::f32, 2, 4, 5, 3};
  Tensor lse = Tensor::plain(DType::f32, {2, 4, 5});
  Tensor dout{DType::f32, 2, 4, 5, 3}, dq{DType::f32, 2, 4, 5, 8}, dk{DType::f32, 2, 2, 6, 8}, dv{DType::f32, 2, 2, 6, 3};
  Tensor h16{DType::f16, 2, 4, 5, 8};
  TensorView qv, kv, vv, ov, lv, gov, gqv, gkv, gvv;
  Params p;
  BwdEnv() {
    std::mt19937_64 rng(3);
    q.randomize(rng), k.randomize(rng), v.randomize(rng), dout.randomize(rng);
    EXPECT_TRUE(attention(q.view, k.view, v.view, out.view, {}, lse.view).ok());
    dq.poison(), dk.poison(), dv.poison();
    qv = q.view, kv = k.view, vv = v.view, ov = out.view, lv = lse.view;
    gov = dout.view, gqv = dq.view, gkv = dk.view, gvv = dv.view;
  }
};

struct BwdBadCase {
  const char* name;
  const char* param;
  std::function<void(BwdEnv&)> mutate;
};
void PrintTo(const BwdBadCase& c, std::ostream* os) { *os << c.name; }

std::vector<BwdBadCase> bwd_bad_cases() {
  return {
      {"dk_mismatch", "k", [](BwdEnv& s) { s.kv.shape[3] = 7; }},
      {"out_shape", "out", [](BwdEnv& s) { s.ov.shape[3] = 4; }},
      {"lse_shape", "lse", [](BwdEnv& s) { s.lv.shape[2] = 4; }},
      {"lse_rank", "lse", [](BwdEnv& s) { s.lv.rank = 2; }},
      {"scale_zero", "scale", [](BwdEnv& s) { s.p.scale = 0.0; }},
      {"grad_out_rank", "grad_out", [](BwdEnv& s) { s.gov.rank = 3; }},
      {"grad_out_shape", "grad_out", [](BwdEnv& s) { s.gov.shape[3] = 8; }},
      {"grad_out_dtype", "grad_out", [](BwdEnv& s) { s.gov.dtype = DType::f16; }},
      {"grad_out_null", "grad_out", [](BwdEnv& s) { s.gov.data = nullptr; }},
      {"grad_q_shape", "grad_q", [](BwdEnv& s) { s.gqv.shape[2] = 6; }},
      {"grad_q_dtype", "grad_q", [](BwdEnv& s) { s.gqv = s.h16.view; }},
      {"grad_q_zero_stride", "grad_q", [](BwdEnv& s) { s.gqv.strides[2] = 0; }},
      {"grad_q_null", "grad_q", [](BwdEnv& s) { s.gqv.data = nullptr; }},
      {"grad_k_shape", "grad_k", [](BwdEnv& s) { s.gkv.shape[1] = 4; }},
      {"grad_k_dtype", "grad_k", [](BwdEnv& s) { s.gkv.dtype = DType::bf16; }},
      {"grad_v_shape", "grad_v", [](BwdEnv& s) { s.gvv.shape[3] = 8; }},
      {"grad_v_dtype", "grad_v", [](BwdEnv& s) { s.gvv.dtype = DType::i32; }},
      {"grad_v_negative_dim", "grad_v", [](BwdEnv& s) { s.gvv.shape[0] = -2; }},
      {"grad_q_aliases_q", "grad_q", [](BwdEnv& s) { s.gqv.data = s.q.view.data; }},
      {"grad_k_aliases_grad_out", "grad_k", [](BwdEnv& s) { s.gkv.data = s.dout.view.data; }},
      {"grad_v_aliases_grad_k", "grad_v", [](BwdEnv& s) { s.gvv.data = static_cast<float*>(s.dk.view.data) + 5; }},
      {"grad_k_aliases_lse", "grad_k", [](BwdEnv& s) { s.gkv.data = s.lse.view.data; }},
  };
}

class BackwardBadInput : public ::testing::TestWithParam<BwdBadCase> {};

TEST_P(BackwardBadInput, ClearErrorAndGradientsUntouched) {
  for (Backend backend : {Backend::flash, Backend::reference}) {
    BwdEnv s;
    s.p.backend = backend;
    const std::vector<unsigned char> q0 = s.dq.storage, k0 = s.dk.storage, v0 = s.dv.storage;
    GetParam().mutate(s);
    const Status st = attention_backward(s.qv, s.kv, s.vv, s.ov, s.lv, s.gov, s.gqv, s.gkv, s.gvv, s.p);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::invalid_argument);
    const std::string& m = st.message();
    EXPECT_EQ(m.rfind(std::string(GetParam().param) + ":", 0), 0u) << "message should start with the parameter: " << m;
    EXPECT_NE(m.find("expected"), std::string::npos) << m;
    EXPECT_EQ(s.dq.storage, q0);
    EXPECT_EQ(s.dk.storage, k0);
    EXPECT_EQ(s.dv.storage, v0);
  }
}

INSTANTIATE_TEST_SUITE_P(Errors, BackwardBadInput, ::testing::ValuesIn(bwd_bad_cases()),
                         [](const ::testing::TestParamInfo<BwdBadCase>& info) { return std::string(info.param.name); });

// The LSE is only read where a block's statistics can come from it (mild scores, finite inputs); a value that is
// not a plausible LSE there (NaN, +inf, beyond ±64) makes that block recompute them from the scores: same
// gradients up to rounding, never an error.
TEST(BackwardNumerics, ImplausibleLseIsRecomputed) {
  BwdEnv s;
  ASSERT_TRUE(attention_backward(s.qv, s.kv, s.vv, s.ov, s.lv, s.gov, s.gqv, s.gkv, s.gvv, s.p).ok());
  Tensor q0 = s.dq, k0 = s.dk, v0 = s.dv;
  s.lse.set(NAN, 1, 2, 3), s.lse.set(INFINITY, 0, 0, 0), s.lse.set(1e6, 1, 1, 1);
  ASSERT_TRUE(attention_backward(s.qv, s.kv, s.vv, s.ov, s.lv, s.gov, s.gqv, s.gkv, s.gvv, s.p).ok());
  for (auto [a, b] : {std::pair{&s.dq, &q0}, {&s.dk, &k0}, {&s.dv, &v0}})
    a->for_each_index([&](auto i, auto j, auto k, auto l) {
      ASSERT_NEAR(a->get(i, j, k, l), b->get(i, j, k, l), 1e-5 * (1 + std::fabs(b->get(i, j, k, l))));
    });
}

TEST(BackwardBadInputList, BaselineIsValid) {
  BwdEnv s;
  const Status st = attention_backward(s.qv, s.kv, s.vv, s.ov, s.lv, s.gov, s.gqv, s.gkv, s.gvv, s.p);
  EXPECT_TRUE(st.ok()) << st.message();
}

}  // namespace
}  // namespace attn::test
