// attn tools: plots drawn with Cairo (antialiased vector drawing, system fonts through fontconfig), written as
// PNG or SVG by the file's extension. Only the layout (where axes, ticks, labels and legends go) is ours.
//
// Cairo is optional (CMakeLists.txt: ATTN_HAVE_CAIRO). Without it the same layout code runs over a Figure that
// draws nothing, so a plot's arguments are checked alike, and every figure ends in the error of no_cairo().
#include "plot.h"

#include "files.h"

#ifndef ATTN_HAVE_CAIRO
#define ATTN_HAVE_CAIRO 0
#endif
#if ATTN_HAVE_CAIRO
#include <cairo-svg.h>
#include <cairo.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <memory>

namespace attn::plot {
namespace {

constexpr Rgb kBlack{0, 0, 0}, kGrey{220, 220, 220}, kDark{70, 70, 70};
constexpr Rgb kPalette[] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}, {140, 86, 75}};
constexpr const char* kFont = "DejaVu Sans";  // fontconfig falls back to any sans-serif font without it

// Why a build without Cairo draws no plot, and what it takes.
constexpr char kNoCairo[] = "this attn was built without Cairo, so it draws no plots";
constexpr char kGetCairo[] = "a build with Cairo (libcairo2-dev: apt-get install libcairo2-dev, then build attn again)";

// The error of a plot asked of a build without Cairo, under `param` ("png", "svg", or the option that asked).
Status no_cairo(const std::string& param) {
  return Status::Invalid(param, std::string(kNoCairo) + "; expected " + kGetCairo);
}

Rgb palette(int index) { return kPalette[static_cast<std::size_t>(index) % std::size(kPalette)]; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && std::equal(tail.rbegin(), tail.rend(), s.rbegin(),
                                               [](char a, char b) { return std::tolower(a) == std::tolower(b); });
}

#if ATTN_HAVE_CAIRO

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  try {
    static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
    return CAIRO_STATUS_SUCCESS;
  } catch (...) {
    return CAIRO_STATUS_NO_MEMORY;
  }
}

// One figure being drawn: a Cairo surface (an image for PNG, a vector stream for SVG) and its context, with
// the few drawing steps the plots need. finish() encodes it and writes the file through tools::write_file (a
// temporary file renamed into place: no partial file on failure).
class Figure {
 public:
  Figure(const std::string& path, double width, double height) : path_(path), svg_(ends_with(path, ".svg")) {
    surface_ = svg_ ? cairo_svg_surface_create_for_stream(append_bytes, &svg_bytes_, width, height)
                    : cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(std::ceil(width)),
                                                 static_cast<int>(std::ceil(height)));
    cr_ = cairo_create(surface_);
    cairo_set_source_rgb(cr_, 1, 1, 1);
    cairo_paint(cr_);
    cairo_select_font_face(cr_, kFont, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  }
  ~Figure() {
    cairo_destroy(cr_);
    cairo_surface_destroy(surface_);
  }
  Figure(const Figure&) = delete;
  Figure& operator=(const Figure&) = delete;

