// Tiny random checkpoints written by tools/make_tiny_checkpoint.py (the real HF layouts), made once
// per test process, and the numpy reference forward of tests/reference/reference.py.
#pragma once
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"

namespace tessera {
class Engine;
}

namespace tessera::test {

// Path of a tiny checkpoint of `family` ("llada" | "dream" | "llada_moe" | "llada2") made with `extra_args`;
// empty with a reason in *why when python3 + numpy are unavailable.
std::filesystem::path tiny_checkpoint(const std::string& family, const std::string& extra_args,
                                      std::string* why);
// Reference logits [rows.size(), vocab] for `tokens` at positions `rows`. margins (optional): each
// row's smallest router margin (k-th minus (k+1)-th router logit over the MoE layers; inf if dense).
// extra_args: more arguments of `reference.py logits` (LLaDA2: "--block B").
std::vector<float> reference_logits(const std::filesystem::path& model, const std::vector<int32_t>& tokens,
                                    const std::vector<int32_t>& rows, int64_t vocab,
                                    std::vector<float>* margins = nullptr,
                                    const std::string& extra_args = "");
// DiffusionGemma's reference logits ([n / vocab, vocab] f32) from tests/reference/ref_diffusion_gemma.py
// logits with `args` ("--mode enc --tokens ... --rows ..." or "--mode dec --prompt ... --canvas ..."); empty
// after a test failure when the script fails.
std::vector<float> diffusion_gemma_reference_logits(const std::filesystem::path& model,
                                                    const std::string& args, size_t n);
std::string join_ids(const std::vector<int32_t>& v);
// A random canvas of n tokens in [0, vocab) with about mask_ratio of them replaced by `mask`.
// n ordinary token ids of a vocabulary (below vocab - 8: no special token), from `seed`.
std::vector<int32_t> ordinary_tokens(int64_t n, int64_t vocab, uint64_t seed);
std::vector<int32_t> random_canvas(int64_t n, int64_t vocab, uint64_t seed, int32_t mask, double mask_ratio);
// 0, 1, ..., n - 1.
std::vector<int32_t> all_positions(int64_t n);

// A KV-cache step on a tiny model: canvas `a` (75 tokens, 70% masks) fills the cache of `e` (reset to
// its size), then `b` (a with every second row of [lo, hi) filled in) computes only rows [lo, hi).
// positions: every third one from lo + 1, whose logit rows lie inside the range (Dream: p - 1). got:
// the engine's logits; reference: reference.py's numpy version of the same computation (A's K / V
// for the other rows).
struct CachedStep {
  std::vector<int32_t> a, b, positions;
  int64_t lo = 32, hi = 64;
  std::vector<float> got, reference;
};
CachedStep run_cached_step(Engine& e, const std::filesystem::path& dir);
// A KV-cache step over a row list that is not one range (Window-Diffusion: the active set and the
// positions decided in the phase): canvas A (48 tokens, 70% masks) fills the cache, B fills rows
// {3, 10, 11, 12, 30, 41} and the step computes those (plus row 31, a logit row, where there is no shift)
// for the logits of 11, 12 and 31; reference: reference.py with A's K / V for every other row.
// On tiny LLaDA, Dream and LLaDA-MoE checkpoints loaded with `opt`: the step computes 6 rows (Dream)
// or 7 and its logits match the reference within `tol` (relative error; the CPU in f32 is held to 5e-6).
void expect_row_list_steps_match_reference(const EngineOptions& opt, double tol);

// reference.py generate (the numpy loop, temperature 0) with the options of `o` that it models:
// gen_length, steps, block_length, alg, cache, suffix, sparse (block, rho, skip), window (ex, in,
// refresh, early stop at eos_ids), cfg_scale, des (k, beta, scope) and their combinations and, with
// `logprobs`, each generated token's log-probability; other options (threshold, temperature, an EOS
// stop, ...) are a test failure. canvas: the final canvas
// (prompt + generation + suffix); order: the positions decided by each step that ran a forward;
// logprobs: per generated position (NaN where the reference decided none). Empty canvas (and a test
// failure) when reference.py fails.
// Runs a reference generation command and returns its JSON result (the last line of its output, with
// "tokens" and "order"); null, and a test failure, when it fails.
nlohmann::json run_reference(const std::string& cmd);
// run_reference of `reference.py generate --model MODEL --prompt PROMPT FLAGS`.
nlohmann::json reference_generate_json(const std::filesystem::path& model, const std::vector<int32_t>& prompt,
                                       const std::string& flags);
struct ReferenceGeneration {
  std::vector<int32_t> canvas;
  std::vector<std::vector<int32_t>> order;
  std::vector<double> logprobs;
};
ReferenceGeneration reference_generate(const std::filesystem::path& model, const std::vector<int32_t>& prompt,
                                       const GenerateOptions& o, bool logprobs = false);

// One generation per prompt: the generated span and the positions decided at each step.
struct ReferenceRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> order;
  bool operator==(const ReferenceRun&) const = default;
};
void PrintTo(const ReferenceRun& r, std::ostream* os);
// reference_generate with the options `o` for every prompt; checks that it kept the prompt and the suffix.
std::vector<ReferenceRun> reference_runs(const std::filesystem::path& dir,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerateOptions& o);
// tessera's generate() (f32) decides, for every prompt, exactly what the reference decides with the
// options `o` (what: the case's name, in the failure messages); returns the reference's runs.
std::vector<ReferenceRun> expect_matches_reference(const std::filesystem::path& dir,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   const GenerateOptions& o, const std::string& what);

