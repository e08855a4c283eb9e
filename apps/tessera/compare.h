// --compare SPEC of tessera eval and tessera bench: a comma-separated list of key=value options (steps,
// block-length, threshold, alg, cfg, temperature, cache, sparse, sparse-block, sparse-rho, sparse-skip, des,
// des-k, des-beta, des-scope, window, window-ex, window-in, window-refresh, window-early-stop,
// mid-block-stop, suffix, logprobs, edit-mode, edit-threshold, max-post-steps, edit-penalty, precision,
// dequantize, device, k-ffn, k-logits, memory-budget) applied to a base configuration; and the progress
// line both commands show on a terminal while they measure.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"

namespace tessera::cli {

Precision parse_precision(const std::string& p);
// The keys a --compare spec may set, comma-separated (for help texts and errors).
std::string known_keys();

// One comparison: generation options and, where they differ from the base, engine options.
struct Candidate {
  std::string label;
  GenerateOptions gen;
  EngineOptions eng;
  bool own_engine = false;  // an engine option changed: the comparison needs an engine of its own
  bool suffix = true;       // tessera eval --suffix-len: infill (suffix=off: continue without the suffix)
};

// Throws Error naming the spec and the offending key (with the closest known key) or value.
Candidate parse_spec(const std::string& spec, const GenerateOptions& base, const EngineOptions& base_eng);
// Every spec parsed against `base` and checked as generate would check it (validate_generate_options:
// vocab of the model, block_causal), same generation length: the first bad one throws, naming it, before
// any measurement. What only an engine can tell (a device that is not built in, a memory budget below
// the step's floor) is found when the comparison runs.
std::vector<Candidate> check_specs(const std::vector<std::string>& specs, const GenerateOptions& base,
                                   const EngineOptions& eng, int64_t vocab, bool block_causal);

// tessera eval's exact path for model `mc`: gen_length tokens, `steps` steps (0: gen_length), block
// `block_length` (0: gen_length; a tri-mode model: its trained block, seeded and committed causally as
// generate's), the unmasking `alg`, greedy, the model's EOS.
GenerateOptions exact_path(const ModelConfig& mc, int gen_length, int steps, int block_length, Unmask alg);

// One progress line on stderr, rewritten in place, when stderr is a terminal (and not `quiet`):
// "[eval] exact: prompt 3/8". Cleared by clear() and on destruction.
class Progress {
 public:
  explicit Progress(std::string command, bool quiet = false);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  bool on() const { return on_; }
  void show(const std::string& what);
  void clear();

 private:
  std::string command_;
  bool on_ = false, shown_ = false;
};

// The comparisons of eval and bench: body(i, engine) for every candidate i, on an engine of its own
// (load(c.eng), announced on the progress line as `what(i)`) where its engine options differ, else on
// `base`. A comparison that throws Error is cleared from the progress line, reported on stderr ("tessera
// COMMAND: comparison 'LABEL' cannot run: ...") and handed to on_error; the others still run. Returns how
// many failed.
int run_comparisons(const std::vector<Candidate>& cs, Engine& base,
                    const std::function<std::unique_ptr<Engine>(const EngineOptions&)>& load,
                    Progress& progress, const std::string& command,
                    const std::function<std::string(size_t)>& what,
                    const std::function<void(size_t, Engine&)>& body,
                    const std::function<void(size_t, const Error&)>& on_error);

}  // namespace tessera::cli
