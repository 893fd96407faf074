// attn cascade-bench: shared-prefix (cascade) batch decode against the plain paged decode of the same batch, in
// one run (issue 30's benchmark: B = 64 sequences, Hq = 32, Hkv = 8, D = 128, a 4,096-token shared prefix and 256
// own tokens each, bf16).
//
// One page pool holds the prefix's pages once and each sequence's own pages. The plain decode reads, for every
// sequence, the prefix's pages and its own (attention_paged, each sequence's table the prefix's pages followed by
// its own); the cascade reads the prefix once for the whole batch (attention_paged_cascade). Both on the same
// inputs; their outputs must agree (max |difference| within two units of a bf16/f16 output's last place at its
// size; 2^-15 of it for f32, whose two results sum in different orders),
// and the median of --reps timed runs of each is reported, with the plain decode's bytes per second against the
// measured streaming-read ceiling and the cascade's FLOP/s against the ceiling of its prefix kernel (AMX bf16, the
// bf16 dot product or FMA); then the cascade's two parts timed alone through attention_paged (the shared prefix for
// every query, each sequence's own pages), so that what is left of its time is its gather and merge.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "ceilings.h"
#include "commands.h"
#include "core/views.h"
#include "json_writer.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

struct CascadeArgs {
  std::int64_t batch = 64, heads = 32, kv_heads = 8, head_dim = 128, prefix = 4096, own = 256, page = 16;
  std::string dtype = "bf16";
  int threads = 0, reps = 5;
  bool json = false, quick_ceilings = false;
};

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

