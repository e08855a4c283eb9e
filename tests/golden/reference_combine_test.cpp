// Features combined by the composed decoding layer (issue #27) against the numpy reference loop
// (reference.py generate, written from algorithms.md and the combination semantics, not from the C++):
// classifier-free guidance plain, with the prefix / dual KV caches (each canvas its own cache) and with
// Window-Diffusion (both canvases see the window; with refresh each keeps its own phase cache);
// Window-Diffusion and SparseD with an infilling suffix; SparseD inside the window and with cfg; DES
// with the window, with cfg and with SparseD inside the window or with cfg. On tiny
// checkpoints in f32 at temperature 0, tessera decides the same tokens at the same steps as the
// reference, for LLaDA low_confidence and, where the algorithm allows (cfg does not), Dream entropy, over
// 3 blocks and two prompts. Each combination also changes the reference's own generation compared with
// leaving either feature out, so an engine that silently dropped one of them would fail.
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

const std::vector<std::vector<int32_t>>& prompts() {
  static const std::vector<std::vector<int32_t>> p = {{5, 17, 230}, {100, 101, 102, 7, 9, 44, 250}};
  return p;
}

const std::vector<int32_t> kSuffix = {11, 12, 13, 14, 15, 16};

// 24 tokens in 3 blocks of 8, 4 steps per block, greedy; no EOS stop.
GenerateOptions options(const std::string& alg) {
  GenerateOptions o;
  o.gen_length = 24;
  o.block_length = 8;
  o.steps = 12;
  o.alg = parse_unmask(alg);
  o.stop_at_eos = false;
  return o;
}

// An external window of 10 undecided positions, active sets of 4 (inside blocks of 8), `refresh`
// forwards per phase (0: no cache).
GenerateOptions windowed(GenerateOptions o, int refresh) {
  o.window = true;
  o.window_ex = 10;
  o.window_in = 4;
  o.window_refresh = refresh;
  return o;
}

// SparseD with tiles of 4 positions, rho 0.3, floor(steps * 0.2) exact forwards.
GenerateOptions sparsed(GenerateOptions o) {
  o.sparse = true;
  o.sparse_block = 4;
  o.sparse_rho = 0.3f;
  o.sparse_skip = 0.2f;
  return o;
}

using Run = test::ReferenceRun;
std::vector<Run> reference_runs(const std::filesystem::path& dir, const GenerateOptions& o) {
  return test::reference_runs(dir, prompts(), o);
}

// The combination `o` (what: its name) decides, for every prompt, exactly what the reference decides;
// and for each (name, options) of `without` (the combination with one of its features left out) the
// reference's generation differs from the combination's for some prompt.
void check_combination(const std::filesystem::path& dir, const GenerateOptions& o, const std::string& what,
                       const std::vector<std::pair<std::string, GenerateOptions>>& without) {
  const std::vector<Run> want = test::expect_matches_reference(dir, prompts(), o, what);
  for (const auto& [name, w] : without)
    EXPECT_NE(reference_runs(dir, w), want) << what << ": " << name << " decides the same in the reference";
}

// 1. cfg without a cache: each forward guides the canvas with the unconditional one (the prompt masked);
// LLaDA's low_confidence on the LLaDA and Dream (shifted logits) checkpoints, also with a suffix (masked
// in the unconditional canvas too).
void check_cfg(const std::string& family) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  const GenerateOptions plain = options("low_confidence");
  GenerateOptions cfg = plain;
  cfg.cfg_scale = 1.0f;
  check_combination(dir, cfg, family + " cfg", {{"no cfg", plain}});
  GenerateOptions infill = plain;
  infill.suffix = kSuffix;
  GenerateOptions both = infill;
  both.cfg_scale = 1.0f;
  check_combination(dir, both, family + " cfg + suffix", {{"no cfg", infill}, {"no suffix", cfg}});
}

TEST(ReferenceCombine, LladaCfg) {
  check_cfg("llada");
}
TEST(ReferenceCombine, DreamModelCfg) {
  check_cfg("dream");
}

