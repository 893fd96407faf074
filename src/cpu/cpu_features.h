// What this CPU offers and what the operating system lets a program use: CPUID feature flags,
// the XCR0 register (which vector state the OS saves on a context switch), Linux's opt-in for AMX
// tile data, and the cache sizes. Plain cpuid/xgetbv; nothing here needs a special compiler target.
#pragma once

#include <cstdint>
#include <string>

namespace attn::cpu {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // the processor brand string, trimmed ("" when the CPU has none)
  // CPUID leaf 1's signature, family and model in their display form (extended fields folded in: AMD family 0x19
  // model 0x11 is Zen 4 "Genoa"); 0 when unknown. Virtual machines often hide the brand ("AMD EPYC"), seldom these.
  int family = 0, model = 0, stepping = 0;

  // What CPUID reports (the hardware), whether or not the OS enables it.
  bool sse2 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;

  // What the OS enables: CPUID.OSXSAVE, then the XCR0 bits (0 when OSXSAVE is off).
  bool osxsave = false;
  std::uint64_t xcr0 = 0;
  bool os_avx = false;     // XCR0 bits 1, 2: SSE and AVX (YMM) state
  bool os_avx512 = false;  // and bits 5, 6, 7: opmask, ZMM_Hi256, Hi16_ZMM
  bool os_amx = false;     // bits 17, 18: XTILECFG, XTILEDATA (Linux also wants a per-process request)

  // Cache sizes in bytes (0 = unknown): L1 data, L2 and the last level (L3 where there is one).
  std::int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;

  // Hardware and OS together.
  bool avx2_usable() const { return avx2 && fma && f16c && os_avx; }
  bool avx512_usable() const { return avx512f && avx512bw && avx512vl && avx512dq && fma && os_avx512; }
  bool amx_bf16_usable() const { return amx_tile && amx_bf16 && os_amx; }  // still needs request_amx()
  // Whether vdpbf16ps outruns fp32 FMAs here: AMD's cores (Zen 4, Zen 5) issue it at the FMA's rate with twice
  // the work per instruction (measured on Zen 4, family 0x19 model 0x11, 2 threads: 469 against 234 GFLOP/s); Intel's (Cooper Lake,
  // Sapphire Rapids) on one port, no faster than FMAs (measured on a Xeon with AMX: attn's bf16 dot-product
  // prefill kernel 0.75x its fp32-FMA vector kernel on the same bf16 call).
  bool bf16_dot_fast() const { return avx512_usable() && avx512_bf16 && vendor == "AuthenticAMD"; }
  // The largest cache level known (l3, else l2, else l1d), for sizing buffers that must miss it.
  std::int64_t last_level_cache_bytes() const;
};

// The core's microarchitecture from the vendor and CPUID signature ("Zen 4", "Sapphire Rapids", ...), from the
// vendors' published family/model numbers; "" for a signature not in the table. A name for people reading a
// benchmark, never a dispatch input: kernels are chosen from feature flags alone.
std::string microarchitecture(const std::string& vendor, int family, int model, int stepping);

// Detected once per process.
const CpuFeatures& cpu_features();

// Linux makes a process ask before it may use AMX tile data (XFEATURE_XTILEDATA = 18): without the
// grant the first tile instruction raises SIGILL.
struct AmxPermission {
  bool kernel_supports = false;  // ARCH_GET_XCOMP_SUPP lists XTILEDATA
  bool permitted = false;        // ARCH_GET_XCOMP_PERM lists it (asked for earlier in this process)
};
AmxPermission amx_permission();  // asks the kernel; changes nothing

struct AmxRequest {
  bool ok = false;  // tile data may be used from now on, by every thread of this process
  int error = 0;    // errno of ARCH_REQ_XCOMP_PERM when it failed (ENOSYS off Linux or off x86-64)
};
// Requests AMX tile data for this process (ARCH_REQ_XCOMP_PERM); asked once, then the answer is cached.
AmxRequest request_amx();

}  // namespace attn::cpu
