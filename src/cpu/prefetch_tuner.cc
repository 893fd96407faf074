// Decode's K-row prefetch step, measured per process (see prefetch_tuner.h).
#include "cpu/prefetch_tuner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attn::cpu {

namespace {
int index_of(std::int64_t step) { return step == PrefetchTuner::kSteps[1] ? 1 : 0; }
int clamp_kind(int kind) { return std::clamp(kind, 0, PrefetchTuner::kKinds - 1); }
}  // namespace

double PrefetchTuner::Arm::median() const {
  const int n = std::min(samples, kWindow);
  if (n == 0) return 0;
  double v[kWindow];
  for (int i = 0; i < n; ++i) {  // insertion sort of at most 8 (std::sort: a false -Warray-bounds in GCC 12)
    int j = i;
    for (; j > 0 && v[j - 1] > recent[i]; --j) v[j] = v[j - 1];
    v[j] = recent[i];
  }
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::int64_t PrefetchTuner::best_locked(const Kind& k) const {
  if (k.current >= 0) return kSteps[k.current];
  if (k.arm[0].samples == 0 || k.arm[1].samples == 0) return kSteps[0];
  return k.arm[1].median() < k.arm[0].median() ? kSteps[1] : kSteps[0];
}

PrefetchTuner::Choice PrefetchTuner::pick(int kind, std::int64_t bytes) {
  if (const std::int64_t f = fixed()) return {f, false};
  std::lock_guard<std::mutex> lock(mu_);
  Kind& k = kinds_[clamp_kind(kind)];
  if (bytes < kMinTimedBytes) return {best_locked(k), false};  // (from cache: the step hardly matters)
  const std::int64_t call = k.calls++;
  if (k.current < 0) {
    if (k.arm[0].samples < kWarmup || k.arm[1].samples < kWarmup) return {kSteps[call % 2], true};
    k.current = index_of(best_locked(k));
  }
  const int every = call < kEarlyCalls ? kExploreEarly : kExploreEvery;
  return {kSteps[call % every == 0 ? 1 - k.current : k.current], true};
}

void PrefetchTuner::record(int kind, std::int64_t step, std::int64_t bytes, double seconds) {
  if (fixed() || bytes <= 0 || !(seconds > 0)) return;
  std::lock_guard<std::mutex> lock(mu_);
  Kind& k = kinds_[clamp_kind(kind)];
  const int i = index_of(step);
  Arm& a = k.arm[i];
  const double per_byte = seconds / static_cast<double>(bytes);
  if (k.current >= 0 && i != k.current) {  // an exploring call, against the calls around it
    k.wins = per_byte < k.arm[k.current].median() ? k.wins + 1 : 0;
    if (k.wins >= kWins) k.current = i, k.wins = 0;
  }
  a.recent[a.samples % kWindow] = per_byte;
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
    if (v && *v && std::strcmp(v, "auto") != 0)
      std::fprintf(stderr, "attn: ATTN_DECODE_PREFETCH=%s is not 64, 128 or auto; measuring (auto)\n", v);
    return std::int64_t{0};
  }());
  return tuner;
}

int decode_prefetch_kind(int kv_dtype, bool paged) { return clamp_kind(2 * kv_dtype + (paged ? 1 : 0)); }

}  // namespace attn::cpu
