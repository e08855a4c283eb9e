// tessera: the command-line interface. Each subcommand lives in its own file (cmd_*.cpp).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "apps/tessera/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: an inference engine for diffusion language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera 0.1.0");
  tessera::cli::Registry reg;
  tessera::cli::add_generate(app, reg);
  tessera::cli::add_inspect(app, reg);
  tessera::cli::add_convert(app, reg);
  tessera::cli::add_plan(app, reg);
  tessera::cli::add_eval(app, reg);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, fn] : reg.handlers) {
      if (sub->parsed()) return fn();
    }
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
