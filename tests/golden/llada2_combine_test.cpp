// Window-Diffusion and SparseD on block-causal LLaDA2, within its block grid (issue #27), against the
// numpy reference (reference.py generate on a llada2_moe checkpoint; ref_combos.py, written from
// algorithms.md and the combination semantics, not from the C++): on a tiny LLaDA2 checkpoint in f32,
// tessera decides the same tokens at the same steps as the reference, for two block lengths, with and
// without the caches. Each combination also changes the reference's own generation compared with leaving
// the window or SparseD out, so an engine that silently dropped one would fail.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"
#include "io/config.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

constexpr const char* kArgs = "--seed 7";

struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> order;
  bool operator==(const Run&) const = default;
};

// The reference's generation of `o` (greedy, LLaDA2's threshold loop) with the window / SparseD / cache
// flags of `o`, its tokens trimmed at the first EOS as tessera's are.
Run reference(const std::filesystem::path& dir, const std::vector<int32_t>& prompt, const GenerateOptions& o,
              int32_t eos) {
  std::string flags = "--gen-length " + std::to_string(o.gen_length) + " --steps " + std::to_string(o.steps) +
                      " --block-length " + std::to_string(o.block_length) + " --threshold " +
                      std::to_string(o.threshold);
  if (o.window)
    flags += " --window " + std::to_string(o.window_ex) + "," + std::to_string(o.window_in) + "," +
             std::to_string(o.window_refresh);
  if (o.sparse)
    flags += " --sparse --sparse-block " + std::to_string(o.sparse_block) + " --sparse-rho " +
             std::to_string(o.sparse_rho) + " --sparse-skip " + std::to_string(o.sparse_skip);
  if (o.cache != KvCache::None) flags += " --cache prefix";
  const nlohmann::json j = test::reference_generate_json(dir, prompt, flags);
  Run r;
  if (j.is_null()) return r;
  for (size_t i = prompt.size(); i < j["tokens"].size(); ++i) {
    const auto t = j["tokens"][i].get<int32_t>();
    if (t == eos) break;
    r.tokens.push_back(t);
  }
  r.order = j["order"].get<std::vector<std::vector<int32_t>>>();
  return r;
}

// tessera decides as the reference for `o`; the reference differs for each of `without`.
void check(const std::filesystem::path& dir, const GenerateOptions& o, const std::string& what,
           const std::vector<std::pair<std::string, GenerateOptions>>& without) {
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int32_t eos = e->config().eos_id;
  const auto prompt = test::llada2_prompt(e->vocab_size());
  const Run want = reference(dir, prompt, o, eos);
  const GenerateResult r = generate(*e, prompt, o);
  EXPECT_EQ(r.order, want.order) << what;
  EXPECT_EQ(r.tokens, want.tokens) << what;
  for (const auto& [name, w] : without)
    EXPECT_NE(reference(dir, prompt, w, eos), want) << what << ": " << name << " decides the same";
}

// The Llada2 golden cases (30 tokens after an 11-token prompt; blocks of 8 and 16; the EOS stop).
std::vector<GenerateOptions> cases(const std::filesystem::path& dir) {
  return test::llada2_generate_cases(load_config(dir).eos_id);
}

// 1. The window inside each block: an external window of 5 masked positions, active sets of 3;
// refresh 0 (no cache) and 2 (a phase cache; the first refresh of a block recomputes the previous one).
TEST(Llada2Combine, WindowInsideTheBlockGrid) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  for (const GenerateOptions& plain : cases(dir)) {
    for (int refresh : {0, 2}) {
      GenerateOptions w = plain;
      w.window = true;
      w.window_ex = 5;
      w.window_in = 3;
      w.window_refresh = refresh;
      check(dir, w, "block " + std::to_string(plain.block_length) + ", window 5,3," + std::to_string(refresh),
            {{"no window", plain}});
    }
  }
}

// 2. SparseD per block (tiles of 4, rho 0.3; with 8 steps per block, skip 0.25: the block's first 2
// forwards exact, the third selects over the keys each row sees, the later ones sparse), without a
// cache and with LLaDA2's exact KV cache (its first forward of a block recomputes the previous block).
TEST(Llada2Combine, SparseDPerBlock) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  for (const GenerateOptions& plain : cases(dir)) {
    for (KvCache cache : {KvCache::None, KvCache::Prefix}) {
      GenerateOptions base = plain;
      base.cache = cache;
      GenerateOptions sp = base;
      sp.sparse = true;
      sp.sparse_block = 4;
      sp.sparse_rho = 0.3f;
      sp.sparse_skip = 0.25f;
      check(dir, sp,
            "block " + std::to_string(plain.block_length) + ", sparse, cache " + std::string(name(cache)),
            {{"no sparse", base}});
    }
  }
}

// SparseD inside the window is not defined on a block-causal model; it is refused before any forward.
TEST(Llada2Combine, SparseDInsideTheWindowIsRefused) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  GenerateOptions o = cases(dir).front();
  o.window = o.sparse = true;
  test::expect_error([&] { (void)generate(*e, test::llada2_prompt(e->vocab_size()), o); },
                     "SparseD inside the window is defined for bidirectional models only");
}

}  // namespace
}  // namespace tessera
