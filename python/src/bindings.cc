// attn._attn: the Python binding. It only converts: arrays (NumPy, PyTorch, anything DLPack or the
// buffer protocol speaks) into attn::TensorView without copying, option strings into enums, and a
// failed attn::Status into an exception carrying the same message. Allocation, dtype and shape
// policy, and the PyTorch-compatible signature live in python/attn/functional.py.
//
// One function per C++ entry point. New entry points (attention_paged, the backward, ...) go here
// the same way: convert, release the GIL, call, check.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attn/attn.h"
#include "attn/backward.h"

namespace nb = nanobind;

namespace {

using In = nb::ndarray<nb::ro>;  // an input: any dtype, rank, strides; read only
using Out = nb::ndarray<>;       // an output: written in place

std::string dlpack_name(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: return "bool";
    default: kind = "dlpack code " + std::to_string(dt.code) + " of "; break;
  }
  return kind + std::to_string(dt.bits) + (dt.lanes != 1 ? "x" + std::to_string(dt.lanes) : "");
}

// bf16_bits: NumPy has no bfloat16 of its own and cannot export ml_dtypes' one, so NumPy bfloat16
// arrays come as their uint16 bit patterns (a view) with this flag set.
attn::DType to_dtype(const std::string& name, nb::dlpack::dtype dt, bool bf16_bits) {
  using Code = nb::dlpack::dtype_code;
  if (bf16_bits && dt.code == static_cast<std::uint8_t>(Code::UInt) && dt.bits == 16 && dt.lanes == 1)
    return attn::DType::bf16;
  if (dt.lanes == 1) {
    switch (static_cast<Code>(dt.code)) {
      case Code::Float:
        if (dt.bits == 32) return attn::DType::f32;
        if (dt.bits == 16) return attn::DType::f16;
        break;
      case Code::Bfloat:
        if (dt.bits == 16) return attn::DType::bf16;
        break;
      case Code::Bool:
        if (dt.bits == 8) return attn::DType::boolean;
        break;
      case Code::Int:
        if (dt.bits == 32) return attn::DType::i32;
        if (dt.bits == 64) return attn::DType::i64;
        break;
      default: break;
    }
  }
  throw nb::type_error((name + ": dtype " + dlpack_name(dt) +
                        " is not one attn handles; expected float32, bfloat16, float16, bool, int32 or int64")
                           .c_str());
}

// The view of an array's memory: same pointer, shape and strides (nanobind reports them in elements).
template <class Array>
attn::TensorView to_view(const std::string& name, const Array& a, bool bf16_bits = false) {
  if (a.device_type() != nb::device::cpu::value)
    throw nb::type_error((name + ": lives on DLPack device type " + std::to_string(a.device_type()) +
                          "; expected CPU memory")
                             .c_str());
  if (a.ndim() < 1 || a.ndim() > 4)
    throw nb::value_error((name + ": rank " + std::to_string(a.ndim()) + "; expected rank 1 to 4").c_str());
  attn::TensorView t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(name, a.dtype(), bf16_bits);
  t.rank = static_cast<int>(a.ndim());
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = static_cast<std::int64_t>(a.shape(d));
    t.strides[d] = a.stride(d);
  }
  return t;
}

template <class Array>
std::optional<attn::TensorView> to_view(const std::string& name, const std::optional<Array>& a) {
  if (!a) return std::nullopt;
  return to_view(name, *a);
}

void check(const attn::Status& s) {
  if (s.ok()) return;
  if (s.code() == attn::StatusCode::invalid_argument) throw nb::value_error(s.message().c_str());
  throw nb::type_error(s.message().c_str());
}

attn::Causal to_causal(const std::string& s) {
  if (s == "none") return attn::Causal::none;
  if (s == "top_left") return attn::Causal::top_left;
  if (s == "bottom_right") return attn::Causal::bottom_right;
  throw nb::value_error(("causal: '" + s + "'; expected 'none', 'top_left' or 'bottom_right'").c_str());
}

attn::Align to_align(const std::string& s) {
  if (s == "top_left") return attn::Align::top_left;
  if (s == "bottom_right") return attn::Align::bottom_right;
  throw nb::value_error(("window_align: '" + s + "'; expected 'top_left' or 'bottom_right'").c_str());
}

