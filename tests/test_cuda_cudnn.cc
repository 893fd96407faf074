// The cuDNN path's host rule (cuda/cudnn_sdpa.h, src/cuda/cudnn_rules.cc): which problems attn hands to cuDNN's
// fused attention, and the parameter it names when it does not. Host tensors: the rule reads dtypes, sizes,
// strides, addresses and options, never values, so it is tested without a GPU; whether cuDNN then computes what attn
// means is make test-gpu's (CudaForwardDevice.CudnnRegistryMatchesFp64Reference).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "core/backward_problem.h"
#include "core/problem.h"
#include "cuda/cudnn_sdpa.h"

namespace {

using namespace attn;

// One call's host tensors, 16-byte aligned: q [B, Hq, Sq, Dk], k [B, Hkv, Skv, Dk], v [B, Hkv, Skv, Dv].
struct Call {
  std::int64_t B = 2, Hq = 8, Hkv = 2, Sq = 5, Skv = 37, Dk = 64, Dv = 64;
  DType dtype = DType::bf16;
  Params params;
  bool with_lse = true;
  std::vector<std::uint32_t> q, k, v, out, dq, dk, dv, dout;  // 4 bytes an element: room for f32 too
  std::vector<float> lse, extra;
  std::vector<std::int32_t> lens;
  TensorView qv, kv, vv, ov, lv;

  void make() {
    q.assign(B * Hq * Sq * Dk + 8, 0x3f803f80), k.assign(B * Hkv * Skv * Dk + 8, 0x3f803f80);
    v.assign(B * Hkv * Skv * Dv + 8, 0x3f803f80), out.assign(B * Hq * Sq * Dv + 8, 0);
    dq = q, dk = k, dv = v, dout = out;
    lse.assign(B * Hq * Sq + 8, 0);
    qv = TensorView::contiguous(q.data(), dtype, {B, Hq, Sq, Dk});
    kv = TensorView::contiguous(k.data(), dtype, {B, Hkv, Skv, Dk});
    vv = TensorView::contiguous(v.data(), dtype, {B, Hkv, Skv, Dv});
    ov = TensorView::contiguous(out.data(), dtype, {B, Hq, Sq, Dv});
    lv = TensorView::contiguous(lse.data(), DType::f32, {B, Hq, Sq});
  }
  Status rule() {
    core::Problem p;
    const Status v = core::validate(qv, kv, vv, ov, params, with_lse ? std::optional<TensorView>(lv) : std::nullopt, &p);
    EXPECT_TRUE(v.ok()) << v.message();
    return cuda::cudnn::takes(p);
  }
  Status backward_rule() {
    core::BackwardProblem bp;
    const Status v = core::validate_backward(
        qv, kv, vv, ov, lv, TensorView::contiguous(dout.data(), dtype, {B, Hq, Sq, Dv}),
        TensorView::contiguous(dq.data(), dtype, {B, Hq, Sq, Dk}), TensorView::contiguous(dk.data(), dtype, {B, Hkv, Skv, Dk}),
        TensorView::contiguous(dv.data(), dtype, {B, Hkv, Skv, Dv}), params, std::nullopt, &bp);
    EXPECT_TRUE(v.ok()) << v.message();
    return cuda::cudnn::takes_backward(bp);
  }
};

// The rule's verdict on the base call with one change: ok, or the parameter named.
std::string verdict(const std::function<void(Call&)>& change, bool backward = false) {
  Call c;
  c.make();
  change(c);
  const Status s = backward ? c.backward_rule() : c.rule();
  return s.ok() ? "ok" : s.param();
}

TEST(CudnnRule, BuildWithoutTheFrontendSaysSo) {
  if (cuda::cudnn::built()) GTEST_SKIP() << "this build has the cuDNN path";
  Call c;
  c.make();
  const Status s = c.rule();
  EXPECT_EQ(s.param(), "backend");
  EXPECT_NE(s.message().find("no cuDNN path"), std::string::npos) << s.message();
}

class CudnnRuleBuilt : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::cudnn::built()) GTEST_SKIP() << "this build has no cuDNN path";
  }
};

TEST_F(CudnnRuleBuilt, TakesTheCommonShapes) {
  EXPECT_EQ(verdict([](Call&) {}), "ok");                                     // GQA 8/2, Sq != Skv
  EXPECT_EQ(verdict([](Call& c) { c.dtype = DType::f16; c.make(); }), "ok");
  EXPECT_EQ(verdict([](Call& c) { c.with_lse = false; }), "ok");
  EXPECT_EQ(verdict([](Call& c) { c.params.causal = Causal::top_left; }), "ok");
  EXPECT_EQ(verdict([](Call& c) { c.params.causal = Causal::bottom_right; }), "ok");  // Sq <= Skv, no lengths
  EXPECT_EQ(verdict([](Call& c) { c.Dk = 128, c.Dv = 64; c.make(); }), "ok");      // Dv != Dk
  EXPECT_EQ(verdict([](Call& c) { c.Dk = c.Dv = 256; c.make(); }), "ok");
  EXPECT_EQ(verdict([](Call& c) {  // key lengths (cuDNN's padding mask), causal from the top
              c.lens = {37, 9};
              c.params.kv_lens = TensorView::contiguous(c.lens.data(), DType::i32, {2});
              c.params.causal = Causal::top_left;
            }),
            "ok");
  EXPECT_EQ(verdict([](Call& c) {  // a decode step over ragged caches: bottom-right causal is no mask at Sq = 1
              c.Sq = 1;
              c.make();
              c.lens = {37, 1};
              c.params.kv_lens = TensorView::contiguous(c.lens.data(), DType::i32, {2});
              c.params.causal = Causal::bottom_right;
            }),
            "ok");
}

