// tessera features: which features of a generation combine (decode/compat.h's table, the source of
// docs/ARCHITECTURE.md's feature matrix).
#include <cstdio>

#include "apps/tessera/commands.h"
#include "decode/compat.h"

namespace tessera::cli {

void add_features(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand(
      "features",
      "Print which features combine (KV cache, SparseD, window, cfg, infilling, DES, ...) as Markdown");
  reg.handlers.emplace_back(sub, [] {
    std::fputs(compat_markdown().c_str(), stdout);
    return 0;
  });
}

}  // namespace tessera::cli
