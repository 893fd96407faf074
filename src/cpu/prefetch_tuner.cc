// Decode's K-row prefetch step, measured per process (see prefetch_tuner.h).
#include "cpu/prefetch_tuner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace attn::cpu {

namespace {
int index_of(std::int64_t step) { return step == PrefetchTuner::kSteps[1] ? 1 : 0; }
int clamp_kind(int kind) { return std::clamp(kind, 0, PrefetchTuner::kKinds - 1); }
}  // namespace

std::int64_t PrefetchTuner::best_locked(const Kind& k) const {
  if (k.arm[0].samples == 0 || k.arm[1].samples == 0) return kSteps[0];
  return k.arm[1].seconds_per_byte < k.arm[0].seconds_per_byte ? kSteps[1] : kSteps[0];
}

PrefetchTuner::Choice PrefetchTuner::pick(int kind, std::int64_t bytes) {
  if (const std::int64_t f = fixed()) return {f, false};
  std::lock_guard<std::mutex> lock(mu_);
  Kind& k = kinds_[clamp_kind(kind)];
  if (bytes < kMinTimedBytes) return {best_locked(k), false};  // (from cache: the step hardly matters)
  const std::int64_t call = k.calls++;
  if (k.arm[0].samples < kWarmup || k.arm[1].samples < kWarmup) return {kSteps[call % 2], true};
  const std::int64_t best = best_locked(k);
  if (call % kExploreEvery == 0) return {best == kSteps[0] ? kSteps[1] : kSteps[0], true};
  return {best, true};
}

void PrefetchTuner::record(int kind, std::int64_t step, std::int64_t bytes, double seconds) {
  if (fixed() || bytes <= 0 || !(seconds > 0)) return;
  std::lock_guard<std::mutex> lock(mu_);
  Arm& a = kinds_[clamp_kind(kind)].arm[index_of(step)];
  double x = seconds / static_cast<double>(bytes);
  if (a.samples > 0) x = std::min(x, 3 * a.seconds_per_byte);  // one preempted call moves the average little
  a.seconds_per_byte = a.samples == 0 ? x : a.seconds_per_byte + kWeight * (x - a.seconds_per_byte);
  ++a.samples;
}

std::int64_t PrefetchTuner::best(int kind) const {
  if (const std::int64_t f = fixed()) return f;
  std::lock_guard<std::mutex> lock(mu_);
  return best_locked(kinds_[clamp_kind(kind)]);
}

PrefetchTuner::Arm PrefetchTuner::arm(int kind, int i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return kinds_[clamp_kind(kind)].arm[i & 1];
}

PrefetchTuner& decode_prefetch_tuner() {
  static PrefetchTuner tuner([] {
    const char* v = std::getenv("ATTN_DECODE_PREFETCH");
    if (v && std::strcmp(v, "64") == 0) return std::int64_t{64};
    if (v && std::strcmp(v, "128") == 0) return std::int64_t{128};
    return std::int64_t{0};
  }());
  return tuner;
}

int decode_prefetch_kind(int kv_dtype, bool paged) { return clamp_kind(2 * kv_dtype + (paged ? 1 : 0)); }

}  // namespace attn::cpu
