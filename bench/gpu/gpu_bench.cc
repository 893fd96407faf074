// attn_gpu_bench: attn's CUDA forward on the shapes of bench/gpu/shapes.json, timed with CUDA events
// (`make test-gpu` runs it; bench/gpu/peers.py times PyTorch's SDPA backends on the same shapes and joins them).
// Each shape runs twice: "own" (Backend::flash, attn's own kernel) and "auto" (Backend::automatic: cuDNN where it
// takes the shape); shapes marked "backward" also time attention_backward (cuDNN's, deterministic; run twice, the
// same bits).
//
// For each shape: seeded random bf16 Q/K/V on the device (never zeros), the output poisoned with NaN, one checked
// call (every output element written and finite), then `--warmup` untimed calls and `--iters` timed ones, each
// between two events; the median is reported with FLOP/s (FlashAttention's count: 4·B·Hq·Sq·Skv·D, halved for a
// causal square) and the bytes the call must move (Q, K, V read once, O written once). With --dump DIR the inputs
// and the output of each shape are written as raw little-endian bf16 (<id>.q/.k/.v/.o) (<id>.auto.o for the automatic path's output)
// so that peers.py can judge attn's output against an fp64 reference at full size.
//
// usage: attn_gpu_bench --shapes FILE [--out FILE.json] [--dump DIR] [--warmup N] [--iters N] [--only ID,...]
// exit: 0 every shape ran and checked, 1 a shape failed, 2 bad usage, 77 no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/info.h"

namespace {

struct Shape {
  std::string id;
  std::int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, D = 64;
  bool causal = false;
  bool backward = false;  // also time attention_backward (cuDNN's, deterministic) on this shape
  std::int64_t page = 0;  // > 0: K/V in a shuffled pool of pages of this many keys (attention_paged)
};

// A deliberately small reader for the flat list of flat objects bench/gpu/shapes.json holds (the file is ours).
std::vector<Shape> read_shapes(const std::string& path, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = "--shapes: cannot read " + path;
    return {};
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<Shape> shapes;
  std::size_t pos = 0;
  while ((pos = text.find('{', pos + 1)) != std::string::npos) {
    const std::size_t end = text.find('}', pos);
    if (end == std::string::npos) break;
    const std::string obj = text.substr(pos, end - pos);
    auto field = [&](const char* key) -> std::string {
      const std::string k = std::string("\"") + key + "\"";
      std::size_t p = obj.find(k);
      if (p == std::string::npos) return "";
      p = obj.find(':', p) + 1;
      while (p < obj.size() && (obj[p] == ' ' || obj[p] == '"')) ++p;
      std::size_t e = p;
      while (e < obj.size() && obj[e] != ',' && obj[e] != '"' && obj[e] != '}' && obj[e] != '\n') ++e;
      return obj.substr(p, e - p);
    };
    Shape s;
    s.id = field("id");
    if (s.id.empty()) continue;  // the outer object
    s.B = std::stoll(field("B")), s.Hq = std::stoll(field("Hq")), s.Hkv = std::stoll(field("Hkv"));
    s.Sq = std::stoll(field("Sq")), s.Skv = std::stoll(field("Skv")), s.D = std::stoll(field("D"));
    s.causal = field("causal") == "true";
    s.backward = field("backward") == "true";
    const std::string page = field("page");
    s.page = page.empty() ? 0 : std::stoll(page);
    shapes.push_back(s);
    pos = end;
  }
  if (shapes.empty()) *error = "--shapes: no shapes in " + path;
  return shapes;
}

std::uint16_t to_bf16(float x) {  // round to nearest even (inputs are finite)
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}
float from_bf16(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Seeded values in (-1, 1) (splitmix64), so that a rerun feeds the same inputs.
std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint16_t> v(n);
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < n; ++i) {
    x += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v[i] = to_bf16(static_cast<float>(static_cast<double>(z >> 11) * 0x1p-53 * 2.0 - 1.0));
  }
  return v;
}

