// The cost, generate and heatmap commands in-process, the PNG writer, and MHA weight files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/mha.h"
#include "cli_support.h"
#include "commands.h"
#include "mha_io.h"
#include "npy.h"
#include "plot.h"

namespace attn {
namespace {

namespace fs = std::filesystem;
using test::cli;
using test::Outcome;
using Dir = test::ScratchDirTest;

bool is_png(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  return f && std::string(sig + 1, 3) == "PNG";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CostCli, SeedsNumbers) {
  Outcome r = cli({"kv-size", "--layers", "80", "--kv-heads", "64", "--head-dim", "128", "--seq", "64000"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "167772160000 bytes = 167.77 GB = 156.25 GiB")) << r.out;
  r = cli({"kv-size", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--seq", "64000", "--dtype", "f16"});
  EXPECT_TRUE(has(r.out, "= 20.97 GB")) << r.out;
  r = cli({"kv-size", "--layers", "1", "--kv-heads", "1", "--head-dim", "4", "--seq", "10", "--batch", "3", "--dtype", "fp8"});
  EXPECT_TRUE(has(r.out, "= 240 bytes")) << r.out;
  r = cli({"kv-size", "--layers", "1", "--kv-heads", "1", "--head-dim", "4", "--seq", "10", "--batch", "3", "--dtype", "int8"});
  EXPECT_TRUE(has(r.out, "= 480 bytes")) << r.out;  // 240 + 2 x 10 x 3 fp32 scales
  EXPECT_TRUE(has(r.out, "fp32 scales")) << r.out;
  r = cli({"params", "--d-model", "512", "--heads", "8"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "parameters of one attention layer: 1048576")) << r.out;
  r = cli({"params", "--d-model", "512", "--heads", "8", "--kv-heads", "2", "--bias"});
  EXPECT_TRUE(has(r.out, ": " + std::to_string(512 * (512 + 128 + 128) + 512 * 512 + (512 + 128 + 128 + 512)))) << r.out;
  r = cli({"flops", "--seq", "4096", "--d-model", "8192", "--heads", "64"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "dominant stage: QKV projections")) << r.out;
  EXPECT_TRUE(has(r.out, "N ≈ 16384 (2.00·d_model)")) << r.out;
  EXPECT_TRUE(has(r.out, "824.6 G")) << r.out;  // the seeds' 3·N·d²
  r = cli({"flops", "--seq", "100000", "--d-model", "64", "--heads", "8", "--causal"});
  EXPECT_TRUE(has(r.out, "N ≈ 255 ")) << r.out;
  EXPECT_TRUE(has(r.out, "dominant stage: Q K^T")) << r.out;
}

TEST(CostCli, BadInputNamesTheOption) {
  Outcome r = cli({"params", "--d-model", "512", "--heads", "8", "--kv-heads", "3"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "attn: error: --kv-heads: 3; expected a divisor of heads = 8 (MHA: heads, GQA: between, MQA: 1)\n");
  r = cli({"kv-size", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--seq", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--seq: 0; expected")) << r.err;
  r = cli({"kv-size", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--seq", "9", "--dtype", "f64"});
  EXPECT_TRUE(has(r.err, "--dtype: 'f64'; expected f32, f16, bf16, fp8, int8 or int4")) << r.err;
  r = cli({"flops", "--seq", "10", "--d-model", "32", "--heads", "4", "--dtype", "int4"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--dtype: 'int4'; expected f32, f16, bf16, fp8 or int8 (int4 is a KV cache's storage")) << r.err;
  // The 4-bit cache: Llama-3-8B's 32 layers x 8 KV heads x 128 dims x 4096 tokens, 64 bytes of values and 4 scales of
  // 4 bytes per row: 2 x 32 x 8 x 4096 x 80 = 167,772,160 bytes.
  r = cli({"kv-size", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--seq", "4096", "--dtype", "int4"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "= 167772160 bytes")) << r.out;
  EXPECT_TRUE(has(r.out, "x 4 fp32 scales (one per 32 values of a row)")) << r.out;
  r = cli({"flops", "--seq", "10", "--d-model", "30", "--heads", "4"});
  EXPECT_TRUE(has(r.err, "--head-dim: not given")) << r.err;
  r = cli({"flops", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "--kv-heads")) << r.out;
}

TEST_F(Dir, GenerateAgreesAndPlots) {
  ATTN_SKIP_WITHOUT_PLOTS();
  for (const char* cache : {"contiguous", "paged"}) {
    const std::string png = path(std::string(cache) + ".png");
    const Outcome r = cli({"generate", "--tokens", "12", "--layers", "2", "--d-model", "32", "--heads", "4", "--kv-heads",
                           "2", "--vocab", "50", "--repeat", "1", "--cache", cache, "--page-size", "3", "--png", png});
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_TRUE(has(r.out, "greedy tokens identical at 12 of 12 steps")) << r.out;
    EXPECT_TRUE(is_png(png));
  }
  const Outcome r = cli({"generate", "--kv-heads", "3"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--kv-heads")) << r.err;
}

TEST_F(Dir, HeatmapBuiltinAndFiles) {
  ATTN_SKIP_WITHOUT_PLOTS();
  Outcome r = cli({"heatmap", "--png", path("builtin.png")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "4 heads, 10 queries x 10 keys")) << r.out;
  EXPECT_TRUE(is_png(path("builtin.png")));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> q(2 * 5 * 8), k(1 * 7 * 8);
  for (float& x : q) x = u(rng);
  for (float& x : k) x = u(rng);
  ASSERT_TRUE(npy::write(path("q.npy"), DType::f32, {2, 5, 8}, q.data()).ok());
  ASSERT_TRUE(npy::write(path("k.npy"), DType::f32, {7, 8}, k.data()).ok());
  r = cli({"heatmap", "--q", path("q.npy"), "--k", path("k.npy"), "--causal", "bottom-right", "--png", path("f.png")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "2 heads, 5 queries x 7 keys")) << r.out;
  ASSERT_TRUE(npy::write(path("k6.npy"), DType::f32, {7, 4}, k.data()).ok());
  r = cli({"heatmap", "--q", path("q.npy"), "--k", path("k6.npy"), "--png", path("g.png")});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--k: head dim 4; expected 8")) << r.err;
  EXPECT_FALSE(fs::exists(path("g.png")));
  r = cli({"heatmap", "--q", path("q.npy")});
  EXPECT_TRUE(has(r.err, "--k: missing")) << r.err;
}

// A build without Cairo refuses a plot before any work, naming the option and what is missing.
TEST_F(Dir, PlotsSayWhatIsMissingWithoutCairo) {
  if (plot::available()) GTEST_SKIP() << "this build draws plots";
  Outcome r = cli({"heatmap", "--png", path("h.png")});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "attn: error: --png: this attn was built without Cairo")) << r.err;
  EXPECT_TRUE(has(r.err, "libcairo2-dev")) << r.err;
  r = cli({"generate", "--tokens", "2", "--png", path("g.png")});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "expected --png '' (no plot) or a build with Cairo")) << r.err;
  EXPECT_TRUE(fs::is_empty(dir_)) << "nothing written";
}

TEST_F(Dir, PlotWriterChecksItsInput) {
  ATTN_SKIP_WITHOUT_PLOTS();
  plot::LinePlot p;
  EXPECT_FALSE(plot::write_line_plot(path("a.png"), p).ok());
  p.series.push_back({"s", {1, 2, 3}, {1, 4}});
  EXPECT_TRUE(has(plot::write_line_plot(path("a.png"), p).message(), "3 x values and 2 y values"));
  p.series[0].y.push_back(9);
  p.log_y = true;
  ASSERT_TRUE(plot::write_line_plot(path("a.png"), p).ok());
  EXPECT_TRUE(is_png(path("a.png")));
  EXPECT_FALSE(plot::write_line_plot(path("no/such/dir/a.png"), p).ok());
  plot::HeatmapFigure f;
  EXPECT_FALSE(plot::write_heatmaps(path("h.png"), f).ok());
  f.panels.push_back({"x", 2, 2, {0, 1, 2}});
  EXPECT_FALSE(plot::write_heatmaps(path("h.png"), f).ok());
  f.panels[0].values.push_back(NAN);  // drawn blank
  ASSERT_TRUE(plot::write_heatmaps(path("h.png"), f).ok());
  // SVG by the extension, with the text as text (Cairo's SVG keeps glyphs as outlines, so check the structure)
  p.title = "a title";
  ASSERT_TRUE(plot::write_line_plot(path("a.svg"), p).ok());
  ASSERT_TRUE(plot::write_heatmaps(path("h.SVG"), f).ok());
  for (const char* name : {"a.svg", "h.SVG"}) {
    std::ifstream svg(path(name));
    const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(has(text, "<svg") && has(text, "</svg>")) << name;
    EXPECT_FALSE(is_png(path(name))) << name;
  }
  EXPECT_EQ(plot::nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  const plot::Rgb lo = plot::viridis(0), hi = plot::viridis(1);
  EXPECT_EQ(lo.r, 68);
  EXPECT_EQ(hi.g, 231);
}

TEST_F(Dir, MhaWeightsRoundTrip) {
  MultiHeadAttention m, back;
  const MhaConfig config{24, 6, 2, 0, 5, true};
  ASSERT_TRUE(MultiHeadAttention::create(config, &m).ok());
  m.init_random(4);
  ASSERT_TRUE(tools::save_mha_weights(path("w"), m).ok());
  for (const char* f : {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"}) EXPECT_TRUE(fs::exists(path(std::string("w/") + f + ".npy")));
  ASSERT_TRUE(tools::load_mha_weights(path("w"), config, &back).ok());
  EXPECT_EQ(back.weights().w_v, m.weights().w_v);
  EXPECT_EQ(back.weights().b_o, m.weights().b_o);
  // The wrong config: a shape mismatch names the file.
  const Status s = tools::load_mha_weights(path("w"), {24, 6, 3, 0, 5, true}, &back);
  EXPECT_TRUE(has(s.message(), "w_k: shape [8, 24] in ") && has(s.message(), "expected [12, 24]")) << s.message();
  fs::remove(path("w/b_v.npy"));
  EXPECT_TRUE(has(tools::load_mha_weights(path("w"), config, &back).message(), "b_v")) ;
}

}  // namespace
}  // namespace attn
