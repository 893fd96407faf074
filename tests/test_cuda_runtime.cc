// The CUDA runtime probe (src/cuda/runtime.h) on any machine: it answers, never aborts. Without a device (no
// driver, no GPU, every device hidden by CUDA_VISIBLE_DEVICES=-1, or a build without CUDA) the count is 0 and
// require_device() names the parameter "device" and says "no CUDA device". ctest runs this program twice: as
// the machine is, and with CUDA_VISIBLE_DEVICES=-1 and ATTN_TEST_EXPECT_NO_CUDA_DEVICE=1.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cuda/runtime.h"

namespace {

TEST(CudaRuntime, BuildFlagIsReported) {
#if ATTN_TEST_EXPECT_CUDA
  EXPECT_TRUE(attn::cuda::built_with_cuda());
#else
  EXPECT_FALSE(attn::cuda::built_with_cuda());
#endif
}

TEST(CudaRuntime, ProbeAnswersWithoutAborting) {
  const attn::cuda::RuntimeProbe& p = attn::cuda::probe();
  EXPECT_GE(p.device_count, 0);
  EXPECT_EQ(&p, &attn::cuda::probe());  // asked once per process
  const attn::Status st = attn::cuda::require_device();
  if (p.device_count == 0) {
    EXPECT_EQ(st.code(), attn::StatusCode::unsupported);
    EXPECT_EQ(st.param(), "device");
    EXPECT_NE(st.message().find("no CUDA device"), std::string::npos) << st.message();
    EXPECT_FALSE(p.error.empty());
    EXPECT_FALSE(attn::cuda::device_info(0).has_value());
    std::printf("as expected here: %s\n", st.message().c_str());
  } else {
    EXPECT_TRUE(st.ok()) << st.message();
    const auto d = attn::cuda::device_info(0);
    ASSERT_TRUE(d.has_value());
    EXPECT_FALSE(d->name.empty());
    std::printf("device 0: %s, sm_%d%d\n", d->name.c_str(), d->sm_major, d->sm_minor);
  }
  EXPECT_FALSE(attn::cuda::device_info(-1).has_value());
  EXPECT_FALSE(attn::cuda::device_info(p.device_count).has_value());
}

TEST(CudaRuntime, NoDeviceWhenTheTestSaysSo) {
  if (std::getenv("ATTN_TEST_EXPECT_NO_CUDA_DEVICE") == nullptr) GTEST_SKIP() << "devices not hidden in this run";
  EXPECT_EQ(attn::cuda::device_count(), 0);
  EXPECT_NE(attn::cuda::require_device().message().find("no CUDA device"), std::string::npos);
}

}  // namespace
