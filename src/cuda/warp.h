// One source of per-warp code for the device and for a host model of a warp.
//
// Per-warp code (the tile steps of the CUDA kernels) is written as templates over a policy W:
//
//   template <class W> ATTN_HD void step(const W& w, ...) {
//     typename W::template Reg<float> x = ...;       // one value per lane
//     x = W::shfl_xor(x, 1);                         // a lane permutation
//     w.mma(MmaTag<MmaType::bf16>{}, d, a, b, c);    // tensor-core MMA on fragments
//     w.ldmatrix(r, addr);                           // 8x8 matrices from shared memory
//   }
//
// On the device W = DeviceWarp: Reg<T> is T, the value of the calling thread, and every operation is the
// instruction itself (inline PTX mma.sync / ldmatrix, __shfl_xor_sync). In the host model W = HostWarp:
// Reg<T> is Lanes<T>, the 32 values of the warp, with elementwise operators, and every operation is
// implemented from the PTX ISA layouts of cuda/fragment.h (lanes as a loop). The host tests run the kernels'
// per-warp code through HostWarp against scalar references; the GPU self-test runs the same code through
// DeviceWarp and checks the layouts the model assumes.
//
// The rules that make one source serve both: values that differ between lanes are Regs, and lane-dependent
// choices are W::select or W::map, never `if` (the host model runs all lanes at once; control flow must be
// uniform across the warp, as the .sync.aligned instructions require anyway); memory is reached through
// W::load / W::store with a per-lane index; shared memory is addressed through w.smem_address(pointer)
// (a 32-bit shared-window address on the device, a byte offset into the model's buffer on the host).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/elem.h"
#include "cuda/fragment.h"
#include "core/hd.h"

namespace attn::cuda {

// The operand type of an MMA, as an argument (so that calls need no `template` keyword).
template <MmaType T>
using MmaTag = std::integral_constant<MmaType, T>;

// ==== the host model ======================================================================================

// One register of a warp: the value of each of the 32 lanes.
template <class T>
struct Lanes {
  std::array<T, frag::kWarp> v{};
  Lanes() = default;
  Lanes(T x) { v.fill(x); }  // NOLINT: a warp-uniform value broadcasts, as it does on the device
  T& operator[](int l) { return v[static_cast<std::size_t>(l)]; }
  const T& operator[](int l) const { return v[static_cast<std::size_t>(l)]; }
};

namespace detail {
template <class T>
const T& lane_of(const T& x, int) {
  return x;
}
template <class T>
const T& lane_of(const Lanes<T>& x, int l) {
  return x[l];
}
template <class T>
struct is_lanes : std::false_type {};
template <class T>
struct is_lanes<Lanes<T>> : std::true_type {};
template <class A, class B>
inline constexpr bool any_lanes = is_lanes<std::decay_t<A>>::value || is_lanes<std::decay_t<B>>::value;
}  // namespace detail

// Elementwise operators: Lanes op Lanes, Lanes op scalar, scalar op Lanes.
#define ATTN_LANES_BINARY(op)                                                                          \
  template <class A, class B, std::enable_if_t<detail::any_lanes<A, B>, int> = 0>                      \
  auto operator op(const A& a, const B& b) {                                                           \
    using R = decltype(detail::lane_of(a, 0) op detail::lane_of(b, 0));                                \
    Lanes<R> r;                                                                                        \
    for (int l = 0; l < frag::kWarp; ++l) r[l] = detail::lane_of(a, l) op detail::lane_of(b, l);       \
    return r;                                                                                          \
  }
ATTN_LANES_BINARY(+)
ATTN_LANES_BINARY(-)
ATTN_LANES_BINARY(*)
ATTN_LANES_BINARY(/)
ATTN_LANES_BINARY(%)
ATTN_LANES_BINARY(&)
ATTN_LANES_BINARY(|)
ATTN_LANES_BINARY(^)
ATTN_LANES_BINARY(<<)
ATTN_LANES_BINARY(>>)
ATTN_LANES_BINARY(<)
ATTN_LANES_BINARY(>)
ATTN_LANES_BINARY(<=)
ATTN_LANES_BINARY(>=)
ATTN_LANES_BINARY(==)
ATTN_LANES_BINARY(!=)
ATTN_LANES_BINARY(&&)
ATTN_LANES_BINARY(||)
#undef ATTN_LANES_BINARY

template <class T>
Lanes<T> operator-(const Lanes<T>& a) {
  Lanes<T> r;
  for (int l = 0; l < frag::kWarp; ++l) r[l] = -a[l];
  return r;
}
template <class T, class B>
Lanes<T>& operator+=(Lanes<T>& a, const B& b) {
  return a = a + b;
}
template <class T, class B>
Lanes<T>& operator*=(Lanes<T>& a, const B& b) {
  return a = a * b;
}

// The host model of one warp. It holds the model's shared memory: a buffer the per-warp code's shared
// pointers point into, addressed by ldmatrix as the device addresses the shared window (byte offsets).
class HostWarp {
 public:
  template <class T>
  using Reg = Lanes<T>;