  void color(Rgb c) { cairo_set_source_rgb(cr_, c.r / 255.0, c.g / 255.0, c.b / 255.0); }
  void line(double x0, double y0, double x1, double y1, Rgb c, double width = 1) {
    color(c);
    cairo_set_line_width(cr_, width);
    cairo_move_to(cr_, x0, y0);
    cairo_line_to(cr_, x1, y1);
    cairo_stroke(cr_);
  }
  void rect(double x, double y, double w, double h, Rgb c, bool filled, double width = 1) {
    color(c);
    cairo_rectangle(cr_, x, y, w, h);
    if (filled) {
      cairo_fill(cr_);
    } else {
      cairo_set_line_width(cr_, width);
      cairo_stroke(cr_);
    }
  }
  double text_width(const std::string& s, double size) {
    cairo_set_font_size(cr_, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr_, s.c_str(), &e);
    return e.x_advance;
  }
  // Text of `size` points at (x, y): ax = 0, 0.5, 1 puts x at its left, centre or right; ay = 0, 0.5, 1 puts y
  // at its top, middle or bottom (the font's ascent and descent, so labels line up whatever their letters).
  // up = true turns it 90° counter-clockwise (reads bottom to top), the anchors then along its own axes.
  void text(double x, double y, const std::string& s, double size, Rgb c, double ax = 0, double ay = 0,
            bool up = false, bool bold = false) {
    if (s.empty()) return;
    cairo_save(cr_);
    cairo_select_font_face(cr_, kFont, CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr_, size);
    cairo_font_extents_t f;
    cairo_font_extents(cr_, &f);
    cairo_text_extents_t e;
    cairo_text_extents(cr_, s.c_str(), &e);
    cairo_translate(cr_, x, y);
    if (up) cairo_rotate(cr_, -M_PI / 2);
    cairo_move_to(cr_, -ax * e.x_advance, f.ascent - ay * (f.ascent + f.descent));
    color(c);
    cairo_show_text(cr_, s.c_str());
    cairo_restore(cr_);
  }
  // A matrix drawn as blocks of `cell` units, one colour per element (nearest-neighbour scaling, so that PNG
  // and SVG both keep sharp cells; the SVG embeds the matrix as a small image).
  void matrix(double x, double y, double cell, int rows, int cols, const std::vector<Rgb>& colors) {
    cairo_surface_t* img = cairo_image_surface_create(CAIRO_FORMAT_RGB24, cols, rows);
    cairo_surface_flush(img);
    unsigned char* data = cairo_image_surface_get_data(img);
    const int stride = cairo_image_surface_get_stride(img);
    for (int r = 0; data && r < rows; ++r) {
      auto* row = reinterpret_cast<std::uint32_t*>(data + static_cast<std::ptrdiff_t>(r) * stride);
      for (int c = 0; c < cols; ++c) {
        const Rgb v = colors[static_cast<std::size_t>(r) * cols + c];
        row[c] = static_cast<std::uint32_t>(v.r) << 16 | static_cast<std::uint32_t>(v.g) << 8 | v.b;
      }
    }
    cairo_surface_mark_dirty(img);
    cairo_save(cr_);
    cairo_translate(cr_, x, y);
    cairo_scale(cr_, cell, cell);
    cairo_set_source_surface(cr_, img, 0, 0);
    cairo_pattern_set_filter(cairo_get_source(cr_), CAIRO_FILTER_NEAREST);
    cairo_rectangle(cr_, 0, 0, cols, rows);
    cairo_fill(cr_);
    cairo_restore(cr_);
    cairo_surface_destroy(img);
  }

  Status finish() {
    std::string bytes;
    cairo_surface_flush(surface_);
    cairo_status_t st = cairo_status(cr_);
    if (svg_) {
      cairo_surface_finish(surface_);  // the SVG stream is complete only now
      st = st ? st : cairo_surface_status(surface_);
      bytes.swap(svg_bytes_);
    } else if (!st) {
      st = cairo_surface_write_to_png_stream(surface_, append_bytes, &bytes);
    }
    if (st)
      return Status::Invalid(svg_ ? "svg" : "png", std::string("drawing '") + path_ + "' failed (" +
                                                        cairo_status_to_string(st) + "); expected a drawable figure");
    return tools::write_file(svg_ ? "svg" : "png", path_, bytes);
  }

  // Line plots: what is drawn between clip() and unclip() stays inside that rectangle; a path is a series of
  // points stroked with round joins and caps, a point that does not continue the line starting a new piece
  // (shown as a dot if it stays alone).
  void clip(double x, double y, double w, double h) {
    cairo_save(cr_);
    cairo_rectangle(cr_, x, y, w, h);
    cairo_clip(cr_);
    cairo_set_line_join(cr_, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr_, CAIRO_LINE_CAP_ROUND);
  }
  void unclip() { cairo_restore(cr_); }
  // The viridis colour ramp in a rectangle, low at the bottom, high at the top (a heatmap's colour bar).
  void viridis_bar(double x, double y, double w, double h) {
    cairo_pattern_t* ramp = cairo_pattern_create_linear(0, y + h, 0, y);
    for (int i = 0; i <= 32; ++i) {
      const Rgb c = viridis(i / 32.0);
      cairo_pattern_add_color_stop_rgb(ramp, i / 32.0, c.r / 255.0, c.g / 255.0, c.b / 255.0);
    }
    cairo_set_source(cr_, ramp);
    cairo_rectangle(cr_, x, y, w, h);
    cairo_fill(cr_);
    cairo_pattern_destroy(ramp);
  }
  // The width of `s` in the regular font at `size`, measured on a scratch surface (before a figure exists: its
  // size may depend on its labels).
  static double measure(const std::string& s, double size) {
    cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1);
    cairo_t* cr = cairo_create(surface);
    cairo_select_font_face(cr, kFont, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.c_str(), &e);
    cairo_destroy(cr);
    cairo_surface_destroy(surface);
    return e.x_advance;
  }
  void path_point(double x, double y, bool continues) {
    if (!continues) {
      cairo_new_sub_path(cr_);
      cairo_move_to(cr_, x, y);
    }
    cairo_line_to(cr_, x, y);
  }
  void stroke_path(Rgb c, double width) {
    color(c);
    cairo_set_line_width(cr_, width);
    cairo_stroke(cr_);
  }

 private:
  std::string path_;
  bool svg_;
  std::string svg_bytes_;
  cairo_surface_t* surface_ = nullptr;
  cairo_t* cr_ = nullptr;
};

