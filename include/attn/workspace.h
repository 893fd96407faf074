// attn: scratch memory reused across calls.
#pragma once

#include <cstdint>
#include <memory>

namespace attn {

// What a call allocates beyond its inputs and outputs (the kernels' per-thread tiles, split-KV partial results,
// the backward's row statistics and dQ partial sums, the per-batch key lengths), kept between calls. Give the
// same Workspace to repeated calls (Params::workspace), as a decode loop does: a call whose shape fits what the
// workspace already holds allocates nothing; a larger one grows it. Not thread-safe: one Workspace per caller
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
