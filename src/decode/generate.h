// The unmasking loops of masked diffusion LMs (host-side logic over the Denoiser interface).
//
// Algorithms (GenerateOptions::alg):
//   low_confidence | random           LLaDA `generate` (algorithms.md 1A): semi-autoregressive blocks,
//                                     Gumbel-max sampling, confidence softmax(L)[x0] or uniform random.
//   origin | maskgit_plus | topk_margin | entropy
//                                     Dream `diffusion_generate` (1B) over the whole generation. When
//                                     block_length < gen_length the Dream schedule (linspace timesteps,
//                                     steps / num_blocks steps) runs inside each block in turn.
//   threshold > 0                     confidence-threshold parallel decoding (1C) inside each block
//                                     (one block when block_length >= gen_length): every masked
//                                     position of the block with conf >= threshold, at least the most
//                                     confident one; the block loops until decided (steps is not split).
//
// RNG: step g (counted over the whole generation: block b, step i -> g = b * steps_per_block + i; one
// per forward under threshold decoding) uses SampleParams.seed = rng_mix(seed + g), so the device
// noise is rng_uniform(rng_mix(seed + g), position, vocab index). Host-side draws of that step
// (origin's transfer coin per position, alg_temp's multinomial) use host_seed = rng_mix(that seed ^
// 0xd1b54a32d192ed03): origin u = rng_uniform(host_seed, position, 0); the j-th multinomial draw
// u = rng_uniform(host_seed, j, 1).
//
// Block-causal models (Denoiser::attention_block() > 0, LLaDA2; LLaDA2MoeModelLM.generate): the model's
// attention block is set to block_length, and the blocks are that grid of absolute positions
// [b * block_length, (b + 1) * block_length), as in the reference (the first block may end the prompt;
// the canvas is padded with masks to whole blocks and the padding is dropped from the result).
// gen_length need not be a multiple of block_length, and `steps` counts steps PER BLOCK. Forwards see
// only the canvas up to the current block's end (exact: earlier blocks never attend to later ones).
// Threshold decoding then follows LLaDA2: accept conf > threshold, and at step i of a block at least
// max(1, llada_schedule(block_length, steps)[i]) positions. The step counter g advances by `steps` per
// block without threshold (one per forward with it).
//
// KV cache (GenerateOptions::cache, Fast-dLLM; algorithms.md 1D), off by default:
//   prefix  the first forward of every block computes the whole canvas and refreshes the cache; later
//           forwards of the block compute only rows [block start, end of canvas) and reuse the cached
//           keys / values of the rows before the block.
//   dual    as prefix, but later forwards compute only the block's rows [lo, hi): the rows after the
//           block (later blocks, an infilling suffix) are cached too.
// Both are approximations for bidirectional models (cached rows do not see the block's new tokens
// until the next block). For block-causal models they are exact (up to rounding) and the same: rows
// of finished blocks never change nor attend to later rows, so the first forward of a block computes
// the previous block (now final) and this one, later forwards only this block.
//
// SparseD (GenerateOptions::sparse; algorithms.md 2), off by default: the first floor(steps *
// sparse_skip) forwards of the request use exact attention; the next one also builds every layer's
// head-specific pattern (isolated selection of prompt and generation key blocks, sparse_rho of each,
// tiles of sparse_block positions); every later forward, in every block, attends only to the pattern's
// tiles. The count is of forwards run (threshold decoding too, with `steps` as its nominal length).
// Bidirectional models only, and not with a KV cache or cfg (one canvas, one sequence per forward).
//
// DES (GenerateOptions::des; algorithms.md 4), off by default, MoE models: in every forward the current
// block's positions (from the end of the prompt; the whole generation without blocks) vote for each MoE
// layer's expert coreset and route inside it (seq: the union of each token's first des_k experts; vote:
// the floor(des_beta * n_experts) experts of highest summed router score). des_scope all routes every
// other row inside the coreset too; block leaves them their own experts. moe_stats counts unique experts
// without sharing (des off).
//
// Window-Diffusion (GenerateOptions::window; algorithms.md 3), off by default, bidirectional models:
// forwards run in phases of window_refresh forwards. A phase's first forward (the refresh) computes
// the canvas up to the end of its external window (the first window_ex undecided positions from the
// first undecided one; 0 = 64 for the LLaDA algorithms, 128 for the Dream ones) and caches every row's
// K / V; the far field after it is in no forward of the phase (positions stay absolute). Each step's
// candidates are the active set (the first window_in undecided positions of the window) inside the
// current block; later forwards of the phase compute only the positions that were undecided at the
// phase start up to the active set's end (the active set and the tokens decided in this phase) and
// reuse the cached K / V of every other row. A phase ends early when its window has no undecided
// position left. window_refresh 0: no cache, every forward computes the whole window (pruning only).
// The schedule's counts are capped at the active set (LLaDA: the rest carries to the next step);
// positions a block's schedule leaves undecided are then decided a whole active set per step (RNG
// step counter from num_blocks * steps_per_block on). window_early_stop: after an EOS is decided at
// p, positions after p are never computed nor decided (they read as that EOS), and the request ends
// when everything before it is decided. Not with a KV cache (the window keeps its own), SparseD, cfg.
//
// Steps whose schedule decides nothing (k = 0, or no origin coin came up) run no forward; they are
// not counted in steps_run and produce no event.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decode/denoiser.h"

