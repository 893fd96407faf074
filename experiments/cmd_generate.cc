// attn generate: a small decoder-only transformer with random weights generates tokens twice, once
// recomputing the whole prefix at every step and once with a KV cache per layer, timing every token.
//
// The model (pre-norm, GPT-2 style): token embedding + sinusoidal positions, then per layer
//   h += MHA(LayerNorm(h), causal);  h += W2·gelu(W1·LayerNorm(h) + b1) + b2
// and logits = LayerNorm(h) · Eᵀ (tied embedding); the next token is the argmax (greedy).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/mha.h"
#include "mha/linear.h"
#include "files.h"
#include "plot.h"
#include "subcommand.h"

// OpenBLAS's thread pool, when the BLAS is OpenBLAS (weak: absent with another BLAS). Its busy-waiting
// threads and OpenMP's fight over a small shared machine and make per-token times swing by 100x.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace attn::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct GenerateArgs {
  std::int64_t tokens = 256, d_model = 128, layers = 4, heads = 8, kv_heads = 2, vocab = 512, prompt = 8;
  std::uint64_t seed = 1;
  std::string cache = "contiguous", png = "generate.png", kv_dtype = "f32";
  std::int64_t page_size = 16, repeat = 3;
  int threads = 1;
};

struct Layer {
  MultiHeadAttention attn;
  std::vector<float> ln1_g, ln1_b, ln2_g, ln2_b, w1, b1, w2, b2;
};

struct Model {
  std::int64_t d = 0, vocab = 0, hidden = 0;
  std::vector<float> embed, lnf_g, lnf_b;  // embed [vocab, d]
  std::vector<Layer> layers;
};

Status build(const GenerateArgs& a, Model* m) {
  m->d = a.d_model, m->vocab = a.vocab, m->hidden = 4 * a.d_model;
  std::mt19937_64 rng(a.seed);
  auto uniform = [&](std::vector<float>& w, std::size_t n, double bound) {
    std::uniform_real_distribution<double> u(-bound, bound);
    w.resize(n);
    for (float& x : w) x = static_cast<float>(u(rng));
  };
  const std::size_t d = static_cast<std::size_t>(a.d_model), h = 4 * d;
  uniform(m->embed, static_cast<std::size_t>(a.vocab) * d, 1.0);
  m->lnf_g.assign(d, 1.0f), m->lnf_b.assign(d, 0.0f);
  for (std::int64_t l = 0; l < a.layers; ++l) {
    Layer layer;
    if (Status s = MultiHeadAttention::create({a.d_model, a.heads, a.kv_heads, 0, 0, true}, &layer.attn); !s) return s;
    layer.attn.init_random(a.seed * 1000 + static_cast<std::uint64_t>(l));
    layer.ln1_g.assign(d, 1.0f), layer.ln1_b.assign(d, 0.0f), layer.ln2_g.assign(d, 1.0f), layer.ln2_b.assign(d, 0.0f);
    uniform(layer.w1, h * d, 1 / std::sqrt(double(d))), uniform(layer.b1, h, 1 / std::sqrt(double(d)));
    uniform(layer.w2, d * h, 1 / std::sqrt(double(h))), uniform(layer.b2, d, 1 / std::sqrt(double(h)));
    m->layers.push_back(std::move(layer));
  }
  return Status::Ok();
}

void layer_norm(const float* x, std::int64_t rows, std::int64_t d, const std::vector<float>& g, const std::vector<float>& b,
                float* y) {
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t i = 0; i < d; ++i) mean += x[r * d + i];
    mean /= d;
    for (std::int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
    const double inv = 1 / std::sqrt(var / d + 1e-5);
    for (std::int64_t i = 0; i < d; ++i) y[r * d + i] = static_cast<float>((x[r * d + i] - mean) * inv * g[i] + b[i]);
  }
}

// Embeds tokens[first .. first + n) at their positions.
std::vector<float> embed(const Model& m, const std::vector<std::int64_t>& tokens, std::int64_t first, std::int64_t n) {
  std::vector<float> h(static_cast<std::size_t>(n * m.d));
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t pos = first + t, tok = tokens[static_cast<std::size_t>(pos)];
    for (std::int64_t i = 0; i < m.d; ++i) {
      const double freq = std::pow(10000.0, -2.0 * (i / 2) / m.d);
      h[t * m.d + i] = m.embed[tok * m.d + i] + static_cast<float>(i % 2 ? std::cos(pos * freq) : std::sin(pos * freq));
    }
  }
  return h;
}

