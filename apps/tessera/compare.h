// --compare SPEC of tessera eval and tessera bench: a comma-separated list of key=value options (steps,
// block-length, threshold, alg, temperature, cache, sparse, sparse-block, sparse-rho, sparse-skip, des,
// des-k, des-beta, des-scope, window, window-ex, window-in, window-refresh, window-early-stop,
// mid-block-stop, suffix, logprobs, edit-mode, edit-threshold, max-post-steps, edit-penalty, precision,
// device, k-ffn, k-logits, memory-budget) applied to a base
// configuration.
#pragma once
#include <string>

#include "decode/generate.h"
#include "engine/engine.h"

namespace tessera::cli {

Precision parse_precision(const std::string& p);

// One comparison: generation options and, where they differ from the base, engine options.
struct Candidate {
  std::string label;
  GenerateOptions gen;
  EngineOptions eng;
  bool own_engine = false;  // an engine option changed: the comparison needs an engine of its own
  bool suffix = true;       // tessera eval --suffix-len: infill (suffix=off: continue without the suffix)
};

// Throws Error naming the spec and the offending key or value.
Candidate parse_spec(const std::string& spec, const GenerateOptions& base, const EngineOptions& base_eng);

}  // namespace tessera::cli
