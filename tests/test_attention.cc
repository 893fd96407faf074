// Every case of the registry, every backend: against the fp64 reference under the tolerance rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "attn/backward.h"
#include "attn/info.h"
#include "cases.h"
#include "core/workspace_impl.h"
#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/prefetch_tuner.h"
#include "cpu/schedule.h"

namespace attn::test {
namespace {

Outputs run_backend(const Case&, Instance& in, Backend backend, int threads, bool with_lse = true) {
  return run_poisoned(in, [&](Instance& x) { return x.run(backend, threads, with_lse); }, with_lse);
}

class AttentionCase : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCase, MatchesFp64Reference) {
  ATTN_SKIP_UNLESS_SAMPLED();
  const Case& c = GetParam();
  Instance in = instantiate(c);
  core::Problem prob;
  ASSERT_TRUE(core::validate(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &prob).ok());
  const reference::Result ref = reference::attention<double>(prob);
  const reference::Result naive = reference::attention<float>(prob);

  auto check = [&](Backend backend, bool with_lse = true) {
    const Outputs r = run_backend(c, in, backend, 0, with_lse);
    expect_matches_reference(c, in, ref, naive, r, with_lse, with_lse ? "with LSE" : "no LSE requested");
  };
  for (cpu::Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string("flash, ") + cpu::isa_name(isa));
    ForceIsa force(isa);
    ASSERT_EQ(cpu::active_isa(), isa);
    check(Backend::flash);
    // Without an LSE output a kernel may take a cheaper path (AMX: the degree-3 exp2); low precision only,
    // where such paths exist.
    if (c.dtype != DType::f32) check(Backend::flash, false);
    // bf16 Q over bf16, i8 or i4 K/V at the avx512bf16 level: the other choice of the pair products too (the CPU's
    // own runs above), so that both kernels are checked on every machine with the level, AMD or Intel
    if (isa == cpu::Isa::avx512bf16 && c.dtype == DType::bf16 &&
        (c.kv_dtype == DType::bf16 || c.kv_dtype == DType::i8 || c.kv_dtype == DType::i4)) {
      SCOPED_TRACE(cpu::bf16_dot_preferred() ? "bf16 pair products off" : "bf16 pair products on");
      ForceBf16Dot other(!cpu::bf16_dot_preferred());
      check(Backend::flash);
      check(Backend::flash, false);
    }
  }
  SCOPED_TRACE("reference");
  check(Backend::reference);
}