Status cascade_bench(const CascadeArgs& a, std::ostream& out) {
  DType dt = DType::bf16;
  if (a.dtype == "f16") dt = DType::f16;
  else if (a.dtype == "f32") dt = DType::f32;
  else if (a.dtype != "bf16") return Status::Invalid("--dtype", "'" + a.dtype + "'; expected bf16, f16 or f32");
  for (const auto& [name, v] : {std::pair{"--batch", a.batch}, {"--heads", a.heads}, {"--kv-heads", a.kv_heads},
                                {"--head-dim", a.head_dim}, {"--page", a.page}, {"--own", a.own}})
    if (v < 1) return Status::Invalid(name, std::to_string(v) + "; expected >= 1");
  if (a.prefix < 1 || a.prefix % a.page != 0)
    return Status::Invalid("--prefix", std::to_string(a.prefix) + "; expected a positive multiple of --page (" +
                                           std::to_string(a.page) + ")");
  if (a.heads % a.kv_heads != 0)
    return Status::Invalid("--heads", std::to_string(a.heads) + "; expected a multiple of --kv-heads");
  if (a.reps < 1) return Status::Invalid("--reps", std::to_string(a.reps) + "; expected >= 1");
  if (a.threads < 0 || a.threads > 4096)
    return Status::Invalid("--threads", std::to_string(a.threads) + "; expected 0 (default) or 1 to 4096");
  const std::int64_t B = a.batch, Hq = a.heads, Hkv = a.kv_heads, D = a.head_dim, page = a.page;
  const std::int64_t prefix_pages = a.prefix / page, own_pages = (a.own + page - 1) / page;
  const std::int64_t pages = prefix_pages + B * own_pages, width = prefix_pages + own_pages;
  const std::size_t es = dtype_size(dt);
  std::vector<unsigned char> q(static_cast<std::size_t>(B * Hq * D) * es), kp(static_cast<std::size_t>(pages * Hkv * page * D) * es),
      vp(kp.size()), out_plain(q.size()), out_cascade(q.size());
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto fill = [&](std::vector<unsigned char>& buf) {
    const TensorView t = TensorView::contiguous(buf.data(), dt, {static_cast<std::int64_t>(buf.size() / es)});
    for (std::int64_t e = 0; e < t.shape[0]; ++e) core::store_float(t, e, u(rng));
  };
  fill(q), fill(kp), fill(vp);
  // Pages: the prefix's first, then each sequence's own, in a shuffled order over the pool.
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
  for (std::int64_t i = 0; i < pages; ++i) perm[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::int32_t> prefix_table(perm.begin(), perm.begin() + prefix_pages);
  std::vector<std::int32_t> own_table(static_cast<std::size_t>(B * own_pages)), full_table(static_cast<std::size_t>(B * width));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t n = 0; n < prefix_pages; ++n) full_table[static_cast<std::size_t>(b * width + n)] = prefix_table[static_cast<std::size_t>(n)];
    for (std::int64_t n = 0; n < own_pages; ++n) {
      const std::int32_t id = perm[static_cast<std::size_t>(prefix_pages + b * own_pages + n)];
      own_table[static_cast<std::size_t>(b * own_pages + n)] = id;
      full_table[static_cast<std::size_t>(b * width + prefix_pages + n)] = id;
    }
  }
  std::vector<std::int32_t> own_lens(static_cast<std::size_t>(B), static_cast<std::int32_t>(a.own)),
      full_lens(static_cast<std::size_t>(B), static_cast<std::int32_t>(a.prefix + a.own));
  const TensorView tq = TensorView::contiguous(q.data(), dt, {B, Hq, 1, D});
  const TensorView tk = TensorView::contiguous(kp.data(), dt, {pages, Hkv, page, D});
  const TensorView tv = TensorView::contiguous(vp.data(), dt, {pages, Hkv, page, D});
  const TensorView to_plain = TensorView::contiguous(out_plain.data(), dt, {B, Hq, 1, D});
  const TensorView to_cascade = TensorView::contiguous(out_cascade.data(), dt, {B, Hq, 1, D});
  Params p;
  p.threads = a.threads;
  Workspace ws;
  p.workspace = &ws;
  const auto plain = [&] {
    return attention_paged(tq, tk, tv, TensorView::contiguous(full_table.data(), DType::i32, {B, width}),
                           TensorView::contiguous(full_lens.data(), DType::i32, {B}), to_plain, p);
  };
  const auto cascade = [&] {
    return attention_paged_cascade(tq, tk, tv, TensorView::contiguous(prefix_table.data(), DType::i32, {prefix_pages}),
                                   a.prefix, TensorView::contiguous(own_table.data(), DType::i32, {B, own_pages}),
                                   TensorView::contiguous(own_lens.data(), DType::i32, {B}), to_cascade, p);
  };
  const auto timed = [&](const auto& call, std::vector<double>* ms) -> Status {
    if (Status s = call(); !s) return s;  // warm-up
    for (int r = 0; r < a.reps; ++r) {
      const auto t0 = Clock::now();
      if (Status s = call(); !s) return s;
      ms->push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    return Status::Ok();
  };
  // The cascade's two parts timed alone through the public entry point (where its time goes): every query of the
  // batch against the prefix's pages, [1, Hq, B, D] over q's memory (the problem the cascade forms), and each
  // sequence against its own pages. Their sum against the cascade's time is the cost of its gather and merge.
  TensorView q_all = tq;
  q_all.shape = {1, Hq, B, D};
  q_all.strides = {0, D, Hq * D, 1};
  std::vector<unsigned char> out_part(q.size());
  TensorView o_all = q_all;
  o_all.data = out_part.data();
  const std::int32_t prefix_len32 = static_cast<std::int32_t>(a.prefix);
  const auto prefix_only = [&] {
    return attention_paged(q_all, tk, tv, TensorView::contiguous(prefix_table.data(), DType::i32, {1, prefix_pages}),
                           TensorView::contiguous(&prefix_len32, DType::i32, {1}), o_all, p);
  };
  const auto suffix_only = [&] {
    return attention_paged(tq, tk, tv, TensorView::contiguous(own_table.data(), DType::i32, {B, own_pages}),
                           TensorView::contiguous(own_lens.data(), DType::i32, {B}),
                           TensorView::contiguous(out_part.data(), dt, {B, Hq, 1, D}), p);
  };
  std::vector<double> plain_ms, cascade_ms, prefix_ms, suffix_ms;
  if (Status s = timed(plain, &plain_ms); !s) return s;
  if (Status s = timed(cascade, &cascade_ms); !s) return s;
  if (Status s = timed(prefix_only, &prefix_ms); !s) return s;
  if (Status s = timed(suffix_only, &suffix_ms); !s) return s;
  // The two outputs agree: within two units in the last place of the output's dtype at the output's size.
  double diff = 0, size = 0;
  const TensorView flat_p = TensorView::contiguous(out_plain.data(), dt, {B * Hq * D});
  const TensorView flat_c = TensorView::contiguous(out_cascade.data(), dt, {B * Hq * D});
  for (std::int64_t e = 0; e < B * Hq * D; ++e) {
    const double a = core::float_at(flat_p, e), b = core::float_at(flat_c, e);
    diff = std::isfinite(a) && std::isfinite(b) ? std::max(diff, std::fabs(a - b)) : HUGE_VAL;  // NaN never agrees
    size = std::max(size, std::fabs(a));
  }
  // (f32: the two sum in different orders, so a few thousand fp32 roundings apart: 2^-16 relative.)
  const double ulp = dt == DType::bf16 ? 0x1p-7 : dt == DType::f16 ? 0x1p-10 : 0x1p-16;
  const bool agree = diff <= 2 * ulp * std::max(size, 1e-3);
  const int threads = resolve_threads(a.threads);
  const Ceilings& ceil = measure_ceilings(CeilingOptions{threads, a.quick_ceilings, true});
  const double t_plain = median(plain_ms), t_cascade = median(cascade_ms);
  const double kv_bytes = 2.0 * static_cast<double>(B * Hkv * (a.prefix + a.own) * D * static_cast<std::int64_t>(es));
  const double plain_gbps = kv_bytes / (t_plain * 1e-3) / 1e9;
  const double flops = 4.0 * static_cast<double>(B * Hq) * static_cast<double>(a.prefix + a.own) * static_cast<double>(D);
  const double cascade_gflops = flops / (t_cascade * 1e-3) / 1e9;
  const double t_prefix = median(prefix_ms), t_suffix = median(suffix_ms);
  const double prefix_gflops = 4.0 * static_cast<double>(B * Hq * a.prefix * D) / (t_prefix * 1e-3) / 1e9;
  const double suffix_gbps = 2.0 * static_cast<double>(B * Hkv * a.own * D * static_cast<std::int64_t>(es)) / (t_suffix * 1e-3) / 1e9;
  // The cascade's compute is its prefix product: judged against the peak of the instructions its kernel runs (AMX
  // bf16, the bf16 dot product, or fp32 FMAs), named by describing the prefix problem as the cascade forms it: every
  // query row of the batch, [1, Hq, B, D] over q's memory, against the prefix's pages.
  std::string prefix_kernel;
  {
    KernelInfo info;
    if (describe_attention_paged(q_all, tk, tv, TensorView::contiguous(prefix_table.data(), DType::i32, {1, prefix_pages}),
                                 TensorView::contiguous(&prefix_len32, DType::i32, {1}), o_all, p, std::nullopt, &info))
      prefix_kernel = info.kernel;
  }
  const bool on_amx = prefix_kernel == "amx" && ceil.amx_bf16_gflops > 0;
  const bool on_dot = prefix_kernel == "bf16 dot" && ceil.bf16_dot_gflops > 0;
  const double compute_ceiling = on_amx ? ceil.amx_bf16_gflops : on_dot ? ceil.bf16_dot_gflops : ceil.fma_gflops;
  const char* ceiling_name = on_amx ? "AMX bf16" : on_dot ? "bf16 dot product" : "FMA";
  if (a.json) {
    JsonObject j;
    j.add("batch", B).add("heads", Hq).add("kv_heads", Hkv).add("head_dim", D).add("prefix", a.prefix)
        .add("own", a.own).add("page", page).add("dtype", a.dtype).add("threads", threads)
        .add("plain_ms", t_plain).add("cascade_ms", t_cascade).add("speedup", t_plain / t_cascade)
        .add("plain_gbps", plain_gbps).add("read_gbps", ceil.read_gbps).add("cascade_gflops", cascade_gflops)
        .add("compute_ceiling_gflops", compute_ceiling).add("compute_ceiling", ceiling_name)
        .add("prefix_kernel", prefix_kernel).add("max_difference", diff).add("outputs_agree", agree)
        .add("prefix_ms", t_prefix).add("prefix_gflops", prefix_gflops).add("suffix_ms", t_suffix)
        .add("suffix_gbps", suffix_gbps).add("plain_trials_ms", plain_ms).add("cascade_trials_ms", cascade_ms);
    out << j.str() << "\n";
  } else {
    out << "cascade decode: B " << B << ", heads " << Hq << "/" << Hkv << ", d " << D << ", shared prefix " << a.prefix
        << " + " << a.own << " own keys, pages of " << page << ", " << a.dtype << ", " << threads << " threads\n";
    char line[256];
    std::snprintf(line, sizeof line, "  plain paged decode  %9.3f ms  %7.1f GB/s  (%3.0f%% of the %.1f GB/s read ceiling)\n",
                  t_plain, plain_gbps, 100 * plain_gbps / ceil.read_gbps, ceil.read_gbps);
    out << line;
    std::snprintf(line, sizeof line, "  cascade             %9.3f ms  %7.1f GFLOP/s  (%3.0f%% of the %.0f GFLOP/s %s ceiling)\n",
                  t_cascade, cascade_gflops, 100 * cascade_gflops / compute_ceiling, compute_ceiling, ceiling_name);
    out << line;
    std::snprintf(line, sizeof line, "    its prefix alone  %9.3f ms  %7.1f GFLOP/s  (%3.0f%%; every query against the shared pages)\n",
                  t_prefix, prefix_gflops, 100 * prefix_gflops / compute_ceiling);
    out << line;
    std::snprintf(line, sizeof line, "    its suffix alone  %9.3f ms  %7.1f GB/s  (%3.0f%%; each sequence against its own pages)\n",
                  t_suffix, suffix_gbps, 100 * suffix_gbps / ceil.read_gbps);
    out << line;
    std::snprintf(line, sizeof line, "    gather and merge  %9.3f ms  (the cascade's time less its two parts)\n",
                  t_cascade - t_prefix - t_suffix);
    out << line;
    std::snprintf(line, sizeof line, "  speed-up (plain time / cascade time): %.2fx (%s); outputs agree: %s (max |difference| %.2e)\n",
                  t_plain / t_cascade, t_plain > t_cascade ? "the cascade is faster" : "the cascade is not faster",
                  agree ? "yes" : "NO", diff);
    out << line;
  }
  if (!agree) return Status::Invalid("cascade", "output differs from the plain paged decode's by " + std::to_string(diff));
  return Status::Ok();
}

}  // namespace

