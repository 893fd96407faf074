// attn's own CUDA forward kernel, run on the host: the block program of src/cuda/forward_block.h (the device
// kernel's code, unchanged) through the host model of a warp (src/cuda/warp.h: mma.sync and ldmatrix implemented
// from the PTX layouts of src/cuda/fragment.h), warp by warp between the block's barriers, on every registry case
// the kernel takes, against the fp64 reference by the tolerance rule, outputs poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cases.h"
#include "core/problem.h"
#include "core/backward_problem.h"
#include "cuda/cudnn_sdpa.h"
#include "cuda/exact_row.h"
#include "cuda/forward.h"
#include "cuda/runtime.h"
#include "cuda/warp.h"
#include "reference/reference.h"
#include "support.h"

namespace {

using namespace attn;
using namespace attn::test;  // NOLINT
using attn::cuda::HostWarp;

// The grid of the kernel launch (cuda/forward.cu), block after block, its four warps in turn; each barrier of the
// kernel is the end of a loop over the warps here. Shared memory starts as NaN (0xffff in bf16 and f16), so a
// fragment read before it is written shows.
// splits > 1: split-KV, as the launch runs it (the parts in blockIdx.y, then the combine step, one element at a time).
Status run_host_model(const core::Problem& p, std::int64_t splits = 1) {
  if (Status s = cuda::fwd::supports(p); !s) return s;
  // As the launch does: no key-length array where every length is Skv.
  const bool uniform = std::all_of(p.kv_len.begin(), p.kv_len.end(), [&](std::int64_t n) { return n == p.Skv; });
  cuda::DeviceProblem dp = cuda::device_problem(p, uniform ? nullptr : p.kv_len.data());
  std::vector<float> parts;
  if (splits > 1) {
    const std::int64_t rows = splits * p.B * p.Hq * p.Sq;
    parts.assign(static_cast<std::size_t>(rows * (p.Dv + 1)), std::numeric_limits<float>::quiet_NaN());
    dp.splits = splits, dp.part_o = parts.data(), dp.part_lse = parts.data() + rows * p.Dv;
  }
  cuda::fwd::with_config(p, [&](auto cfg, auto variant) {
    using C = decltype(cfg);
    using Block = cuda::fwd::ForwardBlock<C, decltype(variant), HostWarp>;
    std::vector<std::uint16_t> smem(C::kSmemElems, 0xffff);
    const HostWarp w(smem.data(), smem.size() * sizeof(std::uint16_t));
    std::vector<typename Block::Warp> warps(C::kWarps);
    const std::int64_t blocks = cuda::sched::packed_grid_blocks(p.B, p.Hkv, p.group, p.Sq, C::kBlockM);
    for (std::int64_t id = 0; id < blocks * dp.splits; ++id) {
      const Block block(dp, smem.data(), id % blocks, id / blocks);
      for (int wi = 0; wi < C::kWarps; ++wi) block.begin(w, wi, warps[wi]);
      const cuda::sched::TileRange tiles = block.tiles();
      if (tiles.first < tiles.end)
        for (int wi = 0; wi < C::kWarps; ++wi) block.load_kv(w, wi, tiles.first, 0);
      for (std::int64_t t = tiles.first; t < tiles.end; ++t) {
        const int stage = static_cast<int>((t - tiles.first) & 1);
        if (t + 1 < tiles.end)
          for (int wi = 0; wi < C::kWarps; ++wi) block.load_kv(w, wi, t + 1, stage ^ 1);
        for (int wi = 0; wi < C::kWarps; ++wi)
          if (block.warp_active(wi)) block.compute(w, wi, warps[wi], t, stage, tiles.masked(t));
      }
      for (int wi = 0; wi < C::kWarps; ++wi) block.finish(w, wi, warps[wi]);
    }
  });
  if (splits > 1)
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t h = 0; h < p.Hq; ++h)
        for (std::int64_t i = 0; i < p.Sq; ++i)
          for (std::int64_t d = 0; d < p.Dv; ++d)
            cuda::fwd::store_combined(dp, b, h, i, d, cuda::fwd::combine_split(dp, b, h, i, d));
  return Status::Ok();
}

bool gpu_dtypes(const Case& c) {
  return (c.dtype == DType::bf16 || c.dtype == DType::f16) && c.kv_dtype == c.dtype && c.Dk <= 256 && c.Dv <= 256;
}

