// The instantiations of the forward kernel and the one switch to them (cuda/forward.h's with_config). Separate
// from forward.h so that forward.h stays free of the block program; this file includes it.
#pragma once

#include "core/problem.h"
#include "cuda/forward_block.h"

namespace attn::cuda::fwd {

inline bool general_variant(const core::Problem& p) {
  return p.mask_kind != core::MaskKind::none || core::variant_kind(p) == core::VariantKind::mods;
}

template <MmaType T, class F>
void with_head_dim(const core::Problem& p, F&& f) {
  const bool general = general_variant(p);
  const auto run = [&](auto cfg) {
    if (general) {
      f(cfg, GeneralVariant{});
    } else {
      f(cfg, PlainVariant{});
    }
  };
  // With per-element scores (the general variant) the key tiles are halved at D = 128 and 256 (32 and 16 keys), so
  // that the variant's row state fits the registers beside the D/2 accumulators (no spills: the static gates).
  switch (padded_head_dim(p.Dk, p.Dv)) {
    case 64: run(Config<T, 64>{}); break;
    case 128:
      if (general) {
        f(Config<T, 128, 32>{}, GeneralVariant{});
      } else {
        f(Config<T, 128>{}, PlainVariant{});
      }
      break;
    default:
      if (general) {
        f(Config<T, 256, 16>{}, GeneralVariant{});
      } else {
        f(Config<T, 256>{}, PlainVariant{});
      }
      break;
  }
}

template <class F>
void with_config(const core::Problem& p, F&& f) {
  if (p.q.dtype == DType::bf16) {
    with_head_dim<MmaType::bf16>(p, f);
  } else {
    with_head_dim<MmaType::f16>(p, f);
  }
}

}  // namespace attn::cuda::fwd
