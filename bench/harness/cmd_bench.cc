// attn bench: times attn::attention (or attn::attention_paged) on random inputs of a given or canonical
// shape and reports the median time, GFLOP/s, GB/s, the fractions of the machine's ceilings measured in
// the same process (bench/harness/ceilings.h) and the resident memory before, with and while running.
//
// Counting: flops = 2·(Dk + Dv)·Hq·(allowed (query, key) pairs), exact for the causal mask and ragged key
// lengths (flops_nominal is docs/DESIGN.md's 2·B·Hq·Sq·Skv·(Dk + Dv) with B·Skv the keys of all sequences, halved for
// causal when Sq = Skv);
// bytes = Q read + O written at their dtype + the K and V rows the keys use, read once, at the KV dtype (a
// latent shape's V is a view into K's rows: its K rows alone).
//
// --backward times attn::attention_backward instead (dQ, dK, dV from dO and the O and LSE of one forward run
// before the timing). Its flops follow the FlashAttention convention: 2.5x the forward's (five products of
// the forward's size: S = QKᵀ and dP = dO Vᵀ recomputed, dV, dK, dQ), whatever the kernel recomputes beyond
// them; bytes = Q, O, dO read and dQ written + K and V read and dK, dV written, once each.
#include <omp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ceilings.h"
#include "commands.h"
#include "core/convert.h"
#include "attn/info.h"
#include "canonical_shapes.h"
#include "json_writer.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

// A scattered-read ceiling as JSON: the page's bytes, the value, every trial and their spread, whether it was given.
JsonObject paged_read_json(const ScatteredRead& pr) {
  JsonObject o;
  o.add("chunk_bytes", pr.chunk_bytes).add("gbps", pr.gbps).add("trials", pr.trials);
  o.add("spread", spread(pr.trials)).add("given", pr.given).add("seconds", pr.seconds);
  return o;
}

// The ceilings as JSON: the values, every trial and their spread ((max - min) / max), and whether they were given.
JsonObject ceilings_json(const Ceilings& ceil) {
  JsonObject c;
  c.add("threads", ceil.threads).add("fma_gflops", ceil.fma_gflops).add("fma_isa", ceil.fma_isa);
  if (ceil.amx_bf16_gflops > 0) c.add("amx_bf16_gflops", ceil.amx_bf16_gflops);
  else c.add_null("amx_bf16_gflops");
  c.add("amx_note", ceil.amx_note);
  if (ceil.bf16_dot_gflops > 0) c.add("bf16_dot_gflops", ceil.bf16_dot_gflops);
  else c.add_null("bf16_dot_gflops");
  c.add("bf16_dot_note", ceil.bf16_dot_note);
  c.add("read_gbps", ceil.read_gbps).add("read_buffer_bytes", ceil.read_buffer_bytes);
  c.add("fma_trials", ceil.fma_trials).add("amx_trials", ceil.amx_trials).add("read_trials", ceil.read_trials);
  c.add("bf16_dot_trials", ceil.bf16_dot_trials);
  c.add("fma_spread", spread(ceil.fma_trials)).add("read_spread", spread(ceil.read_trials));
  c.add("given", ceil.given);
  c.add("huge_pages", ceil.huge_pages).add("seconds", ceil.seconds).add("read_setup_seconds", ceil.read_setup_seconds);
  return c;
}

using Clock = std::chrono::steady_clock;

// ---- shapes ----------------------------------------------------------------------------------------------

struct Shape {
  std::string name;
  std::int64_t B = 1, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, D = 0;  // D: Q's and K's head dim
  bool causal = false;          // bottom-right (the KV-cache alignment; the same as top-left when Sq = Skv)
  std::int64_t page_size = 0;   // 0: contiguous K/V; else attention_paged with pages of this many keys
  std::int64_t kv_len_min = 0;  // 0: every sequence has Skv keys; else lengths spread evenly kv_len_min..Skv
  std::int64_t Dv = 0;          // V's head dim
  bool latent = false;          // V is a view of the first Dv columns of K's rows (multi-head latent attention)
};

Shape from_table(const char* id, const shapes::Dims& d) {
  return {id, d.B, d.Hq, d.Hkv, d.Sq, d.Skv, d.D, d.causal, d.page_size, d.kv_len_min, shapes::value_dim(d), d.latent};
}

std::int64_t kv_len(const Shape& s, std::int64_t b) {
  return shapes::kv_len({s.B, s.Hq, s.Hkv, s.Sq, s.Skv, s.D, s.causal, s.page_size, s.kv_len_min}, b);
}

// Allowed (query, key) pairs of one (batch, head) with L keys: all, or bottom-right causal.
std::int64_t allowed_pairs(std::int64_t Sq, std::int64_t L, bool causal) {
  if (!causal) return Sq * L;
  std::int64_t pairs = 0;
  for (std::int64_t i = 0; i < Sq; ++i) pairs += std::clamp<std::int64_t>(i + L - Sq + 1, 0, L);
  return pairs;
}

// ---- measurements of the process ---------------------------------------------------------------------------

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), or of another such file (/proc/self/smaps_rollup's
// "AnonHugePages"), -1 if unavailable.
std::int64_t proc_status_bytes(const std::string& field, const char* file = "/proc/self/status") {
  std::ifstream status(file);
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      std::int64_t kib = -1;
      fields >> kib;
      return kib < 0 ? -1 : kib * 1024;
    }
  return -1;
}

// Resets the peak resident set size (VmHWM) to the current one (Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

std::int64_t maxrss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // kilobytes on Linux
}

// ---- buffers -------------------------------------------------------------------------------------------

// An input buffer, 64-byte aligned. From 2 MiB up it is its own anonymous mapping, with transparent huge
// pages asked for unless --no-huge-pages (in a VM, streaming through 4 KiB pages can cost more in nested
// page walks than the DRAM reads themselves; run_bench.py gives PyTorch's allocator the same advice).
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::int64_t bytes, bool huge_pages) {
    size_ = static_cast<std::size_t>((std::max<std::int64_t>(bytes, 1) + 63) / 64 * 64);
    if (size_ >= kMapThreshold) {
      void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
      if (huge_pages) madvise(p, size_, MADV_HUGEPAGE);
#endif
      data_ = static_cast<unsigned char*>(p);
      mapped_ = true;
    } else {
      data_ = static_cast<unsigned char*>(std::aligned_alloc(64, size_));
      if (!data_) throw std::bad_alloc();
    }
  }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(mapped_, other.mapped_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (!data_) return;
    if (mapped_) munmap(data_, size_);
    else std::free(data_);
  }
  unsigned char* get() const { return data_; }

 private:
  static constexpr std::size_t kMapThreshold = std::size_t{2} << 20;
  unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
};

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
void fill_chunk(T* p, std::int64_t n, std::uint64_t state) {
  for (std::int64_t i = 0; i < n; ++i) {
    state = splitmix(state);
    const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    p[i] = core::from_float<T>(2.0f * u - 1.0f);
  }
}

// Uniform values in [-1, 1), the same for a given seed whatever the thread count.
void fill_random(void* data, DType dtype, std::int64_t n, std::uint64_t seed, int threads) {
  constexpr std::int64_t kChunk = 1 << 16;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t begin = c * kChunk, count = std::min(kChunk, n - begin);
    const std::uint64_t state = splitmix(seed * 0x100000001b3ull + static_cast<std::uint64_t>(c));
    switch (dtype) {
      case DType::i8: {  // 8-bit K/V: integers in [-127, 127] (their scales are 1/127: values in [-1, 1])
        std::uint64_t st = state;
        for (std::int64_t i = 0; i < count; ++i) {
          if (i % 7 == 0) st = splitmix(st);  // 7 draws of 8 bits from each 64-bit number
          static_cast<std::int8_t*>(data)[begin + i] = static_cast<std::int8_t>(((st >> (8 * (i % 7))) & 0xFF) % 255 - 127);
        }
        break;
      }
      case DType::i4: {  // 4-bit K/V: n counts bytes here (two values each), any nibbles (scales 1/7)
        std::uint64_t st = state;
        for (std::int64_t i = 0; i < count; ++i) {
          if (i % 8 == 0) st = splitmix(st);
          static_cast<std::uint8_t*>(data)[begin + i] = static_cast<std::uint8_t>(st >> (8 * (i % 8)));
        }
        break;
      }
      case DType::bf16: fill_chunk(static_cast<core::bf16*>(data) + begin, count, state); break;
      case DType::f16: fill_chunk(static_cast<core::f16*>(data) + begin, count, state); break;
      default: fill_chunk(static_cast<float*>(data) + begin, count, state); break;
    }
  }
}

