// attn tools: how a subcommand in its own file (tools/cmd_<name>.cc) hooks into the program.
//
// A file registers its subcommands on the app and attaches the work with on_run(); the work runs once
// the whole command line has parsed. A failed Status (or an exception) becomes a CLI error, which
// attn::tools::main reports as the usual single line "attn: error: <message>" with exit status 2.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "attn/status.h"

namespace attn::tools {

// An exception's line: running out of memory says so in the program's words, not std::bad_alloc's.
inline std::string exception_message(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return "the sizes given need more memory than this machine can allocate; expected smaller sizes";
  if (dynamic_cast<const std::length_error*>(&e))  // (a std::vector asked for more than its max_size())
    return "the sizes given need more memory than a process can address; expected smaller sizes";
  return e.what();
}

inline void on_run(CLI::App* sub, std::function<Status()> run) {
  sub->callback([run = std::move(run)] {
    Status s;
    try {
      s = run();
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CLI::RuntimeError(exception_message(e), 2);
    }
    if (!s) throw CLI::RuntimeError(s.message(), 2);
  });
}

}  // namespace attn::tools
