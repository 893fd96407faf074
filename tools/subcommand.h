// attn tools: how a subcommand in its own file (tools/cmd_<name>.cc) hooks into the program.
//
// A file registers its subcommands on the app and attaches the work with on_run(); the work runs once
// the whole command line has parsed. A failed Status (or an exception) becomes a CLI error, which
// attn::tools::main reports as the usual single line "attn: error: <message>" with exit status 2.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <utility>

#include "attn/status.h"

namespace attn::tools {

inline void on_run(CLI::App* sub, std::function<Status()> run) {
  sub->callback([run = std::move(run)] {
    Status s;
    try {
      s = run();
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CLI::RuntimeError(e.what(), 2);
    }
    if (!s) throw CLI::RuntimeError(s.message(), 2);
  });
}

}  // namespace attn::tools