// 2. cfg with the prefix and dual caches: the first forward of a block refreshes both canvases' caches,
// later ones compute the same rows ([block start, end) or the block) for both, each reading the other
// rows from its own cache.
void check_cfg_caches(const std::string& family) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions cfg = options("low_confidence");
  cfg.cfg_scale = 1.5f;
  for (KvCache c : {KvCache::Prefix, KvCache::Dual}) {
    GenerateOptions both = cfg, cache_only = options("low_confidence");
    both.cache = cache_only.cache = c;
    check_combination(dir, both, family + " cfg + " + std::string(name(c)) + " cache",
                      {{"no cache", cfg}, {"no cfg", cache_only}});
  }
}

TEST(ReferenceCombine, LladaCfgWithPrefixAndDualCache) {
  check_cfg_caches("llada");
}
TEST(ReferenceCombine, DreamModelCfgWithPrefixAndDualCache) {
  check_cfg_caches("dream");
}

// 3. Window-Diffusion with cfg: both canvases see the same window view; refresh 0 recomputes it for
// both, refresh 3 keeps a phase cache per canvas. Also with a suffix (the view is the whole canvas).
void check_window_cfg(const std::string& family) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions cfg = options("low_confidence");
  cfg.cfg_scale = 1.0f;
  for (int refresh : {0, 3}) {
    const GenerateOptions both = windowed(cfg, refresh),
                          window_only = windowed(options("low_confidence"), refresh);
    check_combination(dir, both, family + " window + cfg, refresh " + std::to_string(refresh),
                      {{"no window", cfg}, {"no cfg", window_only}});
  }
  GenerateOptions all = windowed(cfg, 3);
  all.suffix = kSuffix;
  check_combination(dir, all, family + " window + cfg + suffix, refresh 3",
                    {{"no suffix", windowed(cfg, 3)}});
}

TEST(ReferenceCombine, LladaWindowWithCfg) {
  check_window_cfg("llada");
}
TEST(ReferenceCombine, DreamModelWindowWithCfg) {
  check_window_cfg("dream");
}

// 4. Window-Diffusion with a suffix: no far field is pruned (every forward sees the whole canvas); the
// window picks the active set and, with refresh 3, the rows computed after each refresh.
void check_window_suffix(const std::string& family, const std::string& alg) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions infill = options(alg);
  infill.suffix = kSuffix;
  for (int refresh : {0, 3}) {
    check_combination(dir, windowed(infill, refresh),
                      family + " " + alg + " window + suffix, refresh " + std::to_string(refresh),
                      {{"no window", infill}, {"no suffix", windowed(options(alg), refresh)}});
  }
}

TEST(ReferenceCombine, LladaWindowWithSuffix) {
  check_window_suffix("llada", "low_confidence");
}
TEST(ReferenceCombine, DreamEntropyWindowWithSuffix) {
  check_window_suffix("dream", "entropy");
}

// The window's early stop drops everything after an EOS: it cannot keep a suffix.
TEST(ReferenceCombine, WindowEarlyStopRefusesASuffix) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 11");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  GenerateOptions o = windowed(options("low_confidence"), 3);
  o.suffix = kSuffix;
  o.window_early_stop = true;
  o.eos_ids = {e->config().eos_id};
  test::expect_error([&] { (void)generate(*e, prompts()[0], o); }, "cannot be combined with a suffix");
}

// 5. SparseD with a suffix: the prompt's key blocks are one selection set, every other key block (the
// generation and the suffix) the other; floor(12 * 0.2) = 2 exact forwards, the third selects (tiles of
// 4, rho 0.3), the other 9 attend to their tiles only.
void check_sparse_suffix(const std::string& family, const std::string& alg) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions sparse = sparsed(options(alg));
  GenerateOptions infill = options(alg), both = sparse;
  infill.suffix = both.suffix = kSuffix;
  check_combination(dir, both, family + " " + alg + " sparse + suffix",
                    {{"no sparse", infill}, {"no suffix", sparse}});
}

TEST(ReferenceCombine, LladaSparseDWithSuffix) {
  check_sparse_suffix("llada", "low_confidence");
}
TEST(ReferenceCombine, DreamEntropySparseDWithSuffix) {
  check_sparse_suffix("dream", "entropy");
}

