// attn tools: the command line. CLI11 parses; each subcommand validates what the library cannot
// (files, ranks, dtypes), lets attn::attention validate the rest, and only writes files on success.
#include "commands.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "demo.h"
#include "explain.h"
#include "files.h"
#include "subcommand.h"

namespace attn::tools {

// ---- shared helpers ---------------------------------------------------------------------------------

Status with_option_names(const Status& status,
                         std::initializer_list<std::pair<const char*, const char*>> extra) {
  // Longer names first where one is a prefix of another ("window.align" before "window").
  static const std::pair<const char*, const char*> kOptions[] = {
      {"q", "--q"},           {"k", "--k"},           {"v", "--v"},
      {"out", "--out"},       {"lse", "--lse"},       {"scale", "--scale"},
      {"causal", "--causal"}, {"window.align", "--window-align"},
      {"window", "--window"}, {"kv_lens", "--kv-lens"}, {"mask", "--mask"},
      {"threads", "--threads"}, {"backend", "--backend"},
      {"softcap", "--softcap"}, {"alibi_slopes", "--alibi-slopes"}, {"sinks", "--sinks"}, {"grad_sinks", "--dsinks"},
      {"dropout_p", "--dropout"},
      {"grad_out", "--grad-out"}, {"grad_q", "--dq"}, {"grad_k", "--dk"}, {"grad_v", "--dv"}};
  const std::string& message = status.message();
  const auto rename = [&](const char* param, const char* option, Status* out) {
    const std::string prefix = std::string(param) + ": ";
    if (message.rfind(prefix, 0) != 0) return false;
    *out = Status::Invalid(option, message.substr(prefix.size()));
    return true;
  };
  Status renamed;
  for (const auto& [param, option] : extra)
    if (rename(param, option, &renamed)) return renamed;
  for (const auto& [param, option] : kOptions)
    if (rename(param, option, &renamed)) return renamed;
  return status;
}

Status view_of(const npy::Array& array, const std::string& option, TensorView* view) {
  const int rank = static_cast<int>(array.shape.size());
  if (rank > 4)
    return Status::Invalid(option, "shape " + shape_text(array.shape) + " has rank " + std::to_string(rank) +
                                       "; expected rank at most 4");
  TensorView t;
  t.data = const_cast<unsigned char*>(array.data.data());
  t.dtype = array.dtype;
  t.rank = rank;
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    t.shape[d] = array.shape[d];
    t.strides[d] = stride;
    if (__builtin_mul_overflow(stride, array.shape[d], &stride))
      return Status::Invalid(option, "shape " + shape_text(array.shape) + " is too large to index");
  }
  *view = t;
  return Status::Ok();
}

Status parse_causal(const std::string& text, const std::string& option, Causal* causal) {
  if (text == "top-left") *causal = Causal::top_left;
  else if (text == "bottom-right") *causal = Causal::bottom_right;
  else if (text == "none") *causal = Causal::none;
  else
    return Status::Invalid(option, "'" + text + "' is not a causal alignment; expected top-left (key j <= query i) "
                                   "or bottom-right (j <= i + Skv - Sq)");
  return Status::Ok();
}

Status parse_scale(const std::string& text, const std::string& option, double* value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(*value) || *value <= 0)
    return Status::Invalid(option, "'" + text + "'; expected a finite number > 0, such as 0.125");
  return Status::Ok();
}

