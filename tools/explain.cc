// attn tools: `attn explain`. The numbers come from the library's fp64 reference (weights and output);
// Q Kᵀ and the exponentials are recomputed here only to show the intermediate steps.
#include "explain.h"

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/convert.h"
#include "core/problem.h"
#include "npy.h"
#include "reference/reference.h"

namespace attn::tools {
namespace {

constexpr std::int64_t kMaxSide = 16;  // larger inputs are not readable as a walk-through

struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> values;  // row-major
  double at(std::int64_t i, std::int64_t j) const { return values[static_cast<std::size_t>(i * cols + j)]; }
};

// ---- input -------------------------------------------------------------------------------------------

Matrix builtin(std::int64_t rows, std::int64_t cols, std::vector<double> values) { return {rows, cols, std::move(values)}; }

Status load_matrix(const std::string& path, const std::string& option, Matrix* m) {
  npy::Array a;
  if (Status s = npy::read(path, option, &a, {DType::f32, DType::f16}); !s) return s;
  const auto& sh = a.shape;
  const bool matrix = sh.size() == 2 || (sh.size() == 4 && sh[0] == 1 && sh[1] == 1);
  if (!matrix)
    return Status::Invalid(option, "shape " + shape_text(sh) + "; expected a matrix [S, D] (or [1, 1, S, D])");
  const std::int64_t rows = sh[sh.size() - 2], cols = sh[sh.size() - 1];
  if (rows > kMaxSide || cols > kMaxSide)
    return Status::Invalid(option, "shape " + shape_text(sh) + " is too large: explain is for small examples "
                                   "(at most 16 rows and 16 columns); use 'attn run' for real inputs");
  if (rows < 1 || cols < 1)
    return Status::Invalid(option, "shape " + shape_text(sh) + " is empty; expected at least one row and one column");
  if (a.dtype != DType::f32 && a.dtype != DType::f16)
    return Status::Invalid(option, std::string("dtype ") + numpy_name(a.dtype) + "; expected float32 or float16");
  m->rows = rows;
  m->cols = cols;
  m->values.resize(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < m->values.size(); ++i)
    m->values[i] = a.dtype == DType::f32 ? a.as<float>()[i] : core::to_float(a.as<core::f16>()[i]);
  return Status::Ok();
}

// The matrix as float32 [1, 1, rows, cols] for the library (exact: the values came from float32/16).
struct Float4d {
  std::vector<float> data;
  TensorView view;
  explicit Float4d(const Matrix& m) : data(m.values.begin(), m.values.end()) {
    view = TensorView::contiguous(data.data(), DType::f32, {1, 1, m.rows, m.cols});
  }
};

// ---- formatting --------------------------------------------------------------------------------------

// Fixed-point with at most `decimals` decimals, trailing zeros dropped: 1, 0.7071, -inf.
std::string fixed(double x, int decimals) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  std::ostringstream s;
  s << std::fixed << std::setprecision(decimals) << x;
  std::string t = s.str();
  if (t.find('.') != std::string::npos) {
    while (t.back() == '0') t.pop_back();
    if (t.back() == '.') t.pop_back();
  }
  return t == "-0" ? "0" : t;
}

// Four significant digits (2.028, 5.056, 4.54e-05), for exponentials whose size varies a lot.
std::string sig(double x) {
  std::ostringstream s;
  s << std::setprecision(4) << x;
  return s.str();
}

std::string tuple(const std::vector<std::string>& items) {
  std::string s = "(";
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s + ")";
}

using Cells = std::vector<std::vector<std::string>>;

// A bracketed matrix with right-aligned columns, indented.
void print_matrix(std::ostream& out, const Cells& cells) {
  std::vector<std::size_t> width;
  for (const auto& row : cells)
    for (std::size_t j = 0; j < row.size(); ++j) {
      if (width.size() <= j) width.push_back(0);
      width[j] = std::max(width[j], row[j].size());
    }
  for (const auto& row : cells) {
    out << "    [ ";
    for (std::size_t j = 0; j < row.size(); ++j) out << (j ? "  " : "") << std::setw(static_cast<int>(width[j])) << row[j];
    out << " ]\n";
  }
}

Cells cells_of(const Matrix& m, int decimals) {
  Cells c(static_cast<std::size_t>(m.rows));
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < m.cols; ++j) c[i].push_back(fixed(m.at(i, j), decimals));
  return c;
}

