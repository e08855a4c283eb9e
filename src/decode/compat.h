// Which features of a generation combine, in one table: validate_generate_options refuses a request
// from it, and docs/ARCHITECTURE.md's feature matrix is printed from it (`tessera features`), so the
// two cannot disagree.
#pragma once
#include <string>
#include <string_view>

#include "decode/options.h"

namespace tessera {

enum class Feature : uint8_t {
  KvCache,      // --cache prefix | dual
  SparseD,      // --sparse
  Window,       // --window (Window-Diffusion)
  Cfg,          // --cfg (classifier-free guidance)
  Infilling,    // --suffix
  Des,          // --des (MoE models)
  BlockCausal,  // a block-causal model (LLaDA2)
  Threshold,    // --threshold (confidence-threshold parallel decoding)
  Logprobs,     // --logprobs
  Editing,      // --edit-mode / --edit-threshold (token editing)
  Batching,     // concurrent requests in serve (engine/batcher)
  Structured,   // structured output (serve's response_format, --json-schema): GenerateOptions::constraint
  TriMode,      // a tri-mode model's causal decoding: mode ar / spec, causal-context diffusion
  Uniform,      // a uniform-noise model's canvases (DiffusionGemma: mode uniform)
};
constexpr int kFeatures = 14;

enum class Combination : uint8_t {
  Exact,        // the combination is exact where each part is
  Approximate,  // combines; one part (or the combination) approximates the exact path
  Alone,        // combines, but such requests run one at a time instead of sharing forwards
  Refused,      // cannot be defined (the reason says why)
};

struct Compat {
  Combination how;
  std::string_view reason;  // why it is refused, approximate or alone ("" for exact)
};

std::string_view feature_name(Feature f);
// Whether a feature is approximate by itself (its output differs from the exact path's).
bool approximate(Feature f);
// How two different features combine (symmetric).
Compat compat(Feature a, Feature b);
// Whether a request of these options (on a block-causal model when block_causal) uses f. Batching is
// never a property of the options (the server's).
bool uses(const GenerateOptions& o, Feature f, bool block_causal);
// Throws Error with the reason of the first refused pair the options use.
void check_combinations(const GenerateOptions& o, bool block_causal);
// The feature-by-feature matrix as a Markdown table, then the reasons, one per line.
std::string compat_markdown();

}  // namespace tessera
