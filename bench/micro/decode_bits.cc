// The bits of the decode kernels, hashed: one line per configuration (its name and an FNV-1a hash of its bf16
// output and fp32 LSE), then one hash over all of them. For a change meant to move no result bit (a reordering of
// the kernel's memory, not of its arithmetic): build this at the commit before and after, run both on the same
// machine, and compare (`diff`); the registry's tolerance tests say whether a result is right, this says whether
// it is the same. Inputs are seeded, so a run is repeatable; the configurations are those the decode kernels treat
// differently: bf16 Q over bf16, 8-bit, 4-bit (the pair products where the CPU has them) and fp16 K/V, fp32 Q over
// fp32, fp16, bf16, 8-bit and 4-bit K/V (fp32 FMAs); GQA groups of 2, 4, 8 and 1 (MHA); 1-3 queries per head; key
// counts of 1, 7, one tile, 113, 203 and 1,000; head dims 64, 96, 128 and MLA's 576/512; scores in log2 units, not in
// them (scale 2), in the wide band (inputs ×40), padded (kv_lens) and causal; 1 and 2 threads.
//
//   cmake --build build --target micro_decode_bits && build/micro_decode_bits > bits.txt
#include <attn/sdpa.h>
#include <attn/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/convert.h"

namespace {

// The values as the library rounds them (round to nearest even).
std::uint16_t to_bf16(float x) { return attn::core::from_float<attn::core::bf16>(x).bits; }
std::uint16_t to_f16(float x) { return attn::core::from_float<attn::core::f16>(x).bits; }

std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

constexpr std::uint64_t kFnvBasis = 1469598103934665603ull;

}  // namespace