// `head` followed by `parts` joined by `sep` (the last one by `last_sep` when that is non-empty), on one
// line when it fits in ~110 columns, else one part per line with the separators aligned under the first.
void print_wrapped(std::ostream& out, const std::string& head, const std::vector<std::string>& parts,
                   const std::string& sep, const std::string& last_sep) {
  auto separator = [&](std::size_t i) { return i + 1 == parts.size() && !last_sep.empty() ? last_sep : sep; };
  std::string line = head;
  for (std::size_t i = 0; i < parts.size(); ++i) line += (i ? " " + separator(i) : "") + parts[i];
  if (line.size() <= 110) {
    out << line << "\n";
    return;
  }
  const std::string indent(head.size() >= 2 ? head.size() - 2 : 0, ' ');
  out << head << parts[0] << "\n";
  for (std::size_t i = 1; i < parts.size(); ++i) out << indent << separator(i) << parts[i] << "\n";
}

std::string dims(std::int64_t rows, std::int64_t cols) { return std::to_string(rows) + "×" + std::to_string(cols); }

// ---- the walk-through --------------------------------------------------------------------------------

struct Walk {
  const Matrix &q, &k, &v;
  const core::Problem& p;
  const reference::Result& r;
  Matrix scores;  // Q Kᵀ
  Matrix scaled;  // scale · Q Kᵀ, -inf where masked
};

void print_inputs(std::ostream& out, const Walk& w) {
  out << "Scaled dot-product attention, step by step:   Attention(Q, K, V) = softmax(Q Kᵀ · scale) V\n\n";
  out << "Inputs: " << w.q.rows << " queries, " << w.k.rows << " keys, d_k = " << w.q.cols << ", d_v = " << w.v.cols
      << "\n";
  out << "  Q (queries, " << dims(w.q.rows, w.q.cols) << ") =\n";
  print_matrix(out, cells_of(w.q, 4));
  out << "  K (keys, " << dims(w.k.rows, w.k.cols) << ") =\n";
  print_matrix(out, cells_of(w.k, 4));
  out << "  V (values, " << dims(w.v.rows, w.v.cols) << ") =\n";
  print_matrix(out, cells_of(w.v, 4));
}

void print_scores(std::ostream& out, const Walk& w, bool given_scale) {
  out << "\nStep 1. Raw dot-product scores S = Q Kᵀ (" << dims(w.q.rows, w.k.rows)
      << "): S[i][j] = q_i · k_j, how strongly query i matches key j\n";
  print_matrix(out, cells_of(w.scores, 4));

  out << "\nStep 2. Scale: ";
  const std::string root = "1/√" + std::to_string(w.q.cols);
  if (given_scale)
    out << "scale = " << fixed(w.p.scale, 4) << " (given with --scale; the default would be 1/√d_k = " << root
        << ")";
  else
    out << "scale = 1/√d_k = " << root << " = " << fixed(w.p.scale, 4)
        << " (keeps the scores' spread independent of d_k)";
  out << ", so S · scale =\n";
  if (w.p.causal != Causal::none)
    out << "  with the causal mask ("
        << (w.p.causal == Causal::top_left ? "top-left: key j is allowed for query i when j <= i"
                                           : "bottom-right: key j is allowed for query i when j <= i + Skv - Sq")
        << "); a blocked score becomes -inf, so its weight will be 0\n";
  print_matrix(out, cells_of(w.scaled, 4));
}

// Step 3: each row's exponentials, their sum and the softmax weights (from the reference).
void print_softmax(std::ostream& out, const Walk& w) {
  double largest = 0;
  for (double x : w.scaled.values)
    if (std::isfinite(x)) largest = std::max(largest, std::fabs(x));
  const bool shift = largest > 10;  // plain exp would print unreadably large (or overflow)
  out << "\nStep 3. Row-wise softmax: α[i][j] = exp(s_ij) / Σ_j' exp(s_ij')\n";
  if (shift)
    out << "  (the scores are large, so each row's maximum m_i is subtracted first: exp(s_ij - m_i); the weights "
           "do not change)\n";
  for (std::int64_t i = 0; i < w.q.rows; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < w.k.rows; ++j) m = std::max(m, w.scaled.at(i, j));
    if (m == -std::numeric_limits<double>::infinity()) {
      out << "  Row " << i << ": every key is masked, so there is nothing to weight: the output row is 0 (and its lse is -inf)\n";
      continue;
    }
    std::vector<std::string> e, alpha;
    double sum = 0, total = 0;
    for (std::int64_t j = 0; j < w.k.rows; ++j) {
      const double x = std::exp(w.scaled.at(i, j) - (shift ? m : 0.0));
      const double a = w.r.probs[static_cast<std::size_t>(i * w.k.rows + j)];
      sum += x;
      total += a;
      e.push_back(sig(x));
      alpha.push_back(fixed(a, 3));
    }
    const std::string exps = (shift ? "exp(s - m) = " : "exp(s) = ") + tuple(e) + ", sum = " + sig(sum);
    const std::string weights =
        "α_" + std::to_string(i) + " = " + tuple(alpha) + ", Σ_j α_" + std::to_string(i) + "j = " + fixed(total, 6);
    print_wrapped(out, "  Row " + std::to_string(i) + ": ", {exps, weights}, "=> ", "");
  }
  out << "  (each row is a probability distribution: non-negative weights that sum to 1)\n";
}

