// attn flops / kv-size / params: the cost model of include/attn/cost.h on the command line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <ostream>
#include <string>

#include "attn/cost.h"
#include "attn/tensor.h"
#include "commands.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

// "1.23 G" style: value scaled by 1e3 steps, 4 significant digits; from 1000 E on, "1.235e+21 " (no prefix).
std::string si(double x) {
  const char* units[] = {"", " k", " M", " G", " T", " P", " E"};
  if (x >= 1e21) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3e ", x);
    return buf;
  }
  int u = 0;
  while (x >= 1000 && u < 6) x /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g%s", x, units[u]);
  return buf;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string pad(std::string s, std::size_t width, bool right = false) {
  if (s.size() >= width) return right ? " " + s : s + " ";  // (a wider value still keeps its columns apart)
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

// The cost model's field names as the options that set them (with_option_names, tools/commands.h).
Status options(const Status& s) {
  return with_option_names(s, {{"d_model", "--d-model"}, {"kv_heads", "--kv-heads"}, {"heads", "--heads"},
                               {"head_dim", "--head-dim"}, {"v_head_dim", "--head-dim"}, {"seq", "--seq"},
                               {"batch", "--batch"}, {"layers", "--layers"}, {"bytes_per_element", "--dtype"}});
}

Status parse_dtype(const std::string& text, KvDType* dtype) {
  if (text == "f32") *dtype = KvDType::f32;
  else if (text == "f16") *dtype = KvDType::f16;
  else if (text == "bf16") *dtype = KvDType::bf16;
  else if (text == "fp8") *dtype = KvDType::fp8;
  else if (text == "int8" || text == "i8") *dtype = KvDType::int8;
  else if (text == "int4" || text == "i4") *dtype = KvDType::int4;
  else return Status::Invalid("--dtype", "'" + text + "'; expected f32, f16, bf16, fp8, int8 or int4");
  return Status::Ok();
}

struct FlopsArgs {
  std::int64_t seq = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, batch = 1;
  bool causal = false;
  std::string dtype = "f32";
};

Status flops(const FlopsArgs& a, std::ostream& out) {
  KvDType dt;
  if (Status s = parse_dtype(a.dtype, &dt); !s) return s;
  if (dt == KvDType::int4)  // (a stage's values are whole bytes: the 4-bit type is a cache's storage)
    return Status::Invalid("--dtype", "'" + a.dtype + "'; expected f32, f16, bf16, fp8 or int8 (int4 is a KV cache's "
                                      "storage: attn kv-size --dtype int4)");
  AttentionShape shape{a.batch, a.seq,  a.d_model, a.heads, a.kv_heads, a.head_dim, 0, a.causal,
                       static_cast<std::int64_t>(kv_dtype_bytes(dt))};
  AttentionCost c;
  if (Status s = attention_cost(shape, &c); !s) return options(s);
  const AttentionShape& s = c.shape;
  out << "one attention layer: batch " << s.batch << ", N = " << s.seq << ", d_model " << s.d_model << ", "
      << s.heads << " query heads / " << s.kv_heads << " KV heads of " << s.head_dim << (s.causal ? ", causal" : "")
      << ", " << a.dtype << " (" << s.bytes_per_element << " B/value)\n\n";
  out << pad("stage", 19) << pad("FLOPs", 12, true) << pad("seeds' count", 14, true) << pad("share", 8, true)
      << pad("bytes", 12, true) << "\n";
  for (const StageCost& st : c.stages)
    out << pad(st.name, 19) << pad(si(st.flops), 12, true) << pad(si(st.seed_ops), 14, true)
        << pad(fmt("%.1f%%", 100 * st.flops / c.total_flops), 8, true) << pad(si(st.bytes) + "B", 12, true) << "\n";
  out << pad("total", 19) << pad(si(c.total_flops), 12, true) << pad(si(c.total_seed_ops), 14, true)
      << pad("", 8) << pad(si(c.total_bytes) + "B", 12, true) << "\n\n";
  out << "FLOPs count 2 per multiply-add; the seeds' count is 1 per multiply-add (their \"3·N·d²\" for QKV) and\n"
         "1 per score for softmax (FLOPs: 5 per score). Bytes: each stage reads its inputs and writes its\n"
         "output once with the score matrix materialised; a fused (flash) kernel moves\n"
      << si(c.fused_attention_bytes) << "B for QKᵀ..AV instead of "
      << si(c.stages[1].bytes + c.stages[2].bytes + c.stages[3].bytes) << "B.\n";
  out << "dominant stage: " << c.dominant << "\n";
  const double attn_flops = c.stages[1].flops + c.stages[3].flops, proj = c.stages[0].flops + c.stages[4].flops;
  out << "crossover: attention matmuls (QKᵀ + AV) overtake the projections at N ≈ " << fmt("%.0f", c.crossover_seq)
      << " (" << fmt("%.2f", c.crossover_seq / s.d_model) << "·d_model); at N = " << s.seq << " they are "
      << fmt("%.2f", attn_flops / proj) << "× the projections.\n";
  out << "seeds: \"crossover at N ≈ 2d\" holds for MHA without a mask (2·N²·d = 4·N·d²); causal moves it to ≈ 4d,\n"
         "GQA/MQA (smaller K/V projections) move it below 2d. Their \"short sequences (N < d/4)\" is not a\n"
         "crossover: at N = d/4 attention is 1/8 of the projections in MHA.\n";
  return Status::Ok();
}

struct KvArgs {
  std::int64_t layers = 0, kv_heads = 0, head_dim = 0, seq = 0, batch = 1;
  std::string dtype = "f16";
};

Status kv_size(const KvArgs& a, std::ostream& out) {
  KvCacheShape shape{a.layers, a.kv_heads, a.head_dim, a.seq, a.batch, KvDType::f16};
  if (Status s = parse_dtype(a.dtype, &shape.dtype); !s) return s;
  double bytes = 0;
  if (Status s = kv_cache_bytes(shape, &bytes); !s) return options(s);
  out << "KV cache: 2 (K, V) x " << a.layers << " layers x " << a.kv_heads << " KV heads x " << a.head_dim
      << " dims x " << a.seq << " tokens x batch " << a.batch << " x " << kv_dtype_bytes(shape.dtype) << " B ("
      << a.dtype << ")";
  if (shape.dtype == KvDType::int8)
    out << "\n  + 2 (K, V) x " << a.layers << " x " << a.kv_heads << " x " << a.seq << " x " << a.batch
        << " fp32 scales (one per token and KV head)";
  if (shape.dtype == KvDType::int4)
    out << "\n  + 2 (K, V) x " << a.layers << " x " << a.kv_heads << " x " << a.seq << " x " << a.batch << " x "
        << a.head_dim / kI4Block + (a.head_dim % kI4Block != 0) << " fp32 scales (one per " << kI4Block
        << " values of a row)";
  if (shape.dtype == KvDType::int4 && a.head_dim % 2)
    out << "\n  (a row of " << a.head_dim << " 4-bit values takes " << a.head_dim / 2 + 1 << " whole bytes)";
  out << "\n";
  // (exact up to 2^53, a double's integers; beyond, the bytes are printed as what they are: 16 digits)
  const bool exact = bytes < 0x1p53;
  out << "  = " << (exact ? fmt("%.0f", bytes) : fmt("%.15e", bytes)) << " bytes = "
      << fmt(exact ? "%.2f" : "%.3e", bytes / 1e9) << " GB = "
      << fmt(exact ? "%.2f" : "%.3e", bytes / (1024.0 * 1024 * 1024)) << " GiB\n";
  return Status::Ok();
}

struct ParamsArgs {
  std::int64_t d_model = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool bias = false;
};

Status params(const ParamsArgs& a, std::ostream& out) {
  std::int64_t n = 0;
  ParamShape shape{a.d_model, a.heads, a.kv_heads, a.head_dim, 0, a.bias};
  if (Status s = parameter_count(shape, &n); !s) return options(s);
  const std::int64_t hkv = a.kv_heads ? a.kv_heads : a.heads, dk = a.head_dim ? a.head_dim : a.d_model / a.heads;
  out << "parameters of one attention layer: " << n << "\n";
  out << "  W_Q " << a.d_model << "x" << a.heads * dk << ", W_K and W_V " << a.d_model << "x" << hkv * dk << ", W_O "
      << a.heads * dk << "x" << a.d_model;
  if (a.bias) out << ", biases " << (a.heads * dk + 2 * hkv * dk + a.d_model);
  out << "\n  = d·(Hq·Dk + 2·Hkv·Dk) + Hq·Dk·d" << (a.bias ? " + (Hq·Dk + 2·Hkv·Dk + d)" : "")
      << "; MHA without bias: d·h·(3·Dk + Dv), the seeds' formula\n";
  return Status::Ok();
}

}  // namespace