void fill_nan(void* data, DType dtype, std::int64_t n) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t i = 0; i < n; ++i) {
    if (dtype == DType::f32) static_cast<float*>(data)[i] = nan;
    else if (dtype == DType::bf16) static_cast<core::bf16*>(data)[i] = core::from_float<core::bf16>(nan);
    else static_cast<core::f16*>(data)[i] = core::from_float<core::f16>(nan);
  }
}

bool all_finite(const void* data, DType dtype, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    float x = 0;
    if (dtype == DType::f32) x = static_cast<const float*>(data)[i];
    else if (dtype == DType::bf16) x = core::to_float(static_cast<const core::bf16*>(data)[i]);
    else x = core::to_float(static_cast<const core::f16*>(data)[i]);
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// ---- text ---------------------------------------------------------------------------------------------

std::string fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) bytes /= 1024, ++u;
  return fmt(u == 0 ? "%.0f" : "%.1f", bytes) + " " + units[u];
}

std::string time_text(double s) {
  if (s >= 1) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.3f ms", s * 1e3);
  return fmt("%.1f us", s * 1e6);
}

std::string percent(double x) { return std::isfinite(x) ? fmt("%.0f%%", 100 * x) : "n/a"; }

// ---- the command ---------------------------------------------------------------------------------------

struct BenchArgs {
  std::string shapes;  // comma-separated canonical ids
  bool list_shapes = false;
  // kNotGiven: not given (B = 1, Hkv = Hq, Skv = Sq, Dv = head_dim; heads, q_len and head_dim have no default), so
  // that a 0 or a -1 given is refused like any other non-positive value
  static constexpr std::int64_t kNotGiven = std::numeric_limits<std::int64_t>::min();
  std::int64_t batch = kNotGiven, heads = kNotGiven, kv_heads = kNotGiven, q_len = kNotGiven, kv_len = kNotGiven,
               head_dim = kNotGiven, value_dim = kNotGiven;
  bool causal = false, latent = false;
  std::string dtype = "f32";
  std::optional<std::string> kv_dtype;  // not given: --dtype
  int threads = 0;
  std::int64_t paged = 0, kv_len_min = 0;
  int reps = 0;     // 0: enough for about a second, at least 3
  int kv_sets = 0;  // 0: automatic
  std::string backend = "flash";
  std::string label;
  bool json = false, no_ceilings = false, quick_ceilings = false, no_huge_pages = false;
  bool backward = false;
  bool ceilings_only = false;      // measure the ceilings, print them, run nothing
  std::vector<double> ceiling_values;  // given ceilings: FMA GFLOP/s, AMX bf16 GFLOP/s (0: none), read GB/s
  std::vector<std::int64_t> paged_read_chunks;  // scattered-read ceilings to measure up front (chunk bytes)
  std::vector<std::string> paged_read_values;   // given scattered-read ceilings, "BYTES:GBPS" each
  double softcap = 0;              // score variants: softcap (0 = off),
  bool alibi = false, sinks = false;  // ALiBi's geometric slopes, a sink of 0.5 per head
  double dropout = 0;                 // attention dropout probability (seed 1)
};

// kv: the K/V dtype, which may also be 8- or 4-bit (i8, int8; i4, int4).
Status parse_dtype(const std::string& text, const char* option, DType* dtype, bool kv = false) {
  if (text == "f32" || text == "fp32" || text == "float32") *dtype = DType::f32;
  else if (text == "bf16" || text == "bfloat16") *dtype = DType::bf16;
  else if (text == "f16" || text == "fp16" || text == "float16") *dtype = DType::f16;
  else if (kv && (text == "i8" || text == "int8")) *dtype = DType::i8;
  else if (kv && (text == "i4" || text == "int4")) *dtype = DType::i4;
  else return Status::Invalid(option, "'" + text + "'; expected f32, bf16" + (kv ? ", f16, int8 or int4" : " or f16"));
  return Status::Ok();
}

Status positive(std::int64_t value, const char* option) {
  if (value <= 0) return Status::Invalid(option, std::to_string(value) + "; expected a positive integer");
  return Status::Ok();
}

// "P1, P2, ..., M4": the canonical ids, for messages.
std::string shape_ids() {
  std::string ids;
  for (const shapes::Canonical& c : shapes::kCanonical) ids += (ids.empty() ? "" : ", ") + std::string(c.id);
  return ids;
}

bool given(std::int64_t option) { return option != BenchArgs::kNotGiven; }

// The shapes to run: the canonical ones named by --shape, else the one the dimension options describe.
Status shapes_of(const BenchArgs& a, std::vector<Shape>* shapes) {
  const bool dims =
      given(a.batch) || given(a.heads) || given(a.kv_heads) || given(a.q_len) || given(a.kv_len) || given(a.head_dim) ||
      given(a.value_dim) || a.causal || a.latent || a.paged || a.kv_len_min;
  if (!a.shapes.empty()) {
    if (dims)
      return Status::Invalid(
          "--shape", "'" + a.shapes +
                         "' together with dimension options; expected either --shape "
                         "or --batch/--heads/--kv-heads/--q-len/--kv-len/--head-dim/--value-dim/--latent/--causal/"
                         "--paged/--kv-len-min");
    std::stringstream list(a.shapes);
    std::string id;
    while (std::getline(list, id, ',')) {
      bool found = false;
      for (const shapes::Canonical& c : shapes::kCanonical)
        if (id == "all" || id == c.id) shapes->push_back(from_table(c.id, c.full)), found = true;
      if (!found) return Status::Invalid("--shape", "'" + id + "'; expected " + shape_ids() + " or all");
    }
    if (shapes->empty()) return Status::Invalid("--shape", "empty; expected " + shape_ids() + " or all");
    return Status::Ok();
  }
  if (!given(a.heads) || !given(a.q_len) || !given(a.head_dim))
    return Status::Invalid(!given(a.heads)   ? "--heads"
                           : !given(a.q_len) ? "--q-len"
                                             : "--head-dim",
                           "missing; expected --shape (" + shape_ids() + " or all), or at least --heads, --q-len "
                           "and --head-dim");
  Shape s;
  s.name = "custom";
  s.B = given(a.batch) ? a.batch : 1;
  s.Hq = a.heads;
  s.Hkv = given(a.kv_heads) ? a.kv_heads : a.heads;
  s.Sq = a.q_len;
  s.Skv = given(a.kv_len) ? a.kv_len : a.q_len;
  s.D = a.head_dim;
  s.Dv = given(a.value_dim) ? a.value_dim : a.head_dim;
  s.latent = a.latent;
  s.causal = a.causal;
  s.page_size = a.paged;
  s.kv_len_min = a.kv_len_min;
  if (Status st = positive(s.B, "--batch"); !st) return st;
  if (Status st = positive(s.Hq, "--heads"); !st) return st;
  if (Status st = positive(s.Hkv, "--kv-heads"); !st) return st;
  if (Status st = positive(s.Sq, "--q-len"); !st) return st;
  if (Status st = positive(s.Skv, "--kv-len"); !st) return st;
  if (Status st = positive(s.D, "--head-dim"); !st) return st;
  if (Status st = positive(s.Dv, "--value-dim"); !st) return st;
  // The library's limits (attn::kMaxHeadDim, kMaxExtent), named by the option here, not by the tensor they reach.
  for (const auto& [value, option] : {std::pair{s.D, "--head-dim"}, std::pair{s.Dv, "--value-dim"}})
    if (value > kMaxHeadDim)
      return Status::Invalid(option, std::to_string(value) + "; expected at most " + std::to_string(kMaxHeadDim) +
                                         " (attn::kMaxHeadDim)");
  for (const auto& [value, option] : {std::pair{s.B, "--batch"}, std::pair{s.Hq, "--heads"}, std::pair{s.Sq, "--q-len"},
                                      std::pair{s.Skv, "--kv-len"}})
    if (value > kMaxExtent)
      return Status::Invalid(option, std::to_string(value) + "; expected at most " + std::to_string(kMaxExtent) +
                                         " (attn::kMaxExtent)");
  if (s.latent && s.Dv > s.D)
    return Status::Invalid("--value-dim", std::to_string(s.Dv) + " with --latent; expected at most --head-dim (" +
                                              std::to_string(s.D) + "): V is the first columns of K's rows");
  if (s.Hq % s.Hkv != 0)
    return Status::Invalid("--kv-heads", std::to_string(s.Hkv) + " does not divide --heads " + std::to_string(s.Hq) +
                                             "; expected a divisor (Hkv = Hq: MHA, 1: MQA, between: GQA)");
  if (s.page_size < 0) return Status::Invalid("--paged", std::to_string(s.page_size) + "; expected a page size >= 1");
  if (s.kv_len_min < 0 || s.kv_len_min > s.Skv)
    return Status::Invalid("--kv-len-min", std::to_string(s.kv_len_min) + "; expected 1 .. --kv-len (" +
                                               std::to_string(s.Skv) + "), or 0 for equal lengths");
  shapes->push_back(s);
  return Status::Ok();
}