// Head dims past the tensor-core kernel's 256, which only the exact path takes (the registry's stop at 256): odd
// ones, Dv != Dk, GQA, causal, key lengths, paged, and MLA's absorbed 576 / 512.
std::vector<Case> wide_head_cases() {
  Case a{.B = 2, .Hq = 4, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 300, .Dv = 264};
  Case b{.B = 1, .Hq = 2, .Hkv = 2, .Sq = 33, .Skv = 33, .Dk = 257, .Dv = 257, .causal = Causal::bottom_right,
         .kv_lens = true, .dtype = DType::bf16, .kv_dtype = DType::bf16};
  Case c{.B = 1, .Hq = 16, .Hkv = 1, .Sq = 2, .Skv = 65, .Dk = 576, .Dv = 512, .causal = Causal::bottom_right,
         .dtype = DType::bf16, .kv_dtype = DType::bf16, .page_size = 16};
  return {a, b, c};
}

std::vector<Case> gpu_cases() {
  std::vector<Case> out;
  for (const Case& c : registry())
    if (gpu_dtypes(c)) out.push_back(c);
  return out;
}

// Runs case c through `run` (the host model, or the device) with the outputs poisoned first (cases.h
// run_poisoned: nothing outside the output view may change), and checks them against the fp64 reference by the
// tolerance rule.
// tensor_cores: the case must be one the tensor-core kernel takes (else any: the exact path, cuDNN).
void check_case(const Case& c, const std::function<Status(Instance&)>& run, bool tensor_cores = true) {
  Instance in = instantiate(c);
  core::Problem p;
  ASSERT_TRUE(in.problem(Backend::flash, 1, true, &p).ok());
  const reference::Result ref = reference::attention<double>(p);
  const reference::Result naive = reference::attention<float>(p);
  if (tensor_cores) ASSERT_TRUE(cuda::fwd::supports(p).ok()) << cuda::fwd::supports(p).message();
  const Outputs r = run_poisoned(in, run);
  expect_matches_reference(c, in, ref, naive, r, /*with_lse=*/true, cuda::fwd::kernel_name(p));
}

// The exact path (cuda/exact_row.h) on the host: every thread of the launch, in order.
Status run_exact_model(const core::Problem& p) {
  if (Status s = cuda::fwd::exact_supports(p); !s) return s;
  const bool uniform = std::all_of(p.kv_len.begin(), p.kv_len.end(), [&](std::int64_t n) { return n == p.Skv; });
  const cuda::DeviceProblem dp = cuda::device_problem(p, uniform ? nullptr : p.kv_len.data());
  const std::int64_t total = cuda::exact::threads(dp);
  for (std::int64_t t = 0; t < total; ++t) {
    if (cuda::fwd::general_variant(p)) {
      cuda::exact::exact_thread<cuda::fwd::GeneralVariant>(dp, t);
    } else {
      cuda::exact::exact_thread<cuda::fwd::PlainVariant>(dp, t);
    }
  }
  return Status::Ok();
}

class CudaForwardModel : public ::testing::TestWithParam<Case> {};

TEST_P(CudaForwardModel, MatchesFp64Reference) {
  ATTN_SKIP_UNLESS_SAMPLED();
  check_case(GetParam(), [](Instance& in) {
    core::Problem p;  // the problem over the poisoned outputs' memory
    if (Status s = in.problem(Backend::flash, 1, true, &p); !s) return s;
    return run_host_model(p);
  });
}

// Split-KV: the keys in 3 parts (parts of whole tiles, some empty where a row has few), merged by the combine
// step; every other registry case (the device test takes them all), sinks and LSE included. The part buffers
// start as NaN: a part row the combine reads but no block wrote shows.
class CudaForwardSplitModel : public ::testing::TestWithParam<Case> {};

std::vector<Case> split_cases() {
  std::vector<Case> all = gpu_cases(), out;
  for (std::size_t i = 0; i < all.size(); i += 2) out.push_back(all[i]);
  return out;
}

TEST_P(CudaForwardSplitModel, SplitKvMatchesFp64Reference) {
  ATTN_SKIP_UNLESS_SAMPLED();
  check_case(GetParam(), [](Instance& in) {
    core::Problem p;
    if (Status s = in.problem(Backend::flash, 1, true, &p); !s) return s;
    return run_host_model(p, 3);
  });
}