attn::Params to_params(const std::optional<In>& mask, const std::optional<In>& kv_lens, std::optional<double> scale,
                       const std::string& causal, std::int64_t window_left, std::int64_t window_right,
                       const std::string& window_align) {
  attn::Params p;
  p.scale = scale;
  p.causal = to_causal(causal);
  p.window = attn::Window{window_left, window_right, to_align(window_align)};
  p.mask = to_view("mask", mask);
  p.kv_lens = to_view("kv_lens", kv_lens);
  return p;
}

void attention(const In& q, const In& k, const In& v, const Out& out, const std::optional<Out>& lse,
               const std::optional<In>& mask, const std::optional<In>& kv_lens, std::optional<double> scale,
               const std::string& causal, std::int64_t window_left, std::int64_t window_right,
               const std::string& window_align, bool bf16_bits) {
  const attn::Params p = to_params(mask, kv_lens, scale, causal, window_left, window_right, window_align);
  const attn::TensorView qv = to_view("q", q, bf16_bits), kv = to_view("k", k, bf16_bits),
                         vv = to_view("v", v, bf16_bits), ov = to_view("out", out, bf16_bits);
  const std::optional<attn::TensorView> lv = to_view("lse", lse);
  attn::Status s;
  {
    nb::gil_scoped_release unlocked;
    s = attn::attention(qv, kv, vv, ov, p, lv);
  }
  check(s);
}

void attention_backward(const In& q, const In& k, const In& v, const In& out, const In& lse, const In& grad_out,
                        const Out& grad_q, const Out& grad_k, const Out& grad_v, const std::optional<In>& mask,
                        const std::optional<In>& kv_lens, std::optional<double> scale, const std::string& causal,
                        std::int64_t window_left, std::int64_t window_right, const std::string& window_align) {
  const attn::Params p = to_params(mask, kv_lens, scale, causal, window_left, window_right, window_align);
  const attn::TensorView qv = to_view("q", q), kv = to_view("k", k), vv = to_view("v", v), ov = to_view("out", out),
                         lv = to_view("lse", lse), gov = to_view("grad_out", grad_out), gq = to_view("grad_q", grad_q),
                         gk = to_view("grad_k", grad_k), gv = to_view("grad_v", grad_v);
  attn::Status s;
  {
    nb::gil_scoped_release unlocked;
    s = attn::attention_backward(qv, kv, vv, ov, lv, gov, gq, gk, gv, p);
  }
  check(s);
}

void merge_attention(const In& out_a, const In& lse_a, const In& out_b, const In& lse_b, const Out& out,
                     const Out& lse) {
  const attn::TensorView oa = to_view("out_a", out_a), la = to_view("lse_a", lse_a), ob = to_view("out_b", out_b),
                         lb = to_view("lse_b", lse_b), o = to_view("out", out), l = to_view("lse", lse);
  attn::Status s;
  {
    nb::gil_scoped_release unlocked;
    s = attn::merge_attention(oa, la, ob, lb, o, l);
  }
  check(s);
}

}  // namespace

NB_MODULE(_attn, m) {
  m.doc() = "attn's C++ entry points over strided arrays (use the attn package, not this module)";
  m.attr("__version__") = ATTN_VERSION;
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("mask").none(), nb::arg("kv_lens").none(), nb::arg("scale").none(), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("window_align"), nb::arg("bf16_bits") = false,
        "attn::attention(q, k, v, out, params, lse): writes out (and lse) in place.");
  m.def("attention_backward", &attention_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("grad_out"), nb::arg("grad_q"), nb::arg("grad_k"), nb::arg("grad_v"),
        nb::arg("mask").none(), nb::arg("kv_lens").none(), nb::arg("scale").none(), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("window_align"),
        "attn::attention_backward: writes grad_q, grad_k and grad_v in place.");
  m.def("merge_attention", &merge_attention, nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"), nb::arg("lse_b"),
        nb::arg("out"), nb::arg("lse"), "attn::merge_attention: writes out and lse in place.");
}
