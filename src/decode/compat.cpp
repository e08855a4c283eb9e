#include "decode/compat.h"

#include <array>

#include "core/error.h"

namespace tessera {
namespace {

struct Entry {
  Feature a, b;
  Compat c;
};

// Every pair that is not simply "exact, or approximate where a part is". The refused pairs are
// checked in this order (the first one a request uses is its error).
constexpr Entry kTable[] = {
    {Feature::KvCache,
     Feature::Cfg,
     {Combination::Approximate,
      "the unconditional canvas keeps its own cache (a second KV stream); such requests run alone in serve"}},
    {Feature::SparseD,
     Feature::KvCache,
     {Combination::Approximate,
      "patterns are selected at the first forward at or after the skip that refreshes the whole canvas; "
      "cached forwards read the pattern rows of their positions (CPU backend)"}},
    {Feature::SparseD,
     Feature::Cfg,
     {Combination::Approximate,
      "both canvases attend over the pattern selected from the conditional canvas's forward"}},
    {Feature::SparseD,
     Feature::BlockCausal,
     {Combination::Approximate,
      "within the block grid: each block's forwards after the skip read the pattern rows its selecting "
      "forward chose for the positions it computes, over the keys each sees (CPU backend)"}},
    {Feature::Window,
     Feature::KvCache,
     {Combination::Refused,
      "Window-Diffusion keeps its own phase cache (window-refresh); use cache none with the window"}},
    {Feature::Window,
     Feature::SparseD,
     {Combination::Approximate,
      "the pattern is selected over the window's rows at a forward computing all of them (a phase's "
      "refresh; with window-refresh 0 every forward) and again when the window has moved; forwards read "
      "it by position (CPU backend with window-refresh > 0)"}},
    {Feature::Window,
     Feature::Cfg,
     {Combination::Approximate,
      "both canvases see the same window and, with window-refresh > 0, keep a phase cache each (two KV "
      "streams; such requests run alone in serve)"}},
    {Feature::Window,
     Feature::BlockCausal,
     {Combination::Approximate,
      "within the block grid: forwards see at most the current block, each block starts a phase, a "
      "refresh recomputes the rows from the first stale block"}},
    {Feature::Infilling,
     Feature::BlockCausal,
     {Combination::Refused,
      "a suffix needs a bidirectional model; this block-causal model cannot see text after the block it "
      "decodes"}},
    {Feature::Infilling,
     Feature::Window,
     {Combination::Approximate,
      "the far field between the window and the suffix stays in every forward: the window picks the "
      "active set and caches rows, and prunes nothing"}},
    {Feature::Infilling,
     Feature::SparseD,
     {Combination::Approximate, "the suffix's key blocks are selected with the generation's"}},
    {Feature::KvCache,
     Feature::BlockCausal,
     {Combination::Exact, "exact: rows of finished blocks never change nor see later rows"}},
    {Feature::Editing,
     Feature::Window,
     {Combination::Refused,
      "token editing revisits the block's decided tokens, which the window's active set leaves out; turn "
      "one of them off"}},
    {Feature::Editing,
     Feature::Threshold,
     {Combination::Exact, "the threshold is editing's mask threshold (the joint threshold)"}},
    {Feature::Editing,
     Feature::KvCache,
     {Combination::Approximate,
      "exact on block-causal models (the next block's first forward recomputes the edited one); on "
      "bidirectional models the cache's own approximation"}},
    {Feature::Structured,
     Feature::Window,
     {Combination::Refused,
      "structured output writes the answer left to right, and the window decides the positions of its own "
      "active set; turn one of them off"}},
    {Feature::Structured,
     Feature::Editing,
     {Combination::Refused,
      "token editing rewrites decided tokens, which structured output has checked and taken; turn one of "
      "them off"}},
    {Feature::Structured,
     Feature::Threshold,
     {Combination::Exact,
      "the threshold is the confidence a prediction needs to join the left-to-right run after the "
      "constrained token (default 0.9)"}},
    {Feature::SparseD,
     Feature::Batching,
     {Combination::Alone, "the engine holds one request's patterns: such requests run one at a time"}},
    {Feature::Des,
     Feature::Batching,
     {Combination::Alone, "the engine holds one request's expert state: such requests run one at a time"}},
    {Feature::TriMode,
     Feature::KvCache,
     {Combination::Refused,
      "tri-mode decoding keeps its own cache, written by causal passes (exact); use cache none with "
      "mode ar / spec or causal-context diffusion"}},
    {Feature::TriMode,
     Feature::SparseD,
     {Combination::Refused,
      "SparseD is not defined over a causally written cache yet; turn sparse off with mode ar / spec or "
      "causal-context diffusion"}},
    {Feature::TriMode,
     Feature::Window,
     {Combination::Refused,
      "the window prunes a bidirectional canvas; tri-mode decoding writes it left to right from a causal "
      "cache; turn the window off"}},
    {Feature::TriMode,
     Feature::Cfg,
     {Combination::Refused,
      "cfg's unconditional canvas has no causal prefix to seed its blocks; set cfg-scale 0"}},
    {Feature::TriMode,
     Feature::Infilling,
     {Combination::Refused, "a causal pass cannot see a suffix after the text it writes; drop the suffix"}},
    {Feature::TriMode,
     Feature::Des,
     {Combination::Refused, "the tri-mode models are dense: DES needs a mixture-of-experts model"}},
    {Feature::TriMode,
     Feature::BlockCausal,
     {Combination::Refused, "a block-causal model (LLaDA2) has no causal mode"}},
    {Feature::TriMode,
     Feature::Editing,
     {Combination::Refused,
      "token editing rewrites decided tokens, which a causal pass has already written into the cache; "
      "turn editing off"}},
    {Feature::TriMode,
     Feature::Structured,
     {Combination::Alone,
      "mode ar only: each causal step samples among the tokens the format allows (whole logit rows on "
      "the host, so such requests run alone in serve); diffusion and spec are refused, since their "
      "drafts and causal seeds would be decided outside the left-to-right check"}},
    {Feature::TriMode,
     Feature::Threshold,
     {Combination::Exact,
      "the threshold of causal-context diffusion's steps (conf >= threshold, at least one); spec's drafts "
      "have their own (draft-threshold)"}},
    {Feature::Uniform,
     Feature::KvCache,
     {Combination::Refused,
      "a uniform-noise model keeps its own cache, written causally by the prompt's and each committed "
      "canvas's encoder pass (exact); use cache none"}},
    {Feature::Uniform,
     Feature::SparseD,
     {Combination::Refused, "SparseD is not built for uniform-noise canvases yet; turn sparse off"}},
    {Feature::Uniform,
     Feature::Window,
     {Combination::Refused,
      "the window prunes masked positions; a uniform-noise canvas re-noises every position each step: "
      "turn the window off"}},
    {Feature::Uniform,
     Feature::Cfg,
     {Combination::Refused, "cfg is not defined for the entropy-bound sampler; set cfg-scale 0"}},
    {Feature::Uniform,
     Feature::Infilling,
     {Combination::Refused,
      "the encoder writes the cache left to right, so a canvas cannot see a suffix; drop the suffix"}},
    {Feature::Uniform,
     Feature::Des,
     {Combination::Refused, "DES is not built for uniform-noise canvases yet; use des off"}},
    {Feature::Uniform,
     Feature::BlockCausal,
     {Combination::Refused, "a block-causal model (LLaDA2) has no uniform-noise canvases"}},
    {Feature::Uniform,
     Feature::Logprobs,
     {Combination::Refused,
      "a committed canvas is the argmax of its last step, which no log-probability describes yet; "
      "drop logprobs"}},
    {Feature::Uniform,
     Feature::Editing,
     {Combination::Refused,
      "uniform-noise canvases re-noise every position each step already; token editing is the masked "
      "models' rule: turn editing off"}},
    {Feature::Uniform,
     Feature::Threshold,
     {Combination::Refused,
      "the entropy bound decides which positions keep their samples (entropy-bound); threshold is "
      "the masked models' rule: set threshold 0"}},
    {Feature::Uniform,
     Feature::Batching,
     {Combination::Alone, "the canvas steps run on the engine's own cache: such requests run one at a time"}},
    {Feature::Uniform,
     Feature::Structured,
     {Combination::Refused,
      "structured output writes left to right under a grammar; a canvas decides its positions together: "
      "drop the format"}},
    {Feature::Uniform,
     Feature::TriMode,
     {Combination::Refused, "uniform-noise canvases are a different model's decoding (DiffusionGemma)"}},
};

}  // namespace

std::string_view feature_name(Feature f) {
  static constexpr std::array<std::string_view, kFeatures> names = {"KV cache",
                                                                    "SparseD",
                                                                    "window",
                                                                    "cfg",
                                                                    "infilling",
                                                                    "DES",
                                                                    "LLaDA2 (block-causal)",
                                                                    "threshold",
                                                                    "logprobs",
                                                                    "editing",
                                                                    "batching",
                                                                    "structured output",
                                                                    "tri-mode (ar / spec)",
                                                                    "uniform noise (DiffusionGemma)"};
  return names[static_cast<size_t>(f)];
}

bool approximate(Feature f) {
  return f == Feature::KvCache || f == Feature::SparseD || f == Feature::Window || f == Feature::Des;
}

Compat compat(Feature a, Feature b) {
  for (const Entry& e : kTable)
    if ((e.a == a && e.b == b) || (e.a == b && e.b == a)) return e.c;
  if (approximate(a) || approximate(b)) return {Combination::Approximate, ""};
  return {Combination::Exact, ""};
}

bool uses(const GenerateOptions& o, Feature f, bool block_causal) {
  switch (f) {
    case Feature::KvCache:
      return o.cache != KvCache::None;
    case Feature::SparseD:
      return o.sparse;
    case Feature::Window:
      return o.window;
    case Feature::Cfg:
      return o.cfg_scale > 0.0f;
    case Feature::Infilling:
      return !o.suffix.empty();
    case Feature::Des:
      return o.des != DesMode::Off;
    case Feature::BlockCausal:
      return block_causal;
    case Feature::Threshold:
      return o.threshold > 0.0f;
    case Feature::Logprobs:
      return o.logprobs;
    case Feature::Editing:
      return o.edit;
    case Feature::Batching:
      return false;
    case Feature::Structured:
      return o.constraint != nullptr;
    case Feature::TriMode:
      return o.mode == DecodeMode::Ar || o.mode == DecodeMode::Spec || o.causal_context;
    case Feature::Uniform:
      return o.mode == DecodeMode::Uniform;
  }
  return false;
}

void check_combinations(const GenerateOptions& o, bool block_causal) {
  for (const Entry& e : kTable) {
    if (e.c.how == Combination::Refused && uses(o, e.a, block_causal) && uses(o, e.b, block_causal))
      fail(std::string(e.c.reason));
  }
}

std::string compat_markdown() {
  // Each pair's reason once, numbered in the order of the upper triangle; both cells carry its number.
  std::string notes;
  int numbers[kFeatures][kFeatures] = {};
  int note = 0;
  for (int i = 0; i < kFeatures; ++i) {
    for (int j = i + 1; j < kFeatures; ++j) {
      const auto a = static_cast<Feature>(i), b = static_cast<Feature>(j);
      const Compat c = compat(a, b);
      if (c.reason.empty()) continue;
      numbers[i][j] = numbers[j][i] = ++note;
      notes += std::to_string(note) + ". " + std::string(feature_name(a)) + " + " +
               std::string(feature_name(b)) + ": " + std::string(c.reason) + "\n";
    }
  }
  std::string s = "| |";
  for (int j = 0; j < kFeatures; ++j) s += " " + std::string(feature_name(static_cast<Feature>(j))) + " |";
  s += "\n|---|";
  for (int j = 0; j < kFeatures; ++j) s += "---|";
  s += "\n";
  static constexpr std::array<std::string_view, 4> how = {"exact", "approx.", "alone", "**refused**"};
  for (int i = 0; i < kFeatures; ++i) {
    const auto a = static_cast<Feature>(i);
    s += "| **" + std::string(feature_name(a)) + "** |";
    for (int j = 0; j < kFeatures; ++j) {
      const auto b = static_cast<Feature>(j);
      std::string cell = i == j ? (approximate(a) ? "approx." : "exact")
                                : std::string(how[static_cast<size_t>(compat(a, b).how)]);
      if (numbers[i][j] > 0) cell += " (" + std::to_string(numbers[i][j]) + ")";
      s += " " + cell + " |";
    }
    s += "\n";
  }
  return s + "\n" + notes;
}

}  // namespace tessera
