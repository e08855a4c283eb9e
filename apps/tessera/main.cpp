// tessera: the command-line interface. Each subcommand lives in its own file (cmd_*.cpp).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "apps/tessera/commands.h"
#include "core/error.h"

namespace {

// libgomp's idle threads spin 300,000 times before they sleep. When another process holds one of the
// cores, a thread waiting at a barrier spins against a sibling that cannot run, and a small step takes
// 10-50x longer (measured: tessera-tiny-moe, 64 steps, 0.4 s alone, 34 s next to a 2-thread job).
// 2,000 spins keep the uncontended speed within ~10% and bound that loss to ~5x. libgomp reads its
// settings once, when it loads, so the process starts itself again with the setting in place; a user's
// own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
void bound_openmp_spinning(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "2000", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with libgomp's defaults
}

}  // namespace

int main(int argc, char** argv) {
  bound_openmp_spinning(argv);
  CLI::App app{"tessera: an inference engine for diffusion language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera 0.1.0");
  tessera::cli::Registry reg;
  tessera::cli::add_generate(app, reg);
  tessera::cli::add_chat(app, reg);
  tessera::cli::add_inspect(app, reg);
  tessera::cli::add_convert(app, reg);
  tessera::cli::add_plan(app, reg);
  tessera::cli::add_eval(app, reg);
  tessera::cli::add_bench(app, reg);
  tessera::cli::add_serve(app, reg);
  tessera::cli::add_features(app, reg);
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
