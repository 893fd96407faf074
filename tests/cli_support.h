// Test support for the attn program: run it in-process, and a fixture with a fresh scratch directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "plot.h"

namespace attn::test {

// First in a test that draws a plot: a build without Cairo draws none (tests/test_plot_without_cairo.cc checks
// what such a build says instead).
#define ATTN_SKIP_WITHOUT_PLOTS() \
  if (!::attn::plot::available()) GTEST_SKIP() << "this build has no Cairo, so it draws no plots"

struct Outcome {
  int code = -1;
  std::string out, err;
};

// Runs `attn <args...>` in-process, capturing stdout and stderr.
inline Outcome cli(std::vector<std::string> args) {
  args.insert(args.begin(), "attn");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  Outcome r;
  r.code = tools::main(static_cast<int>(args.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A test with its own empty directory, removed afterwards.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() / ("attn_" + std::string(info->test_suite_name()) + "_" +
                                                     info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

}  // namespace attn::test
