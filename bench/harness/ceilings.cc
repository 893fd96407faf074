// attn bench: measuring the machine's ceilings (see ceilings.h). The vector loops are compiled once per
// instruction-set level of src/cpu/isa_list.h, each in its own namespace under its own `#pragma GCC target`
// (bench/harness/ceilings_unit.cc.in, generated per level as the kernels are); the CPU features decide which
// one runs. The AMX loop is assembly, here.
#include "ceilings.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "cpu/amx_tiles.h"
#include "cpu/cpu_features.h"
#include "cpu/isa_list.h"

namespace attn::tools {

// ---- the loops, per instruction set ---------------------------------------------------------------------

// One ceiling unit per line of cpu/isa_list.h.
#define ATTN_CEILING_DECLARE(name, target, vec, usable) \
  namespace ceiling_##name {                            \
  CeilingLoops loops();                                 \
  }
ATTN_VECTOR_ISAS(ATTN_CEILING_DECLARE)
#undef ATTN_CEILING_DECLARE

namespace {
// The loops of the last level of the list this CPU and OS allow (the list runs lowest first; sse2 always).
CeilingLoops best_loops(const cpu::CpuFeatures& f) {
  CeilingLoops best{};
#define ATTN_CEILING_PICK(name, target, vec, usable) \
  if (usable) best = ceiling_##name::loops();
  ATTN_VECTOR_ISAS(ATTN_CEILING_PICK)
#undef ATTN_CEILING_PICK
  return best;
}
}  // namespace