// A case's tensors on CUDA device 0 (and its gradients', for the backward): each storage copied to a device
// buffer, the views (and the Params' views) pointed there; back() copies the outputs (out, lse, the gradients)
// back into host storage and restores the host views.
class OnDevice {
 public:
  explicit OnDevice(Instance& in, GradInstance* g = nullptr) : in_(in), g_(g) {}
  Status move() {
    for (Tensor* t : tensors())
      if (!t->storage.empty()) {
        cuda::DeviceBuffer buf;
        if (Status s = cuda::DeviceBuffer::create(0, t->storage.data(), t->storage.size(), &buf); !s) return s;
        moved_.push_back({t, t->view, std::move(buf)});
      }
    for (Moved& m : moved_) m.t->view = on_device(m.t->view);
    Params& pr = in_.params;
    for (std::optional<TensorView>* v : {&pr.kv_lens, &pr.mask, &pr.k_scale, &pr.v_scale, &pr.alibi_slopes, &pr.sinks})
      if (*v) **v = on_device(**v);
    return Status::Ok();
  }
  Status back() {
    for (Moved& m : moved_) {
      const bool output = g_ ? (m.t == &g_->dq || m.t == &g_->dk || m.t == &g_->dv || m.t == &g_->dsinks)
                             : (m.t == &in_.out || m.t == &in_.lse);
      if (output)
        if (Status s = m.buffer.read(m.t->storage.data()); !s) return s;
      m.t->view = m.host;
    }
    for (std::optional<TensorView>* v : {&in_.params.kv_lens, &in_.params.mask, &in_.params.k_scale,
                                         &in_.params.v_scale, &in_.params.alibi_slopes, &in_.params.sinks})
      if (*v) **v = on_host(**v);
    return Status::Ok();
  }

 private:
  struct Moved {
    Tensor* t;
    TensorView host;
    cuda::DeviceBuffer buffer;
  };
  std::vector<Tensor*> tensors() {
    Instance& i = in_;
    std::vector<Tensor*> all{&i.q,        &i.k,       &i.v,        &i.out,           &i.lse,          &i.mask,
                             &i.kv_lens,  &i.alibi,   &i.sinks,    &i.k_pages,       &i.v_pages,      &i.page_table,
                             &i.seq_lens, &i.k_scale, &i.v_scale, &i.k_scale_pages, &i.v_scale_pages};
    if (g_) all.insert(all.end(), {&g_->dout, &g_->dq, &g_->dk, &g_->dv, &g_->dsinks});
    return all;
  }
  // The view over the device copy of the storage that holds v's data.
  TensorView on_device(TensorView v) const {
    for (const Moved& m : moved_) {
      const auto* base = m.t->storage.data();
      const auto* at = static_cast<const unsigned char*>(v.data);
      if (at >= base && at <= base + m.t->storage.size()) {
        v.data = static_cast<unsigned char*>(m.buffer.data()) + (at - base);
        v.device = Device::cuda(0);
        return v;
      }
    }
    return v;
  }
  // The view over the host storage of a device view (the inverse of on_device).
  TensorView on_host(TensorView v) const {
    for (const Moved& m : moved_) {
      const auto* base = static_cast<const unsigned char*>(m.buffer.data());
      const auto* at = static_cast<const unsigned char*>(v.data);
      if (at >= base && at <= base + m.buffer.bytes()) {
        v.data = m.t->storage.data() + (at - base);
        v.device = Device::cpu();
        return v;
      }
    }
    return v;
  }
  Instance& in_;
  GradInstance* g_;
  std::vector<Moved> moved_;
};

// The same cases on the GPU through attention() / attention_paged() (make test-gpu), when there is one: one
// test over all of them, so that machines without a GPU pay one skipped test.
// Every GPU case on device 0 (ATTN_DEVICE_CASES=n: the first n only, for make test-gpu's compute-sanitizer runs)
// through `backend`; `splits` > 0 forces that many split-KV parts (ATTN_CUDA_KV_SPLITS) for the duration. With
// Backend::cudnn the cases cuDNN refuses (its host rule, or its graph) are counted and skipped; the rest must
// pass. Counts the cases run and those cuDNN refused in *ran, *refused.
// all: every registry case (fp32 and 8-bit ones through the exact path), not only the bf16/f16 ones, and the head
// dims past 256 (wide_head_cases).
void registry_on_device(const char* splits, Backend backend = Backend::flash, int* ran = nullptr,
                        int* refused = nullptr, bool all = false) {
  int ran_here = 0, refused_here = 0;
  if (!ran) ran = &ran_here;
  if (!refused) refused = &refused_here;
  struct ForcedSplits {
    explicit ForcedSplits(const char* n) : on(n != nullptr) {
      if (on) setenv("ATTN_CUDA_KV_SPLITS", n, 1);
    }
    ~ForcedSplits() {
      if (on) unsetenv("ATTN_CUDA_KV_SPLITS");
    }
    bool on;
  } forced(splits);
  const char* limit = std::getenv("ATTN_DEVICE_CASES");
  std::vector<Case> cases = all ? registry() : gpu_cases();
  if (all) {
    const std::vector<Case> wide = wide_head_cases();
    cases.insert(cases.begin(), wide.begin(), wide.end());
  }
  if (limit) cases.resize(std::min(cases.size(), static_cast<std::size_t>(std::strtoul(limit, nullptr, 10))));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    if (backend == Backend::cudnn) {  // does cuDNN take it? (a run on the device, its output not judged)
      Instance probe = instantiate(c);
      OnDevice dev(probe);
      ASSERT_TRUE(dev.move().ok());
      const Status s = probe.run(Backend::cudnn, 0, true);
      (void)dev.back();
      if (!s) {
        ASSERT_EQ(s.code(), StatusCode::unsupported) << s.message();
        ++*refused;
        continue;
      }
    }
    check_case(
        c,
        [backend](Instance& in) {
          OnDevice dev(in);
          if (Status s = dev.move(); !s) return s;
          const Status run = in.run(backend, 0, true);
          if (Status s = dev.back(); !s) return s;
          return run;
        },
        /*tensor_cores=*/!all && backend == Backend::flash);
    ++*ran;
    if (::testing::Test::HasFatalFailure()) break;
  }
}

TEST(CudaForwardDevice, RegistryMatchesFp64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda::probe().error << ")";
  registry_on_device(nullptr);
}

// The same with the keys split into 3 parts (split-KV and its combine kernel; the launch's heuristic splits only
// long key ranges, which the registry's cases are not).
TEST(CudaForwardDevice, SplitKvRegistryMatchesFp64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda::probe().error << ")";
  registry_on_device("3");
}

// cuDNN's path (Backend::cudnn) on every case it takes; those it refuses are counted (its host rule refuses dense
// masks, windows, softcap, ALiBi, sinks, dropout, head dims not multiples of 8, unaligned views).
TEST(CudaForwardDevice, CudnnRegistryMatchesFp64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda::probe().error << ")";
  int ran = 0, refused = 0;
  registry_on_device(nullptr, Backend::cudnn, &ran, &refused);
  std::printf("[ cudnn    ] %d registry cases through cuDNN, %d refused (attn's own kernel takes them)\n", ran,
              refused);
  RecordProperty("cudnn_cases", ran);
  RecordProperty("cudnn_refused", refused);
  if (!std::getenv("ATTN_DEVICE_CASES")) EXPECT_GT(ran, 0);
}

// Backend::automatic on every registry case, fp32 and 8-bit K/V included: cuDNN where it takes the case, attn's
// tensor-core kernel where it takes it, the exact path for the rest; all must pass.
TEST(CudaForwardDevice, AutomaticRegistryMatchesFp64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda::probe().error << ")";
  registry_on_device(nullptr, Backend::automatic, nullptr, nullptr, /*all=*/true);
}

// The exact path on every registry case (ATTN_CUDA_EXACT=1 sends the bf16/f16 ones there too).
TEST(CudaForwardDevice, ExactRegistryMatchesFp64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda::probe().error << ")";
  setenv("ATTN_CUDA_EXACT", "1", 1);
  registry_on_device(nullptr, Backend::flash, nullptr, nullptr, /*all=*/true);
  unsetenv("ATTN_CUDA_EXACT");
}