// The parameters stored in the checkpoint at `dir`: all, and those of the routed experts (mlp.experts.*).
struct CheckpointParams {
  int64_t total = 0, routed_experts = 0;
};
CheckpointParams checkpoint_params(const std::filesystem::path& dir);

// tessera's logits (an Engine loaded with `options`: device, precision) of the tiny `family` checkpoint
// made with `args` against the numpy reference, every row of random canvases of 1, 5, 33 and 130
// tokens (40% masks): relative error <= tol. In bf16, rows of MoE models near a routing tie are left
// out (see tiny_models.cpp); at least two thirds of the rows of the longer canvases must stay. Skips
// the calling test without python3 + numpy.
void check_logits_against_reference(const std::string& family, const std::string& args,
                                    const EngineOptions& options, double tol);

// LLaDA2 block diffusion as the tests run it on the tiny checkpoint: a prompt of 11 ordinary tokens
// (it ends inside the first block) and 30 generated tokens (they end inside a block: the canvas is
// padded), greedy, in blocks of 8 (8 steps per block, threshold 0.05) and of 16 (4 steps, threshold
// 0.03); both thresholds decide several positions in some steps.
std::vector<int32_t> llada2_prompt(int64_t vocab);
std::vector<GenerateOptions> llada2_generate_cases(int32_t eos_id);

// `src` (a GGUF) written again with its matrices (2-D and stacked 3-D float tensors whose rows are
// whole blocks of 32) quantized by ggml's reference quantizers: q4_0 for the down projections, q8_0
// for the others; the metadata and the 1-D tensors as they are.
void requantize_gguf(const std::filesystem::path& src, const std::filesystem::path& dst);

// A copy of the checkpoint at `src` whose config.json `edit` changed must fail to load with `expect` in
// the error, from load_config and from the CLI (one line, non-zero exit); `name` tells the cases apart.
void expect_config_error(const std::filesystem::path& src, const std::string& name,
                         const std::function<void(nlohmann::json&)>& edit, const std::string& expect);

}  // namespace tessera::test

#define TESSERA_TINY_OR_SKIP(var, family, args)                                \
  std::string var##_why;                                                       \
  const auto var = ::tessera::test::tiny_checkpoint(family, args, &var##_why); \
  if (var.empty()) GTEST_SKIP() << var##_why
