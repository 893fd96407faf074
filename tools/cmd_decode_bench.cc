// attn decode-bench: the decode shapes of DESIGN.md through the KV caches, timed (an entry point for the
// benchmark harness; no comparison with other libraries here).
//   D1  B 1,  32/8 heads, D 128, 4096 cached keys (KVCache)
//   D2  B 1,  32/8 heads, D 128, 32768 cached keys (KVCache)
//   D3  B 16, 32/8 heads, D 128, ragged 100..8000 cached keys, pages of 16 (PagedKVCache, one call)
// Decode reads every cached key and value once, so the figure of merit is bytes/s: 2·Hkv·D·4·Σlen per step.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attn/kv_cache.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

struct BenchArgs {
  std::string shape = "D3";
  std::int64_t repeat = 5;
  int threads = 0;
};

Status decode_bench(const BenchArgs& a, std::ostream& out) {
  if (a.shape != "D1" && a.shape != "D2" && a.shape != "D3")
    return Status::Invalid("--shape", "'" + a.shape + "'; expected D1, D2 or D3");
  if (a.repeat < 1 || a.repeat > 1000) return Status::Invalid("--repeat", std::to_string(a.repeat) + "; expected 1 to 1000");
  const std::int64_t hq = 32, hkv = 8, D = 128, page = 16;
  std::vector<std::int64_t> lens;
  std::mt19937_64 rng(2026);
  if (a.shape == "D1") lens = {4096};
  else if (a.shape == "D2") lens = {32768};
  else {
    std::uniform_int_distribution<std::int64_t> len(100, 8000);
    for (int b = 0; b < 16; ++b) lens.push_back(len(rng));
  }
  const std::int64_t B = static_cast<std::int64_t>(lens.size());
  std::int64_t total = 0, pages = 0;
  for (std::int64_t n : lens) total += n, pages += (n + page - 1) / page;

  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> q(static_cast<std::size_t>(B * hq * D)), o(q.size()), chunk(static_cast<std::size_t>(hkv * 256 * D));
  for (float& x : q) x = u(rng);
  for (float& x : chunk) x = u(rng);
  Params params = decode_params();
  params.threads = a.threads;
  KVCache one;
  PagedKVCache pool;
  std::vector<std::int64_t> ids;
  const bool paged = a.shape == "D3";
  if (paged) {
    if (Status s = PagedKVCache::create(hkv, D, D, page, pages, &pool); !s) return s;
    for (std::int64_t b = 0; b < B; ++b) ids.push_back(pool.add_sequence());
  } else if (Status s = KVCache::create(hkv, D, D, lens[0], &one); !s) {
    return s;
  }
  // Fill the caches 256 tokens at a time (random values; they need not differ between chunks).
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t done = 0; done < lens[static_cast<std::size_t>(b)];) {
      const std::int64_t n = std::min<std::int64_t>(256, lens[static_cast<std::size_t>(b)] - done);
      TensorView kv = TensorView::contiguous(chunk.data(), DType::f32, {1, hkv, 256, D});
      kv.shape[2] = n;
      if (Status s = paged ? pool.append(ids[static_cast<std::size_t>(b)], kv, kv) : one.append(kv, kv); !s) return s;
      done += n;
    }
  const TensorView qv = TensorView::contiguous(q.data(), DType::f32, {B, hq, 1, D});
  const TensorView ov = TensorView::contiguous(o.data(), DType::f32, {B, hq, 1, D});
  std::vector<double> times;
  for (std::int64_t r = 0; r <= a.repeat; ++r) {  // the first run warms up and is not counted
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = paged ? pool.attend(ids, qv, ov, params) : one.attend(qv, ov, params); !s) return s;
    if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2], bytes = 2.0 * hkv * D * 4 * total;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s: B %lld, %lld/%lld heads, D %lld, %lld cached keys in all%s, f32\n"
                "decode step: median %.3f ms (min %.3f) over %lld runs; K/V read %.1f MB -> %.2f GB/s\n",
                a.shape.c_str(), static_cast<long long>(B), static_cast<long long>(hq), static_cast<long long>(hkv),
                static_cast<long long>(D), static_cast<long long>(total), paged ? " (ragged, pages of 16)" : "",
                med * 1e3, times.front() * 1e3, static_cast<long long>(a.repeat), bytes / 1e6, bytes / med / 1e9);
  out << buf;
  return Status::Ok();
}

}  // namespace

void add_decode_bench_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("decode-bench", "Time one decode step of DESIGN.md's D1, D2 or D3 through the KV caches");
  c->add_option("--shape", a->shape, "D1, D2 or D3 (default D3: 16 ragged sequences, paged)");
  c->add_option("--repeat", a->repeat, "Timed runs (default 5; the median is reported)");
  c->add_option("--threads", a->threads, "Threads (0 = the default)");
  on_run(c, [a, &out] { return decode_bench(*a, out); });
}

}  // namespace attn::tools