bool ok(cudaError_t e, const char* what, std::string* error) {
  if (e == cudaSuccess) return true;
  *error = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  return false;
}

struct Result {
  std::string kernel, error;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  double host_us = 0;  // median host time of one call (validation, launch): what a step of many small calls pays
  std::size_t nonfinite = 0;
};

// Text for a JSON string: double quotes and backslashes become single quotes and slashes (messages only).
std::string quoted(std::string s) {
  for (char& c : s) c = c == '"' ? '\'' : c == '\\' ? '/' : static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  return s;
}

bool write_raw(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  return static_cast<bool>(f);
}

// One shape through attention() with `backend` (flash: attn's own kernel; automatic: cuDNN where it takes the
// shape), or, with `backward`, through attention_backward() (dO random, the forward's O and LSE first).
Result run_shape(const Shape& s, attn::Backend backend, bool backward, int warmup, int iters, const std::string& dump) {
  Result r;
  const std::size_t nq = s.B * s.Hq * s.Sq * s.D, nk = s.B * s.Hkv * s.Skv * s.D;
  const std::vector<std::uint16_t> hq = random_bf16(nq, 1), hk = random_bf16(nk, 2), hv = random_bf16(nk, 3);
  std::vector<std::uint16_t> ho(nq, 0x7fc0);  // NaN
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr, *dout = nullptr, *dq = nullptr,
       *dk = nullptr, *dv = nullptr, *kp = nullptr, *vp = nullptr, *table = nullptr, *lens = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  auto cleanup = [&] {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(dout), cudaFree(dq), cudaFree(dk),
        cudaFree(dv), cudaFree(kp), cudaFree(vp), cudaFree(table), cudaFree(lens);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  };
  if (!ok(cudaMalloc(&q, nq * 2), "cudaMalloc q", &r.error) || !ok(cudaMalloc(&k, nk * 2), "cudaMalloc k", &r.error) ||
      !ok(cudaMalloc(&v, nk * 2), "cudaMalloc v", &r.error) || !ok(cudaMalloc(&o, nq * 2), "cudaMalloc out", &r.error) ||
      !ok(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice), "copy q", &r.error) ||
      !ok(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice), "copy k", &r.error) ||
      !ok(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice), "copy v", &r.error) ||
      !ok(cudaMemcpy(o, ho.data(), nq * 2, cudaMemcpyHostToDevice), "poison out", &r.error) ||
      !ok(cudaEventCreate(&start), "event", &r.error) || !ok(cudaEventCreate(&stop), "event", &r.error)) {
    cleanup();
    return r;
  }
  const attn::Device dev = attn::Device::cuda(0);
  const attn::TensorView tq = attn::TensorView::contiguous(q, attn::DType::bf16, {s.B, s.Hq, s.Sq, s.D}).on(dev);
  const attn::TensorView tk = attn::TensorView::contiguous(k, attn::DType::bf16, {s.B, s.Hkv, s.Skv, s.D}).on(dev);
  const attn::TensorView tv = attn::TensorView::contiguous(v, attn::DType::bf16, {s.B, s.Hkv, s.Skv, s.D}).on(dev);
  const attn::TensorView to = attn::TensorView::contiguous(o, attn::DType::bf16, {s.B, s.Hq, s.Sq, s.D}).on(dev);
  attn::Params p;
  p.causal = s.causal ? attn::Causal::bottom_right : attn::Causal::none;
  p.backend = backend;
  const std::size_t rows = static_cast<std::size_t>(s.B * s.Hq * s.Sq);
  attn::TensorView tl, tdo, tdq, tdk, tdv;
  if (backward) {
    const std::vector<std::uint16_t> hdo = random_bf16(nq, 4);
    if (!ok(cudaMalloc(&lse, rows * 4), "cudaMalloc lse", &r.error) || !ok(cudaMalloc(&dout, nq * 2), "cudaMalloc dout", &r.error) ||
        !ok(cudaMalloc(&dq, nq * 2), "cudaMalloc dq", &r.error) || !ok(cudaMalloc(&dk, nk * 2), "cudaMalloc dk", &r.error) ||
        !ok(cudaMalloc(&dv, nk * 2), "cudaMalloc dv", &r.error) ||
        !ok(cudaMemcpy(dout, hdo.data(), nq * 2, cudaMemcpyHostToDevice), "copy dout", &r.error) ||
        !ok(cudaMemset(dk, 0xff, nk * 2), "poison dk", &r.error)) {
      cleanup();
      return r;
    }
    tl = attn::TensorView::contiguous(lse, attn::DType::f32, {s.B, s.Hq, s.Sq}).on(dev);
    tdo = attn::TensorView::contiguous(dout, attn::DType::bf16, {s.B, s.Hq, s.Sq, s.D}).on(dev);
    tdq = attn::TensorView::contiguous(dq, attn::DType::bf16, {s.B, s.Hq, s.Sq, s.D}).on(dev);
    tdk = attn::TensorView::contiguous(dk, attn::DType::bf16, {s.B, s.Hkv, s.Skv, s.D}).on(dev);
    tdv = attn::TensorView::contiguous(dv, attn::DType::bf16, {s.B, s.Hkv, s.Skv, s.D}).on(dev);
    if (attn::Status st = attn::attention(tq, tk, tv, to, p, tl); !st) {
      r.error = "attention: " + st.message();
      cleanup();
      return r;
    }
  }
  // Paged: the same logical K/V in a pool of pages, sequence b's pages shuffled over the pool.
  attn::TensorView tkp, tvp, ttable, tlens;
  const bool paged = s.page > 0 && !backward;
  if (paged) {
    const std::int64_t per_seq = (s.Skv + s.page - 1) / s.page, pages = s.B * per_seq;
    std::vector<std::int32_t> htable(static_cast<std::size_t>(pages)), hlens(static_cast<std::size_t>(s.B), static_cast<std::int32_t>(s.Skv));
    for (std::int64_t n = 0; n < pages; ++n) htable[static_cast<std::size_t>(n)] = static_cast<std::int32_t>((n * 7919) % pages);
    const std::size_t pool = static_cast<std::size_t>(pages * s.Hkv * s.page * s.D);
    std::vector<std::uint16_t> hkp(pool, 0), hvp(pool, 0);
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t h = 0; h < s.Hkv; ++h)
        for (std::int64_t j = 0; j < s.Skv; ++j) {
          const std::int64_t page = htable[static_cast<std::size_t>(b * per_seq + j / s.page)];
          const std::size_t to_at = static_cast<std::size_t>(((page * s.Hkv + h) * s.page + j % s.page) * s.D);
          const std::size_t from = static_cast<std::size_t>(((b * s.Hkv + h) * s.Skv + j) * s.D);
          std::memcpy(&hkp[to_at], &hk[from], static_cast<std::size_t>(s.D) * 2);
          std::memcpy(&hvp[to_at], &hv[from], static_cast<std::size_t>(s.D) * 2);
        }
    if (!ok(cudaMalloc(&kp, pool * 2), "cudaMalloc k_pages", &r.error) || !ok(cudaMalloc(&vp, pool * 2), "cudaMalloc v_pages", &r.error) ||
        !ok(cudaMalloc(&table, htable.size() * 4), "cudaMalloc page_table", &r.error) ||
        !ok(cudaMalloc(&lens, hlens.size() * 4), "cudaMalloc seq_lens", &r.error) ||
        !ok(cudaMemcpy(kp, hkp.data(), pool * 2, cudaMemcpyHostToDevice), "copy k_pages", &r.error) ||
        !ok(cudaMemcpy(vp, hvp.data(), pool * 2, cudaMemcpyHostToDevice), "copy v_pages", &r.error) ||
        !ok(cudaMemcpy(table, htable.data(), htable.size() * 4, cudaMemcpyHostToDevice), "copy page_table", &r.error) ||
        !ok(cudaMemcpy(lens, hlens.data(), hlens.size() * 4, cudaMemcpyHostToDevice), "copy seq_lens", &r.error)) {
      cleanup();
      return r;
    }
    tkp = attn::TensorView::contiguous(kp, attn::DType::bf16, {pages, s.Hkv, s.page, s.D}).on(dev);
    tvp = attn::TensorView::contiguous(vp, attn::DType::bf16, {pages, s.Hkv, s.page, s.D}).on(dev);
    ttable = attn::TensorView::contiguous(table, attn::DType::i32, {s.B, per_seq}).on(dev);
    tlens = attn::TensorView::contiguous(lens, attn::DType::i32, {s.B}).on(dev);
  }
  const auto call = [&]() -> attn::Status {
    if (paged) return attn::attention_paged(tq, tkp, tvp, ttable, tlens, to, p);
    return backward ? attn::attention_backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, p) : attn::attention(tq, tk, tv, to, p);
  };
  attn::KernelInfo info;
  const attn::Status described =
      paged      ? attn::Status::Ok()
      : backward ? attn::describe_attention_backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, p, &info)
                 : attn::describe_attention(tq, tk, tv, to, p, std::nullopt, &info);
  if (!described) {
    r.error = "describe: " + described.message();
    cleanup();
    return r;
  }
  r.kernel = paged ? "attention_paged, page " + std::to_string(s.page) : info.kernel;
  if (attn::Status st = call(); !st) {
    r.error = (backward ? "attention_backward: " : "attention: ") + st.message();
    cleanup();
    return r;
  }
  if (!ok(cudaDeviceSynchronize(), "first call", &r.error) ||
      !ok(cudaMemcpy(ho.data(), backward ? dk : o, (backward ? nk : nq) * 2, cudaMemcpyDeviceToHost), "copy out", &r.error)) {
    cleanup();
    return r;
  }
  for (std::size_t e = 0; e < (backward ? nk : nq); ++e) r.nonfinite += !std::isfinite(from_bf16(ho[e]));
  if (backward) {  // bitwise determinism: a second run gives the same dK
    std::vector<std::uint16_t> again(nk);
    if (call().ok() && cudaMemcpy(again.data(), dk, nk * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
        std::memcmp(again.data(), ho.data(), nk * 2) != 0)
      r.error = "attention_backward: two runs gave different dK bits";
  }
  if (!dump.empty() && !backward) {
    const std::string base = dump + "/" + s.id;
    const std::string out = base + (backend == attn::Backend::flash ? ".o" : ".auto.o");
    if (!write_raw(base + ".q", hq.data(), nq * 2) || !write_raw(base + ".k", hk.data(), nk * 2) ||
        !write_raw(base + ".v", hv.data(), nk * 2) || !write_raw(out, ho.data(), nq * 2))
      r.error = "--dump: cannot write " + base + ".*";
  }
  for (int i = 0; i < warmup; ++i) (void)call();
  std::vector<double> ms, host;
  for (int i = 0; i < iters && r.error.empty(); ++i) {
    cudaEventRecord(start);
    const auto t0 = std::chrono::steady_clock::now();
    const attn::Status st = call();
    host.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    cudaEventRecord(stop);
    if (!st) r.error = "attention: " + st.message();
    if (!ok(cudaEventSynchronize(stop), "timed call", &r.error)) break;
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cleanup();
  if (!ms.empty()) {
    std::sort(ms.begin(), ms.end());
    r.median_ms = ms[ms.size() / 2], r.min_ms = ms.front(), r.max_ms = ms.back();
    std::sort(host.begin(), host.end());
    r.host_us = host[host.size() / 2];
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes_path, out_path, dump, only;
  int warmup = 5, iters = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "attn_gpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--shapes") shapes_path = value();
    else if (a == "--out") out_path = value();
    else if (a == "--dump") dump = value();
    else if (a == "--only") only = std::string(",").append(value()).append(",");
    else if (a == "--warmup") warmup = std::stoi(value());
    else if (a == "--iters") iters = std::max(1, std::stoi(value()));
    else {
      std::fprintf(stderr, "usage: attn_gpu_bench --shapes FILE [--out FILE.json] [--dump DIR] [--warmup N] "
                           "[--iters N] [--only ID,...]\n");
      return 2;
    }
  }
  std::string error;
  std::vector<Shape> shapes = read_shapes(shapes_path, &error);
  if (shapes.empty()) {
    std::fprintf(stderr, "attn_gpu_bench: %s\n", error.c_str());
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("attn_gpu_bench: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::ostringstream json;
  json << "{\n  \"program\": \"attn_gpu_bench\",\n  \"device\": \"" << prop.name << "\",\n  \"warmup\": " << warmup
       << ",\n  \"iters\": " << iters << ",\n  \"rows\": [";
  bool all_ok = true, first = true;
  std::printf("%-4s %-8s %-52s %10s %10s %9s %8s\n", "id", "path", "kernel", "median ms", "TFLOP/s", "GB/s", "host us");
  struct Run {
    const char* path;  // "own": Backend::flash; "auto": Backend::automatic (cuDNN where it takes the shape)
    attn::Backend backend;
    bool backward;
  };
  for (const Shape& s : shapes) {
    if (!only.empty() && only.find("," + s.id + ",") == std::string::npos) continue;
    std::vector<Run> runs{{"own", attn::Backend::flash, false}, {"auto", attn::Backend::automatic, false}};
    if (s.backward) runs.push_back({"backward", attn::Backend::automatic, true});
    for (const Run& run : runs) {
      const Result r = run_shape(s, run.backend, run.backward, warmup, iters, dump);
      const double square_causal = s.causal ? 0.5 : 1.0;  // FlashAttention's convention (exact for Sq = Skv)
      // The backward's count is FlashAttention's: 2.5 times the forward's (five products against two).
      const double flops = 4.0 * s.B * s.Hq * s.Sq * s.Skv * s.D * square_causal * (run.backward ? 2.5 : 1.0);
      const double bytes = 2.0 * (2.0 * s.B * s.Hq * s.Sq * s.D + 2.0 * s.B * s.Hkv * s.Skv * s.D) * (run.backward ? 2.0 : 1.0);
      const bool good = r.error.empty() && r.nonfinite == 0;
      all_ok &= good;
      const double tflops = good ? flops / (r.median_ms * 1e-3) / 1e12 : 0;
      const double gbps = good ? bytes / (r.median_ms * 1e-3) / 1e9 : 0;
      if (good)
        std::printf("%-4s %-8s %-52s %10.4f %10.1f %9.0f %8.1f\n", s.id.c_str(), run.path, r.kernel.c_str(), r.median_ms,
                    tflops, gbps, r.host_us);
      else
        std::printf("%-4s %-8s FAILED: %s (%zu non-finite outputs)\n", s.id.c_str(), run.path, r.error.c_str(), r.nonfinite);
      json << (first ? "\n" : ",\n") << "    {\"id\": \"" << s.id << "\", \"path\": \"" << run.path << "\", \"kernel\": \""
           << quoted(r.kernel) << "\", \"ok\": " << (good ? "true" : "false") << ", \"error\": \"" << quoted(r.error)
           << "\", \"nonfinite\": " << r.nonfinite << ", \"median_ms\": " << r.median_ms << ", \"min_ms\": " << r.min_ms
           << ", \"max_ms\": " << r.max_ms << ", \"host_us\": " << r.host_us << ", \"flops\": " << flops
           << ", \"bytes\": " << bytes << ", \"tflops\": " << tflops << ", \"gbps\": " << gbps << "}";
      first = false;
    }
  }
  json << "\n  ]\n}\n";
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    f << json.str();
  }
  return all_ok ? 0 : 1;
}
