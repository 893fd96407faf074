// attn scaling-experiment on a tiny configuration: it runs, prints its table (or JSON), writes the PNG,
// and rejects bad options with a message naming them. (The measured result is in docs/experiments.md, not asserted.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

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
