// attn._attn: the Python binding. It only converts: arrays (NumPy, PyTorch, anything DLPack or the
// buffer protocol speaks) into attn::TensorView without copying, option strings into enums, and a
// failed attn::Status into an exception carrying the same message. Allocation, dtype and shape
// policy, and the PyTorch-compatible signature live in python/attn/functional.py.
//
// One function per C++ entry point, each taking the call's options as one Options object (attn::Params's fields;
// built in one place on the Python side, attn.functional._options). New entry points go here the same way:
// convert, release the GIL, call, check.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "attn/attn.h"
#include "attn/backward.h"
#include "attn/cost.h"
#include "attn/info.h"
#include "attn/kv_cache.h"
#include "attn/mha.h"

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
      case Code::UInt:
        if (dt.bits == 8) return attn::DType::i4;  // packed 4-bit K/V, two values per byte (to_view)
        break;
      case Code::Int:
        if (dt.bits == 8) return attn::DType::i8;  // 8-bit K/V (with k_scale and v_scale)
        if (dt.bits == 32) return attn::DType::i32;
        if (dt.bits == 64) return attn::DType::i64;
        break;
      default: break;
    }
  }
  throw nb::type_error((name + ": dtype " + dlpack_name(dt) +
                        " is not one attn handles; expected float32, bfloat16, float16, bool, int8, uint8 (packed "
                        "4-bit values), int32 or int64")
                           .c_str());
}

// The view of an array's memory: same pointer, shape and strides (nanobind reports them in elements).
template <class Array>
attn::TensorView to_view(const std::string& name, const Array& a, bool bf16_bits = false) {
  // CPU memory, or a CUDA device's (torch CUDA tensors through DLPack): the library validates placement (every
  // tensor of a call on one device) and runs the CUDA backend on the default stream, which orders the call after
  // the work PyTorch queued on its default stream (run on an H100: tests/python/test_cuda.py, docs/cuda.md).
  const bool cuda = a.device_type() == nb::device::cuda::value;
  if (a.device_type() != nb::device::cpu::value && !cuda)
    throw nb::type_error((name + ": lives on DLPack device type " + std::to_string(a.device_type()) +
                          "; expected CPU memory or a CUDA device")
                             .c_str());
  if (a.ndim() < 1 || a.ndim() > 4)
    throw nb::value_error((name + ": rank " + std::to_string(a.ndim()) + "; expected rank 1 to 4").c_str());
  attn::TensorView t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(name, a.dtype(), bf16_bits);
  t.rank = static_cast<int>(a.ndim());
  if (cuda) t.device = attn::Device::cuda(static_cast<int>(a.device_id()));
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = static_cast<std::int64_t>(a.shape(d));
    t.strides[d] = a.stride(d);
  }
  if (t.dtype == attn::DType::i4) {  // bytes of two values each: the view counts values (attn/tensor.h)
    const int last = t.rank - 1;
    if (t.shape[last] > 1 && t.strides[last] != 1)
      throw nb::value_error((name + ": stride " + std::to_string(t.strides[last]) +
                             " along its last dimension; expected 1 (packed 4-bit values, two per byte)").c_str());
    for (int d = 0; d < last; ++d) t.strides[d] *= 2;
    t.shape[last] *= 2;
    t.strides[last] = 1;
  }
  return t;
}

template <class Array>
std::optional<attn::TensorView> to_view(const std::string& name, const std::optional<Array>& a) {
  if (!a) return std::nullopt;
  return to_view(name, *a);
}

