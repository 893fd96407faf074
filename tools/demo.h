// attn tools: `attn demo`, the explain walk-through followed by a realistic shape run on both backends.
#pragma once

#include <ostream>

#include "attn/attn.h"

namespace attn::tools {

struct DemoOptions {
  int threads = 0;     // 0 = the library's default
  bool small = false;  // a much smaller shape (for tests)
};

// Runs the demo, writing its report to `out`. Fails if the two backends disagree.
Status demo(const DemoOptions& options, std::ostream& out);

}  // namespace attn::tools