// Bitwise: compare the bytes (NaN-safe), and never pass memcmp a null pointer for empty results.
bool same(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// Blocks are independent, so the thread count never changes a bit of the result.
TEST_P(AttentionCase, FlashIsIdenticalAtEveryThreadCount) {
  const Case& c = GetParam();
  Instance in = instantiate(c);
  for (cpu::Isa isa : supported_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    ForceIsa force(isa);
    const Outputs one = run_backend(c, in, Backend::flash, 1);
    const Outputs two = run_backend(c, in, Backend::flash, 2);
    const Outputs three = run_backend(c, in, Backend::flash, 3);
    EXPECT_TRUE(same(one.out, two.out));
    EXPECT_TRUE(same(one.out, three.out));
    EXPECT_TRUE(same(one.lse, two.lse));
    EXPECT_TRUE(same(one.lse, three.lse));
  }
}

// A Workspace kept across calls changes no bit of the result, though it holds the scratch of other shapes
// (longer keys: other split-KV partials; wider heads: other tiles) and of other thread counts.
TEST_P(AttentionCase, WorkspaceReuseChangesNothing) {
  ATTN_SKIP_UNLESS_SAMPLED();
  const Case& c = GetParam();
  Instance in = instantiate(c);
  for (cpu::Isa isa : supported_isas(/*rotate=*/true)) {  // (one level per case; every level over the registry)
    SCOPED_TRACE(cpu::isa_name(isa));
    ForceIsa force(isa);
    Workspace shared;
    for (const Case& other : workspace_primers(c)) {
      Instance o = instantiate(other);
      o.params.workspace = &shared;
      (void)run_backend(other, o, Backend::flash, 3);
    }
    in.params.workspace = nullptr;
    const Outputs fresh = run_backend(c, in, Backend::flash, 2);
    in.params.workspace = &shared;
    for (int threads : {2, 1, 3}) {
      const Outputs reused = run_backend(c, in, Backend::flash, threads);
      EXPECT_TRUE(same(fresh.out, reused.out)) << threads << " threads";
      EXPECT_TRUE(same(fresh.lse, reused.lse)) << threads << " threads";
    }
    const std::int64_t held = shared.bytes();
    run_backend(c, in, Backend::flash, 2);
    EXPECT_EQ(shared.bytes(), held) << "a repeated call of the same shape grew the workspace";
  }
  in.params.workspace = nullptr;
}

// The scratch a call reports before it runs (attn::describe_attention: the dispatcher's workspace_bytes, each kernel's
// Plan::bytes) is exactly what it then allocates: a fresh Workspace holds that much after the call, at every level
// and thread count (the key lengths validation borrows aside).
TEST_P(AttentionCase, ReportedScratchIsWhatTheCallAllocates) {
  const Case& c = GetParam();
  Instance in = instantiate(c);
  for (cpu::Isa isa : supported_isas()) {
    ForceIsa force(isa);
    for (int threads : {1, 3}) {
      core::Problem p;
      ASSERT_TRUE(in.problem(Backend::flash, threads, true, &p).ok());
      const std::int64_t reported = cpu::select_flash(p, threads).workspace_bytes;
      Workspace ws;
      in.params.workspace = &ws;
      const Status s = in.run(Backend::flash, threads);
      in.params.workspace = nullptr;
      ASSERT_TRUE(s.ok()) << s.message();
      const auto kv_lens = static_cast<std::int64_t>(ws.impl().kv_len.capacity() * sizeof(std::int64_t));
      EXPECT_EQ(ws.bytes() - kv_lens, reported) << cpu::isa_name(isa) << ", " << threads << " threads";
    }
  }
}

// What a Workspace holds survives calls that only describe, and calls refused after validation borrowed its
// key-length vector (the thread count is checked after the key lengths): a serving loop's workspace is not
// emptied by one bad request.
// K and V in [B, S, H, D] memory (rows H·D apart) give the same bits as the same values in [B, H, S, D]: the
// kernel gathers scattered rows into contiguous copies before a prefill (gather_kv) and must not change a value.
TEST(ScatteredRows, SameBitsAsContiguous) {
  const std::int64_t B = 2, Hq = 8, Hkv = 4, Sq = 150, Skv = 181, D = 48;
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::size_t es = dtype_size(dt);
    std::vector<unsigned char> q(static_cast<std::size_t>(B * Hq * Sq * D) * es), kb(static_cast<std::size_t>(B * Hkv * Skv * D) * es),
        vb(kb.size()), ks(kb.size()), vs(kb.size());
    std::uint32_t x = 12345;
    auto next = [&] { return x = x * 1664525u + 1013904223u; };
    auto fill = [&](std::vector<unsigned char>& buf) {
      for (std::size_t i = 0; i < buf.size() / es; ++i) {
        const float f = static_cast<float>(next() % 2001) / 1000.0f - 1.0f;
        if (dt == DType::f32) std::memcpy(buf.data() + i * 4, &f, 4);
        else {
          std::uint32_t u;
          std::memcpy(&u, &f, 4);
          const std::uint16_t h = static_cast<std::uint16_t>(u >> 16);
          std::memcpy(buf.data() + i * 2, &h, 2);
        }
      }
    };
    fill(q), fill(kb), fill(vb);
    // The same values in [B, S, H, D] order.
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t j = 0; j < Skv; ++j) {
          const std::size_t from = static_cast<std::size_t>(((b * Hkv + h) * Skv + j) * D) * es;
          const std::size_t to = static_cast<std::size_t>(((b * Skv + j) * Hkv + h) * D) * es;
          std::memcpy(ks.data() + to, kb.data() + from, static_cast<std::size_t>(D) * es);
          std::memcpy(vs.data() + to, vb.data() + from, static_cast<std::size_t>(D) * es);
        }
    for (Causal c : {Causal::none, Causal::top_left}) {
      std::vector<unsigned char> o1(q.size(), 0xff), o2(q.size(), 0xff);
      Params p;
      p.causal = c;
      ASSERT_TRUE(attention(TensorView::contiguous(q.data(), dt, {B, Hq, Sq, D}),
                            TensorView::contiguous(kb.data(), dt, {B, Hkv, Skv, D}),
                            TensorView::contiguous(vb.data(), dt, {B, Hkv, Skv, D}),
                            TensorView::contiguous(o1.data(), dt, {B, Hq, Sq, D}), p).ok());
      ASSERT_TRUE(attention(TensorView::contiguous(q.data(), dt, {B, Hq, Sq, D}), TensorView::bshd(ks.data(), dt, B, Skv, Hkv, D),
                            TensorView::bshd(vs.data(), dt, B, Skv, Hkv, D),
                            TensorView::contiguous(o2.data(), dt, {B, Hq, Sq, D}), p).ok());
      EXPECT_EQ(o1, o2) << dtype_name(dt) << (c == Causal::none ? " full" : " causal");
    }
  }
}