struct Setup {
  DType dtype = DType::f32, kv_dtype = DType::f32;
  int threads = 1;
  Backend backend = Backend::flash;
  bool huge_pages = true;
};

// Everything one run allocates: Q, O, the K/V sets it rotates through, and for paged runs the page
// table and lengths.
struct Inputs {
  Buffer q, out, lens, table;
  Buffer lse, dout, dq, dk, dv;  // --backward only
  std::vector<Buffer> k, v, k_scale, v_scale;  // scales: i8 and i4 K/V only
  TensorView qv, ov, lens_view, table_view;
  std::vector<TensorView> kv, vv, ksv, vsv;
  TensorView lse_view, dout_view, dq_view, dk_view, dv_view;
  std::int64_t kv_set_bytes = 0;
};

std::int64_t checked_mul(std::initializer_list<std::int64_t> factors) {
  std::int64_t r = 1;
  for (std::int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return std::numeric_limits<std::int64_t>::max();
  return r;
}

std::int64_t checked_add(std::initializer_list<std::int64_t> terms) {
  std::int64_t r = 0;
  for (std::int64_t t : terms)
    if (__builtin_add_overflow(r, t, &r)) return std::numeric_limits<std::int64_t>::max();
  return r;
}

// Rows of one K (or V) set: contiguous [B, Hkv, Skv], or the page pool's.
std::int64_t kv_rows(const Shape& s, std::int64_t* pool_pages) {
  if (s.page_size > 0) {
    std::int64_t pages = 0;
    for (std::int64_t b = 0; b < s.B; ++b) pages += (kv_len(s, b) + s.page_size - 1) / s.page_size;
    *pool_pages = pages;
    return checked_mul({pages, s.Hkv, s.page_size});
  }
  *pool_pages = 0;
  return checked_mul({s.B, s.Hkv, s.Skv});
}

// Scales per row of `dim` quantised values: i8 1, i4 one per kI4Block values, else 0.
std::int64_t scales_per_row(std::int64_t dim, DType kv_dtype) {
  return kv_dtype == DType::i8 ? 1 : kv_dtype == DType::i4 ? (dim + kI4Block - 1) / kI4Block : 0;
}

// Bytes of one stored K or V row of `dim` values with its f32 scales (i8, i4).
std::int64_t row_bytes(std::int64_t dim, DType kv_dtype) {
  return dtype_bytes(kv_dtype, dim) + 4 * scales_per_row(dim, kv_dtype);
}

// Bytes of one K/V set: contiguous [B, Hkv, Skv, D] and [B, Hkv, Skv, Dv], or the page pool's; for i8 and i4 K/V
// with their f32 scales (4 bytes each). A latent shape's V is a view of K: K's bytes alone.
std::int64_t kv_set_bytes(const Shape& s, DType kv_dtype, std::int64_t* pool_pages) {
  const std::int64_t per_row = row_bytes(s.D, kv_dtype) + (s.latent ? 0 : row_bytes(s.Dv, kv_dtype));
  return checked_mul({kv_rows(s, pool_pages), per_row});
}

Status make_inputs(const Shape& s, const Setup& setup, int sets, bool backward, Inputs* in) {
  const std::int64_t qsize = static_cast<std::int64_t>(dtype_size(setup.dtype));
  const std::int64_t kvsize = static_cast<std::int64_t>(dtype_size(setup.kv_dtype));
  const std::int64_t q_elems = checked_mul({s.B, s.Hq, s.Sq, s.D}), o_elems = checked_mul({s.B, s.Hq, s.Sq, s.Dv});
  std::int64_t pages = 0;
  in->kv_set_bytes = kv_set_bytes(s, setup.kv_dtype, &pages);

  in->q = Buffer(q_elems * qsize, setup.huge_pages);
  in->out = Buffer(o_elems * qsize, setup.huge_pages);
  fill_random(in->q.get(), setup.dtype, q_elems, 1, setup.threads);
  fill_nan(in->out.get(), setup.dtype, o_elems);  // poison: an element the kernel leaves unwritten shows
  in->qv = TensorView::contiguous(in->q.get(), setup.dtype, {s.B, s.Hq, s.Sq, s.D});
  in->ov = TensorView::contiguous(in->out.get(), setup.dtype, {s.B, s.Hq, s.Sq, s.Dv});

  const std::int64_t rows = kv_rows(s, &pages);
  const bool i4 = setup.kv_dtype == DType::i4;
  const std::int64_t lead = s.page_size > 0 ? pages : s.B, seq = s.page_size > 0 ? s.page_size : s.Skv;
  // One K (dim = D) or V (dim = Dv) set: random rows (i4 rows start on a byte), its views, its scales (1/127 for
  // i8, 1/7 for i4: values in [-1, 1] and [-8/7, 1]).
  const auto make_rows = [&](std::int64_t dim, std::uint64_t seed, std::vector<Buffer>* data,
                             std::vector<TensorView>* views, std::vector<Buffer>* scales,
                             std::vector<TensorView>* scale_views) {
    const std::int64_t pitch = i4 ? (dim + 1) / 2 * 2 : dim;
    const std::int64_t bytes = checked_mul({rows, dtype_bytes(setup.kv_dtype, pitch)});
    data->emplace_back(bytes, setup.huge_pages);
    fill_random(data->back().get(), setup.kv_dtype, i4 ? bytes : checked_mul({rows, dim}), seed, setup.threads);
    TensorView t = TensorView::contiguous(data->back().get(), setup.kv_dtype, {lead, s.Hkv, seq, dim});
    t.strides = {s.Hkv * seq * pitch, seq * pitch, pitch, 1};
    views->push_back(t);
    if (const std::int64_t per_row = scales_per_row(dim, setup.kv_dtype); per_row > 0) {
      scales->emplace_back(rows * per_row * 4, setup.huge_pages);
      std::fill_n(reinterpret_cast<float*>(scales->back().get()), rows * per_row, i4 ? 1.0f / 7 : 1.0f / 127);
      scale_views->push_back(i4 ? TensorView::contiguous(scales->back().get(), DType::f32, {lead, s.Hkv, seq, per_row})
                                : TensorView::contiguous(scales->back().get(), DType::f32, {lead, s.Hkv, seq}));
    }
  };
  for (int set = 0; set < sets; ++set) {
    make_rows(s.D, 1000 + 2 * set, &in->k, &in->kv, &in->k_scale, &in->ksv);
    if (!s.latent) {
      make_rows(s.Dv, 1001 + 2 * set, &in->v, &in->vv, &in->v_scale, &in->vsv);
      continue;
    }
    // Multi-head latent attention: V is the first Dv columns of K's rows, and their scales K's (i4: the first
    // ceil(Dv / 32) blocks of each row), views with K's strides: the one cache is read once.
    TensorView v = in->kv.back();
    v.shape[3] = s.Dv;
    in->vv.push_back(v);
    if (!in->ksv.empty()) {
      TensorView vs = in->ksv.back();
      if (i4) vs.shape[3] = scales_per_row(s.Dv, setup.kv_dtype);
      in->vsv.push_back(vs);
    }
  }

  if (backward) {  // dO random, the gradients poisoned; O and the LSE come from one forward run
    const std::int64_t dk_elems = checked_mul({s.B, s.Hkv, s.Skv, s.D});
    const std::int64_t dv_elems = checked_mul({s.B, s.Hkv, s.Skv, s.Dv});
    in->lse = Buffer(s.B * s.Hq * s.Sq * 4, setup.huge_pages);
    in->dout = Buffer(o_elems * qsize, setup.huge_pages);
    in->dq = Buffer(q_elems * qsize, setup.huge_pages);
    in->dk = Buffer(dk_elems * kvsize, setup.huge_pages);
    in->dv = Buffer(dv_elems * kvsize, setup.huge_pages);
    fill_random(in->dout.get(), setup.dtype, o_elems, 2, setup.threads);
    fill_nan(in->dq.get(), setup.dtype, q_elems);
    fill_nan(in->dk.get(), setup.kv_dtype, dk_elems);
    fill_nan(in->dv.get(), setup.kv_dtype, dv_elems);
    in->lse_view = TensorView::contiguous(in->lse.get(), DType::f32, {s.B, s.Hq, s.Sq});
    in->dout_view = TensorView::contiguous(in->dout.get(), setup.dtype, {s.B, s.Hq, s.Sq, s.Dv});
    in->dq_view = TensorView::contiguous(in->dq.get(), setup.dtype, {s.B, s.Hq, s.Sq, s.D});
    in->dk_view = TensorView::contiguous(in->dk.get(), setup.kv_dtype, {s.B, s.Hkv, s.Skv, s.D});
    in->dv_view = TensorView::contiguous(in->dv.get(), setup.kv_dtype, {s.B, s.Hkv, s.Skv, s.Dv});
  }
  if (s.page_size > 0 || s.kv_len_min > 0) {
    in->lens = Buffer(s.B * 4, false);
    auto* lens = reinterpret_cast<std::int32_t*>(in->lens.get());
    for (std::int64_t b = 0; b < s.B; ++b) lens[b] = static_cast<std::int32_t>(kv_len(s, b));
    in->lens_view = TensorView::contiguous(lens, DType::i32, {s.B});
  }
  if (s.page_size > 0) {
    // Each sequence's pages are scattered over the pool, as in a cache that has served many requests.
    const std::int64_t max_pages = (s.Skv + s.page_size - 1) / s.page_size;
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
    in->table = Buffer(s.B * max_pages * 4, false);
    auto* table = reinterpret_cast<std::int32_t*>(in->table.get());
    std::fill(table, table + s.B * max_pages, 0);  // past a sequence's last page: never read
    std::size_t next = 0;
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t n = 0; n < (kv_len(s, b) + s.page_size - 1) / s.page_size; ++n)
        table[b * max_pages + n] = order[next++];
    in->table_view = TensorView::contiguous(table, DType::i32, {s.B, max_pages});
  }
  return Status::Ok();
}