namespace {

// ---- parsing of option values ------------------------------------------------------------------------

bool parse_int(const std::string& text, std::int64_t* value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

Status parse_threads(const std::string& text, int* threads) {
  std::int64_t n = 0;
  if (!parse_int(text, &n) || n < 0 || n > 4096)
    return Status::Invalid("--threads", "'" + text + "'; expected 0 (the default) or a thread count from 1 to 4096");
  *threads = static_cast<int>(n);
  return Status::Ok();
}

// "LEFT,RIGHT": two integers >= -1, where -1 leaves that side unbounded.
Status parse_window(const std::string& text, Window* window) {
  const std::size_t comma = text.find(',');
  std::int64_t left = 0, right = 0;
  const bool ok = comma != std::string::npos && parse_int(text.substr(0, comma), &left) &&
                  parse_int(text.substr(comma + 1), &right) && left >= -1 && right >= -1;
  if (!ok)
    return Status::Invalid("--window", "'" + text + "' is not LEFT,RIGHT; expected two integers >= -1 separated by "
                                       "a comma (-1 = unbounded on that side), e.g. 128,0");
  window->left = left;
  window->right = right;
  return Status::Ok();
}

Status parse_align(const std::string& text, Align* align) {
  if (text == "top-left") *align = Align::top_left;
  else if (text == "bottom-right") *align = Align::bottom_right;
  else return Status::Invalid("--window-align", "'" + text + "'; expected top-left or bottom-right");
  return Status::Ok();
}

Status parse_backend(const std::string& text, Backend* backend) {
  if (text == "auto") *backend = Backend::automatic;
  else if (text == "reference") *backend = Backend::reference;
  else if (text == "flash") *backend = Backend::flash;
  else return Status::Invalid("--backend", "'" + text + "'; expected auto, reference or flash");
  return Status::Ok();
}

// ---- attn run ----------------------------------------------------------------------------------------

struct RunArgs {
  std::string q, k, v, out, lse, causal, scale, mask, kv_lens, window, threads;
  std::string softcap, alibi_slopes, sinks;  // score variants
  std::string dropout, seed;                 // attention dropout and its generator's seed
  std::string grad_out, dq, dk, dv;  // the backward pass, all four or none
  std::string dsinks;                // with --sinks: also dL/dsinks
  std::string window_align = "bottom-right";
  std::string backend = "auto";
};

Status run_params(const RunArgs& a, Params* params) {
  if (!a.causal.empty())
    if (Status s = parse_causal(a.causal, "--causal", &params->causal); !s) return s;
  if (!a.scale.empty()) {
    double scale = 0;
    if (Status s = parse_scale(a.scale, "--scale", &scale); !s) return s;
    params->scale = scale;
  }
  if (!a.window.empty())
    if (Status s = parse_window(a.window, &params->window); !s) return s;
  if (Status s = parse_align(a.window_align, &params->window.align); !s) return s;
  if (Status s = parse_backend(a.backend, &params->backend); !s) return s;
  if (!a.threads.empty())
    if (Status s = parse_threads(a.threads, &params->threads); !s) return s;
  if (!a.softcap.empty()) {
    const char* end = a.softcap.data() + a.softcap.size();
    const auto [ptr, ec] = std::from_chars(a.softcap.data(), end, params->softcap);
    if (ec != std::errc() || ptr != end || !std::isfinite(params->softcap) || params->softcap < 0)
      return Status::Invalid("--softcap", "'" + a.softcap + "'; expected a number >= 0 (0 = off), such as 50");
  }
  if (!a.dropout.empty()) {
    const char* end = a.dropout.data() + a.dropout.size();
    const auto [ptr, ec] = std::from_chars(a.dropout.data(), end, params->dropout_p);
    if (ec != std::errc() || ptr != end || !(params->dropout_p >= 0 && params->dropout_p < 1))
      return Status::Invalid("--dropout", "'" + a.dropout + "'; expected a probability in [0, 1) (0 = off), such as 0.1");
  }
  if (!a.seed.empty()) {
    if (a.dropout.empty()) return Status::Invalid("--seed", "is set without --dropout; expected it only with --dropout");
    const char* end = a.seed.data() + a.seed.size();
    const auto [ptr, ec] = std::from_chars(a.seed.data(), end, params->dropout_seed);
    if (ec != std::errc() || ptr != end)
      return Status::Invalid("--seed", "'" + a.seed + "'; expected a decimal integer in [0, 2^64), such as 42");
  }
  return Status::Ok();
}

// q, k and v must be rank-4 float32 or float16 arrays, all of one dtype.
Status check_qkv(const npy::Array& t, const std::string& option, const char* layout, const npy::Array* q) {
  if (t.shape.size() != 4)
    return Status::Invalid(option, "shape " + shape_text(t.shape) + " has rank " + std::to_string(t.shape.size()) +
                                       "; expected rank 4 " + layout);
  if (t.dtype != DType::f32 && t.dtype != DType::f16)
    return Status::Invalid(option, std::string("dtype ") + numpy_name(t.dtype) + "; expected float32 or float16");
  if (q && t.dtype != q->dtype)
    return Status::Invalid(option, std::string("dtype ") + numpy_name(t.dtype) + " but --q is " +
                                       numpy_name(q->dtype) + "; expected q, k and v all float32 or all float16");
  return Status::Ok();
}

// The dtypes each input option of `run` accepts (an .npy file of another dtype is refused by npy::read
// with a message listing these).
constexpr npy::DTypeSet kAttentionDTypes{DType::f32, DType::f16};  // --q, --k, --v, --grad-out
constexpr npy::DTypeSet kMaskDTypes{DType::f32, DType::boolean};   // --mask: additive or keep
constexpr npy::DTypeSet kLengthDTypes{DType::i32, DType::i64};     // --kv-lens
constexpr npy::DTypeSet kPerHeadDTypes{DType::f32};                 // --alibi-slopes, --sinks

// Reads an optional input (mask, key lengths) of rank 1 to 4 into `array` and points `*view` at it.
Status read_optional(const std::string& path, const std::string& option, npy::DTypeSet dtypes, const char* shape,
                     npy::Array* array, std::optional<TensorView>* view) {
  if (path.empty()) return Status::Ok();
  if (Status s = npy::read(path, option, array, dtypes); !s) return s;
  if (array->shape.empty())
    return Status::Invalid(option, "a 0-d array (shape []); expected " + std::string(shape));
  TensorView t;
  if (Status s = view_of(*array, option, &t); !s) return s;
  *view = t;
  return Status::Ok();
}

// An uninitialised buffer of `count` elements of `size` bytes: nothing is touched until the library
// has validated the call, so absurd shapes from a small file cost nothing before they are rejected.
Status allocate(const std::string& option, const std::vector<std::int64_t>& shape, std::size_t size,
                std::unique_ptr<unsigned char[]>* buffer) {
  std::int64_t bytes = static_cast<std::int64_t>(size);
  for (std::int64_t n : shape)
    if (__builtin_mul_overflow(bytes, n, &bytes)) bytes = -1;
  try {
    if (bytes < 0) throw std::bad_alloc();
    *buffer = std::make_unique_for_overwrite<unsigned char[]>(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)));
  } catch (const std::bad_alloc&) {
    return Status::Invalid(option, "an output of shape " + shape_text(shape) + " does not fit in memory");
  }
  return Status::Ok();
}

