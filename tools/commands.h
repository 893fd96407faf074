// attn tools: the `attn` command-line program (subcommands run, explain, demo) and the small helpers
// its subcommands share.
//
// Exit status: 0 on success (and for --help), 2 on bad input: an unknown option, a missing or malformed
// file, a wrong dtype or shape, or any argument the library rejects. An error is reported as exactly
// one line, "attn: error: <message>", on `err`, and no file is created or changed. Output and input files
// follow tools/files.h: outputs new or regular files, never an input; inputs regular files.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.h"
#include "npy.h"

namespace attn::tools {

// The whole program; `out` receives results and help text, `err` error lines.
int main(int argc, char** argv, std::ostream& out, std::ostream& err);

// ---- helpers shared by the subcommands ------------------------------------------------------------

// A library Status names its parameter first ("k: ...", "kv_lens: ..."); this rewrites that prefix
// into the command-line option ("--k: ...", "--kv-lens: ..."). Other messages pass through unchanged.
// `extra`: further library parameter -> option pairs, checked first (a command's own parameters).
Status with_option_names(const Status& status,
                         std::initializer_list<std::pair<const char*, const char*>> extra = {});

// "float32", "bfloat16", "int8", ... and "[2, 3, 4]": the one dtype table and shape formatter (npy.h).
using npy::numpy_name;
using npy::shape_text;

// A contiguous view of `array` keeping its rank; an error naming `option` if the rank exceeds 4.
Status view_of(const npy::Array& array, const std::string& option, TensorView* view);

// Parses "top-left" / "bottom-right" (and "none") for --causal.
Status parse_causal(const std::string& text, const std::string& option, Causal* causal);

// Parses a scale factor: a finite decimal number > 0.
Status parse_scale(const std::string& text, const std::string& option, double* value);

}  // namespace attn::tools