// params: the call's, or for i8 K/V one per set (with that set's scales; built before the timing).
Status call(const Shape& s, const Inputs& in, int set, const std::vector<Params>& per_set, bool backward) {
  const Params& params = per_set[per_set.size() == 1 ? 0 : static_cast<std::size_t>(set)];
  if (backward)
    return attention_backward(in.qv, in.kv[set], in.vv[set], in.ov, in.lse_view, in.dout_view, in.dq_view,
                              in.dk_view, in.dv_view, params);
  if (s.page_size > 0)
    return attention_paged(in.qv, in.kv[set], in.vv[set], in.table_view, in.lens_view, in.ov, params);
  return attention(in.qv, in.kv[set], in.vv[set], in.ov, params);
}

struct Result {
  std::vector<double> times;
  int warmup = 0;
  double median = 0;
  std::int64_t rss_before = -1, rss_inputs = -1, peak_rss = -1, maxrss = -1;
  std::int64_t huge_before = -1, huge_after = -1;  // anonymous memory on transparent huge pages
  bool peak_is_runs = false;
  bool output_finite = false;
};

// The CPU in a few words for the text report: the microarchitecture CPUID names, else the brand string (the JSON's
// "cpu" has the whole describe_cpu line).
std::string cpu_short_name() {
  const CpuInfo c = cpu_info();
  return !c.microarchitecture.empty() ? c.microarchitecture : !c.brand.empty() ? c.brand : "an unknown CPU";
}

// The largest cache level known (L3, else L2, else L1d; 0 when unknown).
std::int64_t last_level_cache_bytes() {
  const CpuInfo c = cpu_info();
  return c.l3_bytes ? c.l3_bytes : c.l2_bytes ? c.l2_bytes : c.l1d_bytes;
}

// How many K/V sets a run rotates through so that each run reads K/V from DRAM, not from the last-level
// cache: decode-like shapes (Sq <= 16) whose K/V would fit get enough sets to cover twice the LLC.
int choose_kv_sets(const Shape& s, std::int64_t set_bytes, int requested, std::int64_t other_bytes) {
  if (requested > 0) return requested;
  if (s.Sq > 16) return 1;
  const std::int64_t llc = last_level_cache_bytes();
  if (llc <= 0 || set_bytes <= 0) return 1;
  std::int64_t sets = std::min<std::int64_t>((2 * llc + set_bytes - 1) / set_bytes, 1024);
  if (const std::int64_t avail = available_memory_bytes(); avail > 0)
    sets = std::min<std::int64_t>(sets, std::max<std::int64_t>(1, (avail / 2 - other_bytes) / set_bytes));
  return static_cast<int>(std::max<std::int64_t>(sets, 1));
}

