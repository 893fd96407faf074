// attn tools: `attn demo` (what `make demo` runs). Part 1 is the explain walk-through; part 2 runs a
// realistic GQA shape through attn::attention on the reference and the flash backend and compares
// their results, their time and the memory each needs.
#include "demo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/info.h"
#include "explain.h"

namespace attn::tools {
namespace {

struct Shape {
  std::int64_t B, Hq, Hkv, S, D;
};

constexpr Shape kRealistic{1, 8, 2, 1024, 64};
constexpr Shape kSmall{1, 4, 2, 128, 32};
constexpr int kFlashRuns = 5;
constexpr unsigned kSeed = 20250804;
// Agreement required between flash (fp32 accumulation) and the fp64 reference.
constexpr double kOutTolerance = 1e-5;  // inputs in [-1, 1], so |O| <= 1: an absolute bound
constexpr double kLseTolerance = 1e-5;  // relative to max(1, |lse|)

std::vector<float> random_values(std::int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& e : x) e = u(rng);
  return x;
}

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && u < 3) bytes /= 1024, ++u;
  std::ostringstream s;
  s << std::fixed << std::setprecision(u == 0 ? 0 : 1) << bytes << " " << units[u];
  return s.str();
}

std::string seconds_text(double s) {
  std::ostringstream t;
  if (s >= 1) t << std::fixed << std::setprecision(2) << s << " s";
  else t << std::fixed << std::setprecision(2) << s * 1e3 << " ms";
  return t.str();
}

std::string ratio_text(double x) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(x < 10 ? 1 : 0) << x << "×";
  return s.str();
}

std::string sci(double x) {
  std::ostringstream s;
  s << std::scientific << std::setprecision(1) << x;
  return s.str();
}

struct Outputs {
  std::vector<float> o, lse;
};

// One call of attn::attention on `backend`; returns the wall time in seconds.
Status timed_call(const Shape& sh, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, Params params, Backend backend, Outputs* r, double* seconds) {
  params.backend = backend;
  r->o.assign(static_cast<std::size_t>(sh.B * sh.Hq * sh.S * sh.D), 0.0f);
  r->lse.assign(static_cast<std::size_t>(sh.B * sh.Hq * sh.S), 0.0f);
  const auto qv = TensorView::contiguous(q.data(), DType::f32, {sh.B, sh.Hq, sh.S, sh.D});
  const auto kv = TensorView::contiguous(k.data(), DType::f32, {sh.B, sh.Hkv, sh.S, sh.D});
  const auto vv = TensorView::contiguous(v.data(), DType::f32, {sh.B, sh.Hkv, sh.S, sh.D});
  const auto ov = TensorView::contiguous(r->o.data(), DType::f32, {sh.B, sh.Hq, sh.S, sh.D});
  const auto lv = TensorView::contiguous(r->lse.data(), DType::f32, {sh.B, sh.Hq, sh.S});
  const auto start = std::chrono::steady_clock::now();
  const Status s = attention(qv, kv, vv, ov, params, lv);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, bool relative) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    worst = std::max(worst, relative ? d / std::max(1.0, std::fabs(double(b[i]))) : d);
  }
  return worst;
}

void print_shape(std::ostream& out, const Shape& sh, int threads) {
  out << "Shape: B = " << sh.B << ", Hq = " << sh.Hq << " query heads sharing Hkv = " << sh.Hkv
      << " key/value heads (GQA: " << sh.Hq / sh.Hkv << " query heads per KV head), Sq = Skv = " << sh.S
      << ", Dk = Dv = " << sh.D << ", causal (bottom-right).\n"
      << "Inputs: float32, uniform in [-1, 1] from a fixed seed (" << kSeed << "). Flash: " << threads
      << " threads, "
      << (attn::active_isa() == "amx" ? "avx512bf16 kernel (level amx: AMX serves bf16 prefill, fp32 runs on AVX-512)"
                                      : attn::active_isa() + " kernel")
      << ".\n\n";
}

void print_memory(std::ostream& out, const Shape& sh, int threads, const KernelInfo& flash) {
  const double head = double(sh.S) * double(sh.S) * 8;
  const double per_thread = double(flash.workspace_bytes) / std::max(flash.threads, 1);
  out << "\nMemory beyond inputs and outputs:\n"
      << "  reference: the fp64 score matrix Sq·Skv·8 bytes = " << bytes_text(head)
      << " per head; it materialises one head at a time (all B·Hq = " << sh.B * sh.Hq << " heads at once would be "
      << bytes_text(head * double(sh.B * sh.Hq)) << ")\n"
      << "  flash:     " << bytes_text(per_thread) << " of tiles per thread × " << threads << " threads = "
      << bytes_text(per_thread * threads) << ", independent of the sequence lengths ("
      << ratio_text(head / (per_thread * threads)) << " less than one reference head)\n";
}

}  // namespace

