// attn tools: PNG plots. Rasterising is done here; libpng only encodes the finished image.
#include "plot.h"

#include "files.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace attn::plot {
namespace {

// The 5x7 font: 7 rows of 5 columns per glyph, '#' = ink.
struct Glyph {
  char c;
  const char* rows;  // 35 characters
};
constexpr Glyph kFont[] = {
    {'0', ".###.#...##..###.#.###..##...#.###."}, {'1', "..#...##....#....#....#....#...###."},
    {'2', ".###.#...#....#...#...#...#...#####"}, {'3', "#####...#...#.....#.....##...#.###."},
    {'4', "...#...##..#.#.#..#.#####...#....#."}, {'5', "######....####.....#....##...#.###."},
    {'6', "..##..#...#....####.#...##...#.###."}, {'7', "#####....#...#...#...#....#....#..."},
    {'8', ".###.#...##...#.###.#...##...#.###."}, {'9', ".###.#...##...#.####....#...#..##.."},
    {'A', ".###.#...##...#######...##...##...#"},  {'B', "####.#...##...#####.#...##...#####."},
    {'C', ".###.#...##....#....#....#...#.###."}, {'D', "###..#..#.#...##...##...##..#.###.."},
    {'E', "######....#....####.#....#....#####"}, {'F', "######....#....####.#....#....#...."},
    {'G', ".###.#...##....#.####...##...#.####"}, {'H', "#...##...##...#######...##...##...#"},
    {'I', ".###...#....#....#....#....#...###."}, {'J', "..###...#....#....#....#.#..#..##.."},
    {'K', "#...##..#.#.#..##...#.#..#..#.#...#"}, {'L', "#....#....#....#....#....#....#####"},
    {'M', "#...###.###.#.##.#.##...##...##...#"}, {'N', "#...###..##.#.##..###...##...##...#"},
    {'O', ".###.#...##...##...##...##...#.###."}, {'P', "####.#...##...#####.#....#....#...."},
    {'Q', ".###.#...##...##...##.#.##..#..##.#"}, {'R', "####.#...##...#####.#.#..#..#.#...#"},
    {'S', ".#####....#.....###.....#....#####."},  {'T', "#####..#....#....#....#....#....#.."},
    {'U', "#...##...##...##...##...##...#.###."}, {'V', "#...##...##...##...##...#.#.#...#.."},
    {'W', "#...##...##...##.#.##.#.##.#.#.#.#."}, {'X', "#...##...#.#.#...#...#.#.#...##...#"},
    {'Y', "#...##...#.#.#...#....#....#....#.."}, {'Z', "#####....#...#...#...#...#....#####"},
    {' ', "..................................."}, {'.', "..............................##..."},
    {',', ".........................##...#..#."}, {'-', "...............###................."},
    {'+', ".......#....#..#####..#....#......."}, {':', ".......#....#.........#....#......."},
    {'(', "...#...#...#....#....#.....#.....#."}, {')', ".#.....#.....#....#....#...#...#..."},
    {'/', "....#....#...#...#...#...#....#...."}, {'=', "..........#####.....#####.........."},
    {'%', "##...##..#...#...#...#...#..##...##"}, {'_', "..............................#####"},
    {'\'', "..#....#...#......................."}, {'[', ".###..#....#....#....#....#....###."},
    {']', ".###....#....#....#....#....#..###."}, {'<', "...#...#...#...#.....#.....#.....#."},
    {'>', ".#.....#.....#.....#...#...#...#..."}, {'*', ".......#..#.#.#.###.#.#.#..#......."},
    {'#', ".#.#..#.#.#####.#.#.#####.#.#..#.#."}, {'!', "..#....#....#....#....#.........#.."},
    {'?', ".###.#...#....#...#...#.........#.."}, {'|', "..#....#....#....#....#....#....#.."},
    {'^', "..#...#.#.#...#...................."}, {'~', "..........##.#.#.##................"},
};

const char* glyph_rows(char c) {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  for (const Glyph& g : kFont)
    if (g.c == c) return g.rows;
  return nullptr;
}

constexpr Rgb kBlack{0, 0, 0}, kGrey{200, 200, 200}, kDark{80, 80, 80};
constexpr Rgb kPalette[] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}, {140, 86, 75}};

}  // namespace