// Step 4: each output row as the weighted sum of the value rows its query may see.
void print_outputs(std::ostream& out, const Walk& w) {
  out << "\nStep 4. Output = α V: each output row is a weighted sum (a convex combination) of the value rows\n";
  for (std::int64_t i = 0; i < w.q.rows; ++i) {
    std::vector<std::string> result;
    for (std::int64_t d = 0; d < w.v.cols; ++d)
      result.push_back(fixed(w.r.out[static_cast<std::size_t>(i * w.v.cols + d)], 3));
    std::vector<std::string> terms;
    for (std::int64_t j = 0; j < w.k.rows; ++j) {
      if (!reference::allowed(w.p, 0, i, j)) continue;
      std::vector<std::string> row;
      for (std::int64_t d = 0; d < w.v.cols; ++d) row.push_back(fixed(w.v.at(j, d), 4));
      terms.push_back(fixed(w.r.probs[static_cast<std::size_t>(i * w.k.rows + j)], 3) + "·" + tuple(row));
    }
    if (terms.empty()) terms.push_back("(no key)");
    terms.push_back(tuple(result));
    print_wrapped(out, "  Row " + std::to_string(i) + ": ", terms, "+ ", "= ");
  }
  const Matrix o{w.q.rows, w.v.cols, w.r.out};
  out << "\nOutput = softmax(Q Kᵀ · scale) V (" << dims(o.rows, o.cols) << ") =\n";
  print_matrix(out, cells_of(o, 3));
}

}  // namespace

Status explain(const ExplainOptions& options, std::ostream& out) {
  Matrix q, k, v;
  if (options.q.empty()) {  // the worked example of the seed notes
    q = builtin(2, 2, {1, 0, 0, 1});
    k = builtin(3, 2, {1, 0, 0, 1, 1, 1});
    v = builtin(3, 2, {1, 0, 0, 2, 3, 1});
  } else {
    if (Status s = load_matrix(options.q, "--q", &q); !s) return s;
    if (Status s = load_matrix(options.k, "--k", &k); !s) return s;
    if (Status s = load_matrix(options.v, "--v", &v); !s) return s;
  }

  std::vector<float> o(static_cast<std::size_t>(q.rows * v.cols));
  Params params;
  params.scale = options.scale;
  params.causal = options.causal;
  core::Problem p;
  const TensorView ov = TensorView::contiguous(o.data(), DType::f32, {1, 1, q.rows, v.cols});
  const Float4d qf(q), kf(k), vf(v);
  if (Status s = core::validate(qf.view, kf.view, vf.view, ov, params, std::nullopt, &p); !s)
    return with_option_names(s);
  const reference::Result r = reference::attention<double>(p, /*keep_probs=*/true);

  Walk w{q, k, v, p, r, {q.rows, k.rows, {}}, {q.rows, k.rows, {}}};
  for (std::int64_t i = 0; i < q.rows; ++i)
    for (std::int64_t j = 0; j < k.rows; ++j) {
      double dot = 0;
      for (std::int64_t d = 0; d < q.cols; ++d) dot += q.at(i, d) * k.at(j, d);
      w.scores.values.push_back(dot);
      w.scaled.values.push_back(reference::allowed(p, 0, i, j) ? p.scale * dot
                                                               : -std::numeric_limits<double>::infinity());
    }

  std::ostringstream text;  // built whole, so an error never leaves half a walk-through behind
  print_inputs(text, w);
  print_scores(text, w, options.scale.has_value());
  print_softmax(text, w);
  print_outputs(text, w);
  out << text.str();
  return Status::Ok();
}

}  // namespace attn::tools