// The backward on the GPU (cuDNN's, deterministic) on the backward registry's bf16/f16 cases it takes, against
// the fp64 reference by the gradient tolerance rule, gradients NaN-poisoned; twice, the same bits.
TEST(CudaForwardDevice, BackwardMatchesFp64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda::probe().error << ")";
  int ran = 0, refused = 0;
  for (const Case& c : backward_registry()) {
    if (!gpu_dtypes(c)) continue;
    SCOPED_TRACE(c.name());
    Instance in = instantiate(c);
    GradInstance g = instantiate_grads(c);
    Params fwd = in.params;
    fwd.backend = Backend::flash;
    ASSERT_TRUE(attention(in.q.view, in.k.view, in.v.view, in.out.view, fwd, in.lse.view).ok());
    core::BackwardProblem bp;
    ASSERT_TRUE(core::validate_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                        g.dq.view, g.dk.view, g.dv.view, in.params, std::nullopt, &bp).ok());
    if (!cuda::cudnn::takes_backward(bp)) {
      ++refused;
      continue;
    }
    const reference::Grads ref = reference::attention_backward<double>(bp.fwd, bp.dout);
    const reference::Grads naive = reference::attention_backward<float>(bp.fwd, bp.dout);
    std::vector<std::vector<unsigned char>> first;
    for (int rep = 0; rep < 2; ++rep) {
      g.dq.poison(), g.dk.poison(), g.dv.poison();
      OnDevice dev(in, &g);
      ASSERT_TRUE(dev.move().ok());
      const Status s = attention_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                          g.dq.view, g.dk.view, g.dv.view, in.params);
      ASSERT_TRUE(dev.back().ok());
      if (!s && rep == 0 && s.code() == StatusCode::unsupported) {  // cuDNN's graph refused it
        ++refused;
        break;
      }
      ASSERT_TRUE(s.ok()) << s.message();
      EXPECT_EQ(gradient_failures(c, in, g, bp.fwd.scale, ref, naive), "");
      std::vector<std::vector<unsigned char>> bits{g.dq.storage, g.dk.storage, g.dv.storage};
      if (rep == 0) {
        first = bits;
        ++ran;
      } else {
        EXPECT_TRUE(bits == first) << "the backward's bits differ between two runs";
      }
    }
    if (::testing::Test::HasFatalFailure()) break;
  }
  std::printf("[ backward ] %d backward registry cases through cuDNN, %d not taken\n", ran, refused);
  RecordProperty("backward_cases", ran);
  RecordProperty("backward_refused", refused);
  if (!std::getenv("ATTN_DEVICE_CASES")) EXPECT_GT(ran, 0);
}

// merge_attention on CUDA tensors (src/cuda/merge.cu) against the same call on the host: both are
// core::merge_weights, so they agree to the last bit or two; rows with one or both sides empty (lse = -inf)
// included, and the merge in place into side a.
TEST(CudaForwardDevice, MergeMatchesTheHost) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda::probe().error << ")";
  const std::int64_t B = 2, H = 3, S = 37, D = 40, rows = B * H * S;
  std::vector<float> oa(rows * D), ob(rows * D), la(rows), lb(rows);
  std::uint64_t x = 12345;
  const auto rnd = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(x >> 11) * 0x1p-53 * 8.0 - 4.0);
  };
  for (float& v : oa) v = rnd();
  for (float& v : ob) v = rnd();
  for (std::int64_t r = 0; r < rows; ++r) {
    la[r] = r % 7 == 0 ? -std::numeric_limits<float>::infinity() : rnd();
    lb[r] = r % 5 == 0 ? -std::numeric_limits<float>::infinity() : rnd();
  }
  const auto view = [&](const void* d, bool lse) {
    return lse ? TensorView::contiguous(d, DType::f32, {B, H, S}) : TensorView::contiguous(d, DType::f32, {B, H, S, D});
  };
  std::vector<float> host_o(rows * D, std::nanf("")), host_l(rows, std::nanf(""));
  ASSERT_TRUE(merge_attention(view(oa.data(), false), view(la.data(), true), view(ob.data(), false),
                              view(lb.data(), true), view(host_o.data(), false), view(host_l.data(), true))
                  .ok());
  cuda::DeviceBuffer doa, dla, dob, dlb;
  ASSERT_TRUE(cuda::DeviceBuffer::create(0, oa.data(), oa.size() * 4, &doa).ok());
  ASSERT_TRUE(cuda::DeviceBuffer::create(0, la.data(), la.size() * 4, &dla).ok());
  ASSERT_TRUE(cuda::DeviceBuffer::create(0, ob.data(), ob.size() * 4, &dob).ok());
  ASSERT_TRUE(cuda::DeviceBuffer::create(0, lb.data(), lb.size() * 4, &dlb).ok());
  const Device gpu = Device::cuda(0);
  const Status s = merge_attention(view(doa.data(), false).on(gpu), view(dla.data(), true).on(gpu),
                                   view(dob.data(), false).on(gpu), view(dlb.data(), true).on(gpu),
                                   view(doa.data(), false).on(gpu), view(dla.data(), true).on(gpu));
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<float> dev_o(rows * D), dev_l(rows);
  ASSERT_TRUE(doa.read(dev_o.data()).ok());
  ASSERT_TRUE(dla.read(dev_l.data()).ok());
  for (std::int64_t r = 0; r < rows; ++r) {
    if (std::isinf(host_l[r])) {
      EXPECT_EQ(dev_l[r], host_l[r]) << "row " << r;
    } else {
      EXPECT_NEAR(dev_l[r], host_l[r], 1e-6f * (1 + std::fabs(host_l[r]))) << "row " << r;
    }
    for (std::int64_t d = 0; d < D; ++d)
      EXPECT_NEAR(dev_o[r * D + d], host_o[r * D + d], 1e-6f * (1 + std::fabs(host_o[r * D + d])))
          << "row " << r << " dim " << d;
  }
}