TEST(WorkspaceReuse, KeptThroughDescribeAndRefusedCalls) {
  const Case c{.B = 3, .Hq = 4, .Hkv = 2, .Sq = 33, .Skv = 700, .Dk = 32, .Dv = 32, .kv_lens = true};
  Instance in = instantiate(c);
  Workspace ws;
  in.params.workspace = &ws;
  ASSERT_TRUE(attention(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view).ok());
  const std::int64_t held = ws.bytes();
  ASSERT_GT(held, 0);
  KernelInfo info;
  ASSERT_TRUE(describe_attention(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &info).ok());
  EXPECT_EQ(ws.bytes(), held) << "describe_attention";
  Params bad = in.params;
  bad.threads = -1;
  EXPECT_FALSE(attention(in.q.view, in.k.view, in.v.view, in.out.view, bad, in.lse.view).ok());
  EXPECT_EQ(ws.bytes(), held) << "a refused call";
  GradInstance g = instantiate_grads(c);
  EXPECT_FALSE(attention_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view, g.dq.view,
                                  g.dk.view, g.dv.view, bad)
                   .ok());
  EXPECT_EQ(ws.bytes(), held) << "a refused backward call";
  ASSERT_TRUE(attention(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view).ok());
  EXPECT_EQ(ws.bytes(), held) << "the same call again";
}

// The dispatcher's rule for bf16 (cpu/dispatch.cc), as describe_attention reports it: at least 64 query rows per KV
// head run the pair-product kernel where the level multiplies bf16 pairs faster than fp32 FMAs (amx: tiles;
// avx512bf16: vdpbf16ps where cpu::bf16_dot_preferred(): AMD), fewer (decode) and other dtypes the vector kernels.
// The registry cases above reach each kernel through the same rule (and the other choice at avx512bf16).
// Decode's prefetch step over the far K rows (cpu/prefetch_tuner.h: measured per process) changes no result bit:
// every K/V storage type, contiguous and paged, at every level, with the step fixed at 64 and at 128.
TEST(Dispatch, DecodePrefetchStepChangesNoBit) {
  cpu::PrefetchTuner& tuner = cpu::decode_prefetch_tuner();
  const std::int64_t before = tuner.fixed();
  for (DType kv : {DType::f32, DType::bf16, DType::f16, DType::i8, DType::i4})
    for (std::int64_t page : {0, 16}) {
      const DType q = kv == DType::f32 || kv == DType::f16 ? DType::f32 : DType::bf16;
      const Case c{.B = 2, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 1100, .Dk = 128, .Dv = 128, .dtype = q,
                   .kv_dtype = kv, .page_size = page};
      for (cpu::Isa isa : supported_isas()) {
        SCOPED_TRACE(std::string(dtype_name(kv)) + (page ? " paged, " : ", ") + cpu::isa_name(isa));
        ForceIsa force(isa);
        std::vector<unsigned char> out[2];
        for (int i = 0; i < 2; ++i) {
          tuner.set_fixed(cpu::PrefetchTuner::kSteps[i]);
          Instance in = instantiate(c);
          ASSERT_TRUE(in.run(Backend::flash, 2).ok());
          out[i] = in.out.storage;
        }
        EXPECT_EQ(out[0], out[1]);
      }
    }
  tuner.set_fixed(before);
}

// The tuner's policy on synthetic timings: the first calls alternate the steps, then the faster runs with the other
// one call in kExploreEarly and later one in kExploreEvery, a change of which is faster is followed after kWins
// exploring calls, short calls are not timed, a fixed step wins.
TEST(PrefetchTuner, AlternatesThenKeepsTheFasterAndFollowsAChange) {
  using T = cpu::PrefetchTuner;
  const std::int64_t big = T::kMinTimedBytes;
  T t;
  EXPECT_EQ(t.best(3), 64);  // no samples: every line
  const auto seconds = [](std::int64_t step, std::int64_t fast) { return step == fast ? 1e-3 : 1.5e-3; };
  std::int64_t counts[2] = {0, 0};
  for (int call = 0; call < 2 * T::kWarmup; ++call) {
    const T::Choice c = t.pick(3, big);
    ASSERT_TRUE(c.timed);
    EXPECT_EQ(c.step, T::kSteps[call % 2]) << call;
    // the first call also starts the threads: 20x slower, which a median leaves out
    t.record(3, c.step, big, call == 1 ? 20e-3 : seconds(c.step, 128));
  }
  EXPECT_EQ(t.best(3), 128);
  EXPECT_EQ(t.best(4), 64);  // kinds are separate
  int exploring = 0;
  for (int call = 2 * T::kWarmup; call < 2 * T::kWarmup + 6 * T::kExploreEvery; ++call) {
    const T::Choice c = t.pick(3, big);
    ++counts[c.step == 128];
    exploring += call % (call < T::kEarlyCalls ? T::kExploreEarly : T::kExploreEvery) == 0;
    t.record(3, c.step, big, seconds(c.step, 128));
  }
  EXPECT_EQ(counts[0], exploring);  // one call in 4 during the first 64, then one in 16, runs the other step
  EXPECT_EQ(counts[0] + counts[1], 6 * T::kExploreEvery);
  EXPECT_EQ(t.best(3), 128);  // the exploring calls were slower: no switch
  // the machine changes: 64 is now the faster, and two exploring calls in a row beating 128's median switch
  int until_switch = 0;
  for (; t.best(3) == 128 && until_switch < 4 * T::kExploreEvery; ++until_switch) {
    const T::Choice c = t.pick(3, big);
    t.record(3, c.step, big, seconds(c.step, 64));
  }
  EXPECT_EQ(t.best(3), 64);
  EXPECT_LE(until_switch, T::kWins * T::kExploreEvery);
  const T::Choice small = t.pick(3, big / 2);
  EXPECT_FALSE(small.timed);
  EXPECT_EQ(small.step, 64);
  const int samples = t.arm(3, 0).samples;
  t.record(3, 64, big, 0.0);  // not a time
  t.record(3, 64, 0, 1e-3);   // no bytes
  EXPECT_EQ(t.arm(3, 0).samples, samples);
  EXPECT_EQ(t.set_fixed(128), 0);
  EXPECT_EQ(t.pick(3, big).step, 128);
  EXPECT_FALSE(t.pick(3, big).timed);
  EXPECT_EQ(t.set_fixed(7), 128);  // not a step: measure again
  EXPECT_EQ(t.fixed(), 0);
}