// AMX: written in assembly (the assembler knows the instructions whatever the compiler target), with the
// tile configuration of cpu/amx_tiles.h (an explicit ldtilecfg from memory). Four accumulator tiles
// (tmm0-3) are fed from two A tiles (tmm4, tmm5) and two B tiles (tmm6, tmm7); each tdpbf16ps is a
// 16x32 by 32x16 bf16 product: 2*16*16*32 flops.
namespace ceiling_amx {
constexpr double kFlops = 4 * 2.0 * 16 * 16 * 32;

// The caller must hold the AMX permission (cpu::request_amx()).
float tdp_loop(std::int64_t iters) {
  alignas(64) std::uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = static_cast<std::uint16_t>(0x3c00 + (i % 64));  // ~0.008..0.015
  alignas(64) float result[16 * 16];
  const long stride = 64;
#if defined(__x86_64__)
  cpu::load_tile_config_16x64();
  __asm__ volatile(
      "tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3\n\t"
      "tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5\n\t"
      "tileloadd (%0,%1,1), %%tmm6\n\ttileloadd (%0,%1,1), %%tmm7"
      :
      : "r"(operand), "r"(stride), "m"(*reinterpret_cast<const std::uint16_t(*)[16 * 32]>(operand)));
  for (std::int64_t n = 0; n < iters; ++n)
    __asm__ volatile(
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\ttdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  __asm__ volatile("tilestored %%tmm3, (%1,%2,1)\n\ttilerelease"
                   : "=m"(*reinterpret_cast<float(*)[16 * 16]>(result))
                   : "r"(result), "r"(stride));
#else
  (void)iters;
  result[0] = 0;
#endif
  return result[0];
}
}  // namespace ceiling_amx

// ---- measuring ------------------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

volatile float g_sink_f = 0;
volatile std::uint64_t g_sink_u = 0;

// Runs loop(iters) on `threads` threads at once and returns the wall time of the slowest.
template <class Loop>
double timed_parallel(int threads, std::int64_t iters, Loop loop) {
  const auto start = Clock::now();
  float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += loop(iters);
  const double t = seconds_since(start);
  g_sink_f = g_sink_f + sink;
  return t;
}

// Flops per second of `loop` (kFlops per iteration) on all threads: calibrate the iteration count on
// one thread to `trial_s` seconds, then keep the best of `trials` parallel trials.
template <class Loop>
std::vector<double> peak_rate(int threads, double flops_per_iter, double trial_s, int trials, Loop loop) {
  std::int64_t iters = 1000;
  for (;;) {  // calibrate: grow until a run takes at least a tenth of a trial
    const auto start = Clock::now();
    g_sink_f = g_sink_f + loop(iters);
    const double t = seconds_since(start);
    if (t >= trial_s / 10 || iters > (std::int64_t{1} << 40)) {
      iters = std::max<std::int64_t>(
          1, static_cast<std::int64_t>(static_cast<double>(iters) * trial_s / std::max(t, 1e-9)));
      break;
    }
    iters *= 4;
  }
  std::vector<double> rates;
  for (int trial = 0; trial < trials; ++trial) {
    const double t = timed_parallel(threads, iters, loop);
    rates.push_back(flops_per_iter * static_cast<double>(iters) * threads / t / 1e9);
  }
  return rates;
}

double best_of(const std::vector<double>& trials) {
  return trials.empty() ? 0.0 : *std::max_element(trials.begin(), trials.end());
}

// An anonymous mapping, with transparent huge pages asked for: first-touching a GiB in 4 KiB pages costs
// a quarter of a million page faults (seconds on a busy machine), in 2 MiB pages a few hundred.
class Mapping {
 public:
  Mapping(std::size_t bytes, bool huge_pages) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    data_ = p;
#ifdef MADV_HUGEPAGE
    if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  }
  ~Mapping() {
    if (data_) munmap(data_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

// Streaming read bandwidth: each thread sums its own contiguous slice (first touched by that thread), with each of
// the sums given (null entries skipped); a pass's rate is the fastest sum's.
using ReadSum = std::uint64_t (*)(const std::uint64_t*, std::int64_t);
std::vector<double> read_bandwidth(int threads, std::int64_t bytes, bool huge_pages, int passes,
                                   std::initializer_list<ReadSum> sums, double* setup_seconds) {
  const auto setup_start = Clock::now();
  const std::int64_t words = bytes / 8;
  Mapping buffer(static_cast<std::size_t>(words) * 8, huge_pages);
  if (!buffer.data()) return {};
  std::uint64_t* p = static_cast<std::uint64_t*>(buffer.data());
  const std::int64_t slice = words / threads / 32 * 32;  // a multiple of 32 words per thread
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), begin = t * slice;
    for (std::int64_t i = begin; i < begin + slice; ++i) p[i] = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  }
  *setup_seconds = seconds_since(setup_start);
  std::vector<double> rates;
  for (int pass = 0; pass < passes; ++pass) {
    double best = 0;
    for (ReadSum sum : sums) {
      if (!sum) continue;
      std::uint64_t total = 0;
      const auto start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
      total += sum(p + omp_get_thread_num() * slice, slice);
      const double t = seconds_since(start);
      g_sink_u = g_sink_u + total;
      best = std::max(best, static_cast<double>(slice * threads * 8) / t / 1e9);
    }
    rates.push_back(best);
  }
  return rates;
}

// The bandwidth buffer's size: twice the last-level cache and at least 256 MiB, but never more than a quarter of the
// free memory (8 MiB for quick ceilings), a multiple of 256 bytes per thread.
std::int64_t read_buffer_bytes(const CeilingOptions& options, int threads) {
  const std::int64_t llc = cpu::cpu_features().last_level_cache_bytes();
  std::int64_t bytes = std::max<std::int64_t>(2 * llc, std::int64_t{256} << 20);
  if (const std::int64_t avail = available_memory_bytes(); avail > 0) bytes = std::min(bytes, avail / 4);
  if (options.quick) bytes = std::int64_t{8} << 20;
  return std::max<std::int64_t>(bytes, std::int64_t{1} << 20) / (std::int64_t{256} * threads) * 256 * threads;
}

// Scattered read bandwidth: the buffer cut into chunks of `chunk` bytes (a multiple of 256) taken in one shuffled
// order, each thread summing whole chunks of its share of the order, on the hardware prefetchers alone and with
// every line of the chunks 32 KiB of reading ahead prefetched (prefetcht2, as the decode kernels prefetch their far
// rows); a pass's rate is the faster.
std::vector<double> scattered_read_bandwidth(int threads, std::int64_t bytes, std::int64_t chunk, bool huge_pages,
                                             int passes, ReadSum sum, double* setup_seconds) {
  const auto setup_start = Clock::now();
  Mapping buffer(static_cast<std::size_t>(bytes), huge_pages);
  if (!buffer.data() || !sum) return {};
  char* p = static_cast<char*>(buffer.data());
  const std::int64_t n = bytes / chunk;
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(12345));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {  // first touched by the thread that reads it
    std::uint64_t* words = reinterpret_cast<std::uint64_t*>(p + order[i] * chunk);
    for (std::int64_t w = 0; w < chunk / 8; ++w)
      words[w] = static_cast<std::uint64_t>(i * chunk + w) * 0x9e3779b97f4a7c15ull;
  }
  *setup_seconds = seconds_since(setup_start);
  const std::int64_t ahead = std::max<std::int64_t>(1, (std::int64_t{32} << 10) / chunk);  // chunks
  std::vector<double> rates;
  for (int pass = 0; pass < passes; ++pass) {
    double best = 0;
    for (const bool prefetch : {false, true}) {
      std::uint64_t total = 0;
      const auto start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
      {
        const std::int64_t t = omp_get_thread_num(), lo = n * t / threads, hi = n * (t + 1) / threads;
        for (std::int64_t i = lo; i < hi; ++i) {
          if (prefetch && i + ahead < hi) {
            const char* next = p + order[i + ahead] * chunk;
            for (std::int64_t off = 0; off < chunk; off += 64) __builtin_prefetch(next + off, 0, 1);
          }
          total += sum(reinterpret_cast<const std::uint64_t*>(p + order[i] * chunk), chunk / 8);
        }
      }
      const double t = seconds_since(start);
      g_sink_u = g_sink_u + total;
      best = std::max(best, static_cast<double>(n * chunk) / t / 1e9);
    }
    rates.push_back(best);
  }
  return rates;
}