// An fp32 copy of a float32 or float16 buffer of n elements (gradients are written as float32).
std::vector<float> as_f32(DType dtype, const unsigned char* data, std::int64_t n) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if (dtype == DType::f32) std::memcpy(&x[i], data + 4 * i, 4);
    else {
      _Float16 h;
      std::memcpy(&h, data + 2 * i, 2);
      x[i] = static_cast<float>(h);
    }
  }
  return x;
}

Status run_command(const RunArgs& a, std::ostream& out) {
  Params params;
  if (Status s = run_params(a, &params); !s) return s;
  // The gradient options come all together or not at all.
  const bool backward = !a.grad_out.empty() || !a.dq.empty() || !a.dk.empty() || !a.dv.empty();
  if (backward)
    for (auto [path, option] : {std::pair{&a.grad_out, "--grad-out"}, {&a.dq, "--dq"}, {&a.dk, "--dk"}, {&a.dv, "--dv"}})
      if (path->empty())
        return Status::Invalid(option, "missing; expected all of --grad-out, --dq, --dk and --dv for the backward pass");
  if (!a.dsinks.empty() && (!backward || a.sinks.empty()))
    return Status::Invalid("--dsinks", "needs --sinks and the backward pass (--grad-out, --dq, --dk, --dv)");
  // Output files, before anything is read: each new or a regular file, none an input, all distinct.
  if (Status s = check_outputs({{"--out", a.out, true}, {"--lse", a.lse}, {"--dq", a.dq}, {"--dk", a.dk}, {"--dv", a.dv},
                                {"--dsinks", a.dsinks}},
                               {{"--q", a.q},
                                {"--k", a.k},
                                {"--v", a.v},
                                {"--mask", a.mask},
                                {"--kv-lens", a.kv_lens},
                                {"--alibi-slopes", a.alibi_slopes},
                                {"--sinks", a.sinks},
                                {"--grad-out", a.grad_out}});
      !s)
    return s;

  npy::Array q, k, v, mask, kv_lens, slopes, sinks, g;
  if (Status s = npy::read(a.q, "--q", &q, kAttentionDTypes); !s) return s;
  if (Status s = check_qkv(q, "--q", "[B, Hq, Sq, Dk]", nullptr); !s) return s;
  if (Status s = npy::read(a.k, "--k", &k, kAttentionDTypes); !s) return s;
  if (Status s = check_qkv(k, "--k", "[B, Hkv, Skv, Dk]", &q); !s) return s;
  if (Status s = npy::read(a.v, "--v", &v, kAttentionDTypes); !s) return s;
  if (Status s = check_qkv(v, "--v", "[B, Hkv, Skv, Dv]", &q); !s) return s;
  if (Status s = read_optional(a.mask, "--mask", kMaskDTypes, "rank 1 to 4, broadcastable to [B, Hq, Sq, Skv]", &mask,
                               &params.mask);
      !s)
    return s;
  if (Status s = read_optional(a.kv_lens, "--kv-lens", kLengthDTypes, "[B]", &kv_lens, &params.kv_lens); !s) return s;
  if (Status s = read_optional(a.alibi_slopes, "--alibi-slopes", kPerHeadDTypes, "[Hq] or [B, Hq]", &slopes,
                               &params.alibi_slopes);
      !s)
    return s;
  if (Status s = read_optional(a.sinks, "--sinks", kPerHeadDTypes, "[Hq]", &sinks, &params.sinks); !s) return s;
  if (backward) {
    if (Status s = npy::read(a.grad_out, "--grad-out", &g, kAttentionDTypes); !s) return s;
    if (Status s = check_qkv(g, "--grad-out", "[B, Hq, Sq, Dv]", &q); !s) return s;
  }

  TensorView qv, kv, vv;
  if (Status s = view_of(q, "--q", &qv); !s) return s;
  if (Status s = view_of(k, "--k", &kv); !s) return s;
  if (Status s = view_of(v, "--v", &vv); !s) return s;
  const std::vector<std::int64_t> out_shape = {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
  const std::vector<std::int64_t> lse_shape = {q.shape[0], q.shape[1], q.shape[2]};
  std::unique_ptr<unsigned char[]> o, lse;
  if (Status s = allocate("--out", out_shape, dtype_size(q.dtype), &o); !s) return s;
  std::optional<TensorView> lse_view;
  if (!a.lse.empty() || backward) {
    if (Status s = allocate("--lse", lse_shape, sizeof(float), &lse); !s) return s;
    lse_view = TensorView::contiguous(lse.get(), DType::f32, {lse_shape[0], lse_shape[1], lse_shape[2]});
  }
  const TensorView ov =
      TensorView::contiguous(o.get(), q.dtype, {out_shape[0], out_shape[1], out_shape[2], out_shape[3]});
  if (Status s = attention(qv, kv, vv, ov, params, lse_view); !s) return with_option_names(s);

  // Files to write, in order: O, then LSE, then dQ, dK, dV (float32).
  struct File {
    std::string path, option, what;
    DType dtype;
    std::vector<std::int64_t> shape;
    const void* data;
  };
  std::vector<File> files = {{a.out, "--out", "O", q.dtype, out_shape, o.get()}};
  if (!a.lse.empty()) files.push_back({a.lse, "--lse", "LSE", DType::f32, lse_shape, lse.get()});
  std::vector<float> dq32, dk32, dv32, dsinks32;
  if (backward) {
    TensorView gv;
    if (Status s = view_of(g, "--grad-out", &gv); !s) return s;
    std::unique_ptr<unsigned char[]> dq, dk, dv;
    if (Status s = allocate("--dq", q.shape, dtype_size(q.dtype), &dq); !s) return s;
    if (Status s = allocate("--dk", k.shape, dtype_size(q.dtype), &dk); !s) return s;
    if (Status s = allocate("--dv", v.shape, dtype_size(q.dtype), &dv); !s) return s;
    auto view4 = [&](const unsigned char* p, const std::vector<std::int64_t>& sh) {
      return TensorView::contiguous(p, q.dtype, {sh[0], sh[1], sh[2], sh[3]});
    };
    std::vector<float> ds(a.dsinks.empty() ? 0 : static_cast<std::size_t>(q.shape[1]));
    std::optional<TensorView> ds_view;
    if (!ds.empty()) ds_view = TensorView::contiguous(ds.data(), DType::f32, {q.shape[1]});
    if (Status s = attention_backward(qv, kv, vv, ov, *lse_view, gv, view4(dq.get(), q.shape),
                                      view4(dk.get(), k.shape), view4(dv.get(), v.shape), params, ds_view);
        !s)
      return with_option_names(s);
    dsinks32 = std::move(ds);
    dq32 = as_f32(q.dtype, dq.get(), q.numel());
    dk32 = as_f32(q.dtype, dk.get(), k.numel());
    dv32 = as_f32(q.dtype, dv.get(), v.numel());
    files.push_back({a.dq, "--dq", "dQ", DType::f32, q.shape, dq32.data()});
    files.push_back({a.dk, "--dk", "dK", DType::f32, k.shape, dk32.data()});
    files.push_back({a.dv, "--dv", "dV", DType::f32, v.shape, dv32.data()});
    if (!a.dsinks.empty()) files.push_back({a.dsinks, "--dsinks", "dsinks", DType::f32, {q.shape[1]}, dsinks32.data()});
  }
  // All or nothing: every file goes to a temporary first; only when all are written are they renamed.
  FileWriter writer;
  for (const File& f : files)
    if (Status s = writer.stage(f.option, f.path, npy::serialize(f.dtype, f.shape, f.data)); !s) return s;
  if (Status s = writer.commit(); !s) return s;
  for (const File& f : files)
    out << "wrote " << f.what << " " << shape_text(f.shape) << " " << numpy_name(f.dtype) << " to " << f.path << "\n";
  return Status::Ok();
}

CLI::App* add_run(CLI::App& app, RunArgs& a) {
  CLI::App* run = app.add_subcommand("run", "Compute attention on .npy files: O = softmax(scale * Q K^T + mask) V");
  run->add_option("--q", a.q, "Queries [B, Hq, Sq, Dk], float32 or float16")->type_name("Q.npy")->required();
  run->add_option("--k", a.k, "Keys [B, Hkv, Skv, Dk], same dtype as q; Hq % Hkv == 0 (MHA, GQA, MQA)")
      ->type_name("K.npy")->required();
  run->add_option("--v", a.v, "Values [B, Hkv, Skv, Dv], same dtype as q")->type_name("V.npy")->required();
  run->add_option("--out", a.out, "Output O [B, Hq, Sq, Dv], written in q's dtype")->type_name("O.npy")->required();
  run->add_option("--lse", a.lse, "Also write the row log-sum-exp [B, Hq, Sq] (float32, natural log)")
      ->type_name("LSE.npy");
  run->add_option("--causal", a.causal, "Causal mask: top-left (key j <= query i) or bottom-right (j <= i + Skv - Sq)")
      ->type_name("ALIGN");
  run->add_option("--scale", a.scale, "Multiplies Q K^T; finite and > 0; default 1/sqrt(Dk)")->type_name("S");
  run->add_option("--mask", a.mask,
                  "Dense mask broadcastable to [B, Hq, Sq, Skv] (rank 1-4): float32 is added to the scaled scores "
                  "(-inf blocks), bool keeps keys where true")
      ->type_name("M.npy");
  run->add_option("--kv-lens", a.kv_lens, "Key lengths [B], int32 or int64: keys j >= len[b] are padding")
      ->type_name("L.npy");
  run->add_option("--window", a.window, "Local attention: keys from diag-LEFT to diag+RIGHT (-1 = unbounded)")
      ->type_name("LEFT,RIGHT");
  run->add_option("--window-align", a.window_align, "Diagonal of the window: top-left or bottom-right (default)")
      ->type_name("ALIGN");
  run->add_option("--backend", a.backend, "auto (default), reference (fp64 oracle, slow) or flash")
      ->type_name("NAME");
  run->add_option("--threads", a.threads, "Threads; 0 or absent = ATTN_NUM_THREADS, else OpenMP's default")
      ->type_name("N");
  run->add_option("--grad-out", a.grad_out, "Backward pass: the gradient dL/dO [B, Hq, Sq, Dv], same dtype as q "
                                            "(needs --dq, --dk and --dv)")
      ->type_name("dO.npy");
  run->add_option("--dq", a.dq, "Write dL/dQ [B, Hq, Sq, Dk] (float32)")->type_name("dQ.npy");
  run->add_option("--dk", a.dk, "Write dL/dK [B, Hkv, Skv, Dk] (float32; summed over the query heads of a KV head)")
      ->type_name("dK.npy");
  run->add_option("--dv", a.dv, "Write dL/dV [B, Hkv, Skv, Dv] (float32)")->type_name("dV.npy");
  run->add_option("--softcap", a.softcap, "Logit soft-capping (Gemma 2): s = C*tanh(scale*q.k / C) before any bias; "
                                          "0 or absent = off")
      ->type_name("C");
  run->add_option("--alibi-slopes", a.alibi_slopes, "ALiBi slopes [Hq] or [B, Hq], float32: s -= slope*|i + Skv - Sq - j| "
                                                    "(bottom-right aligned, as FlashAttention)")
      ->type_name("SLOPES.npy");
  run->add_option("--sinks", a.sinks, "Attention sinks [Hq], float32: a logit per head in every row's softmax "
                                      "denominator with no value (gpt-oss)")
      ->type_name("SINKS.npy");
  run->add_option("--dropout", a.dropout, "Attention dropout (training): drop each softmax weight with probability P "
                                          "and scale the kept ones by 1/(1-P); the mask is a function of --seed "
                                          "(Philox), the same in the backward pass; 0 or absent = off")
      ->type_name("P");
  run->add_option("--seed", a.seed, "With --dropout: the seed that chooses which weights drop (default 0)")
      ->type_name("N");
  run->add_option("--dsinks", a.dsinks, "With --sinks and the backward pass: write dL/dsinks [Hq] (float32)")
      ->type_name("dSINKS.npy");
  return run;
}

// ---- attn explain ------------------------------------------------------------------------------------

struct ExplainArgs {
  std::string q, k, v, causal, scale;
};

Status explain_command(const ExplainArgs& a, std::ostream& out) {
  ExplainOptions options;
  const std::pair<const std::string*, const char*> files[] = {{&a.q, "--q"}, {&a.k, "--k"}, {&a.v, "--v"}};
  const bool any = !a.q.empty() || !a.k.empty() || !a.v.empty();
  for (const auto& [path, option] : files)
    if (any && path->empty())
      return Status::Invalid(option, "missing; explain takes all of --q, --k and --v, or none for the built-in example");
  options.q = a.q;
  options.k = a.k;
  options.v = a.v;
  if (!a.causal.empty())
    if (Status s = parse_causal(a.causal, "--causal", &options.causal); !s) return s;
  if (!a.scale.empty()) {
    double scale = 0;
    if (Status s = parse_scale(a.scale, "--scale", &scale); !s) return s;
    options.scale = scale;
  }
  return explain(options, out);
}

CLI::App* add_explain(CLI::App& app, ExplainArgs& a) {
  CLI::App* explain = app.add_subcommand(
      "explain", "Walk through attention on a small example step by step (default: a 2x2 / 3x2 worked example)");
  explain->add_option("--q", a.q, "Queries [Sq, Dk] (or [1, 1, Sq, Dk]), float32 or float16, at most 16x16")
      ->type_name("Q.npy");
  explain->add_option("--k", a.k, "Keys [Skv, Dk]")->type_name("K.npy");
  explain->add_option("--v", a.v, "Values [Skv, Dv]")->type_name("V.npy");
  explain->add_option("--causal", a.causal, "Causal mask: top-left or bottom-right")->type_name("ALIGN");
  explain->add_option("--scale", a.scale, "Multiplies Q K^T; default 1/sqrt(Dk)")->type_name("S");
  return explain;
}

// ---- attn demo ---------------------------------------------------------------------------------------

struct DemoArgs {
  std::string threads;
  bool small = false;
};

Status demo_command(const DemoArgs& a, std::ostream& out) {
  DemoOptions options;
  options.small = a.small;
  if (!a.threads.empty())
    if (Status s = parse_threads(a.threads, &options.threads); !s) return s;
  return demo(options, out);
}

CLI::App* add_demo(CLI::App& app, DemoArgs& a) {
  CLI::App* demo = app.add_subcommand(
      "demo", "The worked example, then a realistic GQA shape on the reference and flash backends: "
              "agreement, time and memory");
  demo->add_option("--threads", a.threads, "Threads for the flash backend; 0 or absent = the default")->type_name("N");
  demo->add_flag("--small", a.small, "Use a small shape (for tests)")->group("");  // hidden
  return demo;
}

// ---- the program ---------------------------------------------------------------------------------------

// CLI11 reads numbers with strtoll/strtoull/strtold: it takes hexadecimal and octal ("010" is 8), saturates
// a too-large integer to the largest one and wraps a negative value of an unsigned option. Every number
// option of every subcommand is therefore checked first: a decimal integer that fits in 64 bits (and is not
// negative for an unsigned option), or a finite decimal number.
void strict_numbers(CLI::App& app) {
  auto check = [](const std::string& type) {
    return CLI::Validator(
        [type](std::string& text) -> std::string {
          const char* begin = text.data();
          const char* end = begin + text.size();
          if (type == "FLOAT") {
            double x = 0;
            const auto [ptr, ec] = std::from_chars(begin, end, x);
            if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(x))
              return "'" + text + "'; expected a finite decimal number";
            return {};
          }
          const bool sign = type == "INT" && !text.empty() && text[0] == '-';
          const bool digits = text.size() > (sign ? 1u : 0u) &&
                              std::all_of(begin + (sign ? 1 : 0), end, [](char c) { return c >= '0' && c <= '9'; });
          const char* expected = type == "INT" ? "a decimal integer" : "a non-negative decimal integer";
          if (!digits) return "'" + text + "'; expected " + std::string(expected);
          if (text.size() > (sign ? 2u : 1u) && begin[sign ? 1 : 0] == '0')  // CLI11 would read it as octal
            return "'" + text + "' has a leading zero; expected " + std::string(expected) + " without one";
          std::errc ec;
          if (type == "INT") {
            std::int64_t v = 0;
            ec = std::from_chars(begin, end, v).ec;
          } else {
            std::uint64_t v = 0;
            ec = std::from_chars(begin, end, v).ec;
          }
          if (ec != std::errc()) return "'" + text + "' is out of range; expected " + std::string(expected) + " that fits in 64 bits";
          return {};
        },
        "");
  };
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    for (CLI::Option* opt : sub->get_options()) {
      const std::string type = opt->get_type_name();
      if (opt->get_type_size_max() > 0 && (type == "INT" || type == "UINT" || type == "FLOAT")) opt->check(check(type));
    }
}

