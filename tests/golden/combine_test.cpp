// Features that were refused together before the decoding layer was composed (issue #27), now combined,
// on tiny checkpoints in f32: each combination equals the path it must reduce to where it is exact
// (block-causal caches, a window that covers everything), and runs where it approximates.
#include <gtest/gtest.h>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/batcher.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

std::vector<int32_t> ordinary_prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(11 + 17 * i % 250));
  return p;
}

void expect_same(const GenerateResult& got, const GenerateResult& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.order, want.order) << what;
  EXPECT_EQ(got.steps_run, want.steps_run) << what;
}

// cfg keeps a second KV cache for its unconditional canvas. On block-causal LLaDA2 the caches are exact,
// so cfg with either cache decides what cfg without one does, token for token.
TEST(Combine, CfgWithTheExactCachesOfLlada2EqualsCfgAlone) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = test::llada2_prompt(e->vocab_size());
  for (GenerateOptions o : test::llada2_generate_cases(e->config().eos_id)) {
    o.cfg_scale = 1.5f;
    o.threshold = 0.0f;  // (cfg decides by the LLaDA schedule)
    const GenerateResult want = generate(*e, prompt, o);
    for (KvCache c : {KvCache::Prefix, KvCache::Dual}) {
      o.cache = c;
      expect_same(generate(*e, prompt, o), want,
                  "block " + std::to_string(o.block_length) + " " + std::string(name(c)));
    }
    o.cache = KvCache::None;
  }
}

// On a bidirectional model cfg with a cache approximates: it runs, decides every position once, holds
// two caches (the pool doubles) and reads them (the answer differs from the uncached one somewhere).
TEST(Combine, CfgWithABidirectionalCacheHoldsTwoStreams) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = ordinary_prompt(12);
  GenerateOptions o;
  o.gen_length = 32;
  o.block_length = 8;
  o.steps = 16;
  o.stop_at_eos = false;
  o.cache = KvCache::Prefix;
  (void)generate(*e, prompt, o);
  const size_t one_stream = e->kv_cache_bytes();
  o.cfg_scale = 1.0f;
  const GenerateResult r = generate(*e, prompt, o);
  ASSERT_EQ(r.tokens.size(), 32u);
  EXPECT_EQ(r.steps_run, 16);
  EXPECT_GE(e->kv_cache_bytes(), 2 * one_stream);
}

// A window whose external window and active set hold the whole generation prunes nothing and (refresh
// 0) caches nothing: with cfg, and with an infilling suffix, it decides what the plain path decides.
TEST(Combine, AWindowCoveringEverythingWithCfgOrASuffixIsExact) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = ordinary_prompt(10);
  GenerateOptions o;
  o.gen_length = 16;
  o.block_length = 8;
  o.steps = 8;
  o.stop_at_eos = false;
  for (const bool cfg : {true, false}) {
    GenerateOptions p = o;
    if (cfg) p.cfg_scale = 1.0f;
    if (!cfg) p.suffix = {40, 41, 42, 43};
    const GenerateResult want = generate(*e, prompt, p);
    p.window = true;
    p.window_ex = p.window_in = 16;
    for (int refresh : {0, 1}) {  // 1: every forward refreshes the whole canvas into the cache(s)
      p.window_refresh = refresh;
      expect_same(generate(*e, prompt, p), want,
                  std::string(cfg ? "cfg" : "suffix") + " refresh " + std::to_string(refresh));
    }
  }
}

// Approximate combinations run end to end on the engine and decide every position once.
TEST(Combine, ApproximateCombinationsRun) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 3");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = ordinary_prompt(9);
  struct Case {
    const char* what;
    std::function<void(GenerateOptions&)> set;
  };
  const Case cases[] = {
      {"window + cfg + refresh",
       [](GenerateOptions& o) { o.window = true, o.window_ex = 12, o.window_in = 4, o.cfg_scale = 1.0f; }},
      {"window + suffix",
       [](GenerateOptions& o) {
         o.window = true, o.window_ex = 12, o.window_in = 4, o.suffix = {40, 41};
       }},
      {"sparse + suffix",
       [](GenerateOptions& o) {
         o.sparse = true, o.sparse_block = 8, o.suffix = {40, 41, 42};
       }},
      {"dual cache + cfg + DES",
       [](GenerateOptions& o) {
         o.cache = KvCache::Dual, o.cfg_scale = 0.5f, o.des = DesMode::Vote, o.des_beta = 0.5f;
       }},
      {"window + cfg + DES",
       [](GenerateOptions& o) {
         o.window = true, o.window_ex = 12, o.window_in = 4, o.cfg_scale = 1.0f, o.des = DesMode::Seq,
         o.des_k = 1;
       }},
      {"sparse + DES",
       [](GenerateOptions& o) { o.sparse = true, o.sparse_block = 8, o.des = DesMode::Vote; }},
  };
  for (const Case& c : cases) {
    GenerateOptions o;
    o.gen_length = 24;
    o.block_length = 8;
    o.steps = 12;
    o.stop_at_eos = false;
    c.set(o);
    GenerateResult r;
    ASSERT_NO_THROW(r = generate(*e, prompt, o)) << c.what;
    ASSERT_EQ(r.tokens.size(), 24u) << c.what;
    size_t decided = 0;
    for (const auto& s : r.order) decided += s.size();
    EXPECT_EQ(decided, 24u) << c.what;
  }
}

// In the server's batcher, a request whose cfg keeps two caches runs alone (its plan does not share
// forwards) and gets its solo answer; the same request without cfg is packed.
TEST(Combine, CfgWithACacheRunsAloneInTheBatcher) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = ordinary_prompt(12);
  GenerateOptions o;
  o.gen_length = 16;
  o.block_length = 8;
  o.steps = 8;
  o.cache = KvCache::Dual;
  o.cfg_scale = 1.0f;
  EXPECT_FALSE(plan_request(o, static_cast<int64_t>(prompt.size()), false).shares_forwards());
  const GenerateResult want = generate(*e, prompt, o);
  Batcher b(*e, 4);
  test::expect_error([&] { b.generate(prompt, o); }, "cannot be batched");
  GenerateResult got;
  b.run([&] { got = generate(*e, prompt, o); }, true);
  expect_same(got, want, "exclusive job");
  o.cfg_scale = 0.0f;
  EXPECT_TRUE(plan_request(o, static_cast<int64_t>(prompt.size()), false).shares_forwards());
}

}  // namespace
}  // namespace tessera
