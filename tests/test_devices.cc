// Tensors on CUDA devices through the public API, on any machine: every tensor of a call must be on one device
// (the first that is not is named), CUDA-only and CPU-only backends are refused on the other side, and where
// there is no GPU (or no CUDA in the build) a call on CUDA tensors answers "no CUDA device", never aborts, and
// writes nothing. (What runs on a GPU is tested by `make test-gpu`.)
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attn/attn.h"
#include "attn/info.h"
#include "cuda/runtime.h"

namespace attn {
namespace {

// Views over host memory that claim to live on a device: with no device present the library must never read
// them (a read would be a host read of the buffer, harmless here, but the library must not get that far).
struct Call {
  std::vector<float> q = std::vector<float>(2 * 4 * 5 * 8, 0.5f), k = std::vector<float>(2 * 2 * 6 * 8, 0.25f),
                     v = std::vector<float>(2 * 2 * 6 * 8, 1.0f), out = std::vector<float>(2 * 4 * 5 * 8, NAN),
                     lse = std::vector<float>(2 * 4 * 5, NAN);
  std::vector<std::int32_t> lens = {3, 6};
  TensorView qv = TensorView::contiguous(q.data(), DType::f32, {2, 4, 5, 8}),
             kv = TensorView::contiguous(k.data(), DType::f32, {2, 2, 6, 8}),
             vv = TensorView::contiguous(v.data(), DType::f32, {2, 2, 6, 8}),
             ov = TensorView::contiguous(out.data(), DType::f32, {2, 4, 5, 8}),
             lv = TensorView::contiguous(lse.data(), DType::f32, {2, 4, 5}),
             lens_v = TensorView::contiguous(lens.data(), DType::i32, {2});
  void all_on(Device d) { qv.device = kv.device = vv.device = ov.device = lv.device = lens_v.device = d; }
  bool untouched() const {
    for (float x : out)
      if (!std::isnan(x)) return false;
    for (float x : lse)
      if (!std::isnan(x)) return false;
    return true;
  }
};

bool gpu_here() { return cuda::device_count() > 0; }

TEST(Devices, MixedPlacementNamesTheParameter) {
  Call c;
  c.kv.device = Device::cuda(0);
  Status s = attention(c.qv, c.kv, c.vv, c.ov, {}, c.lv);
  EXPECT_EQ(s.param(), "k") << s.message();
  EXPECT_NE(s.message().find("expected q's device, cpu"), std::string::npos) << s.message();
  c.kv.device = Device::cpu();
  c.lv.device = Device::cuda(0);
  s = attention(c.qv, c.kv, c.vv, c.ov, {}, c.lv);
  EXPECT_EQ(s.param(), "lse") << s.message();
  c.lv.device = Device::cpu();
  Params p;
  p.kv_lens = c.lens_v.on(Device::cuda(1));
  s = attention(c.qv, c.kv, c.vv, c.ov, p, c.lv);
  EXPECT_EQ(s.param(), "kv_lens") << s.message();
  EXPECT_NE(s.message().find("on cuda:1"), std::string::npos) << s.message();
  EXPECT_TRUE(c.untouched());
}

TEST(Devices, BackendsOnTheWrongSide) {
  Call c;
  Params p;
  p.backend = Backend::cudnn;
  Status s = attention(c.qv, c.kv, c.vv, c.ov, p, c.lv);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_EQ(s.param(), "backend") << s.message();
  c.all_on(Device::cuda(0));
  p.backend = Backend::reference;
  s = attention(c.qv, c.kv, c.vv, c.ov, p, c.lv);
  if (cuda::built_with_cuda()) EXPECT_EQ(s.param(), "backend") << s.message();
  else EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << s.message();  // (said first)
  EXPECT_TRUE(c.untouched());
}

TEST(Devices, NoDeviceIsAClearStatus) {
  if (gpu_here()) GTEST_SKIP() << "a CUDA device is present (make test-gpu runs the GPU paths)";
  Call c;
  c.all_on(Device::cuda(0));
  const std::string expect = "no CUDA device";  // (and, in a build without CUDA, that it has no CUDA backend)
  Status s = attention(c.qv, c.kv, c.vv, c.ov, {}, c.lv);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  // With key lengths to read (validation copies device values to the host): the same answer.
  Params p;
  p.kv_lens = c.lens_v;
  s = attention(c.qv, c.kv, c.vv, c.ov, p, c.lv);
  EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  KernelInfo info;
  s = describe_attention(c.qv, c.kv, c.vv, c.ov, {}, c.lv, &info);
  EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  std::vector<float> g(c.out.size(), 0.1f), dq(c.q.size(), NAN), dk(c.k.size(), NAN), dv(c.v.size(), NAN);
  const TensorView gv = TensorView::contiguous(g.data(), DType::f32, {2, 4, 5, 8}).on(Device::cuda(0));
  s = attention_backward(c.qv, c.kv, c.vv, c.ov, c.lv, gv,
                         TensorView::contiguous(dq.data(), DType::f32, {2, 4, 5, 8}).on(Device::cuda(0)),
                         TensorView::contiguous(dk.data(), DType::f32, {2, 2, 6, 8}).on(Device::cuda(0)),
                         TensorView::contiguous(dv.data(), DType::f32, {2, 2, 6, 8}).on(Device::cuda(0)));
  EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  for (float x : dq) EXPECT_TRUE(std::isnan(x));
  s = merge_attention(c.ov, c.lv, c.ov, c.lv, c.ov, c.lv);
  EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  EXPECT_TRUE(c.untouched());
}

TEST(Devices, BackwardGradientsOnAnotherDevice) {
  Call c;
  std::vector<float> g(c.out.size(), 0.1f), dq(c.q.size(), NAN), dk(c.k.size(), NAN), dv(c.v.size(), NAN);
  ASSERT_TRUE(attention(c.qv, c.kv, c.vv, c.ov, {}, c.lv).ok());
  const Status s = attention_backward(c.qv, c.kv, c.vv, c.ov, c.lv, TensorView::contiguous(g.data(), DType::f32, {2, 4, 5, 8}),
                                      TensorView::contiguous(dq.data(), DType::f32, {2, 4, 5, 8}),
                                      TensorView::contiguous(dk.data(), DType::f32, {2, 2, 6, 8}).on(Device::cuda(0)),
                                      TensorView::contiguous(dv.data(), DType::f32, {2, 2, 6, 8}));
  EXPECT_EQ(s.param(), "grad_k") << s.message();
  for (float x : dq) EXPECT_TRUE(std::isnan(x));
}

TEST(Devices, MergePlacement) {
  Call c;
  const Status s = merge_attention(c.ov, c.lv, c.ov, c.lv.on(Device::cuda(0)), c.ov, c.lv);
  EXPECT_EQ(s.param(), "lse_b") << s.message();
}

TEST(Devices, Names) {
  EXPECT_EQ(device_name(Device::cpu()), "cpu");
  EXPECT_EQ(device_name(Device::cuda(3)), "cuda:3");
}

}  // namespace
}  // namespace attn