void add_cost_commands(CLI::App& app, std::ostream& out) {
  auto f = std::make_shared<FlopsArgs>();
  CLI::App* fc = app.add_subcommand("flops", "FLOPs and bytes of one attention layer, stage by stage (cost model)");
  fc->add_option("--seq", f->seq, "Sequence length N")->required();
  fc->add_option("--d-model", f->d_model, "Model width d")->required();
  fc->add_option("--heads", f->heads, "Query heads")->required();
  fc->add_option("--kv-heads", f->kv_heads, "KV heads (default: --heads; GQA/MQA when fewer)");
  fc->add_option("--head-dim", f->head_dim, "Head dim (default: d_model / heads)");
  fc->add_flag("--causal", f->causal, "Causal mask: only N(N+1)/2 query-key pairs");
  fc->add_option("--batch", f->batch, "Batch size (default 1)");
  fc->add_option("--dtype", f->dtype, "Bytes per value for the byte counts: f32 (default), f16, bf16, fp8");
  on_run(fc, [f, &out] { return flops(*f, out); });

  auto k = std::make_shared<KvArgs>();
  CLI::App* kc = app.add_subcommand("kv-size", "Bytes of a KV cache: 2 x layers x KV heads x head dim x tokens x batch x dtype");
  kc->add_option("--layers", k->layers, "Layers")->required();
  kc->add_option("--kv-heads", k->kv_heads, "KV heads per layer")->required();
  kc->add_option("--head-dim", k->head_dim, "Head dim")->required();
  kc->add_option("--seq", k->seq, "Tokens cached")->required();
  kc->add_option("--batch", k->batch, "Sequences (default 1)");
  kc->add_option("--dtype", k->dtype, "f32, f16 (default), bf16, fp8, int8 (attn's 8-bit cache: + an fp32 scale per token and KV head) or int4 (its 4-bit cache: + an fp32 scale per 32 values)");
  on_run(kc, [k, &out] { return kv_size(*k, out); });

  auto p = std::make_shared<ParamsArgs>();
  CLI::App* pc = app.add_subcommand("params", "Parameter count of one attention layer (MHA, GQA, MQA)");
  pc->add_option("--d-model", p->d_model, "Model width d")->required();
  pc->add_option("--heads", p->heads, "Query heads")->required();
  pc->add_option("--kv-heads", p->kv_heads, "KV heads (default: --heads)");
  pc->add_option("--head-dim", p->head_dim, "Head dim (default: d_model / heads)");
  pc->add_flag("--bias", p->bias, "Count the biases of the four projections");
  on_run(pc, [p, &out] { return params(*p, out); });
}

}  // namespace attn::tools