TEST_F(CudnnRuleBuilt, RefusesWhatAttnDefinesItsOwnWay) {
  EXPECT_EQ(verdict([](Call& c) { c.dtype = DType::f32; c.make(); }), "q");
  EXPECT_EQ(verdict([](Call& c) { c.Dk = 36; c.make(); }), "q");
  EXPECT_EQ(verdict([](Call& c) { c.Dv = 264; c.make(); }), "q");
  EXPECT_EQ(verdict([](Call& c) { c.params.window.left = 4; }), "window");
  EXPECT_EQ(verdict([](Call& c) { c.params.softcap = 30; }), "softcap");
  EXPECT_EQ(verdict([](Call& c) {
              c.extra.assign(8, 0.5f);
              c.params.alibi_slopes = TensorView::contiguous(c.extra.data(), DType::f32, {8});
            }),
            "alibi_slopes");
  EXPECT_EQ(verdict([](Call& c) {
              c.extra.assign(8, 0.5f);
              c.params.sinks = TensorView::contiguous(c.extra.data(), DType::f32, {8});
            }),
            "sinks");
  EXPECT_EQ(verdict([](Call& c) { c.params.dropout_p = 0.1; }), "dropout_p");
  EXPECT_EQ(verdict([](Call& c) {
              c.extra.assign(5 * 37, 0.0f);
              c.params.mask = TensorView::contiguous(c.extra.data(), DType::f32, {5, 37});
            }),
            "mask");
}

TEST_F(CudnnRuleBuilt, RefusesRowsWithoutKeysAndAmbiguousAlignments) {
  EXPECT_EQ(verdict([](Call& c) {
              c.lens = {37, 0};
              c.params.kv_lens = TensorView::contiguous(c.lens.data(), DType::i32, {2});
            }),
            "kv_lens");
  EXPECT_EQ(verdict([](Call& c) {  // bottom-right with ragged lengths and several queries
              c.lens = {37, 20};
              c.params.kv_lens = TensorView::contiguous(c.lens.data(), DType::i32, {2});
              c.params.causal = Causal::bottom_right;
            }),
            "causal");
  EXPECT_EQ(verdict([](Call& c) {  // bottom-right with more queries than keys: rows without keys
              c.Sq = 40;
              c.make();
              c.params.causal = Causal::bottom_right;
            }),
            "causal");
}

TEST_F(CudnnRuleBuilt, RefusesLayoutsItCannotRead) {
  EXPECT_EQ(verdict([](Call& c) {  // q's rows 2 bytes off a 16-byte boundary
              c.qv.data = reinterpret_cast<std::uint16_t*>(c.q.data()) + 1;
            }),
            "q");
  EXPECT_EQ(verdict([](Call& c) {  // k's rows not unit-stride (every other element of a [.., 2·Dk] buffer)
              c.k.assign(c.B * c.Hkv * c.Skv * c.Dk * 2, 0x3f803f80);
              c.kv.data = c.k.data();
              for (int a = 0; a < 4; ++a) c.kv.strides[a] *= 2;
            }),
            "k");
  EXPECT_EQ(verdict([](Call& c) {  // out with a row stride of 68 elements (136 bytes: not a multiple of 16)
              c.out.assign(c.B * c.Hq * c.Sq * 68, 0);
              c.ov = TensorView{c.out.data(), DType::bf16, Device::cpu(), 4, {c.B, c.Hq, c.Sq, c.Dv}, {c.Hq * c.Sq * 68, c.Sq * 68, 68, 1}};
            }),
            "out");
  EXPECT_EQ(verdict([](Call& c) {  // an LSE that is not packed [B, Hq, Sq]
              c.lse.assign(c.B * c.Hq * c.Sq * 2, 0);
              c.lv = TensorView{c.lse.data(), DType::f32, Device::cpu(), 3, {c.B, c.Hq, c.Sq, 0}, {c.Hq * c.Sq * 2, c.Sq * 2, 2, 0}};
            }),
            "lse");
}

TEST_F(CudnnRuleBuilt, BackwardTakesContiguousHalfPrecision) {
  EXPECT_EQ(verdict([](Call&) {}, true), "ok");
  EXPECT_EQ(verdict([](Call& c) { c.params.causal = Causal::top_left; }, true), "ok");
  EXPECT_EQ(verdict([](Call& c) { c.params.softcap = 30; }, true), "softcap");
  EXPECT_EQ(verdict([](Call& c) { c.Dk = 36; c.make(); }, true), "q");
}

}  // namespace