// A process whose first calls are all slow (its threads start, its inputs are read for the first time) may pick the
// slower step from them; the exploring calls then correct it within a few of them, not after their window refills.
// One lucky exploring call alone does not switch.
TEST(PrefetchTuner, CorrectsAWrongFirstPickSoonAndIgnoresOneLuckyCall) {
  using T = cpu::PrefetchTuner;
  const std::int64_t big = T::kMinTimedBytes;
  T t;
  for (int call = 0; call < 2 * T::kWarmup; ++call) {  // both steps slow at first; 64 looks faster by chance
    const T::Choice c = t.pick(1, big);
    t.record(1, c.step, big, c.step == 64 ? 5.0e-3 : 5.1e-3);
  }
  ASSERT_EQ(t.best(1), 64);
  int calls = 0;  // now 128 is truly faster: 2.9 ms against 3.4
  for (; t.best(1) == 64 && calls < 200; ++calls) {
    const T::Choice c = t.pick(1, big);
    t.record(1, c.step, big, c.step == 128 ? 2.9e-3 : 3.4e-3);
  }
  EXPECT_EQ(t.best(1), 128);
  EXPECT_LE(calls, T::kWins * T::kExploreEarly + T::kExploreEarly);  // within the first few exploring calls
  // 64 explored: one call beats 128's median by luck, the next does not: no switch
  for (int call = 0, lucky = 0; call < 3 * T::kExploreEvery; ++call) {
    const T::Choice c = t.pick(1, big);
    const bool first_explore = c.step == 64 && lucky++ == 0;
    t.record(1, c.step, big, c.step == 128 ? 2.9e-3 : first_explore ? 2.0e-3 : 3.4e-3);
    EXPECT_EQ(t.best(1), 128) << call;
  }
}

// loop_ahead (decode's blocks): every item runs exactly once, on whichever thread; the `next` an item is told is
// the item its thread runs right after it (or -1), so a block may prefetch its successor's rows; with more threads
// than items left, no thread holds an item another is free to take.
TEST(Schedule, LoopAheadRunsEachItemOnceAndTellsEachTheItemItsThreadRunsNext) {
  for (const int threads : {1, 2, 3, 8})
    for (const std::int64_t items : {0, 1, 2, 7, 113}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", items " + std::to_string(items));
      std::vector<std::int64_t> runs(static_cast<std::size_t>(items), 0), told(static_cast<std::size_t>(items), -2);
      std::vector<std::vector<std::int64_t>> order(static_cast<std::size_t>(threads));
      std::vector<cpu::NoWorkspace> team;
      cpu::run_team(&team, threads, items, [](int) { return cpu::NoWorkspace{}; },
                    cpu::loop_ahead(items, [&](std::int64_t it, std::int64_t next, cpu::NoWorkspace&) {
                      ++runs[static_cast<std::size_t>(it)];  // (each item's slot is written by one thread)
                      told[static_cast<std::size_t>(it)] = next;
                      order[static_cast<std::size_t>(omp_get_thread_num())].push_back(it);
                    }));
      for (std::int64_t it = 0; it < items; ++it) EXPECT_EQ(runs[static_cast<std::size_t>(it)], 1) << "item " << it;
      for (const auto& seq : order)
        for (std::size_t k = 0; k < seq.size(); ++k) {
          const std::int64_t next = told[static_cast<std::size_t>(seq[k])];
          if (next >= 0) {
            ASSERT_LT(k + 1, seq.size()) << "item " << seq[k] << " was told " << next << " but was its thread's last";
            EXPECT_EQ(seq[k + 1], next) << "item " << seq[k];
          }
        }
    }
}