  HostWarp() = default;
  HostWarp(void* smem, std::size_t bytes) : smem_(static_cast<std::byte*>(smem)), bytes_(bytes) {}

  static Reg<int> lane() {
    Reg<int> r;
    for (int l = 0; l < frag::kWarp; ++l) r[l] = l;
    return r;
  }

  // f applied lane by lane.
  template <class F, class... A>
  static auto map(F f, const Reg<A>&... a) {
    Reg<decltype(f(a[0]...))> r;
    for (int l = 0; l < frag::kWarp; ++l) r[l] = f(a[l]...);
    return r;
  }
  template <class T>
  static Reg<T> select(const Reg<bool>& c, const Reg<T>& a, const Reg<T>& b) {
    Reg<T> r;
    for (int l = 0; l < frag::kWarp; ++l) r[l] = c[l] ? a[l] : b[l];
    return r;
  }

  // __shfl_xor_sync(full mask, x, mask): lane l receives lane (l ^ mask)'s value.
  template <class T>
  static Reg<T> shfl_xor(const Reg<T>& x, int mask) {
    Reg<T> r;
    for (int l = 0; l < frag::kWarp; ++l) r[l] = x[l ^ mask];
    return r;
  }

  // mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32: the fragments are unpacked into A, B and C by the
  // layouts of cuda/fragment.h, D = A·B + C is formed, and packed back. Each element of D is computed as
  // c + Σ_k a·b in double (the bf16/f16 products are exact) and rounded once to fp32. The hardware's order
  // and intermediate precision of this sum are unspecified (PTX ISA: "the accumulation order ... is
  // implementation dependent"), so the device's D may differ from the model's in the last bits; tests of the
  // kernels compare with tolerances, the one-hot layout tests exactly. d may alias c.
  template <MmaType T>
  static void mma(MmaTag<T>, Reg<float> (&d)[frag::kCRegs], const Reg<std::uint32_t> (&a)[frag::kARegs],
                  const Reg<std::uint32_t> (&b)[frag::kBRegs], const Reg<float> (&c)[frag::kCRegs]) {
    float A[frag::kMmaM][frag::kMmaK], B[frag::kMmaK][frag::kMmaN], C[frag::kMmaM][frag::kMmaN];
    for (int l = 0; l < frag::kWarp; ++l) {
      for (int r = 0; r < frag::kARegs; ++r)
        for (int h = 0; h < 2; ++h) {
          const frag::Coord p = frag::mma_a(l, r, h);
          A[p.row][p.col] = unpack<T>(a[r][l], h);
        }
      for (int r = 0; r < frag::kBRegs; ++r)
        for (int h = 0; h < 2; ++h) {
          const frag::Coord p = frag::mma_b(l, r, h);
          B[p.row][p.col] = unpack<T>(b[r][l], h);
        }
      for (int r = 0; r < frag::kCRegs; ++r) {
        const frag::Coord p = frag::mma_c(l, r);
        C[p.row][p.col] = c[r][l];
      }
    }
    for (int l = 0; l < frag::kWarp; ++l)
      for (int r = 0; r < frag::kCRegs; ++r) {
        const frag::Coord p = frag::mma_c(l, r);
        double s = C[p.row][p.col];
        for (int k = 0; k < frag::kMmaK; ++k) s += static_cast<double>(A[p.row][k]) * B[k][p.col];
        d[r][l] = static_cast<float>(s);
      }
  }

