// Token editing (LLaDA2.1's draft and edit, decode/edit.cpp) against the numpy reference's loop
// (tests/reference/ref_editing.py, written from specs/llada21-editing.md, not from the C++): on tiny
// checkpoints in f32 at temperature 0, tessera fills and rewrites the same tokens at the same steps,
// with the same number of forwards, for several prompts (ending inside a block and on its edge), both
// presets and thresholds low enough for the flat distributions of random weights to fill several
// masks per step, block lengths 8 and 16, the post-step cap, the 2-gram penalty, and LLaDA2's KV cache
// on and off (exact: the same steps). Bidirectional models (LLaDA, Dream) edit the blocks of the
// generation the same way.
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

struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> order;
  std::vector<TokenEdit> edits;
  int64_t forwards = 0;
};

Run reference(const std::filesystem::path& dir, const std::vector<int32_t>& prompt,
              const GenerateOptions& o) {
  const nlohmann::json j = test::reference_generate_json(
      dir, prompt,
      "--gen-length " + std::to_string(o.gen_length) + " --block-length " + std::to_string(o.block_length) +
          " --edit --threshold " + std::to_string(o.threshold) + " --edit-threshold " +
          std::to_string(o.edit_threshold) + " --max-post-steps " + std::to_string(o.max_post_steps) +
          " --edit-penalty " + std::to_string(o.edit_penalty));
  Run r;
  if (j.is_null()) return r;
  for (size_t i = prompt.size(); i < prompt.size() + static_cast<size_t>(o.gen_length); ++i) {
    const auto t = j["tokens"][i].get<int32_t>();
    if (!o.eos_ids.empty() && t == o.eos_ids[0]) break;
    r.tokens.push_back(t);
  }
  r.order = j["order"].get<std::vector<std::vector<int32_t>>>();
  for (const auto& e : j["edits"])
    r.edits.push_back(
        TokenEdit{e[0].get<int>(), e[1].get<int32_t>(), e[2].get<int32_t>(), e[3].get<int32_t>()});
  r.forwards = j["forwards"].get<int64_t>();
  return r;
}

struct Case {
  float threshold, edit_threshold;
  int max_post;
  float penalty = 0.0f;
};

std::string describe(const Case& c, int block, KvCache cache, size_t prompt) {
  return "threshold " + std::to_string(c.threshold) + ", edit " + std::to_string(c.edit_threshold) +
         ", post " + std::to_string(c.max_post) + ", penalty " + std::to_string(c.penalty) + ", block " +
         std::to_string(block) + ", cache " + std::string(name(cache)) + ", prompt of " +
         std::to_string(prompt);
}

// Runs every case on every prompt and block length (and cache, where given) against the reference;
// returns the number of edits seen, so that a caller can require that editing was exercised.
size_t check_cases(const std::filesystem::path& dir, const std::vector<std::vector<int32_t>>& prompts,
                   int gen, const std::vector<Case>& cases, const std::vector<KvCache>& caches) {
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  size_t edits = 0;
  for (const auto& prompt : prompts) {
    for (int block : {8, 16}) {
      for (const Case& c : cases) {
        for (KvCache cache : caches) {
          GenerateOptions o;
          o.gen_length = gen;
          o.block_length = block;
          o.steps = block;
          o.edit = true;
          o.threshold = c.threshold;
          o.edit_threshold = c.edit_threshold;
          o.max_post_steps = c.max_post;
          o.edit_penalty = c.penalty;
          o.cache = cache;
          o.eos_ids = {e->config().eos_id};
          const std::string what = describe(c, block, cache, prompt.size());
          const Run want = reference(dir, prompt, o);
          const GenerateResult r = generate(*e, prompt, o);
          for (size_t k = 0; k < std::min(r.order.size(), want.order.size()); ++k)
            if (r.order[k] != want.order[k]) {
              ADD_FAILURE() << what << ": step " << k << " differs";
              break;
            }
          for (size_t k = 0; k < std::min(r.edits.size(), want.edits.size()); ++k)
            if (!(r.edits[k] == want.edits[k])) {
              ADD_FAILURE() << what << ": edit " << k << " differs: step " << r.edits[k].step << " pos "
                            << r.edits[k].position << " " << r.edits[k].from << "->" << r.edits[k].to
                            << " vs step " << want.edits[k].step << " pos " << want.edits[k].position << " "
                            << want.edits[k].from << "->" << want.edits[k].to;
              break;
            }
          EXPECT_EQ(r.order, want.order) << what;
          EXPECT_EQ(r.tokens, want.tokens) << what;
          EXPECT_EQ(r.edits, want.edits) << what;
          EXPECT_EQ(r.forwards, want.forwards) << what;
          edits += r.edits.size();
        }
      }
    }
  }
  return edits;
}

// The presets (quality: 0.7 / 0.5; speed: 0.5 / 0, editing whenever the candidate differs), low
// thresholds that fill several masks per step, a post-step cap of 2, and the 2-gram penalty.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {0.7f, 0.5f, 16}, {0.5f, 0.0f, 16}, {0.05f, 0.04f, 16}, {0.05f, 0.0f, 2}, {0.05f, 0.0f, 16, 3.0f}};
  return c;
}

TEST(Edit, Llada2MatchesTheReferenceLoop) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  const auto V = load_config(dir).vocab;
  // 11 tokens end inside the first block; 16 end on its edge (blocks of 8 and 16).
  const std::vector<std::vector<int32_t>> prompts = {test::random_canvas(11, V - 8, 5, 0, 0.0),
                                                     test::random_canvas(16, V - 8, 9, 0, 0.0)};
  const size_t edits = check_cases(dir, prompts, 30, cases(), {KvCache::None, KvCache::Prefix});
  EXPECT_GT(edits, 20u) << "editing was hardly exercised";
}

// Temperature > 0 (the reference models greedy decoding only): a draw from the tempered, top-k / top-p
// filtered distribution, its probability the confidence. The same seed gives the same generation, with and
// without the cache; another seed another one; the filters are taken with a LLaDA algorithm.
TEST(Edit, SamplingAtATemperature) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = test::random_canvas(11, e->vocab_size() - 8, 5, 0, 0.0);
  GenerateOptions o;
  o.gen_length = 30;
  o.block_length = o.steps = 8;
  o.edit = true;
  o.threshold = 0.05f;
  o.edit_threshold = 0.04f;
  o.temperature = 0.8f;
  o.top_k = 40;
  o.top_p = 0.95f;
  o.seed = 3;
  const GenerateResult a = generate(*e, prompt, o);
  EXPECT_EQ(generate(*e, prompt, o).tokens, a.tokens);
  GenerateOptions cached = o;
  cached.cache = KvCache::Prefix;
  const GenerateResult c = generate(*e, prompt, cached);
  EXPECT_EQ(c.tokens, a.tokens);
  EXPECT_EQ(c.order, a.order);
  EXPECT_EQ(c.edits, a.edits);
  o.seed = 4;
  EXPECT_NE(generate(*e, prompt, o).tokens, a.tokens);
  for (int32_t t : a.tokens) EXPECT_NE(t, e->mask_token());
}

TEST(Edit, BidirectionalModelsEditTheirBlocks) {
  for (const char* family : {"llada", "dream"}) {
    TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
    const auto V = load_config(dir).vocab;
    const size_t edits =
        check_cases(dir, {test::random_canvas(7, V - 8, 3, 0, 0.0)}, 32, cases(), {KvCache::None});
    EXPECT_GT(edits, 10u) << family << ": editing was hardly exercised";
  }
}

}  // namespace
}  // namespace tessera
