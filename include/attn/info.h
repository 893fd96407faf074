// attn: what the library sees and would run here: the CPU, the instruction-set levels, the kernel a call would
// take and the memory it would allocate. For tools, benchmarks and users; no private header is needed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/sdpa.h"
#include "attn/status.h"
#include "attn/tensor.h"

namespace attn {

// The instruction-set levels of the CPU kernels, lowest first: "sse2", "avx2", "avx512", "avx512bf16", "amx".
std::vector<std::string> isa_levels();
bool isa_supported(const std::string& level);  // by this CPU and OS
std::string best_isa();                        // the best level this CPU and OS support
// The level calls use now: best_isa(), lowered by set_isa() or else by the environment variable ATTN_ISA.
std::string active_isa();
// Lowers the level calls use in this process ("" goes back to the default). An unknown level, or one this
// machine does not support, is an error that changes nothing.
Status set_isa(const std::string& level);
// The thread count a call with Params::threads = requested uses (0: the default, which is set_num_threads()'s
// count, else ATTN_NUM_THREADS, else OpenMP's default).
int resolve_threads(int requested = 0);
// Sets the default thread count of calls in this process (those with Params::threads = 0) to n; 0 goes back to
// ATTN_NUM_THREADS, else OpenMP's default. n outside 0..4096 is an error that changes nothing.
Status set_num_threads(int n);

// What a call would run.
struct KernelInfo {
  std::string backend;            // "flash", "reference" or, on CUDA tensors, "cudnn"
  std::string isa;                // the CPU level whose kernel runs ("amx" only for the tile kernel); on CUDA the
                                  // device's compute capability ("sm_90"); "" for reference
  std::string kernel;             // "vector", "vector (bf16 pairs)" (its decode, bf16 Q over bf16/i8/i4 K/V, on
                                  // AVX512-BF16's dot products), "amx" (bf16 prefill on the tile unit), "bf16 dot"
                                  // (bf16 prefill on AVX512-BF16's dot products), "reference", or on CUDA the
                                  // GPU kernel (e.g. "cudnn sdpa", "flash forward ...", "split-kv decode ...")
  int threads = 0;                // CPU threads (0 on CUDA)
  std::int64_t workspace_bytes = 0;  // what the call allocates beyond its inputs and outputs (on CUDA: device memory)
};
// For attention() / attention_backward() with these arguments: the same validation (an invalid call gives the
// same error), nothing computed or written.
Status describe_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          const Params& params, const std::optional<TensorView>& lse, KernelInfo* info);
// For attention_paged() with these arguments: the same validation, nothing computed or written.
Status describe_attention_paged(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                                const TensorView& page_table, const TensorView& seq_lens, const TensorView& out,
                                const Params& params, const std::optional<TensorView>& lse, KernelInfo* info);
Status describe_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& lse, const TensorView& grad_out,
                                   const TensorView& grad_q, const TensorView& grad_k, const TensorView& grad_v,
                                   const Params& params, KernelInfo* info);

// The CPU as attn sees it (`attn info`).
struct CpuInfo {
  std::string vendor, brand;
  // CPUID's signature in display form (0 = unknown) and the microarchitecture it names ("Zen 4", "Sapphire
  // Rapids"; "" when attn's table does not know it): which CPU a number came from, where a virtual machine's brand
  // string says only "AMD EPYC". Not used to choose kernels (the feature flags are).
  int family = 0, model = 0, stepping = 0;
  std::string microarchitecture;
  std::vector<std::pair<std::string, bool>> cpuid;  // the CPUID flags attn cares about, in a fixed order
  bool osxsave = false;
  std::uint64_t xcr0 = 0;
  bool os_avx = false, os_avx512 = false, os_amx = false;  // what the OS enables (XCR0)
  // Linux's per-process AMX tile-data permission: offered by the kernel, held before attn asked, and the answer
  // attn got when it asked (requested only when the CPU and OS have AMX).
  bool amx_offered = false, amx_permitted_before = false;
  std::optional<bool> amx_granted;
  int amx_error = 0;  // errno of a refused request
  std::int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // 0 = unknown
};
CpuInfo cpu_info();
// One line naming the CPU for a report: "AMD EPYC (Zen 4; AuthenticAMD family 0x19 model 0x11 stepping 1)".
std::string describe_cpu(const CpuInfo& c);

}  // namespace attn