  // The shared-window address of a pointer into the model's shared memory.
  std::uint32_t smem_address(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    if (smem_ == nullptr || b < smem_ || b > smem_ + bytes_)
      throw std::out_of_range("HostWarp::smem_address: pointer outside the model's shared memory");
    return static_cast<std::uint32_t>(b - smem_);
  }

  // ldmatrix.sync.aligned.m8n8.xNum{.trans}.shared.b16 (Num = 1, 2 or 4 deduced from r): the rows are read
  // at the addresses the lanes of cuda/fragment.h's ldmatrix_address_lane supply, and distributed by
  // ldmatrix_elem.
  template <int Num>
  void ldmatrix(Reg<std::uint32_t> (&r)[Num], const Reg<std::uint32_t>& addr) const {
    load_matrices<Num>(r, addr, false);
  }
  template <int Num>
  void ldmatrix_trans(Reg<std::uint32_t> (&r)[Num], const Reg<std::uint32_t>& addr) const {
    load_matrices<Num>(r, addr, true);
  }

  // base[idx] of each lane (any memory: global or the model's shared memory).
  template <class T>
  static Reg<T> load(const T* base, const Reg<int>& idx) {
    Reg<T> r;
    for (int l = 0; l < frag::kWarp; ++l) r[l] = base[idx[l]];
    return r;
  }
  // base[idx] = v for each lane, lane 0 first (lanes storing to one place: the highest lane's value stays;
  // on the device such a race leaves one of them, unspecified which).
  template <class T>
  static void store(T* base, const Reg<int>& idx, const Reg<T>& v) {
    for (int l = 0; l < frag::kWarp; ++l) base[idx[l]] = v[l];
  }
  // base[idx] = v for the lanes where ok holds (a predicated store; any index type).
  template <class T, class I>
  static void store_if(T* base, const Reg<I>& idx, const Reg<T>& v, const Reg<bool>& ok) {
    for (int l = 0; l < frag::kWarp; ++l)
      if (ok[l]) base[idx[l]] = v[l];
  }
  // cp.async.cg.shared.global of 16 bytes, zero-filling (src-size 0) where ok is false: each lane copies the
  // 16 bytes at src to shared element dst of smem (16-bit elements), or writes 16 zero bytes there. The model
  // copies at once (commit and wait order nothing here) and insists on what the instruction requires: both
  // addresses 16-byte aligned, the destination inside the model's shared memory.
  void copy16(std::uint16_t* smem, const Reg<int>& dst, const Reg<const std::uint16_t*>& src,
              const Reg<bool>& ok) const {
    for (int l = 0; l < frag::kWarp; ++l) {
      const std::uint32_t a = smem_address(smem + dst[l]);
      if (a % 16 != 0 || std::size_t{a} + 16 > bytes_)
        throw std::out_of_range("HostWarp::copy16: destination " + std::to_string(a) +
                                " is not a 16-byte aligned chunk inside the model's shared memory");
      if (!ok[l]) {
        std::memset(smem_ + a, 0, 16);
        continue;
      }
      if (reinterpret_cast<std::uintptr_t>(src[l]) % 16 != 0)
        throw std::invalid_argument("HostWarp::copy16: source address not 16-byte aligned");
      std::memcpy(smem_ + a, src[l], 16);
    }
  }
  static void commit() {}
  template <int N>
  static void wait() {}
  // __syncwarp(): the model runs the lanes in lock step already.
  static void sync() {}

 private:
  template <int Num>
  void load_matrices(Reg<std::uint32_t> (&r)[Num], const Reg<std::uint32_t>& addr, bool trans) const {
    static_assert(Num == 1 || Num == 2 || Num == 4, "ldmatrix loads 1, 2 or 4 matrices");
    std::uint16_t rows[Num][frag::kLdmRows][frag::kLdmCols];
    for (int m = 0; m < Num; ++m)
      for (int row = 0; row < frag::kLdmRows; ++row) {
        const std::uint32_t a = addr[frag::ldmatrix_address_lane(m, row)];
        if (a % frag::kLdmRowBytes != 0 || std::size_t{a} + frag::kLdmRowBytes > bytes_)
          throw std::out_of_range("HostWarp::ldmatrix: row address " + std::to_string(a) +
                                  " is not a 16-byte aligned row inside the model's shared memory");
        std::memcpy(rows[m][row], smem_ + a, frag::kLdmRowBytes);
      }
    for (int l = 0; l < frag::kWarp; ++l)
      for (int m = 0; m < Num; ++m) {
        std::uint16_t h[2];
        for (int half = 0; half < 2; ++half) {
          const frag::Coord e = frag::ldmatrix_elem(l, half, trans);
          h[half] = rows[m][e.row][e.col];
        }
        r[m][l] = pack_halves(h[0], h[1]);
      }
  }

