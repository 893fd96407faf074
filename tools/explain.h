// attn tools: `attn explain`, scaled dot-product attention on a small example, one step at a time.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "attn/attn.h"

namespace attn::tools {

struct ExplainOptions {
  // .npy files holding Q [Sq, Dk], K [Skv, Dk] and V [Skv, Dv] (or [1, 1, S, D]); all three empty
  // means the built-in example (Q = [[1,0],[0,1]], K = [[1,0],[0,1],[1,1]], V = [[1,0],[0,2],[3,1]]).
  std::string q, k, v;
  Causal causal = Causal::none;
  std::optional<double> scale;  // default 1/sqrt(Dk)
};

// Writes the walk-through to `out`: the inputs, Q Kᵀ, the scaled scores, each row's softmax and each
// output row as a weighted sum of value rows. On error nothing is written and the Status names the
// offending option. Matrices beyond 16 rows or columns are refused.
Status explain(const ExplainOptions& options, std::ostream& out);

}  // namespace attn::tools