// CLI11's own parse errors, in the program's form "<option>: <what was found>; expected <what>". Errors the
// subcommands raise (CLI::RuntimeError from tools/subcommand.h) already have that form and pass through.
std::string parse_error_message(CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  const std::string kind = e.get_name(), m = e.what();
  auto after = [&](const std::string& prefix) { return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : std::string(); };
  auto ends_with = [](const std::string& text, const std::string& end) {
    return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
  };
  // What an option's value should look like, from its type name ("INT", "Q.npy", ...).
  auto value_of = [&](const std::string& name) -> std::string {
    std::vector<CLI::App*> subs;  // the subcommand named on the command line first, then every other
    const std::vector<CLI::App*> all = app.get_subcommands([](CLI::App*) { return true; });
    for (int i = 1; i < argc && subs.empty(); ++i)
      for (CLI::App* sub : all)
        if (sub->check_name(argv[i])) subs.push_back(sub);
    subs.insert(subs.end(), all.begin(), all.end());
    for (CLI::App* sub : subs)
      if (const CLI::Option* opt = sub->get_option_no_throw(name)) {
        const std::string type = opt->get_type_name();
        if (type == "INT") return "an integer";
        if (type == "UINT") return "a non-negative integer";
        if (type == "FLOAT") return "a number";
        return type.empty() ? "no value, or true or false (it is a flag)" : type;
      }
    return "a value (see --help)";
  };
  if (kind == "RequiredError" && ends_with(m, " is required"))  // "--q is required"
    return m.substr(0, m.size() - 12) + ": missing; expected it (a required option)";
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {  // (its get_name() is the app's name)  // "The following argument(s) was/were not expected: X Y"
    std::string extra = after("The following argument was not expected: ");
    if (extra.empty()) extra = after("The following arguments were not expected: ");
    // (CLI11 lists them last first: name the one that comes first on the command line)
    std::vector<std::string> words;
    for (std::size_t at = 0, end; at < extra.size(); at = end + 1) {
      end = std::min(extra.find(' ', at), extra.size());
      words.push_back(extra.substr(at, end - at));
    }
    for (int i = 1; i < argc && words.size() > 1; ++i)
      if (std::find(words.begin(), words.end(), argv[i]) != words.end()) {
        extra = argv[i];
        break;
      }
    if (!extra.empty())
      return extra + ": " + (extra[0] == '-' ? "unknown option" : "unexpected argument") +
             "; expected a command and its options (see attn --help and attn COMMAND --help)";
  }
  if (kind == "ArgumentMismatch") {
    const std::size_t colon = m.find(": ");
    if (colon != std::string::npos) {
      const std::string option = m.substr(0, colon), rest = m.substr(colon + 2);
      if (rest.rfind("At Most 1 required but received ", 0) == 0)  // "--dq: At Most 1 required but received 2"
        return option + ": given " + rest.substr(32) + " times; expected it once";
      if (ends_with(rest, " missing"))  // "--q: 1 required TEXT missing"
        return option + ": no value; expected " + value_of(option);
    }
  }
  if (kind == "ConversionError") {
    const std::string what = after("Could not convert: ");  // "--seq = abc"
    const std::size_t eq = what.find(" = ");
    if (eq != std::string::npos) {
      const std::string option = what.substr(0, eq);
      return option + ": '" + what.substr(eq + 3) + "' is not valid; expected " + value_of(option);
    }
  }
  return m;
}

