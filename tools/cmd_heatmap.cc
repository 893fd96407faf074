// attn heatmap: the attention weights softmax(scale·QKᵀ + mask) of a small input as a PNG, one panel per
// head. The weights come from attn::attention itself: with V = the identity matrix, O = P.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "attn/sdpa.h"
#include "commands.h"
#include "files.h"
#include "npy.h"
#include "plot.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

struct HeatmapArgs {
  std::string q, k, causal, scale, png = "heatmap.png";
};

// Q [Hq, Sq, D] and K [Hkv, Skv, D] as float32, plus labels and titles.
struct Input {
  std::int64_t hq = 0, hkv = 0, sq = 0, skv = 0, d = 0;
  std::vector<float> q, k;
  std::vector<std::string> words, titles;
};

// The built-in example: ten words and four heads built by hand to show four patterns the literature
// finds in trained models. D = 32: slots 0..15 encode the position, 16..31 the word.
Input builtin() {
  Input in;
  in.words = {"the", "cat", "sat", "on", "the", "mat", "because", "it", "was", "tired"};
  const int word_id[] = {0, 1, 2, 3, 0, 4, 5, 6, 7, 8};
  in.hq = in.hkv = 4, in.sq = in.skv = 10, in.d = 32;
  in.titles = {"head 0: previous word", "head 1: first word", "head 2: same word", "head 3: recent words"};
  in.q.assign(static_cast<std::size_t>(in.hq * in.sq * in.d), 0.0f);
  in.k = in.q;
  auto at = [&](std::vector<float>& t, std::int64_t h, std::int64_t i, std::int64_t e) -> float& {
    return t[static_cast<std::size_t>((h * in.sq + i) * in.d + e)];
  };
  for (std::int64_t i = 0; i < 10; ++i) {
    for (std::int64_t h : {0, 1, 3}) at(in.k, h, i, i) = 1;  // keys: their position
    at(in.k, 2, i, 16 + word_id[i]) = 1;                       // head 2 keys: their word
    at(in.q, 0, i, i > 0 ? i - 1 : 0) = 6;                     // the previous position
    at(in.q, 1, i, 0) = 4;                                     // position 0
    at(in.q, 2, i, 16 + word_id[i]) = 5;                       // the same word
    for (std::int64_t j = 0; j <= i; ++j) at(in.q, 3, i, j) = static_cast<float>(3 * std::exp(-0.5 * (i - j)));
  }
  return in;
}

Status load(const std::string& path, const char* option, std::int64_t* heads, std::int64_t* seq, std::int64_t* dim,
            std::vector<float>* data) {
  npy::Array a;
  if (Status s = npy::read(path, option, &a, {DType::f32}); !s) return s;
  if (a.dtype != DType::f32) return Status::Invalid(option, std::string("dtype ") + numpy_name(a.dtype) + "; expected float32");
  std::vector<std::int64_t> shape = a.shape;
  if (shape.size() == 4 && shape[0] == 1) shape.erase(shape.begin());
  if (shape.size() == 2) shape.insert(shape.begin(), 1);
  if (shape.size() != 3)
    return Status::Invalid(option, "shape " + shape_text(a.shape) + "; expected [S, D], [H, S, D] or [1, H, S, D]");
  if (shape[1] < 1 || shape[1] > 256 || shape[0] < 1 || shape[0] > 64 || shape[2] < 1)
    return Status::Invalid(option, "shape " + shape_text(a.shape) + "; expected at most 64 heads of 1 to 256 tokens (a picture)");
  *heads = shape[0], *seq = shape[1], *dim = shape[2];
  data->assign(a.as<float>(), a.as<float>() + a.numel());
  // (a NaN or infinite entry makes its rows' weights NaN: no picture of attention weights)
  if (const auto bad = std::find_if(data->begin(), data->end(), [](float x) { return !std::isfinite(x); }); bad != data->end())
    return Status::Invalid(option, "element " + std::to_string(bad - data->begin()) + " is " + std::to_string(*bad) +
                                       "; expected finite values");
  return Status::Ok();
}