#else  // no Cairo: the layout runs over this Figure, which draws nothing

class Figure {
 public:
  Figure(const std::string& path, double, double) : svg_(ends_with(path, ".svg")) {}
  void color(Rgb) {}
  void line(double, double, double, double, Rgb, double = 1) {}
  void rect(double, double, double, double, Rgb, bool, double = 1) {}
  double text_width(const std::string& s, double size) { return measure(s, size); }
  void text(double, double, const std::string&, double, Rgb, double = 0, double = 0, bool = false, bool = false) {}
  void matrix(double, double, double, int, int, const std::vector<Rgb>&) {}
  void clip(double, double, double, double) {}
  void unclip() {}
  void path_point(double, double, bool) {}
  void stroke_path(Rgb, double) {}
  void viridis_bar(double, double, double, double) {}
  static double measure(const std::string& s, double size) { return 0.6 * size * static_cast<double>(s.size()); }
  Status finish() { return no_cairo(svg_ ? "svg" : "png"); }

 private:
  bool svg_;
};

#endif

}  // namespace

bool available() { return ATTN_HAVE_CAIRO != 0; }

Status check_can_draw(const std::string& option, const std::string& path, bool optional) {
  if (path.empty() || available()) return Status::Ok();
  if (!optional) return no_cairo(option);
  return Status::Invalid(option, std::string(kNoCairo) + "; expected " + option + " '' (no plot) or " + kGetCairo);
}

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

  std::vector<double> yt;
  if (plot.log_y)
    for (double e = y0; e <= y1 + 1e-9; e += 1) yt.push_back(e);
  else
    yt = nice_ticks(y0, y1, 6);
  Figure fig(path, plot.width, plot.height);
  constexpr double kTick = 13, kLabel = 15, kTitle = 17;
  double tick_w = 0;
  for (double t : yt) tick_w = std::max(tick_w, fig.text_width(tick_label(plot.log_y ? std::pow(10.0, t) : t), kTick));
  const double left = 36 + tick_w + 12, right = 24, top = 44, bottom = 62;
  const double pw = plot.width - left - right, ph = plot.height - top - bottom;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

  // Grid, ticks and tick labels, then the axes and their labels.
  for (double t : nice_ticks(x0, x1, 8)) {
    fig.line(px(t), top, px(t), top + ph, kGrey);
    fig.line(px(t), top + ph, px(t), top + ph + 5, kBlack);
    fig.text(px(t), top + ph + 8, tick_label(t), kTick, kBlack, 0.5, 0);
  }
  for (double t : yt) {
    fig.line(left, py(t), left + pw, py(t), kGrey);
    fig.line(left - 5, py(t), left, py(t), kBlack);
    fig.text(left - 8, py(t), tick_label(plot.log_y ? std::pow(10.0, t) : t), kTick, kBlack, 1, 0.5);
  }
  fig.line(left, top, left, top + ph, kBlack, 1.2);
  fig.line(left, top + ph, left + pw, top + ph, kBlack, 1.2);
  fig.text(plot.width / 2.0, 12, plot.title, kTitle, kBlack, 0.5, 0, false, true);
  fig.text(left + pw / 2, plot.height - 8, plot.x_label, kLabel, kBlack, 0.5, 1);
  fig.text(10, top + ph / 2, plot.y_label, kLabel, kBlack, 0.5, 0, true);

  // Series (clipped to the plot area; a non-finite point breaks the line), then the legend box.
  fig.clip(left, top, pw, ph);
  for (std::size_t n = 0; n < plot.series.size(); ++n) {
    const Series& s = plot.series[n];
    bool open = false;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s.x[i], s.y[i])) {
        open = false;
        continue;
      }
      fig.path_point(px(s.x[i]), py(plot.log_y ? std::log10(s.y[i]) : s.y[i]), open);
      open = true;
    }
    fig.stroke_path(palette(s.color >= 0 ? s.color : static_cast<int>(n)), s.thickness);
  }
  fig.unclip();
  std::vector<std::size_t> legend;  // the labelled series
  double legend_w = 0;
  for (std::size_t n = 0; n < plot.series.size(); ++n)
    if (!plot.series[n].label.empty())
      legend.push_back(n), legend_w = std::max(legend_w, fig.text_width(plot.series[n].label, kTick));
  if (!legend.empty()) {
    // The legend goes into the corner of the plot area that hides the fewest points.
    const double bw = legend_w + 56, bh = legend.size() * 21.0 + 10;
    double bx = left + 12, by = top + 10;
    std::size_t fewest = SIZE_MAX;
    for (int corner = 0; corner < 4; ++corner) {
      const double cx = corner & 1 ? left + pw - 12 - bw : left + 12, cy = corner & 2 ? top + ph - 10 - bh : top + 10;
      std::size_t hidden = 0;
      for (const Series& s : plot.series)
        for (std::size_t i = 0; i < s.x.size(); ++i)
          if (usable(s.x[i], s.y[i])) {
            const double x = px(s.x[i]), y = py(plot.log_y ? std::log10(s.y[i]) : s.y[i]);
            hidden += x >= cx - 4 && x <= cx + bw + 4 && y >= cy - 4 && y <= cy + bh + 4;
          }
      if (hidden < fewest) fewest = hidden, bx = cx, by = cy;
    }
    fig.rect(bx, by, bw, bh, {255, 255, 255}, true);
    fig.rect(bx + 0.5, by + 0.5, bw, bh, {160, 160, 160}, false);
    for (std::size_t i = 0; i < legend.size(); ++i) {
      const Series& s = plot.series[legend[i]];
      const double y = by + 15 + i * 21.0;
      fig.line(bx + 10, y, bx + 38, y, palette(s.color >= 0 ? s.color : static_cast<int>(legend[i])), 3);
      fig.text(bx + 46, y, s.label, kTick, kBlack, 0, 0.5);
    }
  }
  return fig.finish();
}