Status run_one(const Shape& s, const Setup& setup, const BenchArgs& a, const Ceilings* ceil, std::ostream& out) {
  const std::int64_t qsize = static_cast<std::int64_t>(dtype_size(setup.dtype));
  std::int64_t pool_pages = 0;
  const std::int64_t set_bytes = kv_set_bytes(s, setup.kv_dtype, &pool_pages);
  const std::int64_t q_bytes = checked_mul({s.B, s.Hq, s.Sq, s.D, qsize});
  const std::int64_t o_bytes = checked_mul({s.B, s.Hq, s.Sq, s.Dv, qsize});
  if (a.backward && s.latent)
    return Status::Invalid(a.shapes.empty() ? "--latent" : "--shape",
                           "a latent shape (" + s.name + ") with --backward; expected separate K and V (V as a view "
                           "into K's rows would take two gradients)");
  if (a.backward && s.page_size > 0)
    return Status::Invalid(a.shapes.empty() ? "--paged" : "--shape",
                           "a paged shape (" + s.name + ") with --backward; expected contiguous K/V (the backward "
                           "takes no page table)");
  if (a.backward && (setup.kv_dtype == DType::i8 || setup.kv_dtype == DType::i4))
    return Status::Invalid("--kv-dtype", std::string(setup.kv_dtype == DType::i8 ? "int8" : "int4") +
                                             " with --backward; expected f32, bf16 or f16 (quantised K/V have no "
                                             "backward)");
  const int sets = a.backward ? 1 : choose_kv_sets(s, set_bytes, a.kv_sets, checked_add({q_bytes, o_bytes}));
  const std::int64_t qo_bytes = checked_add({checked_mul({a.backward ? 2 : 1, q_bytes}),
                                             checked_mul({a.backward ? 3 : 1, o_bytes})});
  const std::int64_t kv_bytes = checked_mul({set_bytes, sets, a.backward ? 2 : 1});
  const std::int64_t need = checked_add({qo_bytes, kv_bytes});
  // (sizes past 2^63 bytes saturate at INT64_MAX: refused like any other size the memory cannot hold)
  constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max();
  const std::int64_t avail = available_memory_bytes();
  const auto fits = [&](std::int64_t bytes) { return bytes != kHuge && (avail <= 0 || bytes <= avail - avail / 8); };
  if (!fits(need)) {
    // The option to blame: the shape id; --kv-sets when one set would fit; else the largest size behind the larger
    // of Q/O and K/V.
    const char* option = !a.shapes.empty()                              ? "--shape"
                         : a.kv_sets > 1 && fits(checked_add({qo_bytes, set_bytes})) ? "--kv-sets"
                                                                        : nullptr;
    if (!option) {
      const std::pair<const char*, std::int64_t> qo[] = {{"--batch", s.B}, {"--heads", s.Hq}, {"--q-len", s.Sq},
                                                          {"--head-dim", s.D}, {"--value-dim", s.Dv}};
      const std::pair<const char*, std::int64_t> kv[] = {{"--batch", s.B}, {"--kv-heads", s.Hkv}, {"--kv-len", s.Skv},
                                                          {"--head-dim", s.D}, {"--value-dim", s.Dv}};
      const auto& sizes = qo_bytes > kv_bytes ? qo : kv;
      option = std::max_element(std::begin(sizes), std::end(sizes),
                                [](const auto& x, const auto& y) { return x.second < y.second; })->first;
    }
    return Status::Invalid(option, "the inputs need " +
                                       (need == kHuge ? std::string("more than 2^63 bytes")
                                                      : bytes_text(static_cast<double>(need))) +
                                       (avail > 0 ? " but only " + bytes_text(static_cast<double>(avail)) +
                                                        " of memory is available"
                                                  : std::string()) +
                                       "; expected a smaller shape or fewer --kv-sets");
  }

  Result r;
  r.rss_before = proc_status_bytes("VmRSS");
  r.huge_before = proc_status_bytes("AnonHugePages", "/proc/self/smaps_rollup");
  Inputs in;
  if (Status st = make_inputs(s, setup, sets, a.backward, &in); !st) return st;
  r.rss_inputs = proc_status_bytes("VmRSS");
  r.peak_is_runs = reset_peak_rss();

  Params params;
  params.threads = setup.threads;
  params.backend = setup.backend;
  if (s.causal) params.causal = Causal::bottom_right;
  if (s.kv_len_min > 0 && s.page_size == 0) params.kv_lens = in.lens_view;
  std::vector<float> slopes, sinks;
  params.softcap = a.softcap;
  if (a.alibi) {  // ALiBi's slopes 2^(-8(h+1)/Hq)
    for (std::int64_t h = 0; h < s.Hq; ++h) slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(s.Hq)));
    params.alibi_slopes = TensorView::contiguous(slopes.data(), DType::f32, {s.Hq});
  }
  if (a.sinks) {
    sinks.assign(static_cast<std::size_t>(s.Hq), 0.5f);
    params.sinks = TensorView::contiguous(sinks.data(), DType::f32, {s.Hq});
  }
  params.dropout_p = a.dropout;
  params.dropout_seed = 1;

  std::vector<Params> per_set{params};
  if (!in.ksv.empty()) {  // i8 / i4 K/V: each set's scales
    per_set.assign(in.ksv.size(), params);
    for (std::size_t set = 0; set < per_set.size(); ++set) per_set[set].k_scale = in.ksv[set], per_set[set].v_scale = in.vsv[set];
  }
  // The kernel the forward runs (attn/info.h; "" for the backward): its instructions set the compute bound below.
  std::string kernel;
  if (!a.backward) {
    KernelInfo info;
    const Status described =
        s.page_size == 0
            ? describe_attention(in.qv, in.kv[0], in.vv[0], in.ov, per_set[0], std::nullopt, &info)
            : describe_attention_paged(in.qv, in.kv[0], in.vv[0], in.table_view, in.lens_view, in.ov, per_set[0],
                                       std::nullopt, &info);
    if (described) kernel = info.kernel;
  }
  if (a.backward)  // the forward's O and LSE, which the backward reads
    if (Status st = attention(in.qv, in.kv[0], in.vv[0], in.ov, params, in.lse_view); !st) return with_option_names(st);
  // Warm-up: at least one call, and more while they take under 50 ms in all.
  int call_index = 0;
  double warm_total = 0, last = 0;
  do {
    const auto start = Clock::now();
    if (Status st = call(s, in, call_index % sets, per_set, a.backward); !st) return with_option_names(st);
    last = std::chrono::duration<double>(Clock::now() - start).count();
    warm_total += last;
    ++call_index;
  } while (warm_total < 0.05 && call_index < 20);
  r.warmup = call_index;
  const int reps =
      a.reps > 0 ? a.reps : static_cast<int>(std::clamp(std::ceil(1.0 / std::max(last, 1e-9)), 3.0, 100.0));
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = Clock::now();
    if (Status st = call(s, in, call_index % sets, per_set, a.backward); !st) return with_option_names(st);
    r.times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    ++call_index;
  }
  r.peak_rss = r.peak_is_runs ? proc_status_bytes("VmHWM") : maxrss_bytes();
  r.maxrss = maxrss_bytes();
  r.huge_after = proc_status_bytes("AnonHugePages", "/proc/self/smaps_rollup");
  const std::int64_t o_elems = checked_mul({s.B, s.Hq, s.Sq, s.Dv});
  r.output_finite = all_finite(in.out.get(), setup.dtype, o_elems);
  if (a.backward)
    r.output_finite = all_finite(in.dq.get(), setup.dtype, checked_mul({s.B, s.Hq, s.Sq, s.D})) &&
                      all_finite(in.dk.get(), setup.kv_dtype, checked_mul({s.B, s.Hkv, s.Skv, s.D})) &&
                      all_finite(in.dv.get(), setup.kv_dtype, checked_mul({s.B, s.Hkv, s.Skv, s.Dv}));
  std::vector<double> sorted = r.times;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  r.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);

  // Work and traffic.
  std::int64_t pairs = 0, kv_tokens = 0;
  for (std::int64_t b = 0; b < s.B; ++b) {
    pairs += allowed_pairs(s.Sq, kv_len(s, b), s.causal);
    kv_tokens += kv_len(s, b);
  }
  const double pass_factor = a.backward ? 2.5 : 1.0;  // the backward: FlashAttention's 2.5x the forward
  const double flops =
      pass_factor * 2.0 * static_cast<double>(s.D + s.Dv) * static_cast<double>(s.Hq) * static_cast<double>(pairs);
  const double nominal = pass_factor * 2.0 * static_cast<double>(s.Hq * s.Sq * (s.D + s.Dv)) *
                         static_cast<double>(kv_tokens) * (s.causal && s.Sq == s.Skv ? 0.5 : 1.0);
  // K/V bytes per token and KV head: the stored rows with their scales (i8, i4), what decode has to read (a latent
  // shape's V is in K's rows).
  const double kv_row_bytes = static_cast<double>(row_bytes(s.D, setup.kv_dtype) +
                                                  (s.latent ? 0 : row_bytes(s.Dv, setup.kv_dtype)));
  const double bytes = (a.backward ? 2.0 : 1.0) * (static_cast<double>(q_bytes + o_bytes) +
                                                   static_cast<double>(kv_tokens) * static_cast<double>(s.Hkv) *
                                                       kv_row_bytes);
  const double gflops = flops / r.median / 1e9, gbps = bytes / r.median / 1e9;
  // The share of the inputs' resident memory on transparent huge pages at the end of the runs (NaN where the
  // kernel does not say): streaming through 4 KiB pages in a VM can cost as much as the reads, so a slow run
  // shows here whether its inputs lacked them.
  const double huge_fraction =
      r.huge_before >= 0 && r.huge_after >= 0 && r.rss_inputs > r.rss_before
          ? std::clamp(static_cast<double>(r.huge_after - r.huge_before) / static_cast<double>(r.rss_inputs - r.rss_before), 0.0, 1.0)
          : std::numeric_limits<double>::quiet_NaN();

  // Fractions of the ceilings; the bound is the one the shape's arithmetic intensity hits first.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double frac_fma = nan, frac_amx = nan, frac_read = nan, frac_bound = nan, frac_dot = nan, frac_paged = nan;
  const ScatteredRead* paged_read = nullptr;  // paged shapes' page-sized scattered read, with the ceilings
  std::string bound = "unknown";
  if (ceil) {
    frac_fma = gflops / ceil->fma_gflops;
    frac_read = gbps / ceil->read_gbps;
    // (AMX only where the tile kernel runs)
    const bool amx = setup.dtype == DType::bf16 && ceil->amx_bf16_gflops > 0 && kernel == "amx";
    if (amx) frac_amx = gflops / ceil->amx_bf16_gflops;
    // bf16 rows against the bf16 dot-product peak too, where the CPU has one (the kernels' bound is the rate of
    // the instructions they run: AMX's, vdpbf16ps' for the "bf16 dot" prefill and the vector kernel's bf16-pair
    // decode, else fp32 FMAs)
    if (setup.dtype == DType::bf16 && ceil->bf16_dot_gflops > 0) frac_dot = gflops / ceil->bf16_dot_gflops;
    const bool dot = !amx && (kernel == "bf16 dot" || kernel == "vector (bf16 pairs)") && ceil->bf16_dot_gflops > 0;
    const double compute = amx ? ceil->amx_bf16_gflops : dot ? ceil->bf16_dot_gflops : ceil->fma_gflops;
    // Memory-bound: below the ridge point, and the data really come from DRAM (rotated K/V sets, or more
    // than the last-level cache); a small prefill below the ridge runs from cache, against compute.
    const bool from_dram = sets > 1 || bytes > static_cast<double>(last_level_cache_bytes());
    const bool memory_bound = flops / bytes < compute / ceil->read_gbps && from_dram;
    bound = memory_bound ? "memory" : amx ? "compute (AMX bf16)" : dot ? "compute (bf16 dot product)" : "compute (fp32 FMA)";
    frac_bound = memory_bound ? frac_read : amx ? frac_amx : dot ? frac_dot : frac_fma;
    // A paged cache is read a page of one head's rows at a time, at scattered places: judged also against reading
    // chunks of that size in a shuffled order (measured once per page size), which bounds it where streaming does
    // not (on a Zen 4 VM 2 KiB chunks read at about a third of the streaming rate).
    if (s.page_size > 0) {
      paged_read = &measure_scattered_read(CeilingOptions{setup.threads, a.quick_ceilings, setup.huge_pages},
                                           checked_mul({s.page_size, dtype_bytes(setup.kv_dtype, s.D)}));
      if (paged_read->gbps > 0) frac_paged = gbps / paged_read->gbps;
      if (memory_bound && std::isfinite(frac_paged)) bound = "memory (scattered pages)", frac_bound = frac_paged;
    }
  }
  const std::string isa = setup.backend == Backend::reference ? "reference" : attn::active_isa();
  const std::string label = a.label.empty() ? s.name : a.label;

  if (a.json) {
    JsonObject o;
    o.add("tool", "attn")
        .add("label", label)
        .add("shape", s.name)
        .add("backend", setup.backend == Backend::reference ? "reference" : "flash")
        .add("pass", a.backward ? "backward" : "forward")
        .add("isa", isa)
        .add("kernel", kernel)
        .add("cpu", describe_cpu(cpu_info()));
    o.add("B", s.B).add("Hq", s.Hq).add("Hkv", s.Hkv).add("Sq", s.Sq).add("Skv", s.Skv).add("Dk", s.D).add("Dv", s.Dv);
    o.add("latent", s.latent);
    o.add("causal", s.causal).add("dtype", dtype_name(setup.dtype)).add("kv_dtype", dtype_name(setup.kv_dtype));
    o.add("page_size", s.page_size).add("kv_len_min", s.kv_len_min).add("kv_tokens", kv_tokens);
    o.add("threads", setup.threads).add("warmup", r.warmup).add("reps", static_cast<int>(r.times.size()));
    o.add("kv_sets", sets).add("kv_set_bytes", set_bytes).add("huge_pages", setup.huge_pages);
    o.add("time_median_s", r.median).add("time_min_s", sorted.front()).add("time_max_s", sorted.back());
    o.add("times_s", r.times);
    o.add("flops", flops).add("flops_nominal", nominal).add("gflops", gflops).add("bytes", bytes).add("gbps", gbps);
    if (ceil) {
      o.add("ceilings", ceilings_json(*ceil));
    } else {
      o.add_null("ceilings");
    }
    o.add("frac_fma", frac_fma).add("frac_amx", frac_amx).add("frac_bf16_dot", frac_dot).add("frac_read_bw", frac_read);
    if (paged_read) {
      o.add("paged_read", paged_read_json(*paged_read));
    } else {
      o.add_null("paged_read");
    }
    o.add("frac_paged_read", frac_paged);
    o.add("bound", bound).add("frac_bound", frac_bound);
    o.add("rss_before_inputs_bytes", r.rss_before).add("rss_with_inputs_bytes", r.rss_inputs);
    o.add("peak_rss_bytes", r.peak_rss).add("extra_rss_bytes", r.peak_rss - r.rss_inputs);
    o.add("peak_rss_scope", r.peak_is_runs ? "runs" : "process").add("maxrss_bytes", r.maxrss);
    o.add("inputs_huge_page_fraction", huge_fraction);
    o.add("output_finite", r.output_finite);
    out << o.str() << std::endl;
    return Status::Ok();
  }

  out << label << ": B=" << s.B << " Hq=" << s.Hq << " Hkv=" << s.Hkv << " Sq=" << s.Sq << " Skv=" << s.Skv
      << (s.kv_len_min > 0 ? " (ragged " + std::to_string(s.kv_len_min) + ".." + std::to_string(s.Skv) + ")" : "")
      << (s.Dv == s.D ? " D=" + std::to_string(s.D) : " Dk=" + std::to_string(s.D) + " Dv=" + std::to_string(s.Dv))
      << (s.latent ? " latent (V in K's rows)" : "") << (s.causal ? " causal" : "")
      << (s.page_size ? " paged(" + std::to_string(s.page_size) + ")" : "") << (a.backward ? ", backward" : "")
      << ", q/out " << dtype_name(setup.dtype)
      << ", k/v " << dtype_name(setup.kv_dtype) << "; " << isa << (kernel.empty() ? "" : " (" + kernel + " kernel)")
      << ", " << setup.threads << " thread" << (setup.threads == 1 ? "" : "s") << " on " << cpu_short_name() << "\n";
  out << "  time     median " << time_text(r.median) << " (min " << time_text(sorted.front()) << ", max "
      << time_text(sorted.back()) << "; " << r.times.size() << (r.times.size() == 1 ? " rep" : " reps") << " after "
      << r.warmup << " warm-up"
      << (sets > 1 ? "; rotating " + std::to_string(sets) + " K/V sets of " + bytes_text(static_cast<double>(set_bytes))
                   : std::string())
      << ")\n";
  out << "  compute  " << fmt("%.1f", gflops) << " GFLOP/s";
  if (ceil) {
    out << " = " << percent(frac_fma) << " of peak fp32 FMA (" << fmt("%.0f", ceil->fma_gflops) << " GFLOP/s, "
        << ceil->fma_isa << ")";
    if (std::isfinite(frac_amx))
      out << ", " << percent(frac_amx) << " of AMX bf16 (" << fmt("%.0f", ceil->amx_bf16_gflops) << ")";
    if (std::isfinite(frac_dot))
      out << ", " << percent(frac_dot) << " of bf16 dot product (" << fmt("%.0f", ceil->bf16_dot_gflops) << ")";
  }
  out << "   [" << fmt("%.4g", flops) << " flops, exact pair count" << (a.backward ? ", 2.5x the forward's" : "")
      << "]\n";
  out << "  memory   " << fmt("%.2f", gbps) << " GB/s";
  if (ceil) out << " = " << percent(frac_read) << " of streaming read (" << fmt("%.1f", ceil->read_gbps) << " GB/s)";
  if (paged_read && std::isfinite(frac_paged))
    out << ", " << percent(frac_paged) << " of reading " << bytes_text(static_cast<double>(paged_read->chunk_bytes))
        << " pages scattered (" << fmt("%.1f", paged_read->gbps) << " GB/s)";
  out << "   [" << bytes_text(bytes)
      << (a.backward ? " of Q, K, V, O, dO read and dQ, dK, dV written]\n" : " of Q, K, V read and O written]\n");
  if (ceil) out << "  bound    " << bound << ": " << percent(frac_bound) << " of that ceiling\n";
  out << "  RSS      " << bytes_text(static_cast<double>(r.rss_before)) << " before inputs, "
      << bytes_text(static_cast<double>(r.rss_inputs)) << " with inputs, peak "
      << bytes_text(static_cast<double>(r.peak_rss)) << (r.peak_is_runs ? " while running" : " (process)") << " = +"
      << bytes_text(static_cast<double>(r.peak_rss - r.rss_inputs)) << " working memory";
  if (std::isfinite(huge_fraction)) out << "; inputs " << percent(huge_fraction) << " on huge pages";
  out << "\n";
  if (!r.output_finite) out << "  WARNING  the output has non-finite elements\n";
  return Status::Ok();
}

