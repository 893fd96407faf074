// attn: scratch memory reused across calls.
#pragma once

#include <cstdint>
#include <memory>

namespace attn {

// What a call allocates beyond its inputs and outputs (the kernels' per-thread tiles, split-KV partial results,
// the backward's row statistics and dQ partial sums, the per-batch key lengths), kept between calls. Give the
// same Workspace to repeated calls (Params::workspace), as a decode loop does: a call of the shape the workspace
// already holds (a decode loop's, an f32 prefill's or a smaller decode's) allocates nothing; a call of another shape
// may reallocate it to that shape (a bf16/f16 prefill sizes its per-thread K/V head cache to Skv, the backward its
// scratch to the query blocks), and buffers that grow (K/V rows gathered from a [B, S, H, D] layout) may keep up to
// twice the bytes describe_attention reports. Not thread-safe: one Workspace per caller
// running concurrently. Destroying (or clear()ing) it frees everything. (Without one, a CPU call whose scratch is at
// most 4 MiB reuses a per-thread scratch the library keeps between calls, freed when the thread ends; a larger one
// is allocated and freed by the call.)
class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(Workspace&&) noexcept;
  Workspace& operator=(Workspace&&) noexcept;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  std::int64_t bytes() const;  // held now
  void clear();                // frees everything it holds

  struct Impl;  // (src/core/workspace_impl.h)
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn
