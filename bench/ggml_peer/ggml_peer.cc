// llama.cpp's ggml flash attention (ggml_flash_attn_ext on the CPU backend) timed on one attn benchmark row, the
// way bench/run_bench.py times PyTorch: warm-up while under 50 ms, then the median of --reps calls, K/V sets
// rotated between calls (--sets) so decode reads from memory, not from the cache. Prints one JSON object.
//
// Layout is llama.cpp's: q [D, Sq, Hq, B] f32, k and v [D, Skv, Hkv, B] in the cache type (f32, f16, bf16, q8_0 or q4_0:
// llama.cpp's -ctk/-ctv), an f16 mask [Skv, Sq, 1, B] of 0 / -inf for causal rows and ragged key lengths (ggml's
// kernel skips keys whose mask is -inf without reading them), scale 1/sqrt(D). --value-dim gives V its own head dim;
// --latent makes V a view of K's first --value-dim values per row (multi-head latent attention, as llama.cpp runs
// DeepSeek's MLA: one cache read once).
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Row {
  long B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, D = 64, Dv = 0, kv_min = 0;
  bool causal = false, latent = false;
  std::string kv_type = "f32";
  int threads = 1, reps = 10, sets = 1;
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "ggml_peer: %s\n", msg.c_str());
  std::exit(2);
}

Row parse(int argc, char** argv) {
  Row r;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--causal") { r.causal = true; continue; }
    if (a == "--latent") { r.latent = true; continue; }
    if (i + 1 >= argc) die("missing value for " + a);
    std::string v = argv[++i];
    if (a == "--batch") r.B = std::stol(v);
    else if (a == "--heads") r.Hq = std::stol(v);
    else if (a == "--kv-heads") r.Hkv = std::stol(v);
    else if (a == "--q-len") r.Sq = std::stol(v);
    else if (a == "--kv-len") r.Skv = std::stol(v);
    else if (a == "--kv-len-min") r.kv_min = std::stol(v);
    else if (a == "--head-dim") r.D = std::stol(v);
    else if (a == "--value-dim") r.Dv = std::stol(v);
    else if (a == "--kv-type") r.kv_type = v;
    else if (a == "--threads") r.threads = std::stoi(v);
    else if (a == "--reps") r.reps = std::stoi(v);
    else if (a == "--sets") r.sets = std::stoi(v);
    else die("unknown argument " + a);
  }
  if (r.Hq % r.Hkv != 0) die("--heads must be a multiple of --kv-heads");
  if (r.Dv <= 0) r.Dv = r.D;
  if (r.latent && r.Dv > r.D) die("--value-dim must be at most --head-dim with --latent");
  return r;
}

ggml_type kv_type(const std::string& s) {
  if (s == "f32") return GGML_TYPE_F32;
  if (s == "f16") return GGML_TYPE_F16;
  if (s == "bf16") return GGML_TYPE_BF16;
  if (s == "q8_0") return GGML_TYPE_Q8_0;
  if (s == "q4_0") return GGML_TYPE_Q4_0;
  die("--kv-type: expected f32, f16, bf16, q8_0 or q4_0, got " + s);
}

// Key length of sequence b: run_bench.py's (and attn bench's) formula.
long kv_len(const Row& r, long b) {
  if (r.kv_min <= 0 || r.B == 1) return r.Skv;
  return r.kv_min + ((r.Skv - r.kv_min) * b + (r.B - 1) / 2) / (r.B - 1);
}