// --list-shapes: the canonical table, one JSON object per shape, its full and its tiny dimensions.
void list_shapes(std::ostream& out) {
  const auto dims = [](const shapes::Dims& d) {
    JsonObject j;
    j.add("B", d.B).add("Hq", d.Hq).add("Hkv", d.Hkv).add("Sq", d.Sq).add("Skv", d.Skv).add("D", d.D);
    j.add("Dv", shapes::value_dim(d)).add("latent", d.latent);
    return j.add("causal", d.causal).add("page_size", d.page_size).add("kv_len_min", d.kv_len_min);
  };
  for (const shapes::Canonical& c : shapes::kCanonical)
    out << JsonObject().add("id", c.id).add("what", c.what).add("full", dims(c.full)).add("tiny", dims(c.tiny)).str()
        << "\n";
}

Status bench(const BenchArgs& a, std::ostream& out) {
  if (a.list_shapes) {
    list_shapes(out);
    return Status::Ok();
  }
  std::vector<Shape> shapes;
  if (!a.ceilings_only)
    if (Status s = shapes_of(a, &shapes); !s) return s;
  Setup setup;
  if (Status s = parse_dtype(a.dtype, "--dtype", &setup.dtype); !s) return s;
  setup.kv_dtype = setup.dtype;
  if (a.kv_dtype)
    if (Status s = parse_dtype(*a.kv_dtype, "--kv-dtype", &setup.kv_dtype, /*kv=*/true); !s) return s;
  if (a.threads < 0 || a.threads > 4096)
    return Status::Invalid("--threads", std::to_string(a.threads) + "; expected 0 (the default) or 1 to 4096");
  setup.threads = attn::resolve_threads(a.threads);
  if (a.reps < 0) return Status::Invalid("--reps", std::to_string(a.reps) + "; expected >= 1, or 0 for automatic");
  if (a.kv_sets < 0 || a.kv_sets > 4096)
    return Status::Invalid("--kv-sets", std::to_string(a.kv_sets) + "; expected 1 to 4096, or 0 for automatic");
  if (a.backend == "flash" || a.backend == "auto") setup.backend = Backend::flash;
  else if (a.backend == "reference") setup.backend = Backend::reference;
  else return Status::Invalid("--backend", "'" + a.backend + "'; expected flash or reference");

  setup.huge_pages = !a.no_huge_pages;

  const Ceilings* ceil = nullptr;
  Ceilings given;
  if (!a.ceiling_values.empty()) {
    const std::vector<double>& v = a.ceiling_values;
    if ((v.size() != 3 && v.size() != 4) || !(v[0] > 0) || !(v[1] >= 0) || !(v[2] > 0) ||
        (v.size() == 4 && !(v[3] >= 0)))
      return Status::Invalid("--ceiling-values", "expected three or four numbers FMA,AMX,READ[,DOT]: GFLOP/s > 0, "
                                                 "GFLOP/s >= 0 (0: no AMX), GB/s > 0, GFLOP/s >= 0 (0: no bf16 dot "
                                                 "product)");
    if (a.no_ceilings) return Status::Invalid("--ceiling-values", "given with --no-ceilings; expected one of them");
    given.threads = setup.threads, given.fma_gflops = v[0], given.amx_bf16_gflops = v[1], given.read_gbps = v[2];
    given.given = true, given.huge_pages = setup.huge_pages;
    given.amx_note = v[1] > 0 ? "" : "given as 0";
    given.bf16_dot_gflops = v.size() == 4 ? v[3] : 0;
    given.bf16_dot_note = given.bf16_dot_gflops > 0 ? "" : "not given";
    given.fma_isa = "given";
    ceil = &given;
  } else if (!a.no_ceilings) {
    ceil = &measure_ceilings(CeilingOptions{setup.threads, a.quick_ceilings, setup.huge_pages});
  }
  // Scattered-read ceilings of paged runs: given (BYTES:GBPS), or measured up front for the chunk sizes asked.
  const CeilingOptions options{setup.threads, a.quick_ceilings, setup.huge_pages};
  for (const std::string& v : a.paged_read_values) {
    const std::size_t colon = v.find(':');
    char* end = nullptr;
    const long long bytes = colon == std::string::npos ? 0 : std::strtoll(v.c_str(), &end, 10);
    const bool bytes_ok = colon != std::string::npos && end == v.c_str() + colon && bytes >= 1 && bytes <= (1LL << 30);
    const double gbps = bytes_ok ? std::strtod(v.c_str() + colon + 1, &end) : 0;
    if (!bytes_ok || end != v.c_str() + v.size() || !(gbps > 0) || !std::isfinite(gbps))
      return Status::Invalid("--paged-read-values",
                             "'" + v + "'; expected BYTES:GBPS (a page's bytes, 1 to 2^30; GB/s > 0)");
    if (!ceil) return Status::Invalid("--paged-read-values", "given with --no-ceilings; expected one of them");
    give_scattered_read(options, bytes, gbps);
  }
  std::vector<const ScatteredRead*> asked;
  for (const std::int64_t bytes : a.paged_read_chunks) {
    if (bytes < 1 || bytes > (std::int64_t{1} << 30))
      return Status::Invalid("--paged-read-chunks", std::to_string(bytes) + "; expected 1 to 2^30 bytes");
    if (!ceil) return Status::Invalid("--paged-read-chunks", "given with --no-ceilings; expected one of them");
    asked.push_back(&measure_scattered_read(options, bytes));
  }
  if (a.ceilings_only) {
    if (!ceil) return Status::Invalid("--ceilings-only", "given with --no-ceilings; expected one of them");
    if (a.json) {
      JsonObject o;
      o.add("tool", "attn").add("ceilings", ceilings_json(*ceil));
      std::string list = "[";
      for (const ScatteredRead* pr : asked) list += (list.size() > 1 ? "," : "") + paged_read_json(*pr).str();
      o.raw("paged_read", list + "]");
      out << o.str() << std::endl;
      return Status::Ok();
    }
  }
  if (ceil && !a.json)
    out << "ceilings (" << ceil->threads << " thread" << (ceil->threads == 1 ? "" : "s") << ", measured in "
        << fmt("%.2f", ceil->seconds) << " s, " << fmt("%.2f", ceil->read_setup_seconds)
        << " s of it filling the bandwidth buffer): fp32 FMA " << fmt("%.1f", ceil->fma_gflops) << " GFLOP/s ("
        << ceil->fma_isa << "), AMX bf16 "
        << (ceil->amx_bf16_gflops > 0 ? fmt("%.0f GFLOP/s", ceil->amx_bf16_gflops) : "n/a: " + ceil->amx_note)
        << ", bf16 dot product "
        << (ceil->bf16_dot_gflops > 0 ? fmt("%.0f GFLOP/s", ceil->bf16_dot_gflops) : "n/a: " + ceil->bf16_dot_note)
        << ", streaming read " << fmt("%.1f", ceil->read_gbps) << " GB/s ("
        << bytes_text(double(ceil->read_buffer_bytes)) << " buffer); best of " << ceil->read_trials.size()
        << " trials, spread " << fmt("%.0f", 100 * spread(ceil->fma_trials)) << " % (FMA), "
        << fmt("%.0f", 100 * spread(ceil->read_trials)) << " % (read)" << (ceil->given ? "; given, not measured" : "")
        << "\n";
  if (!a.json)
    for (const ScatteredRead* pr : asked)
      out << "scattered read of " << bytes_text(static_cast<double>(pr->chunk_bytes)) << " pages: "
          << fmt("%.1f", pr->gbps) << " GB/s" << (pr->given ? " (given)" : "") << "\n";
  if (a.ceilings_only) return Status::Ok();
  for (const Shape& s : shapes)
    if (Status st = run_one(s, setup, a, ceil, out); !st) return st;
  return Status::Ok();
}

}  // namespace