// A failed Status as the Python exception of its code: invalid_argument -> ValueError, unsupported ->
// TypeError, out_of_memory -> MemoryError; the message is the Status's, "<param>: <found>; expected <what>".
void check(const attn::Status& s) {
  switch (s.code()) {
    case attn::StatusCode::ok: return;
    case attn::StatusCode::invalid_argument: throw nb::value_error(s.message().c_str());
    case attn::StatusCode::out_of_memory:
      PyErr_SetString(PyExc_MemoryError, s.message().c_str());
      throw nb::python_error();
    case attn::StatusCode::unsupported: break;
  }
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

attn::Backend to_backend(const std::string& s) {
  if (s == "auto") return attn::Backend::automatic;
  if (s == "flash") return attn::Backend::flash;
  if (s == "reference") return attn::Backend::reference;
  if (s == "cudnn") return attn::Backend::cudnn;  // CUDA tensors only (cuDNN's fused attention; docs/cuda.md)
  throw nb::value_error(("backend: '" + s + "'; expected 'auto', 'flash', 'reference' or 'cudnn'").c_str());
}

attn::BackwardStatistics to_statistics(const std::string& s) {
  if (s == "auto") return attn::BackwardStatistics::automatic;
  if (s == "from_forward") return attn::BackwardStatistics::from_forward;  // attn.dist's ring backward
  throw nb::value_error(("backward_statistics: '" + s + "'; expected 'auto' or 'from_forward'").c_str());
}

// Everything of one call that is not q, k, v or an output: attn::Params field by field (strings for the enums), and
// the binding's bf16_bits flag. The Python package builds one per call, in one place (attn.functional._options),
// whichever entry point the call came through; this is the one structure that crosses the binding, so that no
// function here spells out the options again. Arrays are held as the caller's arrays (no copy); the strings are
// checked when a call converts them (to_params).
struct Options {
  std::optional<In> mask, kv_lens;
  std::optional<double> scale;
  std::string causal = "none";
  std::int64_t window_left = -1, window_right = -1;
  std::string window_align = "top_left";
  double softcap = 0;
  std::optional<In> alibi_slopes, sinks;
  double dropout_p = 0;
  std::uint64_t seed = 0;
  std::optional<In> k_scale, v_scale;
  bool bf16_bits = false;  // q, k, v and out of dtype uint16 are bfloat16 bit patterns (NumPy + ml_dtypes)
  int threads = 0;
  std::string backend = "auto";
  std::string backward_statistics = "auto";  // attention_backward only; set as an attribute (attn.dist)
};

attn::Params to_params(const Options& o) {
  attn::Params p;
  p.scale = o.scale;
  p.causal = to_causal(o.causal);
  p.window = attn::Window{o.window_left, o.window_right, to_align(o.window_align)};
  p.mask = to_view("mask", o.mask);
  p.kv_lens = to_view("kv_lens", o.kv_lens);
  p.softcap = o.softcap;
  p.alibi_slopes = to_view("alibi_slopes", o.alibi_slopes);
  p.sinks = to_view("sinks", o.sinks);
  p.dropout_p = o.dropout_p;
  p.dropout_seed = o.seed;
  p.k_scale = to_view("k_scale", o.k_scale);
  p.v_scale = to_view("v_scale", o.v_scale);
  p.threads = o.threads;
  p.backend = to_backend(o.backend);
  p.backward_statistics = to_statistics(o.backward_statistics);
  return p;
}

// q, k, v and out of attention() / describe_attention(), bf16 bit patterns read as bf16 when the options say so.
struct Operands {
  attn::TensorView q, k, v, out;
  std::optional<attn::TensorView> lse;
  Operands(const In& q_, const In& k_, const In& v_, const Out& out_, const std::optional<Out>& lse_, bool bf16)
      : q(to_view("q", q_, bf16)), k(to_view("k", k_, bf16)), v(to_view("v", v_, bf16)),
        out(to_view("out", out_, bf16)), lse(to_view("lse", lse_)) {}
};

void attention(const In& q, const In& k, const In& v, const Out& out, const std::optional<Out>& lse,
               const Options& options) {
  const attn::Params p = to_params(options);
  const Operands a(q, k, v, out, lse, options.bf16_bits);
  attn::Status s;
  {
    nb::gil_scoped_release unlocked;
    s = attn::attention(a.q, a.k, a.v, a.out, p, a.lse);
  }
  check(s);
}

// What attention() would run with these arguments (attn::describe_attention): the same checks, nothing written.
nb::dict describe_attention(const In& q, const In& k, const In& v, const Out& out, const std::optional<Out>& lse,
                            const Options& options) {
  const attn::Params p = to_params(options);
  const Operands a(q, k, v, out, lse, options.bf16_bits);
  attn::KernelInfo info;
  check(attn::describe_attention(a.q, a.k, a.v, a.out, p, a.lse, &info));
  nb::dict d;
  d["backend"] = info.backend, d["isa"] = info.isa, d["kernel"] = info.kernel, d["threads"] = info.threads;
  d["workspace_bytes"] = info.workspace_bytes;
  return d;
}

void attention_backward(const In& q, const In& k, const In& v, const In& out, const In& lse, const In& grad_out,
                        const Out& grad_q, const Out& grad_k, const Out& grad_v, const std::optional<Out>& grad_sinks,
                        const Options& options) {
  const attn::Params p = to_params(options);
  const attn::TensorView qv = to_view("q", q), kv = to_view("k", k), vv = to_view("v", v), ov = to_view("out", out),
                         lv = to_view("lse", lse), gov = to_view("grad_out", grad_out), gq = to_view("grad_q", grad_q),
                         gk = to_view("grad_k", grad_k), gv = to_view("grad_v", grad_v);
  const std::optional<attn::TensorView> gs = to_view("grad_sinks", grad_sinks);
  attn::Status s;
  {
    nb::gil_scoped_release unlocked;
    s = attn::attention_backward(qv, kv, vv, ov, lv, gov, gq, gk, gv, p, gs);
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

void attention_paged(const In& q, const In& k_pages, const In& v_pages, const In& page_table, const In& seq_lens,
                     const Out& out, const std::optional<Out>& lse, const Options& options) {
  const attn::Params p = to_params(options);
  const bool bf16 = options.bf16_bits;
  const attn::TensorView qv = to_view("q", q, bf16), kv = to_view("k_pages", k_pages, bf16),
                         vv = to_view("v_pages", v_pages, bf16), tv = to_view("page_table", page_table),
                         sv = to_view("seq_lens", seq_lens), ov = to_view("out", out, bf16);
  const std::optional<attn::TensorView> lv = to_view("lse", lse);
  attn::Status s;
  {
    nb::gil_scoped_release unlocked;
    s = attn::attention_paged(qv, kv, vv, tv, sv, ov, p, lv);
  }
  check(s);
}

void attention_paged_cascade(const In& q, const In& k_pages, const In& v_pages, const In& prefix_table,
                             std::int64_t prefix_len, const In& page_table, const In& seq_lens, const Out& out,
                             const std::optional<Out>& lse, const Options& options) {
  const attn::Params p = to_params(options);
  const bool bf16 = options.bf16_bits;
  const attn::TensorView qv = to_view("q", q, bf16), kv = to_view("k_pages", k_pages, bf16),
                         vv = to_view("v_pages", v_pages, bf16), xv = to_view("prefix_table", prefix_table),
                         tv = to_view("page_table", page_table), sv = to_view("seq_lens", seq_lens),
                         ov = to_view("out", out, bf16);
  const std::optional<attn::TensorView> lv = to_view("lse", lse);
  attn::Status s;
  {
    nb::gil_scoped_release unlocked;
    s = attn::attention_paged_cascade(qv, kv, vv, xv, prefix_len, tv, sv, ov, p, lv);
  }
  check(s);
}

// ---- the process's settings and the CPU (attn/info.h) ----------------------------------------------------

// Both setters report a bad value as ValueError, a level this CPU lacks included (the library calls that one
// unsupported, which check() would raise as TypeError): to a Python caller it is a value this machine refuses.
void set_num_threads(int n) {
  if (attn::Status s = attn::set_num_threads(n); !s) throw nb::value_error(s.message().c_str());
}

void set_isa(const std::string& level) {
  if (attn::Status s = attn::set_isa(level); !s) throw nb::value_error(s.message().c_str());
}

// `attn info --json`'s fields, under the same names, plus the levels and the version.
nb::dict info() {
  const attn::CpuInfo f = attn::cpu_info();
  nb::dict d;
  d["version"] = ATTN_VERSION;
  d["vendor"] = f.vendor, d["brand"] = f.brand;
  d["family"] = f.family, d["model"] = f.model, d["stepping"] = f.stepping;
  d["microarchitecture"] = f.microarchitecture, d["cpu"] = attn::describe_cpu(f);
  nb::dict flags;
  for (const auto& [name, has] : f.cpuid) flags[name.c_str()] = has;
  d["cpuid"] = flags;
  d["osxsave"] = f.osxsave, d["xcr0"] = f.xcr0;
  d["os_avx"] = f.os_avx, d["os_avx512"] = f.os_avx512, d["os_amx"] = f.os_amx;
  d["amx_kernel_supports"] = f.amx_offered, d["amx_permitted_before_request"] = f.amx_permitted_before;
  d["amx_request_ok"] = f.amx_granted ? nb::cast(*f.amx_granted) : nb::none();
  d["l1d_bytes"] = f.l1d_bytes, d["l2_bytes"] = f.l2_bytes, d["l3_bytes"] = f.l3_bytes;
  nb::list levels, supported;
  for (const std::string& l : attn::isa_levels()) {
    levels.append(l);
    if (attn::isa_supported(l)) supported.append(l);
  }
  d["isa_levels"] = levels, d["supported_isa"] = supported;
  d["best_isa"] = attn::best_isa(), d["active_isa"] = attn::active_isa();
  d["threads"] = attn::resolve_threads(0);
  return d;
}

// ---- the cost model: plain numbers in, a dict out ------------------------------------------------------

nb::dict attention_cost(std::int64_t seq, std::int64_t d_model, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t head_dim, std::int64_t v_head_dim, bool causal, std::int64_t batch,
                        std::int64_t bytes_per_element) {
  attn::AttentionShape shape;
  shape.seq = seq, shape.d_model = d_model, shape.heads = heads, shape.kv_heads = kv_heads;
  shape.head_dim = head_dim, shape.v_head_dim = v_head_dim, shape.causal = causal, shape.batch = batch;
  shape.bytes_per_element = bytes_per_element;
  attn::AttentionCost cost;
  check(attn::attention_cost(shape, &cost));
  nb::list stages;
  for (const attn::StageCost& st : cost.stages) {
    nb::dict d;
    d["name"] = st.name, d["flops"] = st.flops, d["seed_ops"] = st.seed_ops, d["bytes"] = st.bytes;
    stages.append(d);
  }
  nb::dict r;
  r["stages"] = stages, r["total_flops"] = cost.total_flops, r["total_seed_ops"] = cost.total_seed_ops;
  r["total_bytes"] = cost.total_bytes, r["dominant"] = cost.dominant;
  r["fused_attention_bytes"] = cost.fused_attention_bytes, r["crossover_seq"] = cost.crossover_seq;
  return r;
}

std::int64_t parameter_count(std::int64_t d_model, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                             std::int64_t v_head_dim, bool bias) {
  attn::ParamShape shape{d_model, heads, kv_heads, head_dim, v_head_dim, bias};
  std::int64_t n = 0;
  check(attn::parameter_count(shape, &n));
  return n;
}

double kv_cache_bytes(std::int64_t layers, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t seq,
                      std::int64_t batch, const std::string& dtype) {
  attn::KvCacheShape shape;
  shape.layers = layers, shape.kv_heads = kv_heads, shape.head_dim = head_dim, shape.seq = seq, shape.batch = batch;
  if (dtype == "f32") shape.dtype = attn::KvDType::f32;
  else if (dtype == "f16") shape.dtype = attn::KvDType::f16;
  else if (dtype == "bf16") shape.dtype = attn::KvDType::bf16;
  else if (dtype == "fp8") shape.dtype = attn::KvDType::fp8;
  else if (dtype == "int8") shape.dtype = attn::KvDType::int8;
  else if (dtype == "int4") shape.dtype = attn::KvDType::int4;
  else throw nb::value_error(("dtype: '" + dtype + "'; expected 'f32', 'f16', 'bf16', 'fp8', 'int8' or 'int4'").c_str());
  double bytes = 0;
  check(attn::kv_cache_bytes(shape, &bytes));
  return bytes;
}

// ---- objects: the multi-head module and the caches (f32 arrays, outputs allocated by the caller) --------

template <class Fn>
void unlocked(Fn&& fn) {
  attn::Status s;
  {
    nb::gil_scoped_release released;
    s = fn();
  }
  check(s);
}

// The rotary tables of a cache append or a cached forward: none, or both (their shapes checked by the library).
std::optional<attn::Rotary> rotary_of(const std::optional<In>& cos, const std::optional<In>& sin, bool interleaved) {
  if (!cos && !sin) return std::nullopt;
  if (!cos || !sin)
    throw nb::value_error("rotary.cos: rotary.cos and rotary.sin come together; expected both or neither");
  return attn::Rotary{to_view("rotary.cos", *cos), to_view("rotary.sin", *sin), interleaved};
}

}  // namespace

NB_MODULE(_attn, m) {
  m.doc() = "attn's C++ entry points over strided arrays (use the attn package, not this module)";
  m.attr("__version__") = ATTN_VERSION;
  // A module, cache or options object can stay referenced until the interpreter's end by caches that outlive the
  // module's teardown (torch.compile's guards hold the objects a traced function saw), which nanobind would report
  // as "leaked instances" at exit: not leaks of attn's, so not reported.
  nb::set_leak_warnings(false);
  nb::class_<Options>(m, "Options", "The options of one call (attn::Params and bf16_bits); see attn.functional.")
      .def("__init__",
           [](Options* self, std::optional<In> mask, std::optional<In> kv_lens, std::optional<double> scale,
              std::string causal, std::int64_t window_left, std::int64_t window_right, std::string window_align,
              double softcap, std::optional<In> alibi_slopes, std::optional<In> sinks, double dropout_p,
              std::uint64_t seed, std::optional<In> k_scale, std::optional<In> v_scale, bool bf16_bits, int threads,
              std::string backend) {
             new (self) Options{std::move(mask),  std::move(kv_lens),      scale,
                                std::move(causal), window_left,            window_right,
                                std::move(window_align), softcap,          std::move(alibi_slopes),
                                std::move(sinks),  dropout_p,              seed,
                                std::move(k_scale), std::move(v_scale),    bf16_bits,
                                threads,           std::move(backend),     "auto"};
           },
           nb::arg("mask").none() = nb::none(), nb::arg("kv_lens").none() = nb::none(),
           nb::arg("scale").none() = nb::none(), nb::arg("causal") = "none", nb::arg("window_left") = -1,
           nb::arg("window_right") = -1, nb::arg("window_align") = "top_left", nb::arg("softcap") = 0.0,
           nb::arg("alibi_slopes").none() = nb::none(), nb::arg("sinks").none() = nb::none(),
           nb::arg("dropout_p") = 0.0, nb::arg("seed") = 0, nb::arg("k_scale").none() = nb::none(),
           nb::arg("v_scale").none() = nb::none(), nb::arg("bf16_bits") = false, nb::arg("threads") = 0,
           nb::arg("backend") = "auto")
      .def_rw("mask", &Options::mask, nb::for_setter(nb::arg("value").none()))
      .def_rw("kv_lens", &Options::kv_lens, nb::for_setter(nb::arg("value").none()))
      .def_rw("scale", &Options::scale, nb::for_setter(nb::arg("value").none()))
      .def_rw("causal", &Options::causal)
      .def_rw("window_left", &Options::window_left)
      .def_rw("window_right", &Options::window_right)
      .def_rw("window_align", &Options::window_align)
      .def_rw("softcap", &Options::softcap)
      .def_rw("alibi_slopes", &Options::alibi_slopes, nb::for_setter(nb::arg("value").none()))
      .def_rw("sinks", &Options::sinks, nb::for_setter(nb::arg("value").none()))
      .def_rw("dropout_p", &Options::dropout_p)
      .def_rw("seed", &Options::seed)
      .def_rw("k_scale", &Options::k_scale, nb::for_setter(nb::arg("value").none()))
      .def_rw("v_scale", &Options::v_scale, nb::for_setter(nb::arg("value").none()))
      .def_rw("bf16_bits", &Options::bf16_bits)
      .def_rw("threads", &Options::threads)
      .def_rw("backend", &Options::backend)
      .def_rw("backward_statistics", &Options::backward_statistics);

  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("options"), "attn::attention(q, k, v, out, params, lse): writes out (and lse) in place.");
  m.def("describe_attention", &describe_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("options"),
        "attn::describe_attention: what attention() would run (a dict of KernelInfo's fields); nothing written.");
  m.def("attention_backward", &attention_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("grad_out"), nb::arg("grad_q"), nb::arg("grad_k"), nb::arg("grad_v"),
        nb::arg("grad_sinks").none(), nb::arg("options"),
        "attn::attention_backward: writes grad_q, grad_k and grad_v (and grad_sinks) in place.");
  m.def("attention_paged", &attention_paged, nb::arg("q"), nb::arg("k_pages"), nb::arg("v_pages"),
        nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("out"), nb::arg("lse").none(), nb::arg("options"),
        "attn::attention_paged: writes out (and lse) in place.");
  m.def("attention_paged_cascade", &attention_paged_cascade, nb::arg("q"), nb::arg("k_pages"), nb::arg("v_pages"),
        nb::arg("prefix_table"), nb::arg("prefix_len"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("options"),
        "attn::attention_paged_cascade: writes out (and lse) in place.");
  m.def("set_num_threads", &set_num_threads, nb::arg("n"));
  m.def("set_isa", &set_isa, nb::arg("level"));
  m.def("info", &info);
  m.def("attention_cost", &attention_cost, nb::arg("seq"), nb::arg("d_model"), nb::arg("heads"), nb::arg("kv_heads"),
        nb::arg("head_dim"), nb::arg("v_head_dim"), nb::arg("causal"), nb::arg("batch"), nb::arg("bytes_per_element"));
  m.def("parameter_count", &parameter_count, nb::arg("d_model"), nb::arg("heads"), nb::arg("kv_heads"),
        nb::arg("head_dim"), nb::arg("v_head_dim"), nb::arg("bias"));
  m.def("kv_cache_bytes", &kv_cache_bytes, nb::arg("layers"), nb::arg("kv_heads"), nb::arg("head_dim"),
        nb::arg("seq"), nb::arg("batch"), nb::arg("dtype"));

  nb::class_<attn::MultiHeadAttention>(m, "MultiHeadAttention")
      .def("__init__",
           [](attn::MultiHeadAttention* self, std::int64_t d_model, std::int64_t heads, std::int64_t kv_heads,
              std::int64_t head_dim, std::int64_t v_head_dim, bool bias) {
             new (self) attn::MultiHeadAttention();
             attn::Status s;
             try {
               s = attn::MultiHeadAttention::create({d_model, heads, kv_heads, head_dim, v_head_dim, bias}, self);
             } catch (const std::bad_alloc&) {  // the weights of a valid but too large module
               s = attn::Status::OutOfMemory("d_model", "the weights could not be allocated; expected a module whose "
                                                        "weights fit in memory");
             } catch (const std::length_error&) {
               s = attn::Status::OutOfMemory("d_model", "the weights exceed the largest possible array; expected a "
                                                        "module whose weights fit in memory");
             }
             check(s);
           },
           nb::arg("d_model"), nb::arg("heads"), nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("v_head_dim"),
           nb::arg("bias"))
      .def_prop_ro("config", [](const attn::MultiHeadAttention& a) {
        const attn::MhaConfig& c = a.config();
        return nb::make_tuple(c.d_model, c.heads, c.kv_heads, c.head_dim, c.v_head_dim, c.bias);
      })
      .def("parameter_count", &attn::MultiHeadAttention::parameter_count)
      .def("init_random", &attn::MultiHeadAttention::init_random, nb::arg("seed"))
      .def("get_weight", [](const attn::MultiHeadAttention& a, const std::string& name) {
        const attn::MhaWeights& w = a.weights();
        const std::vector<float>* v = name == "w_q" ? &w.w_q : name == "w_k" ? &w.w_k : name == "w_v" ? &w.w_v
                                    : name == "w_o" ? &w.w_o : name == "b_q" ? &w.b_q : name == "b_k" ? &w.b_k
                                    : name == "b_v" ? &w.b_v : name == "b_o" ? &w.b_o : nullptr;
        if (!v) throw nb::value_error(("name: '" + name + "'; expected w_q, w_k, w_v, w_o, b_q, b_k, b_v or b_o").c_str());
        return *v;
      })
      .def("set_weight", [](attn::MultiHeadAttention& a, const std::string& name, const std::vector<float>& values) {
        attn::MhaWeights& w = a.weights();
        std::vector<float>* v = name == "w_q" ? &w.w_q : name == "w_k" ? &w.w_k : name == "w_v" ? &w.w_v
                              : name == "w_o" ? &w.w_o : name == "b_q" ? &w.b_q : name == "b_k" ? &w.b_k
                              : name == "b_v" ? &w.b_v : name == "b_o" ? &w.b_o : nullptr;
        if (!v) throw nb::value_error(("name: '" + name + "'; expected w_q, w_k, w_v, w_o, b_q, b_k, b_v or b_o").c_str());
        if (values.size() != v->size())
          throw nb::value_error((name + ": " + std::to_string(values.size()) + " values; expected " +
                                 std::to_string(v->size())).c_str());
        *v = values;
      })
      .def("forward", [](const attn::MultiHeadAttention& a, const In& x, const In& x_kv, const Out& out,
                         const std::optional<In>& mask, const std::optional<In>& kv_lens, const std::string& causal,
                         bool cross) {
        Options o;
        o.mask = mask, o.kv_lens = kv_lens, o.causal = causal, o.window_align = "bottom_right";
        const attn::Params p = to_params(o);
        const attn::TensorView xv = to_view("x", x), kvv = to_view("x_kv", x_kv), ov = to_view("out", out);
        unlocked([&] { return cross ? a.forward_cross(xv, kvv, ov, p) : a.forward(xv, ov, p); });
      })
      .def("forward_cached", [](const attn::MultiHeadAttention& a, const In& x, attn::KVCache& cache, const Out& out,
                                const std::optional<In>& cos, const std::optional<In>& sin, bool interleaved) {
        const attn::TensorView xv = to_view("x", x), ov = to_view("out", out);
        const std::optional<attn::Rotary> r = rotary_of(cos, sin, interleaved);
        unlocked([&] { return r ? a.forward_cached(xv, cache, ov, *r) : a.forward_cached(xv, cache, ov); });
      }, nb::arg("x"), nb::arg("cache"), nb::arg("out"), nb::arg("cos").none() = nb::none(),
         nb::arg("sin").none() = nb::none(), nb::arg("interleaved") = false);

  // A cache's storage dtype by name ("f32", "bf16", "f16", "i8", "i4"); another name reaches create(), which refuses
  // it.
  const auto storage_dtype = [](const std::string& name) {
    for (attn::DType d : {attn::DType::f32, attn::DType::bf16, attn::DType::f16, attn::DType::i8, attn::DType::i4})
      if (name == attn::dtype_name(d)) return d;
    return attn::DType::boolean;
  };
  nb::class_<attn::KVCache>(m, "KVCache")
      .def("__init__",
           [storage_dtype](attn::KVCache* self, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                           std::int64_t capacity, const std::string& dtype) {
             new (self) attn::KVCache();
             check(attn::KVCache::create(kv_heads, head_dim, v_head_dim, capacity, storage_dtype(dtype), self));
           },
           nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("v_head_dim"), nb::arg("capacity"),
           nb::arg("dtype") = "f32")
      .def_prop_ro("dtype", [](const attn::KVCache& c) { return std::string(attn::dtype_name(c.dtype())); })
      .def_prop_ro("length", &attn::KVCache::length)
      .def_prop_ro("capacity", &attn::KVCache::capacity)
      .def("append", [](attn::KVCache& c, const In& k, const In& v, const std::optional<In>& cos,
                        const std::optional<In>& sin, bool interleaved) {
        const attn::TensorView kv = to_view("k", k), vv = to_view("v", v);
        const std::optional<attn::Rotary> r = rotary_of(cos, sin, interleaved);
        unlocked([&] { return r ? c.append(kv, vv, *r) : c.append(kv, vv); });
      }, nb::arg("k"), nb::arg("v"), nb::arg("cos").none() = nb::none(), nb::arg("sin").none() = nb::none(),
         nb::arg("interleaved") = false)
      .def("attend", [](const attn::KVCache& c, const In& q, const Out& out, const std::optional<Out>& lse) {
        const attn::TensorView qv = to_view("q", q), ov = to_view("out", out);
        const std::optional<attn::TensorView> lv = to_view("lse", lse);
        unlocked([&] { return c.attend(qv, ov, attn::decode_params(), lv); });
      })
      .def("truncate", [](attn::KVCache& c, std::int64_t length) { check(c.truncate(length)); })
      .def("clear", &attn::KVCache::clear);

  nb::class_<attn::PagedKVCache>(m, "PagedKVCache")
      .def("__init__",
           [storage_dtype](attn::PagedKVCache* self, std::int64_t kv_heads, std::int64_t head_dim,
                           std::int64_t v_head_dim, std::int64_t page_size, std::int64_t num_pages,
                           const std::string& dtype) {
             new (self) attn::PagedKVCache();
             check(attn::PagedKVCache::create(kv_heads, head_dim, v_head_dim, page_size, num_pages,
                                              storage_dtype(dtype), self));
           },
           nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("v_head_dim"), nb::arg("page_size"), nb::arg("num_pages"),
           nb::arg("dtype") = "f32")
      .def_prop_ro("dtype", [](const attn::PagedKVCache& c) { return std::string(attn::dtype_name(c.dtype())); })
      .def_prop_ro("free_pages", &attn::PagedKVCache::free_pages)
      .def_prop_ro("num_pages", &attn::PagedKVCache::num_pages)
      .def("add_sequence", &attn::PagedKVCache::add_sequence)
      .def("remove_sequence", [](attn::PagedKVCache& c, std::int64_t id) { check(c.remove_sequence(id)); })
      .def("length", [](const attn::PagedKVCache& c, std::int64_t id) {
        std::int64_t n = 0;
        check(c.length(id, &n));
        return n;
      })
      .def("append", [](attn::PagedKVCache& c, std::int64_t id, const In& k, const In& v, const std::optional<In>& cos,
                        const std::optional<In>& sin, bool interleaved) {
        const attn::TensorView kv = to_view("k", k), vv = to_view("v", v);
        const std::optional<attn::Rotary> r = rotary_of(cos, sin, interleaved);
        unlocked([&] { return r ? c.append(id, kv, vv, *r) : c.append(id, kv, vv); });
      }, nb::arg("id"), nb::arg("k"), nb::arg("v"), nb::arg("cos").none() = nb::none(),
         nb::arg("sin").none() = nb::none(), nb::arg("interleaved") = false)
      .def("attend", [](const attn::PagedKVCache& c, const std::vector<std::int64_t>& ids, const In& q, const Out& out,
                        const std::optional<Out>& lse) {
        const attn::TensorView qv = to_view("q", q), ov = to_view("out", out);
        const std::optional<attn::TensorView> lv = to_view("lse", lse);
        unlocked([&] { return c.attend(ids, qv, ov, attn::decode_params(), lv); });
      });

  m.def("merge_attention", &merge_attention, nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"), nb::arg("lse_b"),
        nb::arg("out"), nb::arg("lse"), "attn::merge_attention: writes out and lse in place.");
}
