// std::vector storage on 64-byte (cache-line) boundaries, for kernel scratch: a 64-byte vector load that
// straddles two cache lines costs two loads, and the micro-kernels load their tiles every cycle
// (aligned Qᵀ/Pᵀ tiles measured 5-12% faster in the fp32 forward's micro-kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace attn::cpu {

template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAlignedAllocator() = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const noexcept { return true; }
};

template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

// Workspaces (the kernels' per-thread scratch) list their buffers once, as (member, length) pairs in a static
// layout(shape, f) that calls f(&Workspace::buffer, length) for each: the constructor allocates those lengths,
// bytes(shape) counts them before anything is allocated (what attn::describe_attention reports), and held()
// measures what an existing workspace holds. These do the allocating, counting and measuring for any such
// workspace WS.
template <class S, class V>
constexpr std::int64_t element_bytes(V S::*) {
  return static_cast<std::int64_t>(sizeof(typename V::value_type));
}
template <class WS, class Shape>
void allocate_layout(WS& ws, const Shape& shape) {
  WS::layout(shape, [&](auto member, std::int64_t n) { (ws.*member).resize(static_cast<std::size_t>(n)); });
}
template <class WS, class Shape>
std::int64_t layout_bytes(const Shape& shape) {
  std::int64_t bytes = static_cast<std::int64_t>(sizeof(WS));
  WS::layout(shape, [&](auto member, std::int64_t n) { bytes += n * element_bytes(member); });
  return bytes;
}
template <class WS, class Shape>
std::int64_t held_bytes(const WS& ws, const Shape& shape) {
  std::int64_t bytes = static_cast<std::int64_t>(sizeof(WS));
  WS::layout(shape, [&](auto member, std::int64_t) {
    bytes += static_cast<std::int64_t>((ws.*member).capacity()) * element_bytes(member);
  });
  return bytes;
}

}  // namespace attn::cpu