// The MLP half of a layer, in place on h [n, d].
void mlp(const Layer& l, std::int64_t n, std::int64_t d, std::vector<float>& h) {
  std::vector<float> x(h.size()), u(static_cast<std::size_t>(n * 4 * d)), y(h.size());
  layer_norm(h.data(), n, d, l.ln2_g, l.ln2_b, x.data());
  mha::linear(x.data(), n, d, d, l.w1.data(), 4 * d, l.b1.data(), u.data(), 4 * d);
  for (float& e : u) e = static_cast<float>(0.5 * e * (1 + std::erf(e / std::sqrt(2.0))));
  mha::linear(u.data(), n, 4 * d, 4 * d, l.w2.data(), d, l.b2.data(), y.data(), d);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] += y[i];
}

// Logits of the last row of h [n, d].
std::vector<float> logits(const Model& m, const std::vector<float>& h, std::int64_t n) {
  std::vector<float> x(static_cast<std::size_t>(m.d)), out(static_cast<std::size_t>(m.vocab));
  layer_norm(h.data() + (n - 1) * m.d, 1, m.d, m.lnf_g, m.lnf_b, x.data());
  mha::linear(x.data(), 1, m.d, m.d, m.embed.data(), m.vocab, nullptr, out.data(), m.vocab);
  return out;
}