void add_cascade_bench_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<CascadeArgs>();
  CLI::App* c = app.add_subcommand("cascade-bench", "Time shared-prefix (cascade) batch decode against the plain "
                                                    "paged decode of the same batch (attention_paged_cascade)");
  c->add_option("--batch", a->batch, "Sequences (default 64)");
  c->add_option("--heads", a->heads, "Query heads (default 32)");
  c->add_option("--kv-heads", a->kv_heads, "Key/value heads (default 8)");
  c->add_option("--head-dim", a->head_dim, "Head dim (default 128)");
  c->add_option("--prefix", a->prefix, "Shared prefix keys, a multiple of --page (default 4096)");
  c->add_option("--own", a->own, "Each sequence's own keys (default 256)");
  c->add_option("--page", a->page, "Keys per page (default 16)");
  c->add_option("--dtype", a->dtype, "bf16 (default), f16 or f32");
  c->add_option("--threads", a->threads, "Threads (default: attn's default)");
  c->add_option("--reps", a->reps, "Timed runs of each after a warm-up (default 5; the median is reported)");
  c->add_flag("--json", a->json, "One JSON object instead of the table");
  c->add_flag("--quick-ceilings", a->quick_ceilings, "Tiny ceiling measurements (tests: the numbers mean little)");
  on_run(c, [a, &out] { return cascade_bench(*a, out); });
}

}  // namespace attn::tools
