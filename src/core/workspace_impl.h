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

// The scratch of one call: the caller's Workspace slot when it gave one, else `local` (freed with the call).
template <class T>
T& scratch(Workspace* workspace, const void* key, T& local) {
  return workspace ? workspace->impl().slot<T>(key) : local;
}

}  // namespace attn::core