// 7. SparseD inside Window-Diffusion: after floor(12 * 0.2) = 2 forwards, a forward that computes every
// row of its view (a phase's refresh; with refresh 0 every forward) selects the pattern over the window
// when the window has moved since the last selection; the other forwards read it by position.
void check_sparse_window(const std::string& family, const std::string& alg) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  for (int refresh : {0, 3}) {
    const GenerateOptions window = windowed(options(alg), refresh);
    check_combination(dir, sparsed(window),
                      family + " " + alg + " sparse + window, refresh " + std::to_string(refresh),
                      {{"no sparse", window}, {"no window", sparsed(options(alg))}});
  }
  GenerateOptions infill = windowed(options(alg), 3);
  infill.suffix = kSuffix;
  check_combination(dir, sparsed(infill), family + " " + alg + " sparse + window + suffix, refresh 3",
                    {{"no sparse", infill}});
}

TEST(ReferenceCombine, LladaSparseDInsideTheWindow) {
  check_sparse_window("llada", "low_confidence");
}
TEST(ReferenceCombine, DreamEntropySparseDInsideTheWindow) {
  check_sparse_window("dream", "entropy");
}

// 8. SparseD with cfg: both canvases run in the same phase; the pattern is selected from the conditional
// canvas's forward. Plain and inside the window (refresh 3: a phase cache per canvas).
void check_sparse_cfg(const std::string& family) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions cfg = options("low_confidence");
  cfg.cfg_scale = 1.0f;
  check_combination(dir, sparsed(cfg), family + " sparse + cfg",
                    {{"no sparse", cfg}, {"no cfg", sparsed(options("low_confidence"))}});
  const GenerateOptions window = windowed(cfg, 3);
  check_combination(dir, sparsed(window), family + " sparse + cfg + window, refresh 3",
                    {{"no sparse", window}});
}

TEST(ReferenceCombine, LladaSparseDWithCfg) {
  check_sparse_cfg("llada");
}
TEST(ReferenceCombine, DreamModelSparseDWithCfg) {
  check_sparse_cfg("dream");
}

// 6. DES on tiny LLaDA-MoE (16 experts, top 4): the rows that vote are the block's positions, under the
// window each forward's span of candidates (of the rows a cached forward computes).
constexpr const char* kMoe = "--seed 4 --experts 16 --top-k 4";

GenerateOptions with_des(GenerateOptions o, DesMode mode) {
  o.des = mode;
  o.des_k = 1;
  o.des_beta = 0.3f;  // a coreset of floor(4.8) = 4 experts (top-k)
  return o;
}

TEST(ReferenceCombine, DesWithTheWindow) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", kMoe);
  for (const char* alg : {"low_confidence", "entropy"}) {
    for (DesMode mode : {DesMode::Vote, DesMode::Seq}) {
      for (int refresh : {0, 3}) {
        const GenerateOptions window = windowed(options(alg), refresh);
        check_combination(dir, with_des(window, mode),
                          std::string(alg) + " DES " + std::string(name(mode)) + " + window, refresh " +
                              std::to_string(refresh),
                          {{"no window", with_des(options(alg), mode)}, {"no DES", window}});
      }
    }
  }
}

TEST(ReferenceCombine, DesWithSparseDInsideTheWindowAndWithCfg) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", kMoe);
  for (DesMode mode : {DesMode::Vote, DesMode::Seq}) {
    const std::string des = "DES " + std::string(name(mode));
    const GenerateOptions window = sparsed(windowed(options("low_confidence"), 3));
    check_combination(dir, with_des(window, mode), des + " + sparse + window, refresh 3",
                      {{"no DES", window}});
    GenerateOptions cfg = sparsed(options("low_confidence"));
    cfg.cfg_scale = 1.0f;
    check_combination(dir, with_des(cfg, mode), des + " + sparse + cfg", {{"no DES", cfg}});
  }
}

TEST(ReferenceCombine, DesWithCfg) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", kMoe);
  GenerateOptions cfg = options("low_confidence");
  cfg.cfg_scale = 1.0f;
  for (DesMode mode : {DesMode::Vote, DesMode::Seq}) {
    const std::string des = "DES " + std::string(name(mode));
    check_combination(dir, with_des(cfg, mode), des + " + cfg",
                      {{"no cfg", with_des(options("low_confidence"), mode)}, {"no DES", cfg}});
    GenerateOptions dual = cfg;
    dual.cache = KvCache::Dual;
    check_combination(dir, with_des(dual, mode), des + " + cfg + dual cache", {{"no DES", dual}});
    const GenerateOptions window = windowed(cfg, 3);
    check_combination(dir, with_des(window, mode), des + " + cfg + window, refresh 3", {{"no DES", window}});
  }
}

}  // namespace
}  // namespace tessera