void add_bench_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Time attention on random inputs: median time, GFLOP/s, GB/s, fractions of the ceilings (peak FMA, "
      "AMX, streaming read) measured in the same run, and resident memory");
  sub->add_option("--shape", a->shapes,
                  "Canonical shape(s) of docs/DESIGN.md (tools/canonical_shapes.h), comma-separated: "
                  "P1,P2,P3,D1,D2,D3,X1, the MLA decodes M1,M2,M3,M4, or all")
      ->type_name("IDS");
  sub->add_flag("--list-shapes", a->list_shapes,
                "Print the canonical shapes (full and tiny stand-in dimensions) as JSON lines, and exit");
  sub->add_option("--batch", a->batch, "Batch size B (default 1)")->type_name("B");
  sub->add_option("--heads", a->heads, "Query heads Hq")->type_name("HQ");
  sub->add_option("--kv-heads", a->kv_heads, "Key/value heads Hkv, dividing Hq (default Hq)")->type_name("HKV");
  sub->add_option("--q-len", a->q_len, "Queries per sequence Sq")->type_name("SQ");
  sub->add_option("--kv-len", a->kv_len, "Keys per sequence Skv (default Sq); the longest with --kv-len-min")
      ->type_name("SKV");
  sub->add_option("--head-dim", a->head_dim, "Head dimension D of Q and K (and V, unless --value-dim)")->type_name("D");
  sub->add_option("--value-dim", a->value_dim, "Head dimension of V (default: --head-dim)")->type_name("DV");
  sub->add_flag("--latent", a->latent,
                "Multi-head latent attention: V is a view of the first --value-dim columns of K's rows (one cache)");
  sub->add_flag("--causal", a->causal, "Causal mask, bottom-right aligned (top-left when Sq = Skv)");
  sub->add_option("--dtype", a->dtype, "Q and O dtype: f32 (default), bf16 or f16")->type_name("DTYPE");
  sub->add_option("--kv-dtype", a->kv_dtype, "K and V dtype (default: --dtype)")->type_name("DTYPE");
  sub->add_option("--threads", a->threads, "Threads for attn and for the ceilings (0 = attn's default)")
      ->type_name("N");
  sub->add_option("--paged", a->paged, "Use attention_paged with pages of this many keys, scattered over the pool")
      ->type_name("PAGE_SIZE");
  sub->add_option("--kv-len-min", a->kv_len_min,
                  "Ragged key lengths spread evenly from this (first sequence) to --kv-len (last)")
      ->type_name("N");
  sub->add_option("--reps", a->reps, "Timed repetitions after the warm-up (default: about 1 s worth, 3 to 100)")
      ->type_name("R");
  sub->add_option("--kv-sets", a->kv_sets,
                  "K/V sets rotated between runs (default: decode shapes get enough to cover 2x the last-level cache)")
      ->type_name("N");
  sub->add_option("--backend", a->backend, "flash (default) or reference (fp64, materialises the scores)")
      ->type_name("NAME");
  sub->add_option("--label", a->label, "Name to report for this run (default: the shape id or 'custom')")
      ->type_name("TEXT");
  sub->add_flag("--backward", a->backward,
                "Time attention_backward (dQ, dK, dV from dO and one forward's O and LSE); flops = 2.5x the forward's");
  sub->add_option("--softcap", a->softcap, "Score variant: logit soft-capping at C (0 = off)")->type_name("C");
  sub->add_flag("--alibi", a->alibi, "Score variant: ALiBi biases with the geometric slopes 2^(-8(h+1)/Hq)");
  sub->add_flag("--sinks", a->sinks, "Score variant: an attention sink of logit 0.5 per head");
  sub->add_option("--dropout", a->dropout, "Attention dropout with this probability in [0, 1) (seed 1)")->type_name("P");
  sub->add_flag("--json", a->json, "Print one JSON object per run (fields: see docs/benchmarks.md)");
  sub->add_flag("--no-ceilings", a->no_ceilings, "Skip measuring the machine's ceilings (fractions become null)");
  sub->add_flag("--ceilings-only", a->ceilings_only, "Measure the ceilings (best of 7 trials each), print them, run nothing");
  sub->add_option("--ceiling-values", a->ceiling_values,
                  "Judge the runs against these ceilings instead of measuring them (bench/run_bench.py measures once "
                  "per run): FMA GFLOP/s, AMX bf16 GFLOP/s (0: none), streaming read GB/s[, bf16 dot-product "
                  "GFLOP/s (0 or left out: none)]")
      ->delimiter(',')
      ->type_name("FMA,AMX,READ[,DOT]");
  sub->add_option("--paged-read-chunks", a->paged_read_chunks,
                  "Measure the scattered-read ceilings of pages of these sizes up front (with --ceilings-only: "
                  "print them; bench/run_bench.py measures them once per run)")
      ->delimiter(',')
      ->type_name("BYTES,...");
  sub->add_option("--paged-read-values", a->paged_read_values,
                  "Judge paged runs against these scattered-read ceilings instead of measuring them: a page's bytes "
                  "and GB/s each")
      ->delimiter(',')
      ->type_name("BYTES:GBPS,...");
  sub->add_flag("--no-huge-pages", a->no_huge_pages,
                "Do not ask for transparent huge pages for the inputs and the bandwidth buffer");
  sub->add_flag("--quick-ceilings", a->quick_ceilings, "Measure the ceilings with tiny loops and buffer (for tests)")
      ->group("");  // hidden
  on_run(sub, [a, &out] { return bench(*a, out); });
}

}  // namespace attn::tools