// Fills a tensor of any of the supported types from uniform [-1, 1) floats, one row of ne[0] at a time.
void fill(ggml_tensor* t, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const long n = t->ne[0], rows = ggml_nrows(t);
  std::vector<float> row(n);
  for (long i = 0; i < rows; ++i) {
    for (float& x : row) x = u(gen);
    char* dst = static_cast<char*>(t->data) + i * t->nb[1];  // contiguous: rows are nb[1] apart
    switch (t->type) {
      case GGML_TYPE_F32: std::memcpy(dst, row.data(), n * sizeof(float)); break;
      case GGML_TYPE_F16: ggml_fp32_to_fp16_row(row.data(), reinterpret_cast<ggml_fp16_t*>(dst), n); break;
      case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(row.data(), reinterpret_cast<ggml_bf16_t*>(dst), n); break;
      default: ggml_quantize_chunk(t->type, row.data(), dst, 0, 1, n, nullptr); break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Row r = parse(argc, argv);
  const ggml_type kt = kv_type(r.kv_type);
  if (r.D % ggml_blck_size(kt) != 0) die("--head-dim must be a multiple of the block of " + r.kv_type);
  const bool masked = r.causal || r.kv_min > 0;

  if (r.Dv % ggml_blck_size(kt) != 0) die("--value-dim must be a multiple of the block of " + r.kv_type);
  const size_t kv_bytes = (ggml_row_size(kt, r.D) + (r.latent ? 0 : ggml_row_size(kt, r.Dv))) * r.Skv * r.Hkv * r.B;
  const size_t out_bytes = size_t(r.Dv) * r.Sq * r.Hq * r.B * 4;  // each set's output
  const size_t bytes = size_t(r.sets) * (kv_bytes + out_bytes + 4096) + size_t(r.D) * r.Sq * r.Hq * r.B * 4 +
                       (masked ? size_t(r.Skv) * r.Sq * r.B * 2 : 0) + 64 * ggml_tensor_overhead() +
                       size_t(r.sets) * ggml_graph_overhead() + (1 << 20);
  ggml_init_params ip{bytes, nullptr, false};
  ggml_context* ctx = ggml_init(ip);
  if (!ctx) die("ggml_init failed");

  std::mt19937 gen(1);
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, r.D, r.Sq, r.Hq, r.B);
  fill(q, gen);
  ggml_tensor* mask = nullptr;
  if (masked) {
    mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, r.Skv, r.Sq, 1, r.B);
    auto* m = static_cast<ggml_fp16_t*>(mask->data);
    for (long b = 0; b < r.B; ++b)
      for (long i = 0; i < r.Sq; ++i)
        for (long j = 0; j < r.Skv; ++j) {
          const long n = kv_len(r, b);
          const bool ok = j < n && (!r.causal || j <= i + (n - r.Sq));  // causal aligned bottom-right, as attn's
          m[(b * r.Sq + i) * r.Skv + j] = ggml_fp32_to_fp16(ok ? 0.f : -INFINITY);
        }
  }
  std::vector<ggml_cgraph*> graphs;
  std::vector<ggml_tensor*> outs;
  for (int s = 0; s < r.sets; ++s) {
    ggml_tensor* k = ggml_new_tensor_4d(ctx, kt, r.D, r.Skv, r.Hkv, r.B);
    fill(k, gen);
    ggml_tensor* v = r.latent ? ggml_view_4d(ctx, k, r.Dv, r.Skv, r.Hkv, r.B, k->nb[1], k->nb[2], k->nb[3], 0)
                              : ggml_new_tensor_4d(ctx, kt, r.Dv, r.Skv, r.Hkv, r.B);
    if (!r.latent) fill(v, gen);
    ggml_tensor* o = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.f / std::sqrt(float(r.D)), 0.f, 0.f);
    ggml_cgraph* g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, o);
    graphs.push_back(g);
    outs.push_back(o);
  }
  size_t work = 0;
  for (ggml_cgraph* g : graphs) work = std::max(work, ggml_graph_plan(g, r.threads, nullptr).work_size);
  std::vector<uint8_t> work_data(work + 64);

  long n = 0;
  auto call = [&] {
    ggml_cgraph* g = graphs[n++ % r.sets];
    ggml_cplan plan = ggml_graph_plan(g, r.threads, nullptr);
    plan.work_data = work_data.data();
    const auto t0 = std::chrono::steady_clock::now();
    if (ggml_graph_compute(g, &plan) != GGML_STATUS_SUCCESS) die("ggml_graph_compute failed");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double warm = 0;
  do warm += call(); while (warm < 0.05 && n < 20);
  std::vector<double> times;
  for (int i = 0; i < r.reps; ++i) times.push_back(call());
  std::sort(times.begin(), times.end());

  bool finite = true;
  for (ggml_tensor* o : outs) {
    const float* p = static_cast<const float*>(o->data);
    for (long i = 0, e = ggml_nelements(o); i < e; ++i) finite = finite && std::isfinite(p[i]);
  }
  std::printf("{\"seconds\": %.9g, \"min_seconds\": %.9g, \"reps\": %d, \"sets\": %d, \"kv_type\": \"%s\", "
              "\"ggml\": \"%s\", \"ggml_commit\": \"%s\", \"finite\": %s}\n",
              times[times.size() / 2], times.front(), r.reps, r.sets, r.kv_type.c_str(), ggml_version(),
              ggml_commit(), finite ? "true" : "false");
  ggml_free(ctx);
  return finite ? 0 : 1;
}
