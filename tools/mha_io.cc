#include "mha_io.h"

#include <filesystem>
#include <vector>

#include "commands.h"
#include "files.h"
#include "npy.h"

namespace attn::tools {
namespace {

struct Entry {
  const char* name;
  std::vector<float>* data;
  std::vector<std::int64_t> shape;
};

std::vector<Entry> entries(MultiHeadAttention& m) {
  const MhaConfig& c = m.config();
  MhaWeights& w = m.weights();
  const std::int64_t d = c.d_model, q = c.heads * c.head_dim, k = c.kv_heads * c.head_dim, v = c.kv_heads * c.v_head_dim,
                     o = c.heads * c.v_head_dim;
  std::vector<Entry> e = {{"w_q", &w.w_q, {q, d}}, {"w_k", &w.w_k, {k, d}}, {"w_v", &w.w_v, {v, d}}, {"w_o", &w.w_o, {d, o}}};
  if (c.bias) {
    e.push_back({"b_q", &w.b_q, {q}});
    e.push_back({"b_k", &w.b_k, {k}});
    e.push_back({"b_v", &w.b_v, {v}});
    e.push_back({"b_o", &w.b_o, {d}});
  }
  return e;
}

}  // namespace

Status save_mha_weights(const std::string& dir, const MultiHeadAttention& mha) {
  if (Status s = mha.check_weights(); !s) return s;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Invalid("dir", "cannot create '" + dir + "': " + ec.message());
  MultiHeadAttention copy = mha;
  FileWriter writer;  // all files or none
  for (const Entry& e : entries(copy)) {
    const std::string path = (std::filesystem::path(dir) / (std::string(e.name) + ".npy")).string();
    if (Status s = writer.stage(path, path, npy::serialize(DType::f32, e.shape, e.data->data())); !s) return s;
  }
  return writer.commit();
}

Status load_mha_weights(const std::string& dir, const MhaConfig& config, MultiHeadAttention* mha) {
  MultiHeadAttention m;
  if (Status s = MultiHeadAttention::create(config, &m); !s) return s;
  for (const Entry& e : entries(m)) {
    const std::string path = (std::filesystem::path(dir) / (std::string(e.name) + ".npy")).string();
    npy::Array a;
    if (Status s = npy::read(path, e.name, &a, {DType::f32}); !s) return s;
    if (a.dtype != DType::f32)
      return Status::Invalid(e.name, std::string("dtype ") + numpy_name(a.dtype) + " in " + path + "; expected float32");
    if (a.shape != e.shape)
      return Status::Invalid(e.name, "shape " + shape_text(a.shape) + " in " + path + "; expected " + shape_text(e.shape));
    e.data->assign(a.as<float>(), a.as<float>() + a.numel());
  }
  *mha = std::move(m);
  return Status::Ok();
}

}  // namespace attn::tools
