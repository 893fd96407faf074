// Bad input: every invalid argument gives a clear error that names the parameter, and leaves the
// outputs untouched (byte for byte).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "attn/info.h"
#include "cases.h"

namespace attn::test {
namespace {

struct Env {
  Tensor q{DType::f32, 2, 4, 5, 8}, k{DType::f32, 2, 2, 6, 8}, v{DType::f32, 2, 2, 6, 3}, out{DType::f32, 2, 4, 5, 3};
  Tensor lse = Tensor::plain(DType::f32, {2, 4, 5});
  Tensor mask = Tensor::plain(DType::f32, {5, 6});
  Tensor bmask = Tensor::plain(DType::boolean, {2, 1, 5, 6});
  Tensor lens = Tensor::plain(DType::i32, {2});
  Tensor big = Tensor::plain(DType::f32, {4096});  // scratch memory for aliasing cases
  // 8-bit K/V and their row scales (used by the i8 cases, which switch kv/vv to them)
  Tensor k8{DType::i8, 2, 2, 6, 8}, v8{DType::i8, 2, 2, 6, 3};
  Tensor ks = Tensor::plain(DType::f32, {2, 2, 6}), vs = Tensor::plain(DType::f32, {2, 2, 6});
  // 4-bit K/V (head dims 40 and 3: two blocks and one) and their block scales
  Tensor k4{DType::i4, 2, 2, 6, 40}, v4{DType::i4, 2, 2, 6, 3}, q40{DType::f32, 2, 4, 5, 40};
  Tensor ks4 = Tensor::plain(DType::f32, {2, 2, 6, 2}), vs4 = Tensor::plain(DType::f32, {2, 2, 6, 1});
  TensorView qv, kv, vv, ov;
  std::optional<TensorView> lsev;
  Params p;
  Env() {
    std::mt19937_64 rng(1);
    q.randomize(rng), k.randomize(rng), v.randomize(rng), mask.randomize(rng);
    k8.randomize(rng, 127), v8.randomize(rng, 127), ks.randomize(rng, 0.01), vs.randomize(rng, 0.01);
    k4.randomize(rng, 8), v4.randomize(rng, 8), q40.randomize(rng), ks4.randomize(rng, 0.1), vs4.randomize(rng, 0.1);
    bmask.for_each_index([&](auto a, auto b, auto c, auto d) { bmask.set((a + c + d) % 2, a, b, c, d); });
    lens.set(3, 0), lens.set(6, 1);
    out.poison(), lse.poison();
    qv = q.view, kv = k.view, vv = v.view, ov = out.view, lsev = lse.view;
  }
};

struct BadCase {
  const char* name;
  const char* param;  // must appear in the message
  std::function<void(Env&)> mutate;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<BadCase> bad_cases() {
  return {
      {"q_rank3", "q", [](Env& s) { s.qv.rank = 3; }},
      {"k_rank5", "k", [](Env& s) { s.kv.rank = 5; }},
      {"v_rank2", "v", [](Env& s) { s.vv.rank = 2; }},
      {"out_rank3", "out", [](Env& s) { s.ov.rank = 3; }},
      {"q_negative_dim", "q", [](Env& s) { s.qv.shape[2] = -1; }},
      {"q_null_data", "q", [](Env& s) { s.qv.data = nullptr; }},
      {"q_dtype_bool", "q", [](Env& s) { s.qv.dtype = DType::boolean; }},
      {"k_dtype_i32", "k", [](Env& s) { s.kv.dtype = DType::i32; }},
      {"q_dtype_garbage", "q", [](Env& s) { s.qv.dtype = static_cast<DType>(77); }},
      {"k_batch_mismatch", "k", [](Env& s) { s.kv.shape[0] = 3; }},
      {"dk_mismatch", "k", [](Env& s) { s.kv.shape[3] = 7; }},
      {"heads_not_divisible", "k", [](Env& s) { s.kv.shape[1] = 3, s.vv.shape[1] = 3; }},
      {"zero_kv_heads", "k", [](Env& s) { s.kv.shape[1] = 0; }},
      {"zero_head_dim", "q", [](Env& s) { s.qv.shape[3] = 0, s.kv.shape[3] = 0; }},
      {"v_seq_mismatch", "v", [](Env& s) { s.vv.shape[2] = 5; }},
      {"v_heads_mismatch", "v", [](Env& s) { s.vv.shape[1] = 1; }},
      {"out_dv_mismatch", "out", [](Env& s) { s.ov.shape[3] = 8; }},
      {"out_sq_mismatch", "out", [](Env& s) { s.ov.shape[2] = 4; }},
      {"out_heads_mismatch", "out", [](Env& s) { s.ov.shape[1] = 2; }},
      {"kv_dtype_differs", "v", [](Env& s) { s.vv.dtype = DType::bf16; }},
      {"out_dtype_differs", "out", [](Env& s) { s.ov.dtype = DType::f16; }},
      {"out_zero_stride", "out", [](Env& s) { s.ov.strides[2] = 0; }},
      {"lse_shape", "lse", [](Env& s) { s.lsev->shape[2] = 4; }},
      {"lse_rank", "lse", [](Env& s) { s.lsev->rank = 4; }},
      {"lse_dtype", "lse", [](Env& s) { s.lsev->dtype = DType::f16; }},
      {"scale_zero", "scale", [](Env& s) { s.p.scale = 0.0; }},
      {"scale_negative", "scale", [](Env& s) { s.p.scale = -0.5; }},
      {"scale_nan", "scale", [](Env& s) { s.p.scale = std::nan(""); }},
      {"scale_inf", "scale", [](Env& s) { s.p.scale = INFINITY; }},
      {"causal_garbage", "causal", [](Env& s) { s.p.causal = static_cast<Causal>(9); }},
      {"window_left_bad", "window", [](Env& s) { s.p.window = {-2, 0}; }},
      {"window_right_bad", "window", [](Env& s) { s.p.window = {0, -5}; }},
      {"window_align_garbage", "window", [](Env& s) { s.p.window = {1, 1, static_cast<Align>(4)}; }},
      {"kv_lens_too_long", "kv_lens", [](Env& s) { s.lens.set(7, 1), s.p.kv_lens = s.lens.view; }},
      {"kv_lens_negative", "kv_lens", [](Env& s) { s.lens.set(-1, 0), s.p.kv_lens = s.lens.view; }},
      {"kv_lens_shape", "kv_lens", [](Env& s) { s.p.kv_lens = s.lens.view, s.p.kv_lens->shape[0] = 1; }},
      {"kv_lens_dtype", "kv_lens", [](Env& s) { s.p.kv_lens = s.mask.view, s.p.kv_lens->rank = 1; }},
      {"kv_lens_rank", "kv_lens", [](Env& s) { s.p.kv_lens = s.mask.view; s.p.kv_lens->dtype = DType::i32; }},
      {"mask_not_broadcastable", "mask", [](Env& s) { s.p.mask = s.mask.view, s.p.mask->shape[1] = 4; }},
      {"mask_bad_batch", "mask", [](Env& s) { s.p.mask = s.bmask.view, s.p.mask->shape[0] = 3; }},
      {"mask_rank5", "mask", [](Env& s) { s.p.mask = s.mask.view, s.p.mask->rank = 5; }},
      {"mask_rank0", "mask", [](Env& s) { s.p.mask = s.mask.view, s.p.mask->rank = 0; }},
      {"mask_dtype_i64", "mask", [](Env& s) { s.p.mask = s.mask.view, s.p.mask->dtype = DType::i64; }},
      {"mask_nan", "mask", [](Env& s) { s.mask.set(kNaN, 2, 3), s.p.mask = s.mask.view; }},
      {"mask_plus_inf", "mask", [](Env& s) { s.mask.set(INFINITY, 0, 0), s.p.mask = s.mask.view; }},
      {"threads_negative", "threads", [](Env& s) { s.p.threads = -1; }},
      {"backend_garbage", "backend", [](Env& s) { s.p.backend = static_cast<Backend>(42); }},
      {"out_aliases_q", "out", [](Env& s) {
         s.ov.data = s.q.view.data, s.ov.shape = s.qv.shape, s.ov.shape[3] = 3;
       }},
      {"out_aliases_v", "out", [](Env& s) { s.ov.data = static_cast<float*>(s.v.view.data) + 10; }},
      {"lse_aliases_out", "lse", [](Env& s) { s.lsev->data = s.out.view.data; }},
      {"strides_overflow", "q", [](Env& s) { s.qv.strides[0] = std::int64_t{1} << 62; }},
      {"threads_too_many", "threads", [](Env& s) { s.p.threads = 100000; }},
      // 8-bit K/V: i8 k and v with f32 scales shaped like k's first three dimensions, nothing else
      {"q_dtype_i8", "q", [](Env& s) { s.qv.dtype = DType::i8; }},
      {"k_scale_for_f32_k", "k_scale", [](Env& s) { s.p.k_scale = s.ks.view; }},
      {"v_scale_for_f32_v", "v_scale", [](Env& s) { s.p.v_scale = s.vs.view; }},
      {"i8_without_scales", "k_scale", [](Env& s) { s.kv = s.k8.view, s.vv = s.v8.view; }},
      {"i8_without_v_scale", "v_scale", [](Env& s) { s.kv = s.k8.view, s.vv = s.v8.view, s.p.k_scale = s.ks.view; }},
      {"i8_k_f32_v", "v", [](Env& s) { s.kv = s.k8.view, s.p.k_scale = s.ks.view, s.p.v_scale = s.vs.view; }},
      {"i8_scale_shape", "k_scale", [](Env& s) {
         s.kv = s.k8.view, s.vv = s.v8.view, s.p.k_scale = s.ks.view, s.p.v_scale = s.vs.view, s.p.k_scale->shape[2] = 5;
       }},
      {"i8_scale_rank", "v_scale", [](Env& s) {
         s.kv = s.k8.view, s.vv = s.v8.view, s.p.k_scale = s.ks.view, s.p.v_scale = s.vs.view, s.p.v_scale->rank = 2;
       }},
      {"i8_scale_dtype", "k_scale", [](Env& s) {
         s.kv = s.k8.view, s.vv = s.v8.view, s.p.k_scale = s.ks.view, s.p.v_scale = s.vs.view;
         s.p.k_scale->dtype = DType::bf16;
       }},
      // 4-bit K/V: i4 k and v (rows on bytes) with f32 scales [.., ceil(D / 32)]
      {"i4_without_scales", "k_scale", [](Env& s) { s.qv = s.q40.view, s.kv = s.k4.view, s.vv = s.v4.view; }},
      {"i4_with_i8_scales", "k_scale", [](Env& s) {
         s.qv = s.q40.view, s.kv = s.k4.view, s.vv = s.v4.view, s.p.k_scale = s.ks.view, s.p.v_scale = s.vs.view;
       }},
      {"i4_scale_blocks", "v_scale", [](Env& s) {
         s.qv = s.q40.view, s.kv = s.k4.view, s.vv = s.v4.view, s.p.k_scale = s.ks4.view, s.p.v_scale = s.ks4.view;
       }},
      {"i4_odd_row_stride", "k", [](Env& s) {
         s.qv = s.q40.view, s.kv = s.k4.view, s.vv = s.v4.view, s.p.k_scale = s.ks4.view, s.p.v_scale = s.vs4.view;
         s.kv.shape[2] = 5, s.kv.strides[2] = 41;
         s.vv.shape[2] = 5;
         s.p.k_scale->shape[2] = s.p.v_scale->shape[2] = 5;
       }},
      {"i4_strided_row", "v", [](Env& s) {
         s.qv = s.q40.view, s.kv = s.k4.view, s.vv = s.v4.view, s.p.k_scale = s.ks4.view, s.p.v_scale = s.vs4.view;
         s.vv.shape[3] = 2, s.vv.strides[3] = 2, s.ov.shape[3] = 2;
       }},
      {"i4_k_i8_v", "v", [](Env& s) {
         s.qv = s.q40.view, s.kv = s.k4.view, s.vv = s.v8.view, s.p.k_scale = s.ks4.view, s.p.v_scale = s.vs.view;
       }},
      {"out_aliases_k_scale", "out", [](Env& s) {
         s.kv = s.k8.view, s.vv = s.v8.view, s.p.k_scale = s.ks.view, s.p.v_scale = s.vs.view;
         s.p.k_scale->data = s.out.view.data;
       }},
      // the score variants
      {"softcap_negative", "softcap", [](Env& s) { s.p.softcap = -1.0; }},
      {"softcap_nan", "softcap", [](Env& s) { s.p.softcap = std::nan(""); }},
      {"alibi_slopes_wrong_heads", "alibi_slopes", [](Env& s) {
         s.p.alibi_slopes = TensorView::contiguous(s.big.view.data, DType::f32, {3});
       }},
      {"alibi_slopes_infinite", "alibi_slopes", [](Env& s) {
         static_cast<float*>(s.big.view.data)[1] = std::numeric_limits<float>::infinity();
         s.p.alibi_slopes = TensorView::contiguous(s.big.view.data, DType::f32, {4});
       }},
      {"sinks_wrong_dtype", "sinks", [](Env& s) { s.p.sinks = TensorView::contiguous(s.big.view.data, DType::f16, {4}); }},
      {"sinks_nan", "sinks", [](Env& s) {
         static_cast<float*>(s.big.view.data)[2] = std::nanf("");
         s.p.sinks = TensorView::contiguous(s.big.view.data, DType::f32, {4});
       }},
      {"dropout_p_one", "dropout_p", [](Env& s) { s.p.dropout_p = 1.0; }},
      {"dropout_p_negative", "dropout_p", [](Env& s) { s.p.dropout_p = -0.25; }},
  };
}

// Every Params field and tensor argument of attention() that a value can make invalid: the list above must hold a
// case for each (a new parameter without a case fails here). workspace, stream, dropout_seed,
// backward_statistics and check_mask_values take every value of their type (stream is ignored for host tensors;
// backward_statistics is the backward's: tests/test_backward.cc).
const char* const kCheckedParameters[] = {"q",         "k",       "v",          "out",          "lse",
                                          "scale",     "causal",  "window",     "kv_lens",      "mask",
                                          "k_scale",   "v_scale", "threads",    "backend",      "softcap",
                                          "alibi_slopes", "sinks", "dropout_p"};

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, ClearErrorAndOutputsUntouched) {
  for (Backend backend : {Backend::flash, Backend::reference, Backend::automatic}) {
    Env s;
    s.p.backend = backend;
    const std::vector<unsigned char> out_before = s.out.storage, lse_before = s.lse.storage;
    GetParam().mutate(s);
    const Status st = attention(s.qv, s.kv, s.vv, s.ov, s.p, s.lsev);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::invalid_argument);
    const std::string& m = st.message();
    EXPECT_EQ(m.rfind(std::string(GetParam().param), 0), 0u) << "message should start with the parameter: " << m;
    EXPECT_EQ(st.param().rfind(std::string(GetParam().param), 0), 0u) << st.param();
    EXPECT_NE(m.find("expected"), std::string::npos) << "message should say what was expected: " << m;
    EXPECT_EQ(s.out.storage, out_before) << "out was written";
    EXPECT_EQ(s.lse.storage, lse_before) << "lse was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Errors, BadInput, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

// attention_paged: its own arguments, checked before anything is written.
TEST(BadInputPaged, ClearErrorsAndOutputsUntouched) {
  const std::int64_t B = 2, H = 2, ps = 4, P = 6, D = 8;
  std::mt19937_64 rng(2);
  Tensor q(DType::f32, B, H, 1, D), kp(DType::f32, P, H, ps, D), vp(DType::f32, P, H, ps, D), out(DType::f32, B, H, 1, D);
  q.randomize(rng), kp.randomize(rng), vp.randomize(rng);
  Tensor table = Tensor::plain(DType::i32, {B, 3}), lens = Tensor::plain(DType::i32, {B});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t n = 0; n < 3; ++n) table.set(static_cast<double>(b * 3 + n), b, n);
  lens.set(9, 0), lens.set(12, 1);
  out.poison();
  const auto before = out.storage;
  ASSERT_TRUE(attention_paged(q.view, kp.view, vp.view, table.view, lens.view, out.view).ok());
  struct Bad {
    const char* param;
    std::function<void(TensorView&, TensorView&, Params&)> mutate;  // table, lens, params
  };
  const Bad bad[] = {
      {"page_table", [&](TensorView& t, TensorView&, Params&) { table.set(6, 1, 2), t = table.view; }},
      {"page_table", [&](TensorView& t, TensorView&, Params&) { table.set(-1, 0, 0), t = table.view; }},
      {"page_table", [](TensorView& t, TensorView&, Params&) { t.dtype = DType::i64; }},
      {"page_table", [](TensorView& t, TensorView&, Params&) { t.rank = 1; }},
      {"page_table", [](TensorView& t, TensorView&, Params&) { t.shape[0] = 3; }},
      {"seq_lens", [&](TensorView&, TensorView& l, Params&) { lens.set(13, 1), l = lens.view; }},
      {"seq_lens", [](TensorView&, TensorView& l, Params&) { l.shape[0] = 1; }},
      {"kv_lens", [&](TensorView&, TensorView&, Params& p) { p.kv_lens = lens.view; }},
  };
  for (const Bad& c : bad) {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t n = 0; n < 3; ++n) table.set(static_cast<double>(b * 3 + n), b, n);
    lens.set(9, 0), lens.set(12, 1);
    out.poison();
    TensorView t = table.view, l = lens.view;
    Params p;
    c.mutate(t, l, p);
    const Status st = attention_paged(q.view, kp.view, vp.view, t, l, out.view, p);
    ASSERT_FALSE(st.ok()) << c.param;
    EXPECT_EQ(st.param(), c.param) << st.message();
    EXPECT_NE(st.message().find("expected"), std::string::npos) << st.message();
    EXPECT_EQ(out.storage, before) << "out was written: " << st.message();
  }
}

// Quantised K/V run forward only: the backward refuses them (naming k and the dtype), writing nothing. `s` holds the
// quantised call (its K head dim dk); the gradients are f32 of the same shapes.
void expect_forward_only(Env& s, std::int64_t dk, const char* dtype) {
  ASSERT_TRUE(attention(s.qv, s.kv, s.vv, s.ov, s.p, s.lsev).ok());
  Tensor dout(DType::f32, 2, 4, 5, 3), dq(DType::f32, 2, 4, 5, dk), dk_(DType::f32, 2, 2, 6, dk), dv(DType::f32, 2, 2, 6, 3);
  std::mt19937_64 rng(3);
  dout.randomize(rng), dq.poison(), dk_.poison(), dv.poison();
  const auto before = dq.storage;
  const Status st = attention_backward(s.qv, s.kv, s.vv, s.ov, *s.lsev, dout.view, dq.view, dk_.view, dv.view, s.p);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.param(), "k") << st.message();
  EXPECT_NE(st.message().find("expected"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(dtype), std::string::npos) << st.message();
  EXPECT_EQ(dq.storage, before);
}

TEST(BadInputI8, BackwardRefused) {
  Env s;
  s.kv = s.k8.view, s.vv = s.v8.view, s.p.k_scale = s.ks.view, s.p.v_scale = s.vs.view;
  expect_forward_only(s, 8, "i8");
}

TEST(BadInputI4, ForwardTakesThemBackwardRefuses) {
  Env s;
  s.qv = s.q40.view, s.kv = s.k4.view, s.vv = s.v4.view, s.p.k_scale = s.ks4.view, s.p.v_scale = s.vs4.view;
  expect_forward_only(s, 40, "i4");
}

TEST(BadInputList, EveryParameterHasACase) {
  for (const char* param : kCheckedParameters) {
    const std::vector<BadCase> cases = bad_cases();
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(), [&](const BadCase& c) { return std::string(c.param) == param; }))
        << "no bad-input case for " << param;
  }
}

