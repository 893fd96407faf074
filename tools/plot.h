// attn tools: plots for the command-line program (line plots and heatmaps), drawn with Cairo when the build has it
// (check_can_draw below; the program builds without it): antialiased
// lines, text in a real font (DejaVu Sans through fontconfig), PNG or SVG chosen by the path's extension
// (".svg" = SVG, anything else = PNG).
//
//   plot::LinePlot p;                       // x/y series with axes, ticks, axis labels and a legend
//   p.title = "time per token"; p.x_label = "position"; p.y_label = "ms";
//   p.series.push_back({"with cache", xs, ys});
//   Status s = plot::write_line_plot("out.png", p);
//
//   plot::HeatmapFigure f;                  // one panel per matrix, a shared colour bar (viridis)
//   f.panels.push_back({"head 0", rows, cols, values_row_major});
//   Status s = plot::write_heatmaps("attn.png", f);
//
// Text is UTF-8. Errors (an empty plot, a file that cannot be written) come back as a Status naming the
// problem; no partial file is left behind.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/status.h"

namespace attn::plot {

// Whether this build of the program draws plots: Cairo (libcairo2-dev, found with pkg-config) was there when it was
// built. Without it every write_* below returns an error saying so.
bool available();

// For a command to call before any work: Ok when `path` is empty (no plot asked for) or this build draws plots;
// else an error naming `option` and what is missing ("--png: this attn was built without Cairo, so it draws no
// plots; expected --png '' (no plot) or a build with Cairo (libcairo2-dev: ...)"; `optional` false: a command
// whose plot is its output, no '' advice).
Status check_can_draw(const std::string& option, const std::string& path, bool optional = true);

struct Rgb {
  unsigned char r = 0, g = 0, b = 0;
};

// The viridis colour map, t in [0, 1] (clamped): dark purple -> blue -> green -> yellow.
Rgb viridis(double t);

// About `target` round tick values (1, 2, 5 times a power of ten) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 6);
// A short label for a tick value ("0.5", "120", "1e+06").
std::string tick_label(double v);

struct Series {
  std::string label;         // empty: not in the legend
  std::vector<double> x, y;  // same length; non-finite points are skipped
  int color = -1;            // index into the palette; -1 = the series' position
  int thickness = 2;         // line width in pixels
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<Series> series;  // drawn in a fixed palette (blue, orange, green, red, purple, ...)
  bool log_y = false;          // logarithmic y axis (values <= 0 skipped)
  int width = 900, height = 540;
};
Status write_line_plot(const std::string& path, const LinePlot& plot);

struct Heatmap {
  std::string title;
  std::int64_t rows = 0, cols = 0;
  std::vector<double> values;  // rows x cols, row-major; row 0 drawn at the top
  std::vector<std::string> row_labels, col_labels;  // optional: one per row / column (columns read upwards)
};

struct HeatmapFigure {
  std::string title, x_label, y_label, scale_label;
  std::vector<Heatmap> panels;
  // Colour range; NaN = the smallest / largest value over all panels.
  double vmin = std::numeric_limits<double>::quiet_NaN(), vmax = std::numeric_limits<double>::quiet_NaN();
  int columns = 0;  // panels per row; 0 = up to 4
  int cell = 0;     // pixels per matrix element; 0 = chosen so a panel is about 240 pixels wide
};
Status write_heatmaps(const std::string& path, const HeatmapFigure& figure);

// A timeline: one row per lane (e.g. a ring step), spans of time coloured by kind (e.g. compute, waiting).
struct TimelineSpan {
  double start = 0, end = 0;
  int kind = 0;  // index into Timeline::kinds (and the palette)
};
struct Timeline {
  std::string title, x_label;
  std::vector<std::string> kinds;  // legend labels, one per kind
  std::vector<std::string> rows;   // row labels, top to bottom
  std::vector<std::vector<TimelineSpan>> spans;  // per row
  int width = 900;
};
Status write_timeline(const std::string& path, const Timeline& timeline);

}  // namespace attn::plot