// The exact path on the registry (fp32, 8-bit K/V, head dims past 256, and the bf16/f16 ones too): the same
// function the device runs, thread after thread, outputs poisoned, against the fp64 reference. Every fourth case
// here (CI's time: the fp64 references cost more than the path); make test-gpu runs all of them on the device.
class CudaExactModel : public ::testing::TestWithParam<Case> {};

std::vector<Case> exact_cases() {
  const std::vector<Case> all = registry();
  std::vector<Case> out = wide_head_cases();
  for (std::size_t i = 0; i < all.size(); i += 4) out.push_back(all[i]);
  return out;
}

// Every fourth case still has each kind the exact path handles: fp32, 8-bit K/V, head dims past 256, dense
// masks, windows, softcap, ALiBi, sinks, dropout, paged K/V.
TEST(CudaExactModel, CoversTheKindsThatMatter) {
  bool f32 = false, i8 = false, big = false, mask = false, window = false, softcap = false, alibi = false,
       sinks = false, dropout = false, paged = false;
  for (const Case& c : exact_cases()) {
    f32 |= c.dtype == DType::f32, i8 |= c.kv_dtype == DType::i8, big |= c.Dk > 256 || c.Dv > 256;
    mask |= c.mask != MaskCase::none, window |= c.window.left >= 0 || c.window.right >= 0;
    softcap |= c.softcap > 0, alibi |= c.alibi > 0, sinks |= c.sinks, dropout |= c.dropout > 0, paged |= c.page_size > 0;
  }
  EXPECT_TRUE(f32);
  EXPECT_TRUE(i8);
  EXPECT_TRUE(big);
  EXPECT_TRUE(mask);
  EXPECT_TRUE(window);
  EXPECT_TRUE(softcap);
  EXPECT_TRUE(alibi);
  EXPECT_TRUE(sinks);
  EXPECT_TRUE(dropout);
  EXPECT_TRUE(paged);
}