Status demo(const DemoOptions& options, std::ostream& out) {
  out << "=== Part 1: the worked example, step by step ===\n\n";
  if (Status s = explain(ExplainOptions{}, out); !s) return s;

  const Shape sh = options.small ? kSmall : kRealistic;
  const int threads = attn::resolve_threads(options.threads);
  out << "\n=== Part 2: a realistic shape, reference vs flash ===\n\n";
  print_shape(out, sh, threads);

  std::mt19937 rng(kSeed);
  const auto q = random_values(sh.B * sh.Hq * sh.S * sh.D, rng);
  const auto k = random_values(sh.B * sh.Hkv * sh.S * sh.D, rng);
  const auto v = random_values(sh.B * sh.Hkv * sh.S * sh.D, rng);
  Params params;
  params.causal = Causal::bottom_right;
  params.threads = options.threads;

  Outputs ref, flash;
  double ref_time = 0;
  if (Status s = timed_call(sh, q, k, v, params, Backend::reference, &ref, &ref_time); !s) return s;
  std::vector<double> flash_times;
  for (int run = 0; run < kFlashRuns; ++run) {
    double t = 0;
    if (Status s = timed_call(sh, q, k, v, params, Backend::flash, &flash, &t); !s) return s;
    flash_times.push_back(t);
  }
  std::sort(flash_times.begin(), flash_times.end());
  const double flash_time = flash_times[flash_times.size() / 2];

  const double o_err = max_abs_diff(flash.o, ref.o, false);
  const double lse_err = max_abs_diff(flash.lse, ref.lse, true);
  const bool agree = o_err <= kOutTolerance && lse_err <= kLseTolerance;
  out << "Agreement (flash accumulates in fp32, the reference in fp64):\n"
      << "  max |O_flash - O_ref|     = " << sci(o_err) << "  (tolerance " << sci(kOutTolerance) << ")\n"
      << "  max |LSE_flash - LSE_ref| = " << sci(lse_err) << "  (tolerance " << sci(kLseTolerance)
      << " × max(1, |LSE|))\n"
      << "  " << (agree ? "they agree" : "THEY DISAGREE") << "\n";

  // Useful FLOPs: 4·B·Hq·Sq·Skv·D, halved for a causal mask with Sq = Skv.
  const double flops = 2.0 * double(sh.B * sh.Hq) * double(sh.S) * double(sh.S) * double(sh.D);
  out << "\nTime:\n"
      << "  reference (fp64, one run, one thread): " << seconds_text(ref_time) << "\n"
      << "  flash (median of " << kFlashRuns << " runs):               " << seconds_text(flash_time) << "  (" << std::fixed
      << std::setprecision(1) << flops / flash_time * 1e-9 << " GFLOP/s, " << ratio_text(ref_time / flash_time)
      << " faster)\n";
  {
    KernelInfo info;
    std::vector<float> o(static_cast<std::size_t>(sh.B * sh.Hq * sh.S * sh.D)), l(static_cast<std::size_t>(sh.B * sh.Hq * sh.S));
    if (Status s = describe_attention(TensorView::contiguous(q.data(), DType::f32, {sh.B, sh.Hq, sh.S, sh.D}),
                                      TensorView::contiguous(k.data(), DType::f32, {sh.B, sh.Hkv, sh.S, sh.D}),
                                      TensorView::contiguous(v.data(), DType::f32, {sh.B, sh.Hkv, sh.S, sh.D}),
                                      TensorView::contiguous(o.data(), DType::f32, {sh.B, sh.Hq, sh.S, sh.D}), params,
                                      TensorView::contiguous(l.data(), DType::f32, {sh.B, sh.Hq, sh.S}), &info);
        !s)
      return s;
    print_memory(out, sh, threads, info);
  }
  if (!agree)
    return Status::Invalid("demo", "flash and reference disagree beyond the tolerance (max |dO| = " + sci(o_err) +
                                       ", max |dLSE| = " + sci(lse_err) + ")");
  return Status::Ok();
}

}  // namespace attn::tools
