// attn scaling-experiment on a tiny configuration: it runs, prints its table (or JSON), writes the PNG, and
// rejects bad options with a message naming them; with its fixed seeds it is deterministic, and what it measures at
// initialisation follows from the math (scaling the scores by 1/sqrt(dk) can only raise the attention entropy, never
// above ln(seq)). The training results at full size are in docs/experiments.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "cli_support.h"

namespace attn {
namespace {

using test::cli;
using test::Outcome;
using Dir = test::ScratchDirTest;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

bool is_png(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  return f && std::string(sig + 1, 3) == "PNG";
}

TEST_F(Dir, ScalingExperimentRunsAndPlots) {
  ATTN_SKIP_WITHOUT_PLOTS();
  const std::string png = path("loss.png");
  Outcome r = cli({"scaling-experiment", "--seeds", "2", "--steps", "30", "--dk", "8", "--seq", "4", "--vocab", "6",
                   "--batch", "8", "--threshold", "1.5", "--png", png});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* field : {"steps_to", "final_acc", "final_loss", "entropy@0", "entropy@10", "entropy@50",
                            "1/sqrt(dk)", "steps to threshold, unscaled / scaled, per seed:", "q.k has variance ~d_k = 8.0"})
    EXPECT_TRUE(has(r.out, field)) << field << "\n" << r.out;
  EXPECT_TRUE(is_png(png));

  r = cli({"scaling-experiment", "--seeds", "1", "--steps", "5", "--dk", "4", "--seq", "3", "--vocab", "3", "--batch",
           "2", "--json", "--png", ""});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* field : {"\"scaled\":{\"scale\":0.5,", "\"unscaled\":{\"scale\":1,", "\"steps_to_threshold\":",
                            "\"final_accuracy\":", "\"entropy_step0\":", "\"ratio_unscaled_over_scaled\":"})
    EXPECT_TRUE(has(r.out, field)) << field << "\n" << r.out;
}

// The numbers of the JSON array `"key":[...]` that follows `after` in `json` (null entries as NaN).
std::vector<double> json_array(const std::string& json, const std::string& after, const std::string& key) {
  const std::size_t from = json.find(after);
  const std::size_t at = json.find("\"" + key + "\":[", from == std::string::npos ? 0 : from);
  std::vector<double> out;
  if (from == std::string::npos || at == std::string::npos) return out;
  const std::size_t open = json.find('[', at), close = json.find(']', open);
  std::string items = json.substr(open + 1, close - open - 1);
  for (std::size_t pos = 0; pos <= items.size();) {
    const std::size_t comma = std::min(items.find(',', pos), items.size());
    const std::string item = items.substr(pos, comma - pos);
    out.push_back(item == "null" ? std::nan("") : std::strtod(item.c_str(), nullptr));
    pos = comma + 1;
  }
  return out;
}

TEST_F(Dir, ScalingExperimentIsDeterministicAndScalingRaisesTheEntropy) {
  const std::vector<std::string> args = {"scaling-experiment", "--seeds", "2", "--steps", "30", "--dk", "16", "--seq",
                                         "4", "--vocab", "6", "--batch", "8", "--json", "--png", ""};
  const Outcome a = cli(args), b = cli(args);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const std::regex seconds("\"seconds\":[0-9.e+-]+,");
  EXPECT_EQ(std::regex_replace(a.out, seconds, ""), std::regex_replace(b.out, seconds, ""))
      << "two runs with the same seeds differ";
  const std::vector<double> scaled = json_array(a.out, "\"scaled\":", "entropy_step0");
  const std::vector<double> unscaled = json_array(a.out, "\"unscaled\":", "entropy_step0");
  ASSERT_EQ(scaled.size(), 2u) << a.out;
  ASSERT_EQ(unscaled.size(), 2u) << a.out;
  for (std::size_t s = 0; s < 2; ++s) {
    // The same seed gives both runs the same initial weights: the scaled scores are the unscaled ones / 4.
    EXPECT_GT(scaled[s], unscaled[s]) << "seed " << s << "\n" << a.out;
    EXPECT_LE(scaled[s], std::log(4.0) + 1e-6) << a.out;
    EXPECT_GT(unscaled[s], 0.0) << a.out;
  }
  for (const char* run : {"\"scaled\":", "\"unscaled\":"}) {
    const std::vector<double> accuracy = json_array(a.out, run, "final_accuracy");
    EXPECT_EQ(accuracy.size(), 2u) << run << "\n" << a.out;
    for (double acc : accuracy) {
      EXPECT_GE(acc, 0.0);
      EXPECT_LE(acc, 1.0);
    }
  }
}

TEST_F(Dir, ScalingExperimentRejectsBadOptions) {
  Outcome r = cli({"scaling-experiment", "--seq", "40", "--vocab", "32"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--vocab: 32; expected at least --seq = 40")) << r.err;
  r = cli({"scaling-experiment", "--lr", "0"});
  EXPECT_TRUE(has(r.err, "--lr: ")) << r.err;
  const std::string png = path("no/such/dir/x.png");
  r = cli({"scaling-experiment", "--seeds", "1", "--steps", "2", "--dk", "4", "--seq", "2", "--vocab", "2", "--png", png});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--png")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(png));
}

TEST_F(Dir, CompareScoringRunsAndPlots) {
  ATTN_SKIP_WITHOUT_PLOTS();
  const std::string png = path("scoring.png");
  const Outcome r = cli({"compare-scoring", "--seeds", "2", "--steps", "20", "--d", "8", "--seq", "4", "--vocab", "6",
                         "--batch", "8", "--threshold", "1.5", "--time-n", "40", "--time-d", "8", "--reps", "1",
                         "--png", png});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* field : {"ns per score", "FLOPs per score", "additive / dot:", "30 + 8 tanh", "steps_to",
                            "final_acc", "dot: mean held-out accuracy", "additive: mean held-out accuracy",
                            "scoring parameters: dot 128, additive 136"})
    EXPECT_TRUE(has(r.out, field)) << field << "\n" << r.out;
  EXPECT_TRUE(is_png(png));
}

TEST_F(Dir, CompareScoringRejectsBadOptions) {
  Outcome r = cli({"compare-scoring", "--seq", "40", "--vocab", "32"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--vocab: 32; expected at least --seq = 40")) << r.err;
  r = cli({"compare-scoring", "--reps", "0"});
  EXPECT_TRUE(has(r.err, "--reps: 0; expected at least 1")) << r.err;
  const std::string png = path("no/such/dir/x.png");
  r = cli({"compare-scoring", "--seeds", "1", "--steps", "2", "--d", "4", "--seq", "2", "--vocab", "2", "--time-n", "0",
           "--png", png});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--png")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(png));
}

}  // namespace
}  // namespace attn