TEST(Dispatch, Bf16PrefillRunsOnTheLevelsPairProducts) {
  const Case prefill{.B = 1, .Hq = 4, .Hkv = 2, .Sq = 32, .Skv = 90, .Dk = 40, .Dv = 24, .dtype = DType::bf16, .kv_dtype = DType::bf16};
  Case decode = prefill, f32 = prefill;
  decode.Sq = 31;  // 62 rows per KV head
  f32.dtype = f32.kv_dtype = DType::f32;
  for (cpu::Isa isa : supported_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    ForceIsa force(isa);
    const bool dot = isa == cpu::Isa::avx512bf16 && cpu::bf16_dot_preferred();
    EXPECT_EQ(cpu::bf16_dot_preferred(), cpu::cpu_features().bf16_dot_fast());  // no override left in force
    const std::string pairs = isa == cpu::Isa::amx ? "amx" : dot ? "bf16 dot" : "vector";
    for (const auto& [c, expect] : {std::pair{prefill, pairs}, {decode, std::string("vector")}, {f32, std::string("vector")}}) {
      Instance in = instantiate(c);
      KernelInfo info;
      ASSERT_TRUE(describe_attention(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &info).ok());
      EXPECT_EQ(info.kernel, expect) << "Sq " << c.Sq << ", " << dtype_name(c.dtype);
      EXPECT_EQ(info.isa, std::string(cpu::isa_name(isa == cpu::Isa::amx && expect != "amx" ? cpu::Isa::avx512bf16 : isa)));
    }
    // decode proper (row-major blocks): the vector kernel on bf16 pairs where the level has them and prefers them,
    // over bf16, 8- and 4-bit K/V; fp32 Q stays on fp32 FMAs
    for (DType q : {DType::bf16, DType::f32})
      for (DType kv : {DType::bf16, DType::i8, DType::i4}) {
        Case one = prefill;
        one.Sq = 1, one.Dk = 64, one.Dv = 32, one.dtype = q, one.kv_dtype = kv;
        Instance in = instantiate(one);
        KernelInfo info;
        ASSERT_TRUE(describe_attention(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &info).ok());
        EXPECT_EQ(info.kernel, dot && q == DType::bf16 ? "vector (bf16 pairs)" : "vector")
            << dtype_name(q) << " Q, " << dtype_name(kv) << " K/V";
        // the same from a page pool (describe_attention_paged: the same rule)
        one.page_size = 16;
        Instance paged = instantiate(one);
        Params pp = paged.params;
        pp.kv_lens.reset();
        if (!paged.k_scale_pages.storage.empty()) pp.k_scale = paged.k_scale_pages.view, pp.v_scale = paged.v_scale_pages.view;
        KernelInfo paged_info;
        ASSERT_TRUE(describe_attention_paged(paged.q.view, paged.k_pages.view, paged.v_pages.view, paged.page_table.view,
                                             paged.seq_lens.view, paged.out.view, pp, paged.lse.view, &paged_info)
                        .ok());
        EXPECT_EQ(paged_info.kernel, info.kernel) << "paged, " << dtype_name(q) << " Q, " << dtype_name(kv) << " K/V";
      }
    if (isa != cpu::Isa::avx512bf16) continue;
    for (bool prefer : {true, false}) {  // the override the tests use, both ways
      ForceBf16Dot force_dot(prefer);
      Instance in = instantiate(prefill);
      KernelInfo info;
      ASSERT_TRUE(describe_attention(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &info).ok());
      EXPECT_EQ(info.kernel, prefer ? "bf16 dot" : "vector");
    }
  }
}