int fail(std::ostream& err, std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  while (!message.empty() && message.back() == ' ') message.pop_back();
  err << "attn: error: " << message << "\n";
  return 2;
}

}  // namespace

// The subcommands, each in a file of its own. tools/ holds what a user of the program needs; the benchmark
// harness lives in bench/harness/ and the research experiments in experiments/ (CMakeLists.txt builds all three
// rooms into the one program, so the commands a user types stay the same).
void add_cost_commands(CLI::App& app, std::ostream& out);  // tools/cmd_cost.cc: flops, kv-size, params
void add_heatmap_command(CLI::App& app, std::ostream& out);   // tools/cmd_heatmap.cc
void add_info_command(CLI::App& app, std::ostream& out);   // tools/cmd_info.cc
void add_ring_plan_command(CLI::App& app, std::ostream& out);  // tools/cmd_ring_plan.cc
void add_bench_command(CLI::App& app, std::ostream& out);  // bench/harness/cmd_bench.cc
void add_cascade_bench_command(CLI::App& app, std::ostream& out);  // bench/harness/cmd_cascade_bench.cc
#ifdef ATTN_HAVE_DIST
void add_ring_bench_command(CLI::App& app, std::ostream& out);  // bench/harness/cmd_ring_bench.cc (MPI)
#endif
void add_generate_command(CLI::App& app, std::ostream& out);  // experiments/cmd_generate.cc
void add_scaling_experiment_command(CLI::App& app, std::ostream& out);  // experiments/cmd_scaling_experiment.cc
void add_compare_scoring_command(CLI::App& app, std::ostream& out);  // experiments/cmd_compare_scoring.cc

