// The plots of a build without Cairo (CMakeLists.txt: ATTN_WITH_CAIRO=OFF, or no Cairo found): tools/plot.cc is
// compiled into this test with ATTN_HAVE_CAIRO=0, as such a build compiles it, so every build checks what its
// users are told. A plot asked for is refused before any work with a message naming the option and what is
// missing; the write functions check their arguments as with Cairo, then say the same and write no file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "plot.h"

namespace attn {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PlotWithoutCairo, CommandsRefuseAPlotBeforeAnyWork) {
  EXPECT_FALSE(plot::available());
  EXPECT_TRUE(plot::check_can_draw("--png", "").ok());  // no plot asked for

  const Status optional = plot::check_can_draw("--png", "loss.png");
  EXPECT_EQ(optional.message(),
            "--png: this attn was built without Cairo, so it draws no plots; expected --png '' (no plot) or a build "
            "with Cairo (libcairo2-dev: apt-get install libcairo2-dev, then build attn again)");

  const Status required = plot::check_can_draw("--png", "heatmap.png", /*optional=*/false);
  EXPECT_EQ(required.message(),
            "--png: this attn was built without Cairo, so it draws no plots; expected a build with Cairo "
            "(libcairo2-dev: apt-get install libcairo2-dev, then build attn again)");
}

TEST(PlotWithoutCairo, WritersCheckTheirArgumentsThenSayWhy) {
  const std::string dir = std::filesystem::temp_directory_path() / ("attn_no_cairo." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  plot::LinePlot p;
  p.series.push_back({"a", {1, 2, 3}, {1, 2}});
  EXPECT_TRUE(has(plot::write_line_plot(dir + "/a.png", p).message(), "3 x values and 2 y values"));
  p.series[0].y.push_back(3);
  const Status line = plot::write_line_plot(dir + "/a.png", p);
  EXPECT_TRUE(has(line.message(), "png: this attn was built without Cairo")) << line.message();
  EXPECT_TRUE(has(line.message(), "libcairo2-dev")) << line.message();

  plot::HeatmapFigure f;
  f.panels.push_back({"h", 2, 2, {0, 1, 2, 3}, {}, {}});
  EXPECT_TRUE(has(plot::write_heatmaps(dir + "/h.svg", f).message(), "svg: this attn was built without Cairo"));

  plot::Timeline t;
  t.kinds = {"compute"};
  t.rows = {"step 0"};
  t.spans = {{{0, 1, 0}}};
  EXPECT_TRUE(has(plot::write_timeline(dir + "/t.png", t).message(), "without Cairo"));

  EXPECT_TRUE(std::filesystem::is_empty(dir));  // nothing written
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attn