// What 8- and 4-bit K/V cost in accuracy (the storage's error, not the kernels': those meet the tolerance rule on
// i8 and i4 inputs above): fp32 registry cases of ordinary size (every one for i8, every third for i4) with their K
// and V quantised as attn::KVCache does (i8: per (batch, head, row), scale max|x| / 127; i4: per block of 32 values
// of a row, scale max|x| / 7), against the fp64 reference on the unquantised values. The error is far above the fp32
// tolerance rule, as expected; it is printed per case and bounded loosely (relative to max |V|) on the cases with
// unit-size inputs, where a score moves by about scale·|q|·|k|·2^-8 for i8, 2^-4 for i4 (the wide-score cases,
// amplitude 30, are reported only: a score error of several units there changes which keys dominate).
void quantisation_error(DType storage, int every, int min_cases, double bound) {
  const bool i4 = storage == DType::i4;
  const double qmax = i4 ? 7.0 : 127.0;
  double worst_unit = 0;
  int cases = 0, seen = 0;
  for (const Case& c : registry()) {
    if (c.dtype != DType::f32 || c.kv_dtype != DType::f32 || c.page_size || c.dropout > 0 ||
        c.B * c.Hq * c.Sq * c.Skv * (c.Dk + c.Dv) > 30'000'000 || c.B * c.Skv == 0)
      continue;
    if (seen++ % every != 0) continue;
    Instance in = instantiate(c);
    core::Problem prob;
    ASSERT_TRUE(core::validate(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &prob).ok());
    const reference::Result ref = reference::attention<double>(prob), naive = reference::attention<float>(prob);
    Tensor kq(storage, c.B, c.Hkv, c.Skv, c.Dk), vq(storage, c.B, c.Hkv, c.Skv, c.Dv);
    const auto scales = [&](std::int64_t dim) {
      return i4 ? Tensor::plain(DType::f32, {c.B, c.Hkv, c.Skv, (dim + kI4Block - 1) / kI4Block})
                : Tensor::plain(DType::f32, {c.B, c.Hkv, c.Skv});
    };
    Tensor ks = scales(c.Dk), vs = scales(c.Dv);
    const std::int64_t block = i4 ? kI4Block : std::int64_t{1} << 40;
    for (auto [src, dst, scale, dim] : {std::tuple{&in.k, &kq, &ks, c.Dk}, {&in.v, &vq, &vs, c.Dv}})
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.Hkv; ++h)
          for (std::int64_t j = 0; j < c.Skv; ++j)
            for (std::int64_t d0 = 0; d0 < dim; d0 += block) {
              const std::int64_t d1 = std::min(dim, d0 + block);
              double amax = 0;
              for (std::int64_t d = d0; d < d1; ++d) amax = std::max(amax, std::fabs(src->get(b, h, j, d)));
              const float s = static_cast<float>(amax) / static_cast<float>(qmax);
              scale->set(s, b, h, j, d0 / block);
              for (std::int64_t d = d0; d < d1; ++d) dst->set(s > 0 ? src->get(b, h, j, d) / s : 0.0, b, h, j, d);
            }
    Params p = in.params;
    p.k_scale = ks.view, p.v_scale = vs.view;
    in.out.poison();
    ASSERT_TRUE(attention(in.q.view, kq.view, vq.view, in.out.view, p).ok()) << c.name();
    const double vmax = std::max(max_abs_finite(in.v), 1e-3), atol = forward_atol(DType::f32, ref, vmax);
    double err = 0, naive_err = 0;
    std::size_t i = 0;
    in.out.for_each_index([&](auto b, auto h, auto r, auto d) {
      const double x = in.out.get(b, h, r, d), e = ref.out[i], n = naive.out[i++];
      if (std::isfinite(e)) err = std::max(err, std::fabs(x - e)), naive_err = std::max(naive_err, std::fabs(n - e));
      else EXPECT_FALSE(std::isfinite(x)) << c.name();
      if (std::isfinite(e)) EXPECT_TRUE(std::isfinite(x)) << c.name() << ": non-finite output";
    });
    std::printf("[ %s K/V ] %-60s max|out - fp64| = %.3g = %.3g max|V| (fp32 rule allows %.3g)\n", dtype_name(storage),
                c.name().c_str(), err, err / vmax, 2 * naive_err + atol);
    ++cases;
    if (c.amplitude == 1.0 && !c.scale) worst_unit = std::max(worst_unit, err / vmax);
  }
  EXPECT_GT(cases, min_cases);
  EXPECT_LT(worst_unit, bound) << "unit-size inputs, default scale";
  ::testing::Test::RecordProperty("worst_relative_error_unit_inputs", std::to_string(worst_unit));
  std::printf("[ %s K/V ] %d cases; worst max|out - fp64| / max|V| with unit-size inputs and the default scale: %.3g\n",
              dtype_name(storage), cases, worst_unit);
}

TEST(I8KV, QuantisationErrorOnTheRegistryCases) { quantisation_error(DType::i8, 1, 40, 0.05); }
TEST(I4KV, QuantisationErrorOnTheRegistryCases) { quantisation_error(DType::i4, 3, 40, 0.15); }