Ceilings measure(const CeilingOptions& options) {
  const auto start = Clock::now();
  const cpu::CpuFeatures& f = cpu::cpu_features();
  Ceilings c;
  c.threads = std::max(1, options.threads);
  const double trial_s = options.quick ? 0.002 : 0.08;
  // Seven trials each: in one benchmark run three trials gave read ceilings of 52, 84 and 72 GB/s in three
  // processes on the same machine; the best of seven, measured once per run, is what the rows are judged by.
  const int trials = options.quick ? 1 : 7;

  const CeilingLoops loops = best_loops(f);
  c.fma_isa = loops.vec;
  c.fma_trials = peak_rate(c.threads, loops.fma_flops, trial_s, trials,
                           [&loops](std::int64_t n) { return loops.fma_loop(n, 1.0f); });
  c.fma_gflops = best_of(c.fma_trials);

  if (!f.amx_bf16_usable()) {
    c.amx_note = f.amx_tile && f.amx_bf16 ? "the OS does not enable AMX state (XCR0)" : "no AMX-BF16 on this CPU";
  } else if (const cpu::AmxRequest r = cpu::request_amx(); !r.ok) {
    c.amx_note = std::string("arch_prctl(ARCH_REQ_XCOMP_PERM) failed: ") + std::strerror(r.error);
  } else {
    c.amx_trials = peak_rate(c.threads, ceiling_amx::kFlops, trial_s / 2, trials,
                             [](std::int64_t n) { return ceiling_amx::tdp_loop(n); });
    c.amx_bf16_gflops = best_of(c.amx_trials);
  }

  if (!loops.dpbf16_loop) {
    c.bf16_dot_note = f.avx512_bf16 ? "the OS does not enable AVX-512 state" : "no AVX512-BF16 on this CPU";
  } else {
    c.bf16_dot_trials = peak_rate(c.threads, loops.dot_flops, trial_s, trials,
                                  [&loops](std::int64_t n) { return loops.dpbf16_loop(n, 1.0f); });
    c.bf16_dot_gflops = best_of(c.bf16_dot_trials);
  }

  const std::int64_t bytes = read_buffer_bytes(options, c.threads);
  c.read_buffer_bytes = bytes;
  c.huge_pages = options.huge_pages;
  c.read_trials = read_bandwidth(c.threads, bytes, options.huge_pages, trials, {loops.read_sum, loops.read_sum_prefetched},
                                 &c.read_setup_seconds);
  c.read_gbps = best_of(c.read_trials);
  c.seconds = seconds_since(start);
  return c;
}

}  // namespace

double spread(const std::vector<double>& trials) {
  if (trials.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(trials.begin(), trials.end());
  return *hi > 0 ? (*hi - *lo) / *hi : 0;
}

const Ceilings& measure_ceilings(const CeilingOptions& options) {
  static std::mutex mutex;
  static std::map<std::tuple<int, bool, bool>, std::unique_ptr<Ceilings>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{options.threads, options.quick, options.huge_pages}];
  if (!slot) slot = std::make_unique<Ceilings>(measure(options));
  return *slot;
}

namespace {
std::mutex g_scattered_mutex;
std::map<std::tuple<int, bool, bool, std::int64_t>, std::unique_ptr<ScatteredRead>> g_scattered;

// The cache's slot for a chunk size, rounded up to a multiple of 256 bytes (the read loop's unit).
std::unique_ptr<ScatteredRead>& scattered_slot(const CeilingOptions& options, std::int64_t chunk_bytes,
                                               std::int64_t* chunk) {
  *chunk = std::max<std::int64_t>(256, (chunk_bytes + 255) / 256 * 256);
  return g_scattered[{options.threads, options.quick, options.huge_pages, *chunk}];
}
}  // namespace

void give_scattered_read(const CeilingOptions& options, std::int64_t chunk_bytes, double gbps) {
  const std::lock_guard<std::mutex> lock(g_scattered_mutex);
  std::int64_t chunk = 0;
  auto& slot = scattered_slot(options, chunk_bytes, &chunk);
  slot = std::make_unique<ScatteredRead>();
  slot->chunk_bytes = chunk, slot->gbps = gbps, slot->given = true;
}

const ScatteredRead& measure_scattered_read(const CeilingOptions& options, std::int64_t chunk_bytes) {
  const std::lock_guard<std::mutex> lock(g_scattered_mutex);
  std::int64_t chunk = 0;
  auto& slot = scattered_slot(options, chunk_bytes, &chunk);
  if (!slot) {
    const auto start = Clock::now();
    slot = std::make_unique<ScatteredRead>();
    slot->chunk_bytes = chunk;
    const int threads = std::max(1, options.threads);
    const std::int64_t bytes = read_buffer_bytes(options, threads) / chunk * chunk;
    slot->trials = scattered_read_bandwidth(threads, bytes, chunk, options.huge_pages, options.quick ? 1 : 7,
                                            best_loops(cpu::cpu_features()).read_sum, &slot->setup_seconds);
    slot->gbps = best_of(slot->trials);
    slot->seconds = seconds_since(start);
  }
  return *slot;
}

// Bytes of memory the kernel says are free for new allocations (MemAvailable), 0 if unknown.
std::int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  std::int64_t value = 0;
  while (meminfo >> key >> value >> unit)
    if (key == "MemAvailable:") return value * 1024;
  return 0;
}

}  // namespace attn::tools
