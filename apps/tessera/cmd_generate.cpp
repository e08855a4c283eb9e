#include "apps/tessera/commands.h"
namespace tessera::cli {
void add_generate(CLI::App& app, Registry& reg) { (void)app; (void)reg; }
}  // namespace tessera::cli