// 8- and 4-bit K/V under bf16 queries in decode (the GQA groups of 2, 4 and 8 lanes that run row-major; at
// avx512bf16 the pair products, which widen the rows to bf16 and round the weights, their V scales folded in, to
// bf16) on inputs at the edges of what their scales and weights hold: K scales (per row, or per block of 32) spread
// over 10^3.5 (a tile's weights from 1 down to far below bf16's reach of its largest), V scales from 1e-30 to 1e30,
// queries whose lanes lie 2^6 apart in size and whose values spread over 2^19 inside a row, a NaN in one query lane
// and an infinite V scale. Against the fp64 reference by the tolerance rule, at every level, and at avx512bf16 with
// the pair products both preferred and not (contiguous, Dk = 576 and paged).
void decode_on_extreme_inputs(DType storage) {
  using Adjust = std::function<void(Instance&, std::mt19937_64&)>;
  const std::vector<std::pair<const char*, Adjust>> adjustments = {
      {"lanes and values spread", [](Instance& in, std::mt19937_64&) {
         in.q.for_each_index([&](auto b, auto h, auto r, auto d) {
           in.q.set(in.q.get(b, h, r, d) * std::ldexp(1.0, -6 * static_cast<int>(h % 4) - static_cast<int>(d % 20)), b,
                    h, r, d);
         });
       }},
      {"K scales spread", [](Instance& in, std::mt19937_64& rng) {
         std::uniform_real_distribution<double> e(-3, 0.5);
         in.k_scale.for_each_index([&](auto b, auto h, auto j, auto x) { in.k_scale.set(std::pow(10.0, e(rng)), b, h, j, x); });
       }},
      {"V scales 1e-30 to 1e30", [](Instance& in, std::mt19937_64& rng) {
         std::uniform_real_distribution<double> e(-30, 30);
         in.v_scale.for_each_index([&](auto b, auto h, auto j, auto x) { in.v_scale.set(std::pow(10.0, e(rng)), b, h, j, x); });
       }},
      {"a NaN query value", [](Instance& in, std::mt19937_64&) { in.q.set(std::nan(""), 0, 1, 0, 5); }},
      {"an infinite V scale", [](Instance& in, std::mt19937_64&) {
         in.v_scale.set(std::numeric_limits<double>::infinity(), 0, 0, 3);
       }},
  };
  std::vector<Case> cases;
  for (auto [hq, hkv] : {std::pair{8, 2}, {4, 2}, {8, 1}})
    cases.push_back({.B = 2, .Hq = hq, .Hkv = hkv, .Sq = 1, .Skv = 203, .Dk = 128, .Dv = 96, .dtype = DType::bf16,
                     .kv_dtype = storage});
  cases.push_back({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 576, .Dv = 512, .dtype = DType::bf16,
                   .kv_dtype = storage});
  cases.push_back({.B = 2, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 777, .Dk = 64, .Dv = 64, .dtype = DType::bf16,
                   .kv_dtype = storage, .page_size = 16});
  for (const Case& c : cases)
    for (const auto& [what, adjust] : adjustments) {
      SCOPED_TRACE(c.name() + ", " + what);
      Instance in = instantiate(c, 11, adjust);
      core::Problem prob;
      ASSERT_TRUE(core::validate(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &prob).ok());
      const reference::Result ref = reference::attention<double>(prob), naive = reference::attention<float>(prob);
      const auto check = [&] {
        expect_matches_reference(c, in, ref, naive, run_backend(c, in, Backend::flash, 2), true, what);
      };
      for (cpu::Isa isa : supported_isas()) {
        SCOPED_TRACE(cpu::isa_name(isa));
        ForceIsa force(isa);
        check();
        if (isa == cpu::Isa::avx512bf16) {
          ForceBf16Dot other(!cpu::bf16_dot_preferred());
          check();
        }
      }
    }
}
TEST(I8KV, DecodeOnWideAndExtremeInputs) { decode_on_extreme_inputs(DType::i8); }
TEST(I4KV, DecodeOnWideAndExtremeInputs) { decode_on_extreme_inputs(DType::i4); }