Rgb viridis(double t) {
  static const double anchors[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},  {44, 113, 142}, {33, 144, 141},
                                       {39, 173, 129}, {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  if (!(t >= 0)) t = 0;  // NaN too
  if (t > 1) t = 1;
  const double x = t * 8;
  const int i = std::min(7, static_cast<int>(x));
  const double f = x - i;
  auto mix = [&](int ch) { return static_cast<unsigned char>(std::lround(anchors[i][ch] * (1 - f) + anchors[i + 1][ch] * f)); };
  return {mix(0), mix(1), mix(2)};
}

Canvas::Canvas(int width, int height, Rgb background) : width_(width), height_(height) {
  rgb_.resize(static_cast<std::size_t>(width) * height * 3);
  for (std::size_t i = 0; i < rgb_.size(); i += 3) rgb_[i] = background.r, rgb_[i + 1] = background.g, rgb_[i + 2] = background.b;
}

void Canvas::pixel(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  unsigned char* p = &rgb_[(static_cast<std::size_t>(y) * width_ + x) * 3];
  p[0] = c.r, p[1] = c.g, p[2] = c.b;
}

void Canvas::fill(int x, int y, int w, int h, Rgb c) {
  for (int j = std::max(0, y); j < std::min(height_, y + h); ++j)
    for (int i = std::max(0, x); i < std::min(width_, x + w); ++i) pixel(i, j, c);
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  // Bresenham, with a square pen of `thickness` pixels.
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  for (int steps = 0; steps < 100000; ++steps) {
    for (int a = lo; a <= hi; ++a)
      for (int b = lo; b <= hi; ++b) pixel(x0 + a, y0 + b, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

void Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  for (std::size_t n = 0; n < s.size(); ++n) {
    const char* rows = glyph_rows(s[n]);
    if (!rows) continue;
    for (int r = 0; r < 7; ++r)
      for (int col = 0; col < 5; ++col)
        if (rows[r * 5 + col] == '#') fill(x + (static_cast<int>(n) * 6 + col) * scale, y + r * scale, scale, scale, c);
  }
}

void Canvas::text_up(int x, int y, const std::string& s, Rgb c, int scale) {
  for (std::size_t n = 0; n < s.size(); ++n) {
    const char* rows = glyph_rows(s[n]);
    if (!rows) continue;
    for (int r = 0; r < 7; ++r)
      for (int col = 0; col < 5; ++col)
        if (rows[r * 5 + col] == '#') fill(x + r * scale, y - (static_cast<int>(n) * 6 + col + 1) * scale, scale, scale, c);
  }
}

namespace {

// libpng's write callback: appends to the std::string behind io_ptr.
void append_png_bytes(png_structp png, png_bytep data, png_size_t size) {
  auto* out = static_cast<std::string*>(png_get_io_ptr(png));
  try {
    out->append(reinterpret_cast<const char*>(data), size);
  } catch (...) {
    png_error(png, "out of memory");
  }
}

void flush_png_bytes(png_structp) {}

}  // namespace

// Encodes the image in memory, then writes it through tools::write_file: a temporary file renamed into
// place, never replacing anything but a regular file.
Status Canvas::write_png(const std::string& path) const {
  std::string bytes;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  bool ok = png && info;
  if (ok && setjmp(png_jmpbuf(png)) == 0) {
    png_set_write_fn(png, &bytes, append_png_bytes, flush_png_bytes);
    png_set_IHDR(png, info, static_cast<png_uint_32>(width_), static_cast<png_uint_32>(height_), 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < height_; ++y)
      png_write_row(png, const_cast<png_bytep>(&rgb_[static_cast<std::size_t>(y) * width_ * 3]));
    png_write_end(png, nullptr);
  } else {
    ok = false;
  }
  png_destroy_write_struct(png ? &png : nullptr, info ? &info : nullptr);
  if (!ok) return Status::Invalid("png", "encoding the image for '" + path + "' failed; expected a drawable image");
  return tools::write_file("png", path, bytes);
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, target), mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return ticks;
}

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

Status write_line_plot(const std::string& path, const LinePlot& plot) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  auto usable = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!plot.log_y || y > 0); };
  for (const Series& s : plot.series) {
    if (s.x.size() != s.y.size())
      return Status::Invalid("series", "'" + s.label + "' has " + std::to_string(s.x.size()) + " x values and " +
                                           std::to_string(s.y.size()) + " y values; expected as many of each");
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (usable(s.x[i], s.y[i])) {
        const double y = plot.log_y ? std::log10(s.y[i]) : s.y[i];
        x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]), y0 = std::min(y0, y), y1 = std::max(y1, y);
      }
  }
  if (!(x1 >= x0)) return Status::Invalid("series", "no finite points to plot; expected at least one");
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) y0 -= 1, y1 += 1;
  if (!plot.log_y && y0 > 0 && y0 < 0.5 * y1) y0 = 0;  // start at zero when that costs little
  if (plot.log_y) y0 = std::floor(y0), y1 = std::ceil(y1);
  const double ypad = plot.log_y ? 0 : (y1 - y0) * 0.05;
  y1 += ypad;
  if (y0 != 0) y0 -= ypad;

  Canvas cv(plot.width, plot.height);
  const int left = 90, right = 24, top = 44, bottom = 64;
  const int pw = plot.width - left - right, ph = plot.height - top - bottom;
  auto px = [&](double x) { return left + static_cast<int>(std::lround((x - x0) / (x1 - x0) * pw)); };
  auto py = [&](double y) { return top + ph - static_cast<int>(std::lround((y - y0) / (y1 - y0) * ph)); };

  // Grid, ticks and tick labels.
  for (double t : nice_ticks(x0, x1, 8)) {
    const int x = px(t);
    cv.line(x, top, x, top + ph, kGrey);
    cv.line(x, top + ph, x, top + ph + 5, kBlack);
    const std::string l = tick_label(t);
    cv.text(x - Canvas::text_width(l, 2) / 2, top + ph + 10, l, kBlack, 2);
  }
  std::vector<double> yt;
  if (plot.log_y)
    for (double e = y0; e <= y1 + 1e-9; e += 1) yt.push_back(e);
  else
    yt = nice_ticks(y0, y1, 6);
  for (double t : yt) {
    const int y = py(t);
    cv.line(left, y, left + pw, y, kGrey);
    cv.line(left - 5, y, left, y, kBlack);
    const std::string l = tick_label(plot.log_y ? std::pow(10.0, t) : t);
    cv.text(left - 9 - Canvas::text_width(l, 2), y - 7, l, kBlack, 2);
  }
  cv.line(left, top, left, top + ph, kBlack);
  cv.line(left, top + ph, left + pw, top + ph, kBlack);
  cv.text((plot.width - Canvas::text_width(plot.title, 2)) / 2, 12, plot.title, kBlack, 2);
  cv.text(left + (pw - Canvas::text_width(plot.x_label, 2)) / 2, plot.height - 24, plot.x_label, kBlack, 2);
  cv.text_up(10, top + (ph + Canvas::text_width(plot.y_label, 2)) / 2, plot.y_label, kBlack, 2);

  // Series, then the legend box in the top-left corner of the plot area.
  for (std::size_t n = 0; n < plot.series.size(); ++n) {
    const Series& s = plot.series[n];
    const Rgb c = kPalette[static_cast<std::size_t>(s.color >= 0 ? s.color : static_cast<int>(n)) % std::size(kPalette)];
    bool have = false;
    int lx = 0, ly = 0;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s.x[i], s.y[i])) {
        have = false;
        continue;
      }
      const int x = px(s.x[i]), y = py(plot.log_y ? std::log10(s.y[i]) : s.y[i]);
      if (have) cv.line(lx, ly, x, y, c, s.thickness);
      else cv.fill(x - 1, y - 1, 3, 3, c);
      lx = x, ly = y, have = true;
    }
  }
  std::vector<std::size_t> legend;  // the labelled series
  int legend_w = 0;
  for (std::size_t n = 0; n < plot.series.size(); ++n)
    if (!plot.series[n].label.empty())
      legend.push_back(n), legend_w = std::max(legend_w, Canvas::text_width(plot.series[n].label, 2));
  if (!legend.empty()) {
    const int bx = left + 12, by = top + 10, bh = static_cast<int>(legend.size()) * 22 + 8;
    cv.fill(bx, by, legend_w + 52, bh, {255, 255, 255});
    cv.line(bx, by, bx + legend_w + 52, by, kDark), cv.line(bx, by + bh, bx + legend_w + 52, by + bh, kDark);
    cv.line(bx, by, bx, by + bh, kDark), cv.line(bx + legend_w + 52, by, bx + legend_w + 52, by + bh, kDark);
    for (std::size_t i = 0; i < legend.size(); ++i) {
      const Series& s = plot.series[legend[i]];
      const int y = by + 8 + static_cast<int>(i) * 22;
      const int color = s.color >= 0 ? s.color : static_cast<int>(legend[i]);
      cv.line(bx + 8, y + 7, bx + 36, y + 7, kPalette[static_cast<std::size_t>(color) % std::size(kPalette)], 3);
      cv.text(bx + 44, y, s.label, kBlack, 2);
    }
  }
  return cv.write_png(path);
}

