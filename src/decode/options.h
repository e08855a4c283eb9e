// The options of one generation, typed: every choice is an enum, parsed once where it enters (CLI
// flags, serve's JSON, --compare specs) by the parse_* functions below, which name the bad value and
// the choices. Nothing inside src/ compares option strings.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "decode/constraint.h"

namespace tessera {

// The unmask policy (GenerateOptions::alg): how a step ranks the candidate positions.
enum class Unmask : uint8_t {
  LowConfidence,  // LLaDA 1A: softmax probability of the Gumbel-max token
  Random,         // LLaDA 1A: uniform random ranks
  Origin,         // Dream 1B: each position transfers with probability 1 - s / t
  MaskgitPlus,    // Dream 1B: probability of the token
  TopkMargin,     // Dream 1B: p1 - p2
  Entropy,        // Dream 1B: negative entropy
};
// The KV cache (Fast-dLLM, algorithms.md 1D).
enum class KvCache : uint8_t { None, Prefix, Dual };
// Which rows of a forward route inside the DES coreset: the block's (the tokens decoded in parallel)
// or every row.
enum class DesScope : uint8_t { Block, All };
// LLaDA2.1's token-editing presets (specs/llada21-editing.md section 4; the model card's own numbers
// could not be read, these are the spec's recommendation): quality = mask threshold 0.7, editing above
// 0.5; speed = mask threshold 0.5, editing whenever the candidate differs (edit threshold 0); both at
// most 16 post steps. Off: no editing.
enum class EditMode : uint8_t { Off, Quality, Speed };
struct EditPreset {
  float threshold, edit_threshold;
  int max_post_steps;
};
EditPreset edit_preset(EditMode m);  // m != Off
// How a generation writes the canvas (GenerateOptions::mode). Diffusion: the unmasking loops (on a
// tri-mode model with causal_context: block diffusion seeded and committed by causal passes,
// decode/causal.cpp). Ar and Spec need a tri-mode model (Nemotron-Labs-Diffusion): Ar decodes one token
// per causal forward; Spec is linear self-speculation (a bidirectional draft fills a block, a causal
// pass verifies it, the longest matching run plus one token is kept).
// Uniform: a uniform-noise model's canvases (DiffusionGemma, decode/uniform.cpp), the only mode such a
// model has.
enum class DecodeMode : uint8_t { Diffusion, Ar, Spec, Uniform };
DecodeMode parse_decode_mode(std::string_view s);
std::string_view name(DecodeMode m);
// How spec keeps drafts at temperature > 0 (GenerateOptions::spec_sampling). Match (the reference's):
// the verify pass samples every position and its samples are kept while each drafted token equals the
// one verified before it. Rejection (speculative sampling, Leviathan et al. / Chen et al. 2023): drafted
// token d at a position is kept with probability min(1, p(d) / q(d)) (p: the verify pass's distribution,
// q: the draft's), the first rejected one is replaced by a sample of the residual max(0, p - q). Both
// keep the model's autoregressive distribution (decode/causal.cpp); rejection keeps more drafts.
enum class SpecSampling : uint8_t { Match, Rejection };
SpecSampling parse_spec_sampling(std::string_view s);
std::string_view name(SpecSampling s);

Unmask parse_unmask(std::string_view s);
KvCache parse_kv_cache(std::string_view s);
DesMode parse_des(std::string_view s);
DesScope parse_des_scope(std::string_view s);
EditMode parse_edit_mode(std::string_view s);
std::string_view name(Unmask a);
std::string_view name(KvCache c);
std::string_view name(DesMode d);
std::string_view name(DesScope s);
std::string_view name(EditMode m);

// LLaDA's algorithms (semi-autoregressive blocks, Gumbel-max sampling) and Dream's (timesteps).
inline bool is_llada(Unmask a) {
  return a == Unmask::LowConfidence || a == Unmask::Random;
}
inline bool is_dream(Unmask a) {
  return !is_llada(a);
}

// The entropy-bound sampler of uniform-noise canvases (DecodeMode::Uniform; decode/uniform.cpp); the
// model's generation_config.json gives the defaults (the session sets them). Steps per canvas are
// GenerateOptions::steps, the canvas length block_length.
struct UniformSampling {
  double t_min = 0.4, t_max = 0.8;  // the temperature schedule, from t_max (first step) down to t_min
  double entropy_bound = 0.1;       // a step keeps the lowest-entropy samples while their sum stays below
  int stability = 1;                // stop when the last `stability` argmax canvases repeat (0: always)
  double confidence = 0.005;        // ... and the mean entropy is below this (0: never early)
  int32_t pad_id = 0;               // shown at positions no canvas has reached yet
};

// What a generation does (each part is described in its file of decode/, listed in decode/loop.h;
// decode/compat.h says which combine).
struct GenerateOptions {
  int gen_length = 128, steps = 128, block_length = 128;
  float temperature = 0.0f;
  Unmask alg = Unmask::LowConfidence;
  float threshold = 0.0f;  // > 0: confidence-threshold parallel decoding (1C)
  float cfg_scale = 0.0f;  // > 0: classifier-free guidance (LLaDA algorithms only)
  int top_k = 0;           // Dream algorithms only; 0 = off
  float top_p = 1.0f;      // Dream algorithms only; 1 = off
  float alg_temp = 0.0f;   // Dream confidence algorithms: > 0 samples positions
  float eps = 1e-3f;       // Dream timesteps linspace(1, eps, steps + 1)
  uint64_t seed = 0;
  bool logits_eos_inf = false;    // forbid eos_ids[0] (LLaDA's logits_eos_inf)
  bool stop_at_eos = true;        // trim the output at the first EOS; stop after a block that holds one
  KvCache cache = KvCache::None;  // KV cache (decode/rows.cpp)
  bool sparse = false;            // SparseD sparse attention (decode/sparse.cpp)
  int sparse_block = 32;
  float sparse_rho = 0.5f;
  float sparse_skip = 0.2f;
  DesMode des = DesMode::Off;  // Dynamic Expert Sharing (decode/experts.cpp)
  int des_k = 2;
  float des_beta = 0.4f;
  DesScope des_scope = DesScope::Block;
  bool moe_stats = false;   // count unique experts (Denoiser::des_begin with mode Off) when des is off
  bool window = false;      // Window-Diffusion (decode/window.cpp)
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
  // Structured output (decode/constrained.cpp): the answer is written left to right under this
  // constraint (a JSON Schema, any JSON object), each token one that keeps it completable in the
  // positions left; null: none.
  std::shared_ptr<const TokenConstraint> constraint;
  bool mid_block_stop = true;
  // Infilling: tokens after the generated span. The canvas is prompt + gen_length masks + suffix and
  // every forward sees the suffix (cfg's unconditional canvas masks it with the prompt); the answer is
  // the span between them. Bidirectional models only.
  std::vector<int32_t> suffix;
  // Record each generated token's log-probability (GenerateResult::logprobs): the forward that decided
  // it returns them beside the tokens (SampleParams::logprobs; with cfg, from the guided logits).
  bool logprobs = false;
  // Token editing (LLaDA2.1's draft and edit, decode/edit.cpp): each step of a block fills masks whose
  // candidate's probability is > threshold (at least one) and, from the same forward, rewrites the
  // block's tokens decided before the step whose candidate differs with probability > edit_threshold
  // (0: whenever it differs). A block ends at a step without a mask that edits nothing, or after
  // max_post_steps forwards without a mask. Editing on or off is `edit`, never the threshold's value.
  // edit_penalty > 0: SGLang's 2-gram penalty (that much off the logit of the token before each
  // position in its block).
  bool edit = false;
  float edit_threshold = 0.9f;
  int max_post_steps = 16;
  float edit_penalty = 0.0f;
  // Tri-mode models (decode/causal.cpp): the mode, and whether Diffusion runs with the causal context
  // (the session sets it for a tri-mode model: its blocks are seeded by the causal prefill and each
  // finished block's K / V written by a causal pass, as the model was trained). Ar and Spec always
  // write the cache causally.
  DecodeMode mode = DecodeMode::Diffusion;
  bool causal_context = false;
  bool draft_adapter = true;  // spec: drafts add the checkpoint's draft adapter (LoRA) when it has one
  SpecSampling spec_sampling = SpecSampling::Match;  // spec at temperature > 0
  // spec's drafts: 0 (the reference's default) fills the block in one pass; > 0 runs passes deciding the
  // most confident position and every other with conf >= draft_threshold. (`threshold` is diffusion's.)
  float draft_threshold = 0.0f;
  UniformSampling uniform;  // mode uniform
  // Whether the generation's forwards switch to causal attention (Denoiser::set_causal).
  bool causal() const { return mode != DecodeMode::Diffusion || causal_context; }
};

// Throws Error with a one-line message for invalid options (vocab_size bounds eos ids). block_causal:
// the options are for a block-causal model (no divisibility rules; see generate()). A combination of
// features is checked against the table of decode/compat.h.
void validate_generate_options(const GenerateOptions& o, int64_t vocab_size, bool block_causal = false);

// For an unmasking the user did not choose (the model's default): threshold decoding, cfg and token
// editing rank by a probability-like LLaDA confidence, which entropy, origin or random unmasking do not
// give. When o asks for one of them with such a default, o.alg becomes low_confidence (which serves all
// three) and the returned note says why; otherwise nothing changes.
std::optional<std::string> fit_default_alg(GenerateOptions& o);

// Token editing as a boundary gives it (CLI flags, serve's fields, --compare keys): a preset mode and the
// values given explicitly, which override the preset's (threshold: the mask threshold, when given).
// Editing is on with a quality / speed mode or an edit threshold; off with mode off, which refuses the
// editing values beside it (Error). Without a mode, max_post and penalty only set their values.
struct EditFlags {
  std::optional<EditMode> mode;
  std::optional<float> threshold, edit_threshold, penalty;
  std::optional<int> max_post;
};
void apply_edit_flags(const EditFlags& f, GenerateOptions& o);

// The external window of the options: window_ex, or its default for the algorithm (64 LLaDA, 128 Dream).
int window_external(const GenerateOptions& o);
// The DES method of a request: `des` when given, else the one des-k (seq) or des-beta (vote) implies,
// else `otherwise`; throws Error when both are given without des.
DesMode implied_des(std::optional<DesMode> des, bool k_given, bool beta_given, DesMode otherwise);

}  // namespace tessera