// The valid setup itself passes, so every failure above is due to its one mutation.
TEST(BadInputList, BaselineIsValid) {
  Env s;
  s.p.mask = s.mask.view;
  s.p.kv_lens = s.lens.view;
  const Status st = attention(s.qv, s.kv, s.vv, s.ov, s.p, s.lsev);
  EXPECT_TRUE(st.ok()) << st.message();
}

// attn::set_num_threads: the process's default thread count, read by every call after it; 0 gives the default
// back; a count outside 0..4096 is refused with a Status naming n and changes nothing.
TEST(SetNumThreads, SetsTheDefaultAndRefusesBadCounts) {
  const int before = resolve_threads(0);
  ASSERT_TRUE(set_num_threads(3).ok());
  EXPECT_EQ(resolve_threads(0), 3);
  EXPECT_EQ(resolve_threads(5), 5);  // a call's own Params::threads still wins
  Env s;
  KernelInfo info;
  ASSERT_TRUE(describe_attention(s.qv, s.kv, s.vv, s.ov, s.p, s.lsev, &info).ok());
  EXPECT_EQ(info.threads, 3);
  for (int bad : {-1, 4097}) {
    const Status st = set_num_threads(bad);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::invalid_argument);
    EXPECT_EQ(st.param(), "n") << st.message();
    EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("expected"), std::string::npos) << st.message();
    EXPECT_EQ(resolve_threads(0), 3);
  }
  ASSERT_TRUE(set_num_threads(0).ok());
  EXPECT_EQ(resolve_threads(0), before);
}

}  // namespace
}  // namespace attn::test