namespace tessera {

struct GenerateOptions {
  int gen_length = 128, steps = 128, block_length = 128;
  float temperature = 0.0f;
  std::string alg = "low_confidence";  // low_confidence|random|origin|maskgit_plus|topk_margin|entropy
  float threshold = 0.0f;              // > 0: confidence-threshold parallel decoding (1C)
  float cfg_scale = 0.0f;              // > 0: classifier-free guidance (LLaDA algorithms only)
  int top_k = 0;                       // Dream algorithms only; 0 = off
  float top_p = 1.0f;                  // Dream algorithms only; 1 = off
  float alg_temp = 0.0f;               // Dream confidence algorithms: > 0 samples positions
  float eps = 1e-3f;                   // Dream timesteps linspace(1, eps, steps + 1)
  uint64_t seed = 0;
  bool logits_eos_inf = false;  // forbid eos_ids[0] (LLaDA's logits_eos_inf)
  bool stop_at_eos = true;      // trim the output at the first EOS; stop after a block that holds one
  std::string cache = "none";   // KV cache: none | prefix | dual (see above)
  bool sparse = false;          // SparseD sparse attention (see above)
  int sparse_block = 32;
  float sparse_rho = 0.5f;
  float sparse_skip = 0.2f;
  std::string des = "off";  // Dynamic Expert Sharing: off | seq | vote (see above)
  int des_k = 2;
  float des_beta = 0.4f;
  std::string des_scope = "block";  // block | all
  bool moe_stats = false;   // count unique experts (Denoiser::des_begin with mode Off) when des is off
  bool window = false;      // Window-Diffusion (see above)
  int window_ex = 0;        // external window in undecided positions; 0 = 64 (LLaDA algs) / 128 (Dream)
  int window_in = 16;       // active set
  int window_refresh = 32;  // forwards per phase; 0 = no cache
  bool window_early_stop = false;
  std::vector<int32_t> eos_ids;
  // Stop sequences (text, each non-empty): the answer ends before the first one. generate() has no
  // tokenizer: the caller that has one (cli::Session) cuts the text and sets stop_when, which says
  // whether generated tokens hold a stop sequence. mid_block_stop (default): whenever the run of decided
  // tokens from the start of the generation grows, generate() ends as soon as that run holds an EOS
  // (stop_at_eos) or stop_when says it holds a stop sequence (asked with the run, not when it holds an
  // EOS), inside a block too. Exact: the tokens of the run are final, so the answer is the same as
  // running every step. false: asked only after every block but the last (the run cut at its first EOS
  // when stop_at_eos) and true skips the later blocks; kept to measure what the default saves.
  std::vector<std::string> stop;
  std::function<bool(std::span<const int32_t>)> stop_when;
  bool mid_block_stop = true;
  // Infilling: tokens after the generated span. The canvas is prompt + gen_length masks + suffix and
  // every forward sees the suffix (cfg's unconditional canvas masks it with the prompt); the answer is
  // the span between them. Bidirectional models only; not with Window-Diffusion or SparseD.
  std::vector<int32_t> suffix;
  // Record each generated token's log-probability (GenerateResult::logprobs): the forward that decided
  // it returns them beside the tokens (SampleParams::logprobs; with cfg, from the guided logits).
  bool logprobs = false;
};

// A generated token's log-probability: log_softmax of the model's logits at its position, in the
// forward of the step that decided it (raw logits: no temperature, no top-k / top-p filter; with cfg the
// guided logits), and the most likely tokens of that distribution.
struct TokenLogprob {
  float logprob = NAN;                         // of the token; NaN for a position never decided
  int step = -1;                               // the executed step that decided it (index into order)
  std::vector<std::pair<int32_t, float>> top;  // min(kTopLogprobs, vocab) (token, logprob), most likely first
};

struct StepEvent {
  int step;                                          // 0-based index of the executed step
  std::span<const int32_t> canvas;                   // the whole canvas (prompt + generation)
  std::span<const int32_t> newly_decided_positions;  // absolute canvas positions, ascending
  std::span<const TokenLogprob> logprobs;            // GenerateOptions::logprobs: per generated position
};

struct GenerateResult {
  std::vector<int32_t> tokens;              // generated part only (trimmed at the first EOS if stop_at_eos)
  std::vector<std::vector<int32_t>> order;  // absolute positions decided at each executed step, ascending
  int steps_run = 0;                        // executed steps (each one forward; two with cfg)
  std::vector<TokenLogprob> logprobs;       // GenerateOptions::logprobs: one per token of `tokens`
};

// Throws Error with a one-line message for invalid options (vocab_size bounds eos ids). block_causal:
// the options are for a block-causal model (no divisibility rules; see generate()).
void validate_generate_options(const GenerateOptions& o, int64_t vocab_size, bool block_causal = false);

// The external window of the options: window_ex, or its default for the algorithm (64 LLaDA, 128 Dream).
int window_external(const GenerateOptions& o);

// The DesConfig of the options' des, des_k, des_beta and des_scope (Denoiser::des_begin).
DesConfig des_config(const GenerateOptions& o);
// The DES method of a request: `des` when given, else the one des-k (seq) or des-beta (vote) implies,
// else `otherwise`; throws Error when both are given without des.
std::string implied_des(const std::optional<std::string>& des, bool k_given, bool beta_given,
                        const std::string& otherwise);

// Whether a request holds a KV cache for its canvas: --cache, or the window's phase cache (refresh > 0).
bool holds_kv_cache(const GenerateOptions& o);

// The canvas a generation uses: prompt + gen_length (+ the suffix), padded to whole blocks for
// block-causal models.
int64_t canvas_length(int64_t prompt_len, const GenerateOptions& o, bool block_causal);

GenerateResult generate(Denoiser& den, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(const StepEvent&)>& on_step = {});

}  // namespace tessera