std::int64_t argmax(const std::vector<float>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

TensorView rows_view(std::vector<float>& h, std::int64_t batch, std::int64_t n, std::int64_t d) {
  return TensorView::contiguous(h.data(), DType::f32, {batch, n, d});
}

// No cache: the whole prefix through every layer with a causal mask.
Status step_recompute(const Model& m, const std::vector<std::int64_t>& tokens, std::int64_t n, int threads,
                      std::vector<float>* out) {
  std::vector<float> h = embed(m, tokens, 0, n), x(h.size()), y(h.size());
  Params p;
  p.causal = Causal::top_left;
  p.threads = threads;
  for (const Layer& l : m.layers) {
    layer_norm(h.data(), n, m.d, l.ln1_g, l.ln1_b, x.data());
    if (Status s = l.attn.forward(rows_view(x, 1, n, m.d), rows_view(y, 1, n, m.d), p); !s) return s;
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += y[i];
    mlp(l, n, m.d, h);
  }
  *out = logits(m, h, n);
  return Status::Ok();
}

// With a cache: only tokens[first .. first + n) go through the layers.
struct Caches {
  std::vector<KVCache> contiguous;
  std::vector<PagedKVCache> paged;
  std::vector<std::int64_t> ids;
};

Status step_cached(const Model& m, Caches& c, const std::vector<std::int64_t>& tokens, std::int64_t first, std::int64_t n,
                   int threads, std::vector<float>* out) {
  std::vector<float> h = embed(m, tokens, first, n), x(h.size()), y(h.size());
  Params p = decode_params();
  p.threads = threads;
  // A repeated step (for timing) first drops what the previous attempt appended.
  for (KVCache& k : c.contiguous) (void)k.truncate(std::min(k.length(), first));
  for (std::size_t i = 0; i < c.paged.size(); ++i) {
    std::int64_t len = 0;
    (void)c.paged[i].length(c.ids[i], &len);
    (void)c.paged[i].truncate(c.ids[i], std::min(len, first));
  }
  for (std::size_t li = 0; li < m.layers.size(); ++li) {
    const Layer& l = m.layers[li];
    layer_norm(h.data(), n, m.d, l.ln1_g, l.ln1_b, x.data());
    const Status s = c.paged.empty()
                         ? l.attn.forward_cached(rows_view(x, 1, n, m.d), c.contiguous[li], rows_view(y, 1, n, m.d), p)
                         : l.attn.forward_paged(rows_view(x, 1, n, m.d), c.paged[li], {c.ids[li]}, rows_view(y, 1, n, m.d), p);
    if (!s) return s;
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += y[i];
    mlp(l, n, m.d, h);
  }
  *out = logits(m, h, n);
  return Status::Ok();
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One KV cache per layer of the chosen kind, storing `dtype`, for `total` tokens.
Status make_caches(const GenerateArgs& a, const MhaConfig& cfg, std::int64_t total, DType dtype, Caches* caches) {
  for (std::int64_t l = 0; l < a.layers; ++l) {
    if (a.cache == "contiguous") {
      caches->contiguous.emplace_back();
      if (Status s = KVCache::create(cfg.kv_heads, cfg.head_dim, cfg.v_head_dim, total, dtype, &caches->contiguous.back());
          !s)
        return s;
    } else {
      caches->paged.emplace_back();
      if (Status s = PagedKVCache::create(cfg.kv_heads, cfg.head_dim, cfg.v_head_dim, a.page_size,
                                          (total + a.page_size - 1) / a.page_size, dtype, &caches->paged.back());
          !s)
        return s;
      caches->ids.push_back(caches->paged.back().add_sequence());
    }
  }
  return Status::Ok();
}

// The logits a cache of `dtype` gives at every step for the given tokens (the prompt, then one token per step):
// the same prefixes as the timed run, untimed.
Status cached_logits_for(const GenerateArgs& a, const Model& m, DType dtype, const std::vector<std::int64_t>& tokens,
                         std::vector<std::vector<float>>* logits) {
  Caches caches;
  if (Status s = make_caches(a, m.layers[0].attn.config(), a.prompt + a.tokens, dtype, &caches); !s) return s;
  std::vector<float> lg;
  if (Status s = step_cached(m, caches, tokens, 0, a.prompt, a.threads, &lg); !s) return s;
  logits->assign(1, lg);
  for (std::int64_t i = 0; i + 1 < a.tokens; ++i) {
    if (Status s = step_cached(m, caches, tokens, a.prompt + i, 1, a.threads, &lg); !s) return s;
    logits->push_back(lg);
  }
  return Status::Ok();
}

// The largest |a - b| over every step's logits.
double max_logit_gap(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double gap = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    for (std::size_t v = 0; v < a[i].size(); ++v) gap = std::max(gap, std::fabs(double(a[i][v]) - b[i][v]));
  return gap;
}

Status generate(const GenerateArgs& a, std::ostream& out) {
  const std::pair<const char*, std::int64_t> positive[] = {{"--tokens", a.tokens}, {"--d-model", a.d_model},
                                                           {"--layers", a.layers}, {"--heads", a.heads},
                                                           {"--kv-heads", a.kv_heads},  // (0 was MHA, silently)
                                                           {"--vocab", a.vocab},   {"--prompt", a.prompt},
                                                           {"--page-size", a.page_size}};
  for (const auto& [name, v] : positive)
    if (v < 1) return Status::Invalid(name, std::to_string(v) + "; expected >= 1");
  if (a.repeat < 1 || a.repeat > 100) return Status::Invalid("--repeat", std::to_string(a.repeat) + "; expected 1 to 100");
  if (a.threads < 0) return Status::Invalid("--threads", std::to_string(a.threads) + "; expected >= 0");
  if (a.tokens > 100000) return Status::Invalid("--tokens", std::to_string(a.tokens) + "; expected at most 100000");
  if (a.cache != "contiguous" && a.cache != "paged")
    return Status::Invalid("--cache", "'" + a.cache + "'; expected contiguous or paged");
  DType kv_dtype = DType::boolean;
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i8, DType::i4})
    if (a.kv_dtype == dtype_name(d) || (d == DType::i8 && a.kv_dtype == "int8") || (d == DType::i4 && a.kv_dtype == "int4"))
      kv_dtype = d;
  if (kv_dtype == DType::boolean)
    return Status::Invalid("--kv-dtype", "'" + a.kv_dtype + "'; expected f32, bf16, f16, int8 (i8) or int4 (i4)");
  if (Status s = check_outputs({{"--png", a.png}}, {}); !s) return s;  // before minutes of work
  if (Status s = plot::check_can_draw("--png", a.png); !s) return s;
  if (a.threads > 0 && openblas_set_num_threads) openblas_set_num_threads(a.threads);
  Model m;
  if (Status s = build(a, &m); !s) {
    if (s.message().rfind("kv_heads", 0) == 0) return Status::Invalid("--kv-heads", s.message().substr(10));
    if (s.message().rfind("head_dim", 0) == 0)  // (generate has no head-dim option: d_model / heads is it)
      return Status::Invalid("--heads", std::to_string(a.heads) + " does not divide --d-model " +
                                            std::to_string(a.d_model) + "; expected a divisor (head dim = d_model / heads)");
    return s;
  }
  const MhaConfig& cfg = m.layers[0].attn.config();
  const std::int64_t total = a.prompt + a.tokens;
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(a.prompt));
  for (std::int64_t i = 0; i < a.prompt; ++i) tokens[static_cast<std::size_t>(i)] = (i * 7 + 3) % a.vocab;

  Caches caches;
  if (Status s = make_caches(a, cfg, total, kv_dtype, &caches); !s) return s;
  out << "decoder: " << a.layers << " layers, d_model " << a.d_model << ", " << cfg.heads << " query / " << cfg.kv_heads
      << " KV heads of " << cfg.head_dim << ", MLP " << 4 * a.d_model << ", vocab " << a.vocab << ", seed " << a.seed
      << "; prompt " << a.prompt << " tokens, generating " << a.tokens << " (" << a.cache << " KV cache of "
      << dtype_name(kv_dtype)
      << (a.cache == "paged" ? ", page " + std::to_string(a.page_size) : std::string()) << ")\n"
      << "each step timed " << a.repeat << " times (minimum kept; the host is shared), threads " << a.threads
      << " (attention and OpenBLAS)\n";

  // With the cache: the prompt in one step (prefill), then one token per step.
  std::vector<double> pos, t_cached, t_full;
  std::vector<float> lg;
  auto t0 = Clock::now();
  if (Status s = step_cached(m, caches, tokens, 0, a.prompt, a.threads, &lg); !s) return s;
  const double prefill = seconds_since(t0);
  std::vector<std::vector<float>> cached_logits;
  for (std::int64_t i = 0; i < a.tokens; ++i) {
    tokens.push_back(argmax(lg));
    cached_logits.push_back(lg);
    if (i + 1 == a.tokens) break;
    double best = INFINITY;
    for (std::int64_t r = 0; r < a.repeat; ++r) {
      t0 = Clock::now();
      if (Status s = step_cached(m, caches, tokens, a.prompt + i, 1, a.threads, &lg); !s) return s;
      best = std::min(best, seconds_since(t0));
    }
    t_cached.push_back(best * 1e3);
    pos.push_back(static_cast<double>(a.prompt + i + 1));
  }
  // Without: every step recomputes the whole prefix of the same tokens.
  double max_diff = 0, max_logit = 0;
  std::int64_t same = 0;
  std::vector<std::vector<float>> recompute_logits;
  for (std::int64_t i = 0; i < a.tokens; ++i) {
    double best = INFINITY;
    for (std::int64_t r = 0; r < (i > 0 ? a.repeat : 1); ++r) {
      t0 = Clock::now();
      if (Status s = step_recompute(m, tokens, a.prompt + i, a.threads, &lg); !s) return s;
      best = std::min(best, seconds_since(t0));
    }
    if (i > 0) t_full.push_back(best * 1e3);
    recompute_logits.push_back(lg);
    const std::vector<float>& c = cached_logits[static_cast<std::size_t>(i)];
    for (std::size_t v = 0; v < lg.size(); ++v)
      max_diff = std::max(max_diff, std::fabs(double(lg[v]) - c[v])), max_logit = std::max(max_logit, std::fabs(double(c[v])));
    same += argmax(lg) == tokens[static_cast<std::size_t>(a.prompt + i)];
  }

  out << "prefill of the prompt with the cache: " << prefill * 1e3 << " ms\n\n";
  out << "   position   with cache (ms/token)   recompute (ms/token)\n";
  const std::size_t n = t_cached.size();
  for (std::size_t k = 0; k < 9 && n > 0; ++k) {
    const std::size_t i = std::min(n - 1, k * (n - 1) / 8);
    char line[128];
    std::snprintf(line, sizeof line, "%11.0f %23.3f %22.3f\n", pos[i], t_cached[i], t_full[i]);
    out << line;
  }
  double sum_c = 0, sum_f = 0;
  for (std::size_t i = 0; i < n; ++i) sum_c += t_cached[i], sum_f += t_full[i];
  auto quarter_mean = [&](const std::vector<double>& t, bool last) {
    const std::size_t q = std::max<std::size_t>(1, n / 4);
    double s = 0;
    for (std::size_t i = 0; i < q; ++i) s += t[last ? n - 1 - i : i];
    return s / q;
  };
  char buf[512];
  if (n > 0) {
    std::snprintf(buf, sizeof buf,
                  "\ntotal for %zu decode steps: %.1f ms with the cache, %.1f ms recomputing (%.1fx)\n"
                  "per-token time, last quarter / first quarter: with cache %.2fx, recomputing %.2fx (positions %.0f..%.0f)\n"
                  "  recomputing costs O(t) per token (O(N^2) in all); with the cache a token costs the projections and\n"
                  "  MLP of one row plus one row of attention over t cached keys: nearly flat, linear in N in all.\n",
                  n, sum_c, sum_f, sum_f / std::max(sum_c, 1e-9), quarter_mean(t_cached, true) / quarter_mean(t_cached, false),
                  quarter_mean(t_full, true) / quarter_mean(t_full, false), pos.front(), pos.back());
    out << buf;
  }
  std::snprintf(buf, sizeof buf,
                "outputs agree: greedy tokens identical at %lld of %lld steps; max |logit difference| = %.3g (logits up to %.3g)\n",
                static_cast<long long>(same), static_cast<long long>(a.tokens), max_diff, max_logit);
  out << buf;
  // A cache that stores rounded keys and values (bf16, f16, i8, i4) computes slightly different logits by design: the
  // recompute (f32 activations throughout) is the yardstick, and an i8, i4 or f16 cache is also compared with a bf16
  // cache over the same tokens.
  const bool exact_cache = kv_dtype == DType::f32;
  if (!exact_cache && kv_dtype != DType::bf16) {
    std::vector<std::vector<float>> bf16_logits;
    if (Status s = cached_logits_for(a, m, DType::bf16, tokens, &bf16_logits); !s) return s;
    std::int64_t agree_bf16 = 0;
    for (std::size_t i = 0; i < bf16_logits.size(); ++i) agree_bf16 += argmax(bf16_logits[i]) == argmax(cached_logits[i]);
    std::snprintf(buf, sizeof buf,
                  "against a bf16 cache over the same tokens: max |logit difference| = %.3g (the bf16 cache against the "
                  "recompute: %.3g); greedy tokens identical at %lld of %lld steps\n",
                  max_logit_gap(cached_logits, bf16_logits), max_logit_gap(bf16_logits, recompute_logits),
                  static_cast<long long>(agree_bf16), static_cast<long long>(a.tokens));
    out << buf;
  }
  if (same != a.tokens)
    out << (exact_cache ? "WARNING: the two runs chose different tokens\n"
                        : "(the cache stores rounded keys and values: near-ties in the logits may pick other tokens)\n");

  if (!a.png.empty() && n > 0) {
    plot::LinePlot p;
    p.title = "time per generated token (" + std::to_string(a.layers) + " layers, d " + std::to_string(a.d_model) + ")";
    p.x_label = "position (tokens so far)";
    p.y_label = "ms per token";
    p.series.push_back({"recompute the prefix", pos, t_full});
    p.series.push_back({"KV cache (" + a.cache + ")", pos, t_cached});
    if (Status s = plot::write_line_plot(a.png, p); !s) return renamed(s, "--png");
    out << "wrote " << a.png << "\n";
  }
  if (same != a.tokens && exact_cache) return Status::Invalid("generate", "the cached and recomputed runs disagree");
  return Status::Ok();
}

}  // namespace