int main(int argc, char** argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"attn: scaled dot-product attention, O = softmax(scale * Q K^T + mask) V", "attn"};
  app.require_subcommand(0, 1);
  RunArgs run_args;
  ExplainArgs explain_args;
  DemoArgs demo_args;
  CLI::App* run = add_run(app, run_args);
  CLI::App* explain = add_explain(app, explain_args);
  CLI::App* demo = add_demo(app, demo_args);
  add_cost_commands(app, out);
  add_generate_command(app, out);
  add_heatmap_command(app, out);
  add_info_command(app, out);
  add_bench_command(app, out);
  add_cascade_bench_command(app, out);
  add_scaling_experiment_command(app, out);
  add_compare_scoring_command(app, out);
  add_ring_plan_command(app, out);
#ifdef ATTN_HAVE_DIST
  add_ring_bench_command(app, out);
#endif
  app.footer("Run 'attn COMMAND --help' for the options of a command.");  // after: subcommands copy it
  strict_numbers(app);

  // "--name=" is refused: CLI11 reads it as the option with no value and takes the next argument as its value
  // ("--png= --json" wrote a PNG named --json).
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {  // (CLI11 takes them last first)
    const std::string arg = argv[i];
    if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.find('=') == arg.size() - 1)
      return fail(err, arg.substr(0, arg.size() - 1) + ": empty value after '='; expected a value (or the option "
                                                        "left out)");
    args.push_back(arg);
  }
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    out << app.help();  // the help of the subcommand named on the command line, if any
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    return fail(err, parse_error_message(app, argc, argv, e));
  }

  try {
    Status status;
    if (run->parsed()) status = run_command(run_args, out);
    else if (explain->parsed()) status = explain_command(explain_args, out);
    else if (demo->parsed()) status = demo_command(demo_args, out);
    else if (!app.get_subcommands().empty()) {}  // ran in its callback during parse (tools/subcommand.h)
    else {
      out << app.help();
      return fail(err, "no command given; expected one of the commands above (attn COMMAND --help for its options)");
    }
    if (!status) return fail(err, status.message());
  } catch (const std::exception& e) {  // e.g. out of memory: still one line, still exit 2
    return fail(err, exception_message(e));
  }
  return 0;
}

}  // namespace attn::tools
