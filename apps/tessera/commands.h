// Subcommand registration for the tessera CLI.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <utility>
#include <vector>

namespace tessera::cli {

struct Registry {
  std::vector<std::pair<CLI::App*, std::function<int()>>> handlers;
};

void add_generate(CLI::App& app, Registry& reg);
void add_inspect(CLI::App& app, Registry& reg);
void add_convert(CLI::App& app, Registry& reg);
void add_plan(CLI::App& app, Registry& reg);
void add_eval(CLI::App& app, Registry& reg);
void add_bench(CLI::App& app, Registry& reg);
void add_serve(CLI::App& app, Registry& reg);

}  // namespace tessera::cli