int main() {
  using namespace attn;
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0, 1);
  std::uint64_t total = kFnvBasis;
  int cases = 0, failed = 0;
  struct Kinds {
    DType q, kv;
  };
  const Kinds kinds[] = {{DType::bf16, DType::bf16}, {DType::bf16, DType::i8}, {DType::bf16, DType::i4},
                         {DType::bf16, DType::f16},  {DType::f32, DType::f32}, {DType::f32, DType::f16},
                         {DType::f32, DType::bf16},  {DType::f32, DType::i8},  {DType::f32, DType::i4}};
  for (const Kinds& kind : kinds)
    for (int group : {4, 2, 8, 1})
      for (long sq : {1L, 2L, 3L})
        for (long skv : {1L, 7L, 64L, 113L, 203L, 1000L})
          for (long dk : {128L, 64L, 96L, 576L})
            for (int variant = 0; variant < 6; ++variant) {
              const long dv = dk == 576 ? 512 : dk, B = 2, Hkv = 2, Hq = Hkv * group;
              const float mag = variant == 3 ? 40.0f : 1.0f;  // variant 3: scores in the wide band
              const DType q_dtype = kind.q, kv_dtype = kind.kv;
              const bool q32 = q_dtype == DType::f32;
              std::vector<float> q(B * Hq * sq * dk * (q32 ? 1 : 0));
              std::vector<std::uint16_t> q16(B * Hq * sq * dk * (q32 ? 0 : 1));
              for (auto& x : q) x = normal(rng) * mag;
              for (auto& x : q16) x = to_bf16(normal(rng) * mag);
              // K or V rows of `dim` values (bytes) and, for i8 and i4, their scales (one per row, or per 32 values)
              const auto fill = [&](std::vector<unsigned char>& t, std::vector<float>& scales, long dim) {
                const long n = B * Hkv * skv * dim;
                if (kv_dtype == DType::f32) {
                  t.resize(n * 4);
                  auto* p = reinterpret_cast<float*>(t.data());
                  for (long i = 0; i < n; ++i) p[i] = normal(rng) * mag;
                } else if (kv_dtype == DType::bf16 || kv_dtype == DType::f16) {
                  t.resize(n * 2);
                  auto* p = reinterpret_cast<std::uint16_t*>(t.data());
                  for (long i = 0; i < n; ++i) p[i] = kv_dtype == DType::bf16 ? to_bf16(normal(rng) * mag) : to_f16(normal(rng) * mag);
                } else if (kv_dtype == DType::i8) {
                  t.resize(n);
                  for (auto& x : t) x = static_cast<unsigned char>(static_cast<signed char>(int(rng() % 255) - 127));
                  scales.resize(B * Hkv * skv);
                  for (auto& s : scales) s = mag * (0.005f + 0.01f * (rng() % 100) / 100.0f);
                } else {
                  t.resize(n / 2);
                  for (auto& x : t) x = static_cast<unsigned char>(rng() & 0xFF);
                  scales.resize(B * Hkv * skv * ((dim + 31) / 32));
                  for (auto& s : scales) s = mag * (0.1f + 0.2f * (rng() % 100) / 100.0f);
                }
              };
              std::vector<unsigned char> k, v;
              std::vector<float> k_scale, v_scale;
              fill(k, k_scale, dk);
              fill(v, v_scale, dv);
              std::vector<float> out(B * Hq * sq * dv * (q32 ? 1 : 0), NAN);  // NaN: an unwritten element shows
              std::vector<std::uint16_t> out16(B * Hq * sq * dv * (q32 ? 0 : 1), 0x7FC0);
              std::vector<float> lse(B * Hq * sq, NAN);
              std::vector<std::int32_t> lens = {int(skv), int(std::max(1L, skv - 5))};
              Params p;
              p.threads = variant % 2 + 1;
              if (variant == 2) p.scale = 2.0;  // not log2 units
              if (variant == 4) p.kv_lens = TensorView::contiguous(lens.data(), DType::i32, {B});
              if (variant == 5) p.causal = Causal::bottom_right;
              if (kv_dtype == DType::i8) {
                p.k_scale = TensorView::contiguous(k_scale.data(), DType::f32, {B, Hkv, skv});
                p.v_scale = TensorView::contiguous(v_scale.data(), DType::f32, {B, Hkv, skv});
              } else if (kv_dtype == DType::i4) {
                p.k_scale = TensorView::contiguous(k_scale.data(), DType::f32, {B, Hkv, skv, (dk + 31) / 32});
                p.v_scale = TensorView::contiguous(v_scale.data(), DType::f32, {B, Hkv, skv, (dv + 31) / 32});
              }
              void* qp = q32 ? static_cast<void*>(q.data()) : static_cast<void*>(q16.data());
              void* op = q32 ? static_cast<void*>(out.data()) : static_cast<void*>(out16.data());
              const Status st = attention(TensorView::contiguous(qp, q_dtype, {B, Hq, sq, dk}),
                                          TensorView::contiguous(k.data(), kv_dtype, {B, Hkv, skv, dk}),
                                          TensorView::contiguous(v.data(), kv_dtype, {B, Hkv, skv, dv}),
                                          TensorView::contiguous(op, q_dtype, {B, Hq, sq, dv}), p,
                                          TensorView::contiguous(lse.data(), DType::f32, {B, Hq, sq}));
              std::printf("%s/%s group %d sq %ld skv %ld dk %ld variant %d ", dtype_name(q_dtype), dtype_name(kv_dtype),
                          group, sq, skv, dk, variant);
              if (!st.ok()) {
                std::printf("error: %s\n", st.message().c_str());
                ++failed;
                continue;
              }
              const std::uint64_t h = fnv1a(lse.data(), lse.size() * 4,
                                            fnv1a(out.data(), out.size() * 4, fnv1a(out16.data(), out16.size() * 2, kFnvBasis)));
              std::printf("%016llx\n", static_cast<unsigned long long>(h));
              total = fnv1a(&h, sizeof h, total);
              ++cases;
            }
  std::printf("cases %d, errors %d, all %016llx\n", cases, failed, static_cast<unsigned long long>(total));
  return failed ? 1 : 0;
}
