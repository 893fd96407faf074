// attn::Workspace's inside: typed slots a kernel keeps its scratch in between calls, and the key-length vector
// validation borrows (KvLenLoan gives it back).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "attn/workspace.h"
#include "core/problem.h"

namespace attn {

struct Workspace::Impl {
  struct Slot {
    std::shared_ptr<void> object;
    std::int64_t (*bytes)(const void*) = nullptr;
  };
  std::unordered_map<const void*, Slot> slots;  // keyed by an address unique to the kernel (and instruction set)
  std::vector<std::int64_t> kv_len;             // lent to core::validate for the call

  // The object of type T kept under `key` (made empty the first time); T has `std::int64_t bytes() const`.
  template <class T>
  T& slot(const void* key) {
    Slot& s = slots[key];
    if (!s.object) {
      s.object = std::make_shared<T>();
      s.bytes = [](const void* o) { return static_cast<const T*>(o)->bytes(); };
    }
    return *static_cast<T*>(s.object.get());
  }
};

}  // namespace attn

namespace attn::core {

// Gives the key-length vector core::validate borrowed from the caller's Workspace (its capacity, so a repeated
// call allocates nothing) back to it when the call ends, whichever way it ends. One per entry point, made before
// validation.
struct KvLenLoan {
  Problem& p;
  ~KvLenLoan() {
    if (p.workspace) p.workspace->impl().kv_len = std::move(p.kv_len);
  }
};

// Without a caller's Workspace, a call whose scratch is at most kKeepScratchBytes reuses one its thread keeps between
// calls (one per scratch type, so per kernel family and instruction set; freed when the thread ends), so that a
// decode loop allocates, zeroes and page-faults nothing per step (a 64-key decode step spent 18 % of its time so:
// Hq 32, Hkv 8, D 128, 1 thread); it is reused exactly as a caller's Workspace is: the same bits.
inline constexpr std::int64_t kKeepScratchBytes = std::int64_t{4} << 20;

// The scratch of one call: the caller's Workspace slot when it gave one, else the thread's kept scratch when the
// call needs at most kKeepScratchBytes (`bytes`: the kernel's Plan formula), else `local` (freed with the call).
template <class T>
T& scratch(Workspace* workspace, const void* key, T& local, std::int64_t bytes) {
  if (workspace) return workspace->impl().slot<T>(key);
  static thread_local T kept;
  return bytes <= kKeepScratchBytes ? kept : local;
}

}  // namespace attn::core