void add_generate_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* g = app.add_subcommand(
      "generate", "Generate tokens with a small random decoder, with and without a KV cache; time per token and a PNG plot");
  g->add_option("--tokens", a->tokens, "Tokens to generate (default 256)");
  g->add_option("--prompt", a->prompt, "Prompt length (default 8)");
  g->add_option("--layers", a->layers, "Decoder layers (default 4)");
  g->add_option("--d-model", a->d_model, "Model width (default 128)");
  g->add_option("--heads", a->heads, "Query heads (default 8)");
  g->add_option("--kv-heads", a->kv_heads, "KV heads (default 2: GQA)");
  g->add_option("--vocab", a->vocab, "Vocabulary size (default 512)");
  g->add_option("--seed", a->seed, "Seed of the random weights (default 1)");
  g->add_option("--cache", a->cache, "contiguous (default) or paged");
  g->add_option("--page-size", a->page_size, "Page size of the paged cache (default 16)");
  g->add_option("--kv-dtype", a->kv_dtype,
                "Storage of the KV cache: f32 (default), bf16, f16, int8 (per (token, head) scales) or int4 (a scale "
                "per 32 values of a row); other than f32 the logits are also compared with a bf16 cache's");
  g->add_option("--repeat", a->repeat, "Time every step this many times and keep the minimum (default 3)");
  g->add_option("--threads", a->threads, "Threads for attention and OpenBLAS (default 1; 0 = their defaults)");
  g->add_option("--png", a->png, "Plot of time per token against position (default generate.png; '' = none)");
  on_run(g, [a, &out] { return generate(*a, out); });
}

}  // namespace attn::tools
