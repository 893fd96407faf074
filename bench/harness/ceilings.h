// attn bench: the machine's ceilings, measured in the same process as the runs they judge.
//   - peak fp32 FMA rate: a register-only loop of independent multiply-adds, compiled per instruction
//     set (the best one the CPU and OS allow), on every thread at once;
//   - peak AMX bf16 rate (tdpbf16ps on tiles that stay in the tile registers), where the CPU has AMX;
//   - peak bf16 dot-product rate (vdpbf16ps on registers), where the CPU has AVX512-BF16;
//   - streaming read bandwidth: every thread sums its slice of a buffer far larger than the last-level
//     cache, once on the hardware prefetchers alone and once prefetching every line 32 KiB ahead (as the decode
//     kernels do); a trial's rate is the faster of the two.
// Each is the best of several short trials (the ceiling is what the machine can do, so the fastest
// trial is the estimate; noise only ever slows a trial down); every trial is kept, so a report can give the
// spread. bench/run_bench.py measures them once per benchmark run (`attn bench --ceilings-only`) and hands the
// values to every later invocation (--ceiling-values), so that every row of a table is judged against the same
// ceiling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::tools {

struct CeilingOptions {
  int threads = 1;
  bool quick = false;      // tiny buffer and loops: exercises the code in tests, the numbers mean little
  bool huge_pages = true;  // ask for transparent huge pages for the bandwidth buffer
};

struct Ceilings {
  int threads = 1;
  double fma_gflops = 0;       // fp32; an FMA counts as 2 flops (SSE2 has none: a mul plus an add)
  std::string fma_isa;         // "avx512", "avx2" or "sse2"
  double amx_bf16_gflops = 0;  // 0 when not measured
  std::string amx_note;        // why AMX was not measured ("" when it was)
  double bf16_dot_gflops = 0;  // AVX512-BF16 vdpbf16ps (a pair product and its sum: 4 flops per lane); 0 when not
  std::string bf16_dot_note;   // why it was not measured ("" when it was)
  double read_gbps = 0;        // 1e9 bytes per second
  std::int64_t read_buffer_bytes = 0;
  bool huge_pages = true;
  std::vector<double> fma_trials, amx_trials, read_trials, bf16_dot_trials;  // every trial; empty when given
  bool given = false;             // the values came from --ceiling-values, not measured in this process
  double seconds = 0;             // time spent measuring all of them
  double read_setup_seconds = 0;  // of which allocating and first-touching the bandwidth buffer
};

// (max - min) / max over trials: 0 for one trial or none.
double spread(const std::vector<double>& trials);

// Measured on the first call for a given `options`, then cached for the life of the process.
const Ceilings& measure_ceilings(const CeilingOptions& options);

// Reading a paged cache: its pages are chunks of page_size rows at scattered places, and on a VM reading 2 KiB chunks
// in a shuffled order ran at a third of the streaming rate (2-core Zen 4, bench/results_zen4_paged_read.md), so a
// paged decode is judged against this too: every thread sums whole chunks of chunk_bytes (rounded up to 256) of a
// buffer as large as the streaming one's, in one shuffled order, on the hardware prefetchers alone and prefetching
// every line 32 KiB ahead; the best of several trials.
struct ScatteredRead {
  std::int64_t chunk_bytes = 0;
  double gbps = 0;
  std::vector<double> trials;  // empty when given
  bool given = false;          // from --paged-read-values (run_bench.py measures once per run), not measured here
  double seconds = 0, setup_seconds = 0;
};
// Measured on the first call for given options and chunk size (unless given first), then cached for the life of
// the process.
const ScatteredRead& measure_scattered_read(const CeilingOptions& options, std::int64_t chunk_bytes);
// The value later calls for this chunk size return instead of measuring it.
void give_scattered_read(const CeilingOptions& options, std::int64_t chunk_bytes, double gbps);

// Bytes of memory the kernel says are free for new allocations (MemAvailable), 0 if unknown.
std::int64_t available_memory_bytes();

// What each instruction-set level's ceiling unit (ceilings_unit.cc.in, one per line of src/cpu/isa_list.h)
// gives measure_ceilings(): its vector flavour's name ("sse2", "avx2", "avx512": Ceilings::fma_isa), the flops of
// one fma_loop iteration, and the loops compiled for that level (the bf16 dot-product loop only where the level's
// target has AVX512-BF16).
struct CeilingLoops {
  const char* vec = "";
  double fma_flops = 0;
  float (*fma_loop)(std::int64_t iters, float seed) = nullptr;  // returns a sum, so the work is not dropped
  std::uint64_t (*read_sum)(const std::uint64_t* words, std::int64_t n) = nullptr;
  double dot_flops = 0;                                          // of one dpbf16_loop iteration
  float (*dpbf16_loop)(std::int64_t iters, float seed) = nullptr;  // null: the level has no vdpbf16ps
  std::uint64_t (*read_sum_prefetched)(const std::uint64_t* words, std::int64_t n) = nullptr;  // lines 32 KiB ahead
};

}  // namespace attn::tools