Status heatmap(const HeatmapArgs& a, std::ostream& out) {
  Input in;
  Params params;
  if (Status s = check_outputs({{"--png", a.png, true}}, {{"--q", a.q}, {"--k", a.k}}); !s) return s;
  if (a.q.empty() != a.k.empty())
    return Status::Invalid(a.q.empty() ? "--q" : "--k", "missing; expected both --q and --k, or neither for the built-in example");
  if (a.q.empty()) {
    in = builtin();
    params.causal = Causal::top_left;
    params.scale = 1.0;
  } else {
    std::int64_t dk = 0;
    if (Status s = load(a.q, "--q", &in.hq, &in.sq, &in.d, &in.q); !s) return s;
    if (Status s = load(a.k, "--k", &in.hkv, &in.skv, &dk, &in.k); !s) return s;
    if (dk != in.d) return Status::Invalid("--k", "head dim " + std::to_string(dk) + "; expected " + std::to_string(in.d) + " as --q");
    for (std::int64_t h = 0; h < in.hq; ++h) in.titles.push_back("head " + std::to_string(h));
  }
  if (!a.causal.empty())
    if (Status s = parse_causal(a.causal, "--causal", &params.causal); !s) return s;
  if (!a.scale.empty()) {
    double scale = 0;
    if (Status s = parse_scale(a.scale, "--scale", &scale); !s) return s;
    params.scale = scale;
  }
  // The picture is the command's output: a build without Cairo says so once the inputs are known to be right.
  if (Status s = plot::check_can_draw("--png", a.png, /*optional=*/false); !s) return s;
  // V = I (per KV head) makes the output the weight matrix itself.
  std::vector<float> eye(static_cast<std::size_t>(in.hkv * in.skv * in.skv), 0.0f), p(static_cast<std::size_t>(in.hq * in.sq * in.skv));
  for (std::int64_t h = 0; h < in.hkv; ++h)
    for (std::int64_t j = 0; j < in.skv; ++j) eye[static_cast<std::size_t>((h * in.skv + j) * in.skv + j)] = 1;
  const Status s = attention(TensorView::contiguous(in.q.data(), DType::f32, {1, in.hq, in.sq, in.d}),
                             TensorView::contiguous(in.k.data(), DType::f32, {1, in.hkv, in.skv, in.d}),
                             TensorView::contiguous(eye.data(), DType::f32, {1, in.hkv, in.skv, in.skv}),
                             TensorView::contiguous(p.data(), DType::f32, {1, in.hq, in.sq, in.skv}), params);
  if (!s) return with_option_names(s);

  plot::HeatmapFigure fig;
  fig.title = a.q.empty() ? "attention weights of a built-in example (causal)" : "attention weights softmax(QK^T)";
  fig.x_label = "key";
  fig.y_label = "query";
  fig.scale_label = "weight";
  fig.vmin = 0;
  fig.vmax = 1;
  double worst = 0;
  for (std::int64_t h = 0; h < in.hq; ++h) {
    plot::Heatmap panel;
    panel.title = in.titles[static_cast<std::size_t>(h)];
    panel.rows = in.sq, panel.cols = in.skv;
    panel.values.assign(p.begin() + h * in.sq * in.skv, p.begin() + (h + 1) * in.sq * in.skv);
    panel.row_labels = panel.col_labels = in.words;
    for (std::int64_t i = 0; i < in.sq; ++i) {
      double sum = 0;
      for (std::int64_t j = 0; j < in.skv; ++j) sum += panel.values[static_cast<std::size_t>(i * in.skv + j)];
      if (sum > 0) worst = std::max(worst, std::fabs(sum - 1));  // an all-masked row sums to 0
    }
    fig.panels.push_back(std::move(panel));
  }
  if (Status w = plot::write_heatmaps(a.png, fig); !w) return renamed(w, "--png");
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld heads, %lld queries x %lld keys; every row sums to 1 within %.1e\n",
                static_cast<long long>(in.hq), static_cast<long long>(in.sq), static_cast<long long>(in.skv), worst);
  out << buf << "wrote " << a.png << "\n";
  return Status::Ok();
}

}  // namespace

void add_heatmap_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<HeatmapArgs>();
  CLI::App* c = app.add_subcommand("heatmap", "Draw the attention weights of a small input as a PNG, one panel per head "
                                              "(default: a built-in example)");
  c->add_option("--q", a->q, "Queries [S, D], [H, S, D] or [1, H, S, D], float32")->type_name("Q.npy");
  c->add_option("--k", a->k, "Keys, same forms (Hq % Hkv == 0)")->type_name("K.npy");
  c->add_option("--causal", a->causal, "top-left or bottom-right (the built-in example is top-left)")->type_name("ALIGN");
  c->add_option("--scale", a->scale, "Multiplies Q K^T; default 1/sqrt(D) (1 for the built-in example)")->type_name("S");
  c->add_option("--png", a->png, "Output image (default heatmap.png)")->type_name("OUT.png");
  on_run(c, [a, &out] { return heatmap(*a, out); });
}

}  // namespace attn::tools
