// merge_attention: the online-softmax merge, exposed for finished partial results.
#include <string>
#include <vector>

#include "attn/sdpa.h"
#include "core/online_softmax.h"
#include "core/views.h"
#include "cuda/backend.h"

namespace attn {
namespace {

// A view of rank `rank`, f32, with out_a's dims (`like`; its first `rank` dims).
Status check(const char* name, const TensorView& t, int rank, const TensorView& like) {
  if (Status s = core::check_view(name, t, rank); !s) return s;
  if (t.dtype != DType::f32) return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected f32");
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] != like.shape[d])
      return Status::Invalid(name, "dimension " + std::to_string(d) + " is " + std::to_string(t.shape[d]) +
                                       "; expected " + std::to_string(like.shape[d]) + " (as out_a)");
  }
  return Status::Ok();
}

bool same_view(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.rank == b.rank && a.shape == b.shape && a.strides == b.strides;
}

std::int64_t off(const TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d = 0) {
  return a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + (t.rank == 4 ? d * t.strides[3] : 0);
}

}  // namespace

Status merge_attention(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                       const TensorView& lse_b, const TensorView& out, const TensorView& lse, void* stream) {
  if (Status s = check("out_a", out_a, 4, out_a); !s) return s;
  if (out_a.shape[3] > kMaxHeadDim)
    return Status::Invalid("out_a", "head dim " + std::to_string(out_a.shape[3]) + "; expected at most " +
                                        std::to_string(kMaxHeadDim) + " (attn::kMaxHeadDim)");
  if (Status s = check("out_b", out_b, 4, out_a); !s) return s;
  if (Status s = check("out", out, 4, out_a); !s) return s;
  if (Status s = check("lse_a", lse_a, 3, out_a); !s) return s;
  if (Status s = check("lse_b", lse_b, 3, out_a); !s) return s;
  if (Status s = check("lse", lse, 3, out_a); !s) return s;
  if (Status s = core::check_output_strides("out", out); !s) return s;
  if (Status s = core::check_output_strides("lse", lse); !s) return s;
  // Outputs: each either exactly one of its inputs (a merge in place; every row is read before it is written)
  // or memory apart from every input and from the other output.
  const struct {
    const char* name;
    const TensorView& t;
  } inputs[] = {{"out_a", out_a}, {"lse_a", lse_a}, {"out_b", out_b}, {"lse_b", lse_b}};
  const struct {
    const char* name;
    const TensorView& t;
    const TensorView& in_place_a;
    const TensorView& in_place_b;
  } outputs[] = {{"out", out, out_a, out_b}, {"lse", lse, lse_a, lse_b}};
  for (const auto& o : outputs) {
    if (same_view(o.t, o.in_place_a) || same_view(o.t, o.in_place_b)) continue;
    for (const auto& i : inputs)
      if (core::overlaps(core::extent_of(o.t), core::extent_of(i.t)))
        return Status::Invalid(o.name, std::string("memory overlaps input ") + i.name +
                                           "; expected a separate buffer, or exactly the view of " + i.name +
                                           " (to merge in place)");
  }
  if (core::overlaps(core::extent_of(out), core::extent_of(lse)))
    return Status::Invalid("lse", "memory overlaps out; expected a separate buffer");
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"lse_a", lse_a}, {"out_b", out_b},
                                {"lse_b", lse_b}, {"out", out}, {"lse", lse}})
    if (t.device != out_a.device)
      return Status::Invalid(name, "on " + device_name(t.device) + "; expected out_a's device, " +
                                       device_name(out_a.device) + " (all six on one device)");
  if (out_a.device.is_cuda()) return cuda::merge(out_a, lse_a, out_b, lse_b, out, lse, stream);
  (void)stream;
  const auto* oa = static_cast<const float*>(out_a.data);
  const auto* ob = static_cast<const float*>(out_b.data);
  const auto* la = static_cast<const float*>(lse_a.data);
  const auto* lb = static_cast<const float*>(lse_b.data);
  auto* o = static_cast<float*>(out.data);
  auto* l = static_cast<float*>(lse.data);
  const std::int64_t dv = out_a.shape[3];
  std::vector<float> row_a(static_cast<std::size_t>(dv)), row_b(static_cast<std::size_t>(dv));
  for (std::int64_t b = 0; b < out_a.shape[0]; ++b)
    for (std::int64_t h = 0; h < out_a.shape[1]; ++h)
      for (std::int64_t i = 0; i < out_a.shape[2]; ++i) {
        for (std::int64_t d = 0; d < dv; ++d) row_a[d] = oa[off(out_a, b, h, i, d)], row_b[d] = ob[off(out_b, b, h, i, d)];
        core::RowState state = core::state_from_lse(la[off(lse_a, b, h, i)]);
        core::merge(state, row_a.data(), core::state_from_lse(lb[off(lse_b, b, h, i)]), row_b.data(), dv,
                    static_cast<float>(core::kLog2e));
        const float factor = core::finish_factor(state.l);
        for (std::int64_t d = 0; d < dv; ++d) o[off(out, b, h, i, d)] = core::finish_output(row_a[d], state.l, factor);
        l[off(lse, b, h, i)] = core::finish_lse(state.m, state.l, 1.0);
      }
  return Status::Ok();
}

}  // namespace attn
