// Decode's prefetch step over the far K rows, chosen per process by measuring. The decode kernels prefetch the K
// rows far ahead of their keys into L2 (cpu/flash_kernel.h, prefetch_rows) either every 64-byte line or one line in
// two (128: the L2's adjacent-line prefetcher, where it runs, brings the partner). Which is faster is not a
// property of the CPU model: on the same kind of 2-core AMD EPYC VM (CPUID: Zen 4) one line in two ran D1-D3 decode
// 1.16-1.66x as fast as every line during hours when every line was slow (bench/results_zen5_decode_prefetch_step.md),
// and every line ran them 1.16-1.5x as fast as one in two on another day (bench/results_zen4_prefetch_tuner.md).
// The prefetch changes no arithmetic (the results are the same bits either way), so each process times its own
// decode calls and keeps the faster step: per K/V dtype and layout (contiguous or paged), the first calls alternate
// the two steps and the one with the lower median seconds per byte becomes the current step. After that the other
// step runs again one call in 4 (for the first 64 calls) and then one in 16, and it becomes the current step when
// two of those calls in a row beat the median of the current step's last 8 calls. (Each exploring call is judged
// against the calls around it, not against the other step's older samples: a process's first calls also start its
// threads and touch its scratch and its inputs for the first time, and the memory of a shared host moves within the
// hour, so samples taken far apart do not compare. A median, not an average, for the same reason: the interference
// of a shared machine only ever slows a call.)
//
// ATTN_DECODE_PREFETCH=64 or =128 fixes the step for the process (benchmarks and A/B runs); unset or "auto" leaves it
// to the measurement, as does any other value (reported once on stderr).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace attn::cpu {

class PrefetchTuner {
 public:
  static constexpr std::int64_t kSteps[2] = {64, 128};
  static constexpr int kWarmup = 3;          // calls per step before the medians decide
  static constexpr int kExploreEarly = 4;    // then one call in this many runs the other step,
  static constexpr int kEarlyCalls = 64;     // during the kind's first this many calls,
  static constexpr int kExploreEvery = 16;   // and one in this many after them
  static constexpr int kWins = 2;            // exploring calls in a row faster than the current median switch steps
  static constexpr int kWindow = 8;          // samples per step the median is taken over
  static constexpr std::int64_t kMinTimedBytes = std::int64_t{8} << 20;  // calls reading less are not timed
  static constexpr int kKinds = 16;          // (K/V dtype, paged) pairs

  struct Arm {
    double recent[kWindow] = {};  // seconds per byte of the last min(samples, kWindow) calls (a ring)
    int samples = 0;
    double median() const;  // of recent; 0 before the first sample
  };
  struct Choice {
    std::int64_t step = 64;
    bool timed = false;  // whether the caller should time the call and record() it
  };

  // fixed: 0 (measure), 64 or 128.
  explicit PrefetchTuner(std::int64_t fixed = 0) : fixed_(fixed) {}

  Choice pick(int kind, std::int64_t bytes);
  void record(int kind, std::int64_t step, std::int64_t bytes, double seconds);
  // The step this kind runs now: the default, 64, before both steps have samples; the lower median during the first
  // calls; then the current step (which exploring calls change, above).
  std::int64_t best(int kind) const;
  Arm arm(int kind, int i) const;
  std::int64_t fixed() const { return fixed_.load(std::memory_order_relaxed); }
  // 0 (measure), 64 or 128 from now on (the tests run decode at both steps); returns the previous setting.
  std::int64_t set_fixed(std::int64_t step) { return fixed_.exchange(step == 64 || step == 128 ? step : 0); }

 private:
  struct Kind {
    Arm arm[2];
    std::int64_t calls = 0;
    int current = -1;  // index of the current step; -1 while the first calls alternate
    int wins = 0;      // exploring calls in a row faster than the current step's median
  };
  std::int64_t best_locked(const Kind& k) const;
  std::atomic<std::int64_t> fixed_;
  mutable std::mutex mu_;
  Kind kinds_[kKinds];
};

// The process's tuner (ATTN_DECODE_PREFETCH read once), and the kind of a decode call: its K/V dtype and whether the
// cache is paged.
PrefetchTuner& decode_prefetch_tuner();
int decode_prefetch_kind(int kv_dtype, bool paged);

}  // namespace attn::cpu