  std::byte* smem_ = nullptr;
  std::size_t bytes_ = 0;
};

// ==== the device ==========================================================================================
#if defined(__CUDACC__)

struct DeviceWarp {
  template <class T>
  using Reg = T;

  __device__ __forceinline__ static int lane() { return static_cast<int>(threadIdx.x) & 31; }

  template <class F, class... A>
  __device__ __forceinline__ static auto map(F f, A... a) {
    return f(a...);
  }
  template <class T>
  __device__ __forceinline__ static T select(bool c, T a, T b) {
    return c ? a : b;
  }
  template <class T>
  __device__ __forceinline__ static T shfl_xor(T x, int mask) {
    return __shfl_xor_sync(0xffffffffu, x, mask);
  }

  // The real instruction (sm_80 and later). d may alias c.
  template <MmaType T>
  __device__ __forceinline__ static void mma(MmaTag<T>, float (&d)[4], const std::uint32_t (&a)[4],
                                             const std::uint32_t (&b)[2], const float (&c)[4]) {
    if constexpr (T == MmaType::bf16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%10,%11,%12,%13};\n"
          : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
            "f"(c[3]));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%10,%11,%12,%13};\n"
          : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
            "f"(c[3]));
    }
  }

  __device__ __forceinline__ static std::uint32_t smem_address(const void* p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
  }

  // The "memory" clobber orders the load after the thread's own earlier stores to shared memory, which the
  // compiler cannot see the asm read; other lanes' stores still need W::sync() (or __syncthreads()) first.
  template <int Num>
  __device__ __forceinline__ static void ldmatrix(std::uint32_t (&r)[Num], std::uint32_t addr) {
    static_assert(Num == 1 || Num == 2 || Num == 4, "ldmatrix loads 1, 2 or 4 matrices");
    if constexpr (Num == 1) {
      asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr) : "memory");
    } else if constexpr (Num == 2) {
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                   : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
    } else {
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
    }
  }
  template <int Num>
  __device__ __forceinline__ static void ldmatrix_trans(std::uint32_t (&r)[Num], std::uint32_t addr) {
    static_assert(Num == 1 || Num == 2 || Num == 4, "ldmatrix loads 1, 2 or 4 matrices");
    if constexpr (Num == 1) {
      asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                   : "=r"(r[0]) : "r"(addr) : "memory");
    } else if constexpr (Num == 2) {
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                   : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
    } else {
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
    }
  }

  template <class T>
  __device__ __forceinline__ static T load(const T* base, int idx) {
    return base[idx];
  }
  template <class T>
  __device__ __forceinline__ static void store(T* base, int idx, T v) {
    base[idx] = v;
  }
  template <class T, class I>
  __device__ __forceinline__ static void store_if(T* base, I idx, T v, bool ok) {
    if (ok) base[idx] = v;
  }
  // cp.async.cg (L2 only: K/V tiles are read once per block) with src-size 0 where !ok: 16 zero bytes, nothing
  // read. Completion is ordered by commit() / wait<N>() (cp.async.commit_group / wait_group N) and made visible to
  // the other threads by the barrier after the wait.
  __device__ __forceinline__ void copy16(std::uint16_t* smem, int dst, const std::uint16_t* src, bool ok) const {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem + dst)), "l"(src),
                 "r"(ok ? 16 : 0)
                 : "memory");
  }
  __device__ __forceinline__ static void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  template <int N>
  __device__ __forceinline__ static void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  }
  __device__ __forceinline__ static void sync() { __syncwarp(); }
};

#endif  // __CUDACC__

}  // namespace attn::cuda