TEST_P(CudaExactModel, MatchesFp64Reference) {
  ATTN_SKIP_UNLESS_SAMPLED();
  check_case(
      GetParam(),
      [](Instance& in) {
        core::Problem p;
        if (Status s = in.problem(Backend::flash, 1, true, &p); !s) return s;
        return run_exact_model(p);
      },
      /*tensor_cores=*/false);
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaExactModel, ::testing::ValuesIn(exact_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });
INSTANTIATE_TEST_SUITE_P(Registry, CudaForwardModel, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });
INSTANTIATE_TEST_SUITE_P(Registry, CudaForwardSplitModel, ::testing::ValuesIn(split_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// The split-KV half of the registry still has every kind the parts could get wrong: sinks (absorbed once),
// paged K/V, key lengths (empty parts), causal and windowed ranges, dropout.
TEST(CudaForwardSplitModel, CoversTheKindsThatMatter) {
  bool paged = false, sinks = false, lens = false, window = false, dropout = false, causal = false;
  for (const Case& c : split_cases()) {
    paged |= c.page_size > 0, sinks |= c.sinks, lens |= c.kv_lens, dropout |= c.dropout > 0;
    window |= c.window.left >= 0 || c.window.right >= 0, causal |= c.causal != Causal::none;
  }
  EXPECT_TRUE(paged && sinks && lens && window && dropout && causal);
}

// Every kind of registry case the CPU takes in bf16/f16 is among them: masks, windows, variants, paging, GQA.
TEST(CudaForwardModel, CoversTheRegistrysKinds) {
  const std::vector<Case> cases = gpu_cases();
  bool paged = false, additive = false, keep = false, window = false, softcap = false, alibi = false, sinks = false,
       dropout = false, gqa = false, lens = false, d256 = false, f16 = false;
  for (const Case& c : cases) {
    paged |= c.page_size > 0, window |= c.window.left >= 0 || c.window.right >= 0;
    additive |= c.mask == MaskCase::additive_full || c.mask == MaskCase::additive_2d;
    keep |= c.mask == MaskCase::keep_per_batch || c.mask == MaskCase::keep_keys;
    softcap |= c.softcap > 0, alibi |= c.alibi > 0, sinks |= c.sinks, dropout |= c.dropout > 0;
    gqa |= c.Hq != c.Hkv, lens |= c.kv_lens, d256 |= c.Dk > 128, f16 |= c.dtype == DType::f16;
  }
  EXPECT_GT(cases.size(), 100u);
  EXPECT_TRUE(paged && additive && keep && window && softcap && alibi && sinks && dropout && gqa && lens && d256 && f16);
}

// Both ways of filling shared memory run: 16-byte copies (aligned rows) and element by element (any other view),
// for Q and for K/V, contiguous and paged.
TEST(CudaForwardModel, CoversBothCopyPaths) {
  int vec_q = 0, vec_kv = 0, vec_paged = 0, scalar_q = 0, scalar_kv = 0;
  for (const Case& c : gpu_cases()) {
    Instance in = instantiate(c);
    core::Problem p;
    ASSERT_TRUE(in.problem(Backend::flash, 1, true, &p).ok());
    const cuda::DeviceProblem d = cuda::device_problem(p, p.kv_len.data());
    vec_q += d.vec_q, scalar_q += !d.vec_q, vec_kv += d.vec_kv, scalar_kv += !d.vec_kv;
    vec_paged += d.vec_kv && p.paged.has_value();
  }
  EXPECT_GT(vec_q, 10);
  EXPECT_GT(vec_kv, 10);
  EXPECT_GT(vec_paged, 0);
  EXPECT_GT(scalar_q, 10);
  EXPECT_GT(scalar_kv, 10);
  std::printf("copy paths: Q %d in 16-byte pieces, %d by element; K/V %d (%d paged), %d\n", vec_q, scalar_q, vec_kv,
              vec_paged, scalar_kv);
}

// What the kernel refuses, by name.
TEST(CudaForwardModel, RefusesWhatItDoesNotTake) {
  Case c;
  c.B = 1, c.Hq = 2, c.Hkv = 1, c.Sq = 7, c.Skv = 9, c.Dk = 64, c.Dv = 64;
  Instance f32 = instantiate(c);
  core::Problem p;
  ASSERT_TRUE(f32.problem(Backend::flash, 1, true, &p).ok());
  const Status s = cuda::fwd::supports(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expected bf16 or f16"), std::string::npos) << s.message();
  c.dtype = c.kv_dtype = DType::bf16;
  c.Dk = c.Dv = 320;
  Instance wide = instantiate(c);
  ASSERT_TRUE(wide.problem(Backend::flash, 1, true, &p).ok());
  EXPECT_NE(cuda::fwd::supports(p).message().find("at most 256"), std::string::npos);
  c.Dk = 96, c.Dv = 40;
  Instance ok = instantiate(c);
  ASSERT_TRUE(ok.problem(Backend::flash, 1, true, &p).ok());
  EXPECT_TRUE(cuda::fwd::supports(p).ok());
  EXPECT_EQ(cuda::fwd::kernel_name(p), "flash forward (tensor cores, bf16, d128, plain)");
}

}  // namespace
