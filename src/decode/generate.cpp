// generate(): checks the options and the prompt, plans the request, holds its engine state, and runs
// the composed step loop (decode/loop.h) in the model's block layout.
#include "decode/generate.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "decode/compat.h"
#include "decode/loop.h"
#include "decode/schedule.h"

namespace tessera {
namespace {

std::string num(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void check_prompt_tokens(std::span<const int32_t> prompt, int64_t V) {
  for (size_t i = 0; i < prompt.size(); ++i)
    TESSERA_CHECK(prompt[i] >= 0 && prompt[i] < V,
                  "prompt token " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                      " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

}  // namespace

std::optional<std::string> fit_default_alg(GenerateOptions& o) {
  const Unmask a = o.alg;
  const char* why = o.threshold > 0.0f && (a == Unmask::Random || a == Unmask::Origin || a == Unmask::Entropy)
                        ? "threshold decoding"
                    : o.cfg_scale > 0.0f && !is_llada(a)                               ? "cfg"
                    : o.edit && a != Unmask::LowConfidence && a != Unmask::MaskgitPlus ? "token editing"
                                                                                       : nullptr;
  if (why == nullptr) return std::nullopt;
  o.alg = Unmask::LowConfidence;
  return std::string("unmasking low_confidence instead of the model's default ") + std::string(name(a)) +
         ": " + why + " ranks by a probability-like confidence (--alg chooses)";
}

void validate_generate_options(const GenerateOptions& o, int64_t vocab_size, bool block_causal) {
  const Unmask a = o.alg;
  const std::string an(name(a));
  TESSERA_CHECK(o.gen_length > 0, "gen-length must be > 0 (got " + std::to_string(o.gen_length) + ")");
  TESSERA_CHECK(o.steps > 0, "steps must be > 0 (got " + std::to_string(o.steps) + ")");
  TESSERA_CHECK(o.block_length > 0, "block-length must be > 0 (got " + std::to_string(o.block_length) + ")");
  TESSERA_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.0f,
                "temperature must be >= 0 (got " + num(o.temperature) + ")");
  TESSERA_CHECK(std::isfinite(o.threshold) && o.threshold >= 0.0f && o.threshold <= 1.0f,
                "threshold must be in [0, 1] (got " + num(o.threshold) + "); 0 turns threshold decoding off");
  TESSERA_CHECK(
      !(o.threshold > 0.0f && (a == Unmask::Random || a == Unmask::Origin || a == Unmask::Entropy)),
      "threshold decoding needs a probability-like confidence; use alg low_confidence, maskgit_plus "
      "or topk_margin (got " +
          an + ")");
  TESSERA_CHECK(std::isfinite(o.cfg_scale) && o.cfg_scale >= 0.0f,
                "cfg-scale must be >= 0 (got " + num(o.cfg_scale) + ")");
  TESSERA_CHECK(!(o.cfg_scale > 0.0f && !is_llada(a)),
                "cfg-scale applies only to the LLaDA algorithms low_confidence and random (got " + an + ")");
  TESSERA_CHECK(o.top_k >= 0, "top-k must be >= 0 (got " + std::to_string(o.top_k) + "); 0 turns it off");
  TESSERA_CHECK(std::isfinite(o.top_p) && o.top_p > 0.0f && o.top_p <= 1.0f,
                "top-p must be in (0, 1] (got " + num(o.top_p) + "); 1 turns it off");
  if (o.edit) {  // token editing (decode/edit.cpp)
    TESSERA_CHECK(
        o.threshold > 0.0f,
        "token editing needs a mask threshold > 0 (--threshold; LLaDA2.1's generate uses 0.95) or an "
        "edit-mode preset");
    TESSERA_CHECK(
        a == Unmask::LowConfidence || a == Unmask::MaskgitPlus,
        "token editing ranks by the candidate's probability; use alg low_confidence or maskgit_plus "
        "(got " +
            an + ")");
    TESSERA_CHECK(std::isfinite(o.edit_threshold) && o.edit_threshold >= 0.0f && o.edit_threshold <= 1.0f,
                  "edit-threshold must be in [0, 1] (got " + num(o.edit_threshold) +
                      "); 0 edits whenever the candidate differs");
    TESSERA_CHECK(!o.logits_eos_inf,
                  "logits-eos-inf cannot be combined with token editing (editing suppresses the mask token)");
    TESSERA_CHECK(o.max_post_steps >= 0,
                  "max-post-steps must be >= 0 (got " + std::to_string(o.max_post_steps) + ")");
  }
  TESSERA_CHECK(std::isfinite(o.edit_penalty) && o.edit_penalty >= 0.0f,
                "edit-penalty must be >= 0 (got " + num(o.edit_penalty) + "); 0 turns it off");
  TESSERA_CHECK(!(o.edit_penalty > 0.0f && !o.edit),
                "edit-penalty applies to token editing; turn editing on (edit-mode or edit-threshold)");
  TESSERA_CHECK(
      !(is_llada(a) && !o.edit && (o.top_k > 0 || o.top_p < 1.0f)),
      "top-k / top-p apply only to the Dream algorithms origin, maskgit_plus, topk_margin, entropy (got " +
          an + ")");
  TESSERA_CHECK(std::isfinite(o.alg_temp) && o.alg_temp >= 0.0f,
                "alg-temp must be >= 0 (got " + num(o.alg_temp) + ")");
  TESSERA_CHECK(!(o.alg_temp > 0.0f && (is_llada(a) || a == Unmask::Origin)),
                "alg-temp applies only to maskgit_plus, topk_margin and entropy (got " + an + ")");
  TESSERA_CHECK(!(o.alg_temp > 0.0f && o.threshold > 0.0f),
                "alg-temp cannot be combined with threshold decoding; set one of them to 0");
  TESSERA_CHECK(std::isfinite(o.eps) && o.eps > 0.0f && o.eps < 1.0f,
                "eps must be in (0, 1) (got " + num(o.eps) + ")");
  for (int32_t e : o.eos_ids)
    TESSERA_CHECK(
        e >= 0 && e < vocab_size,
        "eos id " + std::to_string(e) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  if (o.sparse) {
    TESSERA_CHECK(o.sparse_block > 0,
                  "sparse-block must be > 0 (got " + std::to_string(o.sparse_block) + ")");
    TESSERA_CHECK(std::isfinite(o.sparse_rho) && o.sparse_rho >= 0.0f && o.sparse_rho <= 1.0f,
                  "sparse-rho must be in [0, 1] (got " + num(o.sparse_rho) + ")");
    TESSERA_CHECK(std::isfinite(o.sparse_skip) && o.sparse_skip >= 0.0f && o.sparse_skip < 1.0f,
                  "sparse-skip must be in [0, 1) (got " + num(o.sparse_skip) + ")");
  }
  if (o.des != DesMode::Off) {
    TESSERA_CHECK(o.des_k >= 1, "des-k must be >= 1 (got " + std::to_string(o.des_k) + ")");
    TESSERA_CHECK(std::isfinite(o.des_beta) && o.des_beta > 0.0f && o.des_beta <= 1.0f,
                  "des-beta must be in (0, 1] (got " + num(o.des_beta) + ")");
  }
  if (o.window) {
    TESSERA_CHECK(o.window_ex >= 0, "window-ex must be >= 0 (got " + std::to_string(o.window_ex) +
                                        "); 0 picks 64 for the LLaDA algorithms, 128 for the Dream ones");
    TESSERA_CHECK(o.window_in >= 1, "window-in must be >= 1 (got " + std::to_string(o.window_in) + ")");
    TESSERA_CHECK(window_external(o) >= o.window_in, "window-in (" + std::to_string(o.window_in) +
                                                         ") must not exceed window-ex (" +
                                                         std::to_string(window_external(o)) +
                                                         "): the active set lies inside the external window");
    TESSERA_CHECK(o.window_refresh >= 0, "window-refresh must be >= 0 (got " +
                                             std::to_string(o.window_refresh) +
                                             "); 0 recomputes the window at every step (no cache)");
  }
  TESSERA_CHECK(!(o.window_early_stop && !o.window), "window-early-stop needs the window; turn window on");
  TESSERA_CHECK(!(o.window_early_stop && !o.suffix.empty()),
                "window-early-stop cannot be combined with a suffix: the suffix follows the answer, and the "
                "early stop drops everything after its EOS");
  TESSERA_CHECK(!(o.window && o.sparse && block_causal),
                "SparseD inside the window is defined for bidirectional models only: on a block-causal model "
                "SparseD selects each block's pattern from a forward over all its rows, which the window's "
                "forwards do not compute; use the window or SparseD");
  TESSERA_CHECK(
      !(o.window_early_stop && block_causal),
      "window-early-stop needs a bidirectional model: this block-causal model stops at an EOS after "
      "the block that decides it");
  TESSERA_CHECK(!(o.window_early_stop && o.eos_ids.empty()),
                "window-early-stop needs an eos id to stop at; pass at least one eos id");
  TESSERA_CHECK(!(o.logits_eos_inf && o.eos_ids.empty()),
                "logits-eos-inf needs an eos id to suppress; pass at least one eos id");
  for (const std::string& s : o.stop) TESSERA_CHECK(!s.empty(), "a stop sequence must not be empty");
  if (!o.suffix.empty()) {
    for (size_t i = 0; i < o.suffix.size(); ++i)
      TESSERA_CHECK(o.suffix[i] >= 0 && o.suffix[i] < vocab_size,
                    "suffix token " + std::to_string(o.suffix[i]) + " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  }
  if (o.spec_sampling == SpecSampling::Rejection) {
    TESSERA_CHECK(o.mode == DecodeMode::Spec, "spec-sampling rejection applies to mode spec");
    TESSERA_CHECK(
        o.draft_threshold <= 0.0f,
        "spec-sampling rejection drafts in one pass (its proposal distribution); use draft-threshold 0");
    TESSERA_CHECK(!o.logprobs, "spec-sampling rejection cannot report log-probabilities yet; drop logprobs");
  }
  TESSERA_CHECK(
      std::isfinite(o.draft_threshold) && o.draft_threshold >= 0.0f && o.draft_threshold <= 1.0f,
      "draft-threshold must be in [0, 1] (got " + num(o.draft_threshold) + "); 0 drafts in one pass");
  TESSERA_CHECK(!(o.draft_threshold > 0.0f && o.mode != DecodeMode::Spec),
                "draft-threshold applies to mode spec");
  check_combinations(o, block_causal);  // what cannot be defined together (decode/compat.cpp)
  if (o.mode == DecodeMode::Uniform) {
    const UniformSampling& u = o.uniform;
    TESSERA_CHECK(
        std::isfinite(u.t_min) && u.t_min > 0.0 && std::isfinite(u.t_max) && u.t_max >= u.t_min,
        "t-min and t-max must satisfy 0 < t-min <= t-max (got " + num(u.t_min) + ", " + num(u.t_max) + ")");
    TESSERA_CHECK(std::isfinite(u.entropy_bound) && u.entropy_bound >= 0.0,
                  "entropy-bound must be >= 0 (got " + num(u.entropy_bound) + ")");
    TESSERA_CHECK(u.stability >= 0 && u.stability <= 64,
                  "stability must be in [0, 64] (got " + std::to_string(u.stability) + ")");
    TESSERA_CHECK(std::isfinite(u.confidence) && u.confidence >= 0.0,
                  "confidence must be >= 0 (got " + num(u.confidence) + "); 0 never stops a canvas early");
    TESSERA_CHECK(u.pad_id >= 0 && u.pad_id < vocab_size, "the pad id is outside the vocabulary");
    TESSERA_CHECK(!block_causal, "mode uniform needs a uniform-noise model (DiffusionGemma)");
    return;
  }
  TESSERA_CHECK(
      !(o.constraint && o.causal() && o.mode != DecodeMode::Ar),
      "structured output on a tri-mode model needs mode ar (diffusion's causal seeds and spec's "
      "drafts are decided outside the format's left-to-right check); use mode ar or drop the format");
  if (block_causal) return;  // blocks on the model's block grid: any block length, steps per block
  if (o.mode != DecodeMode::Diffusion) return;  // ar and spec: no blocks of steps
  const bool split = o.threshold <= 0.0f && (is_llada(a) || o.block_length < o.gen_length);
  (void)block_layout(o.gen_length, o.block_length, o.steps, split);
}

int window_external(const GenerateOptions& o) {
  return o.window_ex > 0 ? o.window_ex : is_dream(o.alg) ? 128 : 64;
}

DesMode implied_des(std::optional<DesMode> des, bool k_given, bool beta_given, DesMode otherwise) {
  if (des) return *des;
  TESSERA_CHECK(!(k_given && beta_given),
                "des-k (DES-Seq) and des-beta (DES-Vote) choose different methods; give des seq or des vote");
  return k_given ? DesMode::Seq : beta_given ? DesMode::Vote : otherwise;
}

GenerateResult generate(Denoiser& den, std::span<const int32_t> prompt, const GenerateOptions& o,
                        const std::function<void(const StepEvent&)>& on_step) {
  RequestScope request(den, plan_checked(prompt, o, den.vocab_size(), den.attention_block() > 0));
  return generate(request, prompt, o, on_step);
}

RequestPlan plan_checked(std::span<const int32_t> prompt, const GenerateOptions& o, int64_t vocab,
                         bool block_causal) {
  validate_generate_options(o, vocab, block_causal);
  check_prompt_tokens(prompt, vocab);
  return plan_request(o, static_cast<int64_t>(prompt.size()), block_causal);
}

GenerateResult generate(RequestScope& request, std::span<const int32_t> prompt, const GenerateOptions& o,
                        const std::function<void(const StepEvent&)>& on_step) {
  Denoiser& den = request.denoiser();
  const RequestPlan& plan = request.plan();
  const bool block_causal = plan.attention_block > 0;
  TESSERA_CHECK(plan.prompt_len == static_cast<int64_t>(prompt.size()) &&
                    plan.canvas == canvas_length(plan.prompt_len, o, block_causal),
                "generate: internal error, the request was planned for another prompt or options");
  decode::Loop L(den, o, plan, on_step);
  L.parts = decode::choose_parts(o, plan);
  if (o.constraint) {
    L.grammar = o.constraint->start();
    if (L.grammar->min_tokens() > o.gen_length)
      fail("the answer's " + std::to_string(o.gen_length) + " tokens cannot hold the shortest text of the " +
           "requested format (" + std::to_string(L.grammar->min_tokens()) + " tokens); allow more tokens");
  }
  decode::init_canvas(L, prompt);
  TESSERA_CHECK(!(plan.causal && prompt.empty()),
                "mode " + std::string(name(o.mode)) +
                    " starts with a causal pass over the prompt: give a prompt of at least one token");
  if (o.mode == DecodeMode::Uniform)
    decode::run_uniform(L);
  else if (o.mode == DecodeMode::Ar)
    decode::run_autoregressive(L);
  else if (o.mode == DecodeMode::Spec)
    decode::run_speculative(L);
  else if (block_causal)
    decode::run_block_causal(L);
  else
    decode::run_bidirectional(L);
  return decode::finish(L);
}

}  // namespace tessera