// 4-bit K/V read by the kernels are exactly their definition, value q times its block's scale rounded once to fp32,
// at every level (each with its own 4-bit loader: AVX-512's product-table lookups, AVX2's and SSE2's widening) and on
// every path that reads them (the decode kernels' row loads, the prefill's widening into fp32 tiles, contiguous and
// paged rows, whole and partial 32-value blocks): an fp32 query over i4 K/V gives the same bits as over fp32 K/V
// holding those products. Where the sums run in another order (decode on AVX-512 and AVX2 reads a span's even
// values, then its odd ones: flash_kernel.h's kQ4Split), the two agree to within a few rounding steps instead.
TEST(I4KV, SameBitsAsTheirFp32Values) {
  std::vector<Case> cases;
  for (std::int64_t page : {0, 16})
    for (std::int64_t D : {128, 72})
      for (std::int64_t Sq : {1, 3, 128})  // 128: whole blocks of lanes at every level (a last few run row-major)
        cases.push_back({.B = 2, .Hq = 8, .Hkv = 2, .Sq = Sq, .Skv = 777, .Dk = D, .Dv = D + 32,
                         .causal = Sq > 1 ? Causal::bottom_right : Causal::none, .kv_dtype = DType::i4,
                         .page_size = page});
  for (cpu::Isa isa : supported_isas()) {
    ForceIsa force(isa);
    for (const Case& c : cases)
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + ", " + c.name() + ", " + std::to_string(threads) + " threads");
        Instance i4 = instantiate(c);
        Case f = c;
        f.kv_dtype = DType::f32;
        Instance f32 = instantiate(f, 7, [&](Instance& in, std::mt19937_64&) {
          in.q.for_each_index([&](auto b, auto h, auto r, auto d) { in.q.set(i4.q.get(b, h, r, d), b, h, r, d); });
          for (auto [from, scale, to] : {std::tuple{&i4.k, &i4.k_scale, &in.k}, {&i4.v, &i4.v_scale, &in.v}})
            to->for_each_index([&](auto b, auto h, auto j, auto d) {
              const float q = static_cast<float>(from->get(b, h, j, d));
              const float s = static_cast<float>(scale->get(b, h, j, d / kI4Block));
              to->set(q * s, b, h, j, d);
            });
        });
        const Outputs a = run_poisoned(i4, [&](Instance& in) { return in.run(Backend::flash, threads); });
        const Outputs b = run_poisoned(f32, [&](Instance& in) { return in.run(Backend::flash, threads); });
        ASSERT_EQ(a.out.size(), b.out.size());
        std::size_t differ = 0;
        for (std::size_t i = 0; i < a.out.size(); ++i) differ += std::memcmp(&a.out[i], &b.out[i], sizeof(double)) != 0;
        for (std::size_t i = 0; i < a.lse.size(); ++i) differ += std::memcmp(&a.lse[i], &b.lse[i], sizeof(double)) != 0;
        const bool split_order = isa >= cpu::Isa::avx2 && c.Sq < 128;
        if (!split_order) {
          EXPECT_EQ(differ, 0u) << "of " << a.out.size() + a.lse.size() << " outputs";
          continue;
        }
        double worst = 0;
        for (std::size_t i = 0; i < a.out.size(); ++i) worst = std::max(worst, std::fabs(a.out[i] - b.out[i]));
        for (std::size_t i = 0; i < a.lse.size(); ++i) worst = std::max(worst, std::fabs(a.lse[i] - b.lse[i]));
        EXPECT_LT(worst, 1e-5);  // |out| <= 1.5 / 7 · 8 here; fp32's rounding step at 1 is 1.2e-7
      }
  }
}

// 4-bit rows whose block scales lie apart (a scale view [B, Hkv, Skv, blocks] over [B, Hkv, blocks, Skv] memory):
// decode reads such rows widened into fp32 tiles (flash_block: RowSource::scales_adjacent; in registers a Q4Row
// reads adjacent scales only), and gives what the same values with adjacent scales give, to within the summation
// order's rounding, at every level, under fp32 and bf16 queries (the pair products for bf16 at avx512bf16).
TEST(I4KV, BlockScalesApartReadAsAdjacent) {
  for (DType qd : {DType::f32, DType::bf16})
    for (std::int64_t D : {128, 96}) {
      const Case c{.B = 2, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 203, .Dk = D, .Dv = D, .dtype = qd,
                   .kv_dtype = DType::i4};
      for (cpu::Isa isa : supported_isas()) {
        ForceIsa force(isa);
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + ", " + c.name());
        Instance adjacent = instantiate(c), apart = instantiate(c);
        Tensor scales_apart[2];
        for (int t = 0; t < 2; ++t) {
          const Tensor& from = t == 0 ? adjacent.k_scale : adjacent.v_scale;
          const std::int64_t blocks = from.view.shape[3];
          Tensor& to = scales_apart[t];
          to = Tensor::plain(DType::f32, {c.B, c.Hkv, blocks, c.Skv});
          to.view.shape = {c.B, c.Hkv, c.Skv, blocks};
          to.view.strides = {c.Hkv * blocks * c.Skv, blocks * c.Skv, 1, c.Skv};
          to.for_each_index([&](auto b, auto h, auto j, auto e) { to.set(from.get(b, h, j, e), b, h, j, e); });
          (t == 0 ? apart.params.k_scale : apart.params.v_scale) = to.view;
        }
        const Outputs a = run_poisoned(adjacent, [&](Instance& in) { return in.run(Backend::flash, 1); });
        const Outputs b = run_poisoned(apart, [&](Instance& in) { return in.run(Backend::flash, 1); });
        ASSERT_EQ(a.out.size(), b.out.size());
        double worst = 0;
        for (std::size_t i = 0; i < a.out.size(); ++i) worst = std::max(worst, std::fabs(a.out[i] - b.out[i]));
        for (std::size_t i = 0; i < a.lse.size(); ++i) worst = std::max(worst, std::fabs(a.lse[i] - b.lse[i]));
        // bf16: the pair products round the weights to bf16 (2^-9 relative), the widened path keeps them fp32
        EXPECT_LT(worst, qd == DType::f32 ? 1e-5 : 2e-2);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Registry, AttentionCase, ::testing::ValuesIn(registry()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

}  // namespace
}  // namespace attn::test