Status write_heatmaps(const std::string& path, const HeatmapFigure& fig) {
  if (fig.panels.empty()) return Status::Invalid("panels", "none; expected at least one heatmap");
  double lo = fig.vmin, hi = fig.vmax, auto_lo = INFINITY, auto_hi = -INFINITY;
  std::int64_t max_rows = 0, max_cols = 0;
  for (const Heatmap& h : fig.panels) {
    if (h.rows < 1 || h.cols < 1 || static_cast<std::int64_t>(h.values.size()) != h.rows * h.cols)
      return Status::Invalid("panels", "'" + h.title + "' has " + std::to_string(h.values.size()) + " values for " +
                                           std::to_string(h.rows) + " x " + std::to_string(h.cols) +
                                           "; expected rows x cols >= 1");
    if (h.rows > 4096 || h.cols > 4096)
      return Status::Invalid("panels", "'" + h.title + "' is larger than 4096 x 4096; expected a small matrix to draw");
    for (double v : h.values)
      if (std::isfinite(v)) auto_lo = std::min(auto_lo, v), auto_hi = std::max(auto_hi, v);
    max_rows = std::max(max_rows, h.rows), max_cols = std::max(max_cols, h.cols);
  }
  if (std::isnan(lo)) lo = std::isfinite(auto_lo) ? auto_lo : 0;
  if (std::isnan(hi)) hi = std::isfinite(auto_hi) ? auto_hi : 1;
  if (!(hi > lo)) hi = lo + 1;

  int label_w = 0, label_h = 0;  // room for row labels (left) and column labels (below)
  for (const Heatmap& h : fig.panels) {
    for (const std::string& l : h.row_labels) label_w = std::max(label_w, Canvas::text_width(l) + 6);
    for (const std::string& l : h.col_labels) label_h = std::max(label_h, Canvas::text_width(l) + 6);
  }
  const int n = static_cast<int>(fig.panels.size());
  const int cols = fig.columns > 0 ? fig.columns : std::min(n, 4), prow = (n + cols - 1) / cols;
  const int cell = fig.cell > 0 ? fig.cell : std::max(1, static_cast<int>(240 / std::max(max_rows, max_cols)));
  const int pw = static_cast<int>(max_cols) * cell, ph = static_cast<int>(max_rows) * cell;
  const int gap = 40 + label_w, left = 30 + label_w, top = 50, title_h = 22, bar_w = 130;
  const int vgap = 34;
  const int width = left + cols * (pw + gap) - label_w + bar_w, height = top + prow * (ph + title_h + vgap + label_h) + 10;
  Canvas cv(width, height);
  cv.text((width - Canvas::text_width(fig.title, 2)) / 2, 14, fig.title, kBlack, 2);
  for (int p = 0; p < n; ++p) {
    const Heatmap& h = fig.panels[static_cast<std::size_t>(p)];
    const int ox = left + (p % cols) * (pw + gap), oy = top + (p / cols) * (ph + title_h + vgap + label_h) + title_h;
    cv.text(ox, oy - title_h + 4, h.title, kBlack, 2);
    for (std::int64_t r = 0; r < h.rows; ++r)
      for (std::int64_t c = 0; c < h.cols; ++c) {
        const double v = h.values[static_cast<std::size_t>(r * h.cols + c)];
        const Rgb col = std::isfinite(v) ? viridis((v - lo) / (hi - lo)) : Rgb{255, 255, 255};
        cv.fill(ox + static_cast<int>(c) * cell, oy + static_cast<int>(r) * cell, cell, cell, col);
      }
    const int w = static_cast<int>(h.cols) * cell, hh = static_cast<int>(h.rows) * cell;
    cv.line(ox - 1, oy - 1, ox + w, oy - 1, kDark), cv.line(ox - 1, oy + hh, ox + w, oy + hh, kDark);
    cv.line(ox - 1, oy - 1, ox - 1, oy + hh, kDark), cv.line(ox + w, oy - 1, ox + w, oy + hh, kDark);
    for (std::size_t r = 0; r < h.row_labels.size() && static_cast<std::int64_t>(r) < h.rows; ++r)
      cv.text(ox - 4 - Canvas::text_width(h.row_labels[r]), oy + static_cast<int>(r) * cell + (cell - 7) / 2, h.row_labels[r], kDark);
    for (std::size_t c = 0; c < h.col_labels.size() && static_cast<std::int64_t>(c) < h.cols; ++c)
      cv.text_up(ox + static_cast<int>(c) * cell + (cell - 7) / 2, oy + hh + 4 + Canvas::text_width(h.col_labels[c]),
                 h.col_labels[c], kDark);
    cv.text(ox + (w - Canvas::text_width(fig.x_label, 1)) / 2, oy + hh + 6 + label_h, fig.x_label, kDark, 1);
    cv.text_up(ox - 14 - label_w, oy + (hh + Canvas::text_width(fig.y_label, 1)) / 2, fig.y_label, kDark, 1);
  }
  // The colour bar with ticks.
  const int bx = left + cols * (pw + gap) - label_w, by = top + title_h, bh = std::max(120, std::min(ph, 400));
  for (int y = 0; y < bh; ++y) cv.fill(bx, by + y, 20, 1, viridis(1.0 - static_cast<double>(y) / (bh - 1)));
  cv.line(bx - 1, by - 1, bx + 20, by - 1, kDark), cv.line(bx - 1, by + bh, bx + 20, by + bh, kDark);
  cv.line(bx - 1, by - 1, bx - 1, by + bh, kDark), cv.line(bx + 20, by - 1, bx + 20, by + bh, kDark);
  for (double t : nice_ticks(lo, hi, 5)) {
    const int y = by + static_cast<int>(std::lround((hi - t) / (hi - lo) * (bh - 1)));
    cv.line(bx + 20, y, bx + 25, y, kBlack);
    cv.text(bx + 29, y - 7, tick_label(t), kBlack, 2);
  }
  cv.text(bx, by - 18, fig.scale_label, kBlack, 1);
  return cv.write_png(path);
}

}  // namespace attn::plot