Status write_heatmaps(const std::string& path, const HeatmapFigure& figure) {
  if (figure.panels.empty()) return Status::Invalid("panels", "none; expected at least one heatmap");
  double lo = figure.vmin, hi = figure.vmax, auto_lo = INFINITY, auto_hi = -INFINITY;
  std::int64_t max_rows = 0, max_cols = 0;
  for (const Heatmap& h : figure.panels) {
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

  constexpr double kSmall = 10, kTick = 12, kPanel = 14, kTitle = 16;
  const int n = static_cast<int>(figure.panels.size());
  const int cols = figure.columns > 0 ? figure.columns : std::min(n, 4), prow = (n + cols - 1) / cols;
  const double cell = figure.cell > 0 ? figure.cell : std::max(1.0, std::floor(240.0 / std::max(max_rows, max_cols)));
  const double pw = max_cols * cell, ph = max_rows * cell;
  // Measure the labels on a scratch surface first: the figure's size depends on them.
  double label_w = 0, label_h = 0;  // room for row labels (left) and column labels (below)
  for (const Heatmap& h : figure.panels) {
    for (const std::string& l : h.row_labels) label_w = std::max(label_w, Figure::measure(l, kSmall) + 6);
    for (const std::string& l : h.col_labels) label_h = std::max(label_h, Figure::measure(l, kSmall) + 6);
  }
  const double gap = 44 + label_w, left = 34 + label_w, top = 50, title_h = 24, bar_w = 140, vgap = 36;
  const double width = left + cols * (pw + gap) - label_w + bar_w;
  const double height = top + prow * (ph + title_h + vgap + label_h) + 10;
  Figure fig(path, width, height);
  fig.text(width / 2, 14, figure.title, kTitle, kBlack, 0.5, 0, false, true);
  for (int p = 0; p < n; ++p) {
    const Heatmap& h = figure.panels[static_cast<std::size_t>(p)];
    const double ox = left + (p % cols) * (pw + gap), oy = top + (p / cols) * (ph + title_h + vgap + label_h) + title_h;
    fig.text(ox, oy - 6, h.title, kPanel, kBlack, 0, 1);
    std::vector<Rgb> colors(h.values.size());
    for (std::size_t i = 0; i < h.values.size(); ++i)
      colors[i] = std::isfinite(h.values[i]) ? viridis((h.values[i] - lo) / (hi - lo)) : Rgb{255, 255, 255};
    fig.matrix(ox, oy, cell, static_cast<int>(h.rows), static_cast<int>(h.cols), colors);
    const double w = h.cols * cell, hh = h.rows * cell;
    fig.rect(ox - 0.5, oy - 0.5, w + 1, hh + 1, kDark, false);
    for (std::size_t r = 0; r < h.row_labels.size() && static_cast<std::int64_t>(r) < h.rows; ++r)
      fig.text(ox - 4, oy + (r + 0.5) * cell, h.row_labels[r], kSmall, kDark, 1, 0.5);
    for (std::size_t c = 0; c < h.col_labels.size() && static_cast<std::int64_t>(c) < h.cols; ++c)
      fig.text(ox + (c + 0.5) * cell, oy + hh + 4, h.col_labels[c], kSmall, kDark, 1, 0.5, true);
    fig.text(ox + w / 2, oy + hh + 6 + label_h, figure.x_label, kTick, kDark, 0.5, 0);
    fig.text(ox - 8 - label_w, oy + hh / 2, figure.y_label, kTick, kDark, 0.5, 1, true);
  }
  // The colour bar with ticks.
  const double bx = left + cols * (pw + gap) - label_w, by = top + title_h, bh = std::max(120.0, std::min(ph, 400.0));
  fig.viridis_bar(bx, by, 20, bh);
  fig.rect(bx - 0.5, by - 0.5, 21, bh + 1, kDark, false);
  for (double t : nice_ticks(lo, hi, 5)) {
    const double y = by + (hi - t) / (hi - lo) * bh;
    fig.line(bx + 20, y, bx + 25, y, kBlack);
    fig.text(bx + 29, y, tick_label(t), kTick, kBlack, 0, 0.5);
  }
  fig.text(bx, by - 8, figure.scale_label, kTick, kBlack, 0, 1);
  return fig.finish();
}

Status write_timeline(const std::string& path, const Timeline& t) {
  if (t.rows.empty() || t.rows.size() != t.spans.size())
    return Status::Invalid("rows", std::to_string(t.rows.size()) + " row labels for " + std::to_string(t.spans.size()) +
                                       " rows of spans; expected as many, at least one");
  double t0 = INFINITY, t1 = -INFINITY;
  for (const auto& row : t.spans)
    for (const TimelineSpan& s : row) {
      if (!(s.end >= s.start) || !std::isfinite(s.start) || !std::isfinite(s.end))
        return Status::Invalid("spans", "a span from " + tick_label(s.start) + " to " + tick_label(s.end) +
                                            "; expected finite times with end >= start");
      if (s.kind < 0 || s.kind >= static_cast<int>(t.kinds.size()))
        return Status::Invalid("spans", "kind " + std::to_string(s.kind) + "; expected 0 to " +
                                            std::to_string(static_cast<int>(t.kinds.size()) - 1));
      t0 = std::min(t0, s.start), t1 = std::max(t1, s.end);
    }
  if (!(t1 > t0)) t0 = 0, t1 = 1;
  constexpr double kTick = 12, kLabel = 14, kTitle = 16, kRow = 26;
  Figure fig(path, t.width, 110 + kRow * static_cast<double>(t.rows.size()) + 40);
  double label_w = 0;
  for (const std::string& r : t.rows) label_w = std::max(label_w, fig.text_width(r, kTick));
  const double left = 20 + label_w + 10, right = 24, top = 70, pw = t.width - left - right;
  const double ph = kRow * static_cast<double>(t.rows.size());
  auto px = [&](double x) { return left + (x - t0) / (t1 - t0) * pw; };
  fig.text(t.width / 2.0, 12, t.title, kTitle, kBlack, 0.5, 0, false, true);
  double lx = left;  // the legend, one line above the lanes
  for (std::size_t k = 0; k < t.kinds.size(); ++k) {
    fig.rect(lx, 44, 18, 12, palette(static_cast<int>(k)), true);
    fig.text(lx + 24, 50, t.kinds[k], kTick, kBlack, 0, 0.5);
    lx += 24 + fig.text_width(t.kinds[k], kTick) + 24;
  }
  for (double tick : nice_ticks(t0, t1, 8)) {
    fig.line(px(tick), top, px(tick), top + ph, kGrey);
    fig.line(px(tick), top + ph, px(tick), top + ph + 5, kBlack);
    fig.text(px(tick), top + ph + 8, tick_label(tick), kTick, kBlack, 0.5, 0);
  }
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    const double y = top + r * kRow;
    fig.text(left - 8, y + kRow / 2, t.rows[r], kTick, kBlack, 1, 0.5);
    for (const TimelineSpan& s : t.spans[r])
      fig.rect(px(s.start), y + 4, std::max(px(s.end) - px(s.start), 0.5), kRow - 8, palette(s.kind), true);
  }
  fig.line(left, top + ph, left + pw, top + ph, kBlack, 1.2);
  fig.text(left + pw / 2, top + ph + 30, t.x_label, kLabel, kBlack, 0.5, 0);
  return fig.finish();
}

}  // namespace attn::plot
