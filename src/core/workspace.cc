#include "attn/workspace.h"

#include "core/workspace_impl.h"

namespace attn {

Workspace::Workspace() : impl_(std::make_unique<Impl>()) {}
Workspace::~Workspace() = default;
Workspace::Workspace(Workspace&&) noexcept = default;
Workspace& Workspace::operator=(Workspace&&) noexcept = default;

std::int64_t Workspace::bytes() const {
  std::int64_t n = static_cast<std::int64_t>(impl_->kv_len.capacity() * sizeof(std::int64_t));
  for (const auto& [key, slot] : impl_->slots) n += slot.bytes(slot.object.get());
  return n;
}

void Workspace::clear() { impl_ = std::make_unique<Impl>(); }

}  // namespace attn
